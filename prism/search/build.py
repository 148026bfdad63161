"""From a complete structure to sGraphs: enumerate map assignments, build kernel graphs.

A complete block structure has constraints over its map symbols. Its *assignments* are the solutions
with grid-dim symmetry broken (used grid dims first, strictly increasing signatures); each becomes a
block graph with concrete maps and SYMBOLIC grid sizes and for-loop range (``g0, g1, g2, F`` of the
first customized operator, ``g0_1, ...`` of the second), built through the IR's ``BlockBuilder`` so
every shape is re-derived and checked by the IR itself.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from prism.ir.block import ACCUMULATORS, BlockBuilder, BlockGraph
from prism.ir.builder import Tensor
from prism.ir.graph import Graph
from prism.search import maps as M
from prism.search.block import BlockStruct
from prism.search.kernel import KernelCandidate
from prism.search.program import CoreProgram

Assignment = tuple  # (grid columns, loop column): one solution of each column problem (prism.search.maps)


def assignments(s: BlockStruct) -> Iterator[Assignment]:
    """Map assignments of a structure, one per grid-permutation class."""
    n = len(s.ctx.inputs)
    csp = M.MapCSP(s.domains(), n)
    if s.fixed is not None:  # concrete mode: inputs fixed up front, solve the savers per column
        grid, loop = s.fixed
        gcons = [c for c in s.cons if M.column(c) == M.G]
        order = [M.mvar(i, M.G) for i in range(n)] + [M.ovar(k) for k in range(len(s.outputs))]
        cols = []
        for col in grid:
            sol = next(M.solve_column(gcons, {**csp.domains, **{v: (x,) for v, x in col.items()}}, order), None)
            if sol is None:
                return
            cols.append(sol)
        yield tuple(cols), loop
        return
    cols = csp.grid_columns(s.cons, len(s.outputs))
    loops = csp.loop_columns(s.cons)
    for grid in M.grid_choices(cols, n):
        for loop in loops:
            yield grid, loop


def symbol_names(index: int) -> tuple[list[str], str]:
    """Grid and for-loop symbol names of the ``index``-th customized operator."""
    sfx = "" if index == 0 else f"_{index}"
    return [f"g{p}{sfx}" for p in range(M.MAX_GRID)], f"F{sfx}"


def has_loop(a: Assignment, n_inputs: int) -> bool:
    return any(a[1][M.mvar(i, M.L)] != M.NONE for i in range(n_inputs))


def build_block_graph(s: BlockStruct, a: Assignment, inputs: Sequence[Tensor], index: int,
                      sizes: Sequence[int] | None = None) -> BlockGraph:
    """The block graph of structure ``s`` under assignment ``a``. With ``sizes`` (concrete mode) the grid
    and loop sizes are numbers, else symbols."""
    n = len(s.ctx.inputs)
    grid_cols, loop = a
    gnames, fname = symbol_names(index)
    looped = has_loop(a, n)
    if sizes:
        grid: list[int | str] = [sizes[p] for p in range(len(grid_cols))]
        floop: int | str = sizes[3] if looped else 1
    else:
        grid = gnames[:len(grid_cols)]
        floop = fname if looped else 1
    bb = BlockBuilder(grid=grid, forloop=floop, inputs=list(inputs))
    vals: list[Tensor] = []
    for t in s.tensors:
        if t.op == "iter":
            i = t.arg[0]
            imap = tuple(M.decode(col[M.mvar(i, M.G)]) for col in grid_cols)
            vals.append(bb.iter(i, imap=imap, fmap=M.decode(loop[M.mvar(i, M.L)])))
        elif t.op == "acc":
            kind, params = t.arg
            vals.append(bb.accumulate(kind, *(vals[j] for j in t.src), **dict(zip(ACCUMULATORS[kind].params, params))))
        else:
            vals.append(bb._apply(t.op, [vals[j] for j in t.src], t.arg))
    for k, t in enumerate(s.outputs):
        bb.save(vals[t], omap=tuple(M.decode(col[M.ovar(k)]) for col in grid_cols))
    return bb.build()


def build_graph(prog: CoreProgram, cand: KernelCandidate, choice: Sequence[tuple[BlockStruct, Assignment]],
                name: str = "") -> Graph:
    """The kernel graph of a candidate (program inputs, peeled layout ops re-attached): per customized op,
    one (structure, assignment) choice."""
    program = prog.program
    g = Graph(name or f"{program.name} (searched)")
    tensors: list[Tensor] = prog.wrap_inputs(g)
    ci = 0
    for op in cand.ops:
        srcs = [tensors[i] for i in op.srcs]
        if not op.custom:
            t = op.tmpl
            assert t is not None
            tensors.append(g._apply(t.op, srcs, t.absolute_arg(len(srcs[0].shape))))
        else:
            s, a = choice[ci]
            bg = build_block_graph(s, a, srcs, ci, s.sizes or None)
            tensors.extend(g.customized(bg, srcs))
            ci += 1
    for k, (name_, idx, want) in enumerate(zip(program.output_names, cand.outputs, program.outputs)):
        t = prog.wrap_output(g, k, tensors[idx])
        if t.dtype != want.dtype:
            # the search drops casts to float32 (the identity on values, prism.search.abstract): the output
            # is stored as the program's dtype
            t = g.cast(t, want.dtype)
        g.output(t, name_)
    return g
