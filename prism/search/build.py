"""From a complete structure to sGraphs: enumerate map assignments, build kernel graphs.

A complete block structure has constraints over its map symbols. Its *assignments* are the solutions
with grid-dim symmetry broken (used grid dims first, strictly increasing signatures); each becomes a
block graph with concrete maps and SYMBOLIC grid sizes and for-loop range (``g0, g1, g2, F`` of the
first customized operator, ``g0_1, ...`` of the second), built through the IR's ``BlockBuilder`` so
every shape is re-derived and checked by the IR itself.

An input the core reads through a view (:class:`~prism.search.program.InputView`) is read as stored: its
iterator walks the stored tensor with the view's permutation applied to its maps, then a tile permute (a
strided read in the generated code). A view's per-channel scale is iterated beside it, with the maps of the
scaled dim, and multiplied in as late as is exact: a product with the scaled dim as its output rows or columns
is scaled after the product, and a ``sum`` accumulation of a scaled product after the loop when the scale is
loop-invariant -- ``acc(x @ q.T) * s.T``, one multiply per output instead of one per weight. Any other use
multiplies the tile itself (``q * s``, exact too). The built graph is verified like every other.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from prism.ir.block import ACCUMULATORS, BlockBuilder, BlockGraph
from prism.ir.builder import Tensor
from prism.ir.graph import Graph
from prism.search import maps as M
from prism.search.block import BlockStruct, _is_one
from prism.search.kernel import KernelCandidate
from prism.search.program import CoreProgram, InputView

Assignment = tuple  # (grid columns, loop column): one solution of each column problem (prism.search.maps)


def assignments(s: BlockStruct) -> Iterator[Assignment]:
    """Map assignments of a structure, one per grid-permutation class."""
    n = len(s.ctx.inputs)
    csp = M.MapCSP(s.domains(), n, gridless=s.ctx.gridless)
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
    one = csp.gridless_column(s.cons, len(s.outputs)) if not cols else None
    for grid in M.grid_choices(cols, n) if one is None else [(one,)]:
        for loop in loops:
            yield grid, loop


def symbol_names(index: int) -> tuple[list[str], str]:
    """Grid and for-loop symbol names of the ``index``-th customized operator."""
    sfx = "" if index == 0 else f"_{index}"
    return [f"g{p}{sfx}" for p in range(M.MAX_GRID)], f"F{sfx}"


def has_loop(a: Assignment, n_inputs: int) -> bool:
    return any(a[1][M.mvar(i, M.L)] != M.NONE for i in range(n_inputs))


@dataclass(frozen=True)
class ViewInput:
    """Structure input read through a view: the block inputs holding the stored tensor and its scale."""

    view: InputView
    raw: int
    scale: int | None = None


@dataclass(frozen=True)
class _Scaled:
    """A tile equal to ``raw * scale`` (the scale a [k, 1], [1, k] or [k] tile, broadcast), not multiplied yet."""

    raw: Tensor
    scale: Tensor
    invariant: bool   # the scale does not change over the for-loop


def build_block_graph(s: BlockStruct, a: Assignment, inputs: Sequence[Tensor], index: int,
                      sizes: Sequence[int] | None = None, slots: Sequence[int | ViewInput] | None = None
                      ) -> BlockGraph:
    """The block graph of structure ``s`` under assignment ``a``. With ``sizes`` (concrete mode) the grid
    and loop sizes are numbers, else symbols. ``inputs``: the block inputs; structure input ``i`` is block
    input ``slots[i]`` (default ``i``), or is read through a view of the block inputs it names (see the module
    docstring)."""
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
    if len(grid_cols) == 1 and all(grid_cols[0][M.mvar(i, M.G)] == M.NONE for i in range(n)):
        grid = [1]   # no grid: one block (MapCSP.gridless_column)
    bb = BlockBuilder(grid=grid, forloop=floop, inputs=list(inputs))
    where = list(slots) if slots is not None else list(range(len(inputs)))
    vals: list[Tensor | _Scaled] = []
    done: dict[int, Tensor] = {}

    def plain(j: int) -> Tensor:
        """Tensor ``j`` with its scale multiplied in (once)."""
        v = vals[j]
        if isinstance(v, Tensor):
            return v
        if j not in done:
            done[j] = bb.mul(v.raw, v.scale)
        return done[j]

    for t in s.tensors:
        if t.op == "iter":
            i = t.arg[0]
            imap = tuple(M.decode(col[M.mvar(i, M.G)]) for col in grid_cols)
            fmap = M.decode(loop[M.mvar(i, M.L)])
            slot = where[i]
            vals.append(bb.iter(slot, imap=imap, fmap=fmap) if isinstance(slot, int) else
                        _view_iter(bb, slot, imap, fmap))
        elif t.op == "acc":
            kind, params = t.arg
            src = vals[t.src[0]]
            kw = dict(zip(ACCUMULATORS[kind].params, params))
            if kind == "sum" and isinstance(src, _Scaled) and src.invariant:  # sum_i x_i * s == (sum_i x_i) * s
                vals.append(_Scaled(bb.accumulate(kind, src.raw, **kw), src.scale, True))
            else:
                vals.append(bb.accumulate(kind, *(plain(j) for j in t.src), **kw))
        elif t.op == "permute" and isinstance(v := vals[t.src[0]], _Scaled) and len(t.arg[0]) == 2 and \
                len(v.scale.shape) == 2:
            vals.append(_Scaled(bb.permute(v.raw, t.arg[0]), bb.permute(v.scale, t.arg[0]), v.invariant))
        elif t.op == "matmul" and any(isinstance(vals[j], _Scaled) for j in t.src):
            vals.append(_scaled_matmul(bb, vals[t.src[0]], vals[t.src[1]], plain, t.src))
        else:
            vals.append(bb._apply(t.op, [plain(j) for j in t.src], t.arg))
    for k, t in enumerate(s.outputs):
        bb.save(plain(t), omap=tuple(M.decode(col[M.ovar(k)]) for col in grid_cols))
    return bb.build()


def _view_iter(bb: BlockBuilder, v: ViewInput, imap: tuple, fmap: object) -> Tensor | _Scaled:
    """The tile of a view input: the stored tensor iterated with the view's maps (and its scale beside it)."""
    perm = v.view.perm

    def raw_dim(d: object) -> object:
        return d if d is None or perm is None else perm[d]  # type: ignore[index]

    rmap, rf = tuple(raw_dim(d) for d in imap), raw_dim(fmap)
    x = bb.iter(v.raw, imap=rmap, fmap=rf)
    if perm is not None:
        x = bb.permute(x, perm)
    if v.scale is None:
        return x
    # the scale holds one factor per index of the stored tensor's dim ``axis``, which is the view's last dim
    # (prism.search.program: a factor per column of the product); stored [k], [k, 1] or [1, k]
    sshape = bb.inputs[v.scale].shape
    sd = next((i for i, d in enumerate(sshape) if not _is_one(d)), len(sshape) - 1)
    axis = v.view.axis
    sc = bb.iter(v.scale, imap=tuple(sd if d == axis else None for d in rmap), fmap=sd if rf == axis else None)
    if len(sshape) == 2 and sd == 0:
        sc = bb.permute(sc, (1, 0))   # [k, 1] -> [1, k]: a row broadcast along the view's columns
    return _Scaled(x, sc, rf != axis)


def _cols(scale: Tensor) -> bool:
    """The scale is a row broadcast, one factor per column ([k] or [1, k])."""
    return len(scale.shape) == 1 or _is_one(scale.shape[0])


def _scaled_matmul(bb: BlockBuilder, a: Tensor | _Scaled, b: Tensor | _Scaled, plain: object,
                   src: tuple[int, ...]) -> Tensor | _Scaled:
    """``a @ b`` with a scaled operand: the scale moves to the product when it scales the product's columns
    (``b``'s, a [1, k] scale) or rows (``a``'s, a [k, 1] scale); otherwise the operand is multiplied first."""
    if isinstance(b, _Scaled) and _cols(b.scale):
        left = a if isinstance(a, Tensor) else plain(src[0])  # type: ignore[operator]
        return _Scaled(bb.matmul(left, b.raw), b.scale, b.invariant)
    if isinstance(a, _Scaled) and len(a.scale.shape) == 2 and _is_one(a.scale.shape[-1]):
        right = b if isinstance(b, Tensor) else plain(src[1])  # type: ignore[operator]
        return _Scaled(bb.matmul(a.raw, right), a.scale, a.invariant)
    return bb.matmul(plain(src[0]), plain(src[1]))  # type: ignore[operator]


def build_graph(prog: CoreProgram, cand: KernelCandidate, choice: Sequence[tuple[BlockStruct, Assignment]],
                name: str = "") -> Graph:
    """The kernel graph of a candidate (program inputs, peeled layout ops re-attached): per customized op,
    one (structure, assignment) choice."""
    program = prog.program
    g = Graph(name or f"{program.name} (searched)")
    handles = prog.declare_inputs(g)
    names = list(prog.core.inputs)
    tensors: list[Tensor | None] = [None] * len(names)   # core inputs, made at the kernel level on first use

    def kernel_tensor(i: int) -> Tensor:
        t = tensors[i]
        if t is None:
            t = tensors[i] = prog.core_input(g, handles, names[i])
        return t

    ci = 0
    for op in cand.ops:
        if not op.custom:
            t = op.tmpl
            assert t is not None
            srcs = [kernel_tensor(i) for i in op.srcs]
            tensors.append(g._apply(t.op, srcs, t.absolute_arg(len(srcs[0].shape))))
        else:
            s, a = choice[ci]
            block_in: list[Tensor] = []
            slots: list[int | ViewInput] = []
            for i in op.srcs:
                v = prog.views.get(names[i]) if i < len(names) else None
                if v is None:
                    slots.append(len(block_in))
                    block_in.append(kernel_tensor(i))
                    continue
                slots.append(ViewInput(v, len(block_in), None if v.scale is None else len(block_in) + 1))
                block_in.append(handles[names[i]])
                if v.scale is not None:
                    block_in.append(handles[v.scale])
            bg = build_block_graph(s, a, block_in, ci, s.sizes or None, slots)
            tensors.extend(g.customized(bg, block_in))
            ci += 1
    for k, (name_, idx, want) in enumerate(zip(program.output_names, cand.outputs, program.outputs)):
        t = prog.wrap_output(g, k, kernel_tensor(idx))
        if t.dtype != want.dtype:
            # the search drops casts to float32 (the identity on values, prism.search.abstract): the output
            # is stored as the program's dtype
            t = g.cast(t, want.dtype)
        g.output(t, name_)
    return g
