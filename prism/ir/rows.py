"""Row separability: when a program's outputs along a dim are computed row by row from the same rows of its inputs.

A program is *row-separable* along a size symbol ``s`` when, for every value ``n`` of ``s`` and every split
``n = n1 + n2``, its outputs at ``n`` are its outputs at ``n1`` on the first ``n1`` rows of every input that has
``s``, followed by its outputs at ``n2`` on the last ``n2`` rows (inputs without ``s`` passed whole). A prefill
piece of a language model is (an MLP, a projection, a norm, RoPE over the prompt's tokens); causal attention is
not (a row attends to the rows before it).

:func:`row_witness` proves it from a *verified* sGraph of the program (DESIGN.md §4.3 semantics): a single
graph-defined kernel on the program's inputs with a grid dim ``i`` of size ``p`` (a free parameter) that splits
the ``s`` axis of every input and output that has one, replicates the others, and whose instance at ``p = s``
is valid -- one row per block -- with the *same block program* at every value checked. The verifier proved the
sGraph equal to the program at every valid instance, so at ``p = s = x`` the program's output row ``j`` is the
block program on input row ``j``; the same block program at ``p = s = 1`` is the program at one row. Rows of the
program at ``x`` are therefore the program at one row on each row, for every ``x`` checked, and a split of ``n``
into ``n1 + n2`` (all three checked) computes the same values. The runtime uses it to serve a length no tuned
grid divides as calls at lengths that are divided (prism/runtime/split.py).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import NamedTuple

from prism.errors import PrismError
from prism.ir import dims as D
from prism.ir.graph import Graph


class NotRowSeparable(PrismError):
    """No proof that a program is row-separable along a dim (the message says what is missing)."""


def row_axes(program: Graph, dim: str) -> tuple[dict[str, int | None], dict[str, int]]:
    """(per input, per output: the axis that is ``dim`` itself, None for an input without it), or why not: ``dim``
    elsewhere in a shape (inside another size, or twice) is no row axis; every output must have it. Raises
    :class:`NotRowSeparable` otherwise."""
    def axis(name: str, shape: tuple) -> int | None:
        at = [i for i, d in enumerate(shape) if dim in D.symbols(d)]
        if len(at) > 1 or (at and not D.structurally_equal(shape[at[0]], D.sym(dim))):
            raise NotRowSeparable(f"{name!r} {D.format_shape(shape)} has {dim} in more than one axis or inside "
                                  "another size")
        return at[0] if at else None
    ins = {name: axis(name, node.shape) for name, node in program.inputs.items()}
    outs: dict[str, int] = {}
    for name, shape in program.output_shapes.items():
        a = axis(name, shape)
        if a is None:
            raise NotRowSeparable(f"output {name!r} has no {dim} axis")
        outs[name] = a
    return ins, outs


class RowGrid(NamedTuple):
    """An sGraph's grid dim over the rows: its parameter and index, and the program's row axes (:func:`row_axes`)."""

    param: str
    index: int
    inputs: dict[str, int | None]
    outputs: dict[str, int]


def row_grid(sgraph: Graph, program: Graph, dim: str, params: Mapping[str, object]) -> RowGrid:
    """The structure half of :func:`row_witness`: ``sgraph`` is one graph-defined kernel on ``program``'s inputs
    whose grid dim of free size splits the ``dim`` axis of every operand and output that has one (its map symbols
    as in ``params``). Raises :class:`NotRowSeparable` saying why not."""
    ins, outs = row_axes(program, dim)
    nodes = sgraph.nodes
    custom = [n for n in nodes if n.op == "customized"]
    if len(custom) != 1 or any(n.op not in ("input", "customized", "result", "output") for n in nodes):
        raise NotRowSeparable("the sGraph is not a single graph-defined kernel on the program's inputs")
    (c,) = custom
    names = {id(node): name for name, node in sgraph.inputs.items()}
    if any(id(s) not in names for s in c.src):
        raise NotRowSeparable("the kernel's operands are not the program's inputs")
    src_axes = [ins.get(names[id(s)]) for s in c.src]
    out_axes = {}
    for o in sgraph.outputs:
        r = o.src[0]
        if r.op != "result" or r.src[0] is not c:
            raise NotRowSeparable(f"output {o.arg[0]!r} is not a result of the kernel")
        out_axes[int(r.arg[0])] = outs[o.arg[0]]
    bg = c.arg[0]
    maps = {k: v for k, v in params.items() if k in bg.map_symbols()}
    try:
        bg = bg.instantiate(maps) if maps else bg
    except PrismError as e:
        raise NotRowSeparable(f"its maps do not instantiate: {e}") from None
    iters = [n for n in bg.nodes if n.op == "iter"]
    for i, g in enumerate(bg.grid):
        names_g = D.symbols(g)
        if len(names_g) != 1 or not D.structurally_equal(g, D.sym(next(iter(names_g)))):
            continue
        if all(n.arg[1][i] == src_axes[n.arg[0]] for n in iters) and all(
                s.arg[1][i] == out_axes.get(s.arg[0]) for s in bg.outputs):
            grid = next(iter(names_g))
            if grid != dim and grid in params:
                return RowGrid(grid, i, ins, outs)
            break
    raise NotRowSeparable(f"no grid dim of the kernel splits the {dim} axis of every operand and output that has one")


def check_one_row(sgraph: Graph, dim: str, rows: RowGrid, params: Mapping[str, object], env: Mapping[str, int],
                  values: Iterable[int] = ()) -> None:
    """The instance half of :func:`row_witness`: one row per block (``rows.param`` = ``dim``) is a valid instance of
    ``sgraph`` at 1 and at every value in ``values`` (the other dims as in ``env``), with one block program.
    Raises :class:`NotRowSeparable` saying why not."""
    body = None
    for x in [1, *sorted(set(values))]:
        at = {**env, dim: x}
        try:
            inst = sgraph.instantiate({**at, **D.resolve_params({k: v for k, v in params.items() if k != rows.param},
                                                                at), rows.param: x})
        except PrismError as e:
            raise NotRowSeparable(f"one row per block is not a valid instance at {dim}={x}: {e}") from None
        (ci,) = [n for n in inst.nodes if n.op == "customized"]
        b = ci.arg[0]
        outs_x = (b.forloop, tuple(g for k, g in enumerate(b.grid) if k != rows.index), b.outputs)
        if body is None:
            body = outs_x
        elif outs_x != body:
            raise NotRowSeparable(f"the block program at one row per block differs between {dim}=1 and {dim}={x}")


def row_witness(sgraph: Graph, program: Graph, dim: str, params: Mapping[str, object], env: Mapping[str, int],
                values: Iterable[int] = ()) -> str:
    """The parameter of ``sgraph``'s grid dim over the rows when ``sgraph`` (a verified sGraph of ``program``,
    with the other ``params`` of its instance) proves ``program`` row-separable along ``dim`` at every value in
    ``values`` and at 1 (the other dims as in ``env``; see the module docstring): :func:`row_grid`, then
    :func:`check_one_row`. Raises :class:`NotRowSeparable` saying why not: any structure it does not recognize is a
    reason, never a guess."""
    rows = row_grid(sgraph, program, dim, params)
    check_one_row(sgraph, dim, rows, params, env, values)
    return rows.param
