"""Depth-first generation of block graphs with symbolic grid sizes, for-loop range and maps.

A *block context* fixes the customized operator's inputs (their abstract classes and full shapes).
Everything about the parallelization stays symbolic: three grid dims ``g0, g1, g2`` (any of which may
end up unused), the for-loop range ``F``, and one map symbol per (input, parallel dim)
(:mod:`prism.search.maps`) -- including the for-loop map, so whether an iterator walks the loop is a
symbol too: a tile is *pre* (before accumulation; loop-varying or invariant depending on its inputs'
loop maps) or *post* (after an accumulator), and the builder's phase rules become constraints
(an accumulated value must depend on a looped input, a value mixed with a post-loop value or saved
without an accumulator must not). A tile dim is represented by its *origin*
``(full size, input, data dim)``; its size is the full size divided by whichever parallel dims the
map symbols assign to that origin. Matching two tile dims records constraints instead of comparing
numbers, so one generated structure stands for every map assignment that satisfies them.

Each step adds one tile operator or accumulator, in canonical order, and prunes with (counted per
rule in :class:`~prism.search.stats.Stats`): the abstract-expression test (one lookup in the frozen
e-graph), duplicates, dimension matching (full sizes, then satisfiability of the map constraints),
the builder's structural rules, and a bound on unused tensors. Whenever all iterators are used and
every unused tensor can be saved, the state also yields a complete structure (with the saver
constraints). In *concrete* mode the same code runs once per concrete map assignment and grid/loop
sizes (Mirage-style), with singleton domains, so every constraint is decided on the spot.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field

from prism.ir.dims import DimLike, evaluate
from prism.ir.ops import OPS
from prism.search import maps as M
from prism.search.egraph import ClassTable
from prism.search.space import COMMUTATIVE, CompiledTemplate, Limits, Template
from prism.search.stats import Budget, Stats

TDim = tuple | None  # (full size, input, data dim), or None for a dim of size 1


class BT:
    """A tile tensor of a block state."""

    __slots__ = ("arg", "cls", "cone", "op", "pg", "phase", "pl", "shape", "src", "tmpl")

    def __init__(self, op: str, src: tuple[int, ...], arg: tuple, cls: int, shape: tuple[TDim, ...], phase: str,
                 cone: frozenset[int], tmpl: Template | None, pg: frozenset = frozenset(),
                 pl: frozenset = frozenset()) -> None:
        self.op, self.src, self.arg, self.cls, self.shape = op, src, arg, cls, shape
        self.phase, self.cone, self.tmpl = phase, cone, tmpl
        # contracted origins: the tile is a partial sum over the blocks (pg) / iterations (pl) of whichever
        # grid column / loop splits one of them
        self.pg, self.pl = pg, pl

    def __repr__(self) -> str:
        return f"BT({self.op}{self.arg if self.arg else ''} {self.src} {self.phase})"


@dataclass(frozen=True)
class BlockContext:
    """What a block search depends on: its inputs (class, full shape), and whether its outputs must be
    the program's outputs (the customized op is the last kernel operator)."""

    inputs: tuple[tuple[int, tuple[DimLike, ...]], ...]
    final: bool = False
    # per input, per dim: a kept axis of the program (True), a known other axis (False), unknown (None);
    # () or None for an input: nothing known (prism.search.axes)
    axes: tuple[tuple[bool | None, ...] | None, ...] = ()

    # structural equality (contexts key a memo): the generated ``==`` would compare symbolic dims with
    # ``Dim.__eq__``, which raises on an undecidable ``n == 8`` whenever two different contexts' hashes collide
    def __eq__(self, other: object) -> bool:
        if not isinstance(other, BlockContext):
            return NotImplemented
        return self.final == other.final and self.axes == other.axes and len(self.inputs) == len(other.inputs) and all(
            c1 == c2 and len(s1) == len(s2) and all(_beq(a, b) for a, b in zip(s1, s2))
            for (c1, s1), (c2, s2) in zip(self.inputs, other.inputs))

    def __hash__(self) -> int:
        return hash((self.inputs, self.final, self.axes))

    def kept(self, d: TDim) -> bool | None:
        """The axis flag of a tile dim (by its origin): True on a kept axis of the program."""
        if d is None or not self.axes:
            return None
        a = self.axes[d[1]]
        return None if a is None else a[d[2]]

    @property
    def gridless(self) -> bool:
        """Whether a block may have no grid: every input has at most one dim of size above 1. A structure
        that reduces that dim (a vector's max, a row's scale at one row, [1, K]) has nothing to split over the
        grid -- reductions are never split across blocks -- and without this had no implementation at all
        (the W8A8 row scale at one row ran in PyTorch). Wider inputs always leave a dim to split."""
        return all(sum(not _is_one(s) for s in shape) <= 1 for _, shape in self.inputs)

    def domains(self) -> dict[M.Var, tuple[int, ...]]:
        dom: dict[M.Var, tuple[int, ...]] = {}
        for i, (_, shape) in enumerate(self.inputs):
            dims = tuple(d for d, s in enumerate(shape) if not _is_one(s))
            for c in (M.G, M.L):
                dom[M.mvar(i, c)] = (M.NONE, *dims)
        return dom


@dataclass(frozen=True)
class BlockStruct:
    """A complete block-graph structure: its tensors, the saved ones, and the map constraints."""

    ctx: BlockContext
    tensors: tuple[BT, ...]
    outputs: tuple[int, ...]
    cons: frozenset[M.Constraint]
    out_cls: tuple[int, ...]
    out_shapes: tuple[tuple[DimLike, ...], ...]
    fixed: tuple | None = None          # concrete mode: (grid columns, loop column) fixed up front
    sizes: tuple[int, ...] = ()         # concrete mode: (g0, g1, g2, F)

    def domains(self) -> dict[M.Var, tuple[int, ...]]:
        dom = self.ctx.domains()
        for k, t in enumerate(self.outputs):
            dom[M.ovar(k)] = (M.NONE, *range(len(self.tensors[t].shape)))
        return dom

    def describe(self) -> str:
        names = []
        for t in self.tensors:
            if t.op == "iter":
                names.append(f"iter{t.arg[0]}")
            else:
                names.append(f"{t.tmpl}({', '.join(f'%{s}' for s in t.src)})")
        return "; ".join(f"%{i}={n}" for i, n in enumerate(names)) + f" -> save {list(self.outputs)}"


def compile_templates(table: ClassTable, templates: Sequence[Template]) -> list[CompiledTemplate]:
    return [CompiledTemplate(t, table) for t in templates if t.block]


def _is_one(s: DimLike) -> bool:
    return isinstance(s, int) and s == 1


def _beq(a: DimLike, b: DimLike) -> bool:
    """Structural equality of two dims (never raises: ``n`` and ``8`` are different dims here, although
    ``n == 8`` is undecidable)."""
    if isinstance(a, int) and isinstance(b, int):
        return a == b
    return a is b


def _same_tdim(a: TDim, b: TDim) -> bool:
    if a is None or b is None:
        return a is b
    return a[1] == b[1] and a[2] == b[2] and _beq(a[0], b[0])


def _same_tshape(a: tuple[TDim, ...], b: tuple[TDim, ...]) -> bool:
    """Structural identity of two tile shapes (same origins). Never ``==`` on tuples holding dims: that
    compares a symbolic full size with ``Dim.__eq__``, which raises when undecidable (``n`` vs ``8``)."""
    return len(a) == len(b) and all(_same_tdim(x, y) for x, y in zip(a, b))


class _State:
    __slots__ = ("cons", "last", "nacc", "nops", "sinks", "tensors", "unused_iters", "uses")

    def __init__(self, tensors: tuple[BT, ...], uses: tuple[int, ...], cons: frozenset, nops: int, nacc: int,
                 last: tuple, unused_iters: int, sinks: int) -> None:
        self.tensors, self.uses, self.cons = tensors, uses, cons
        self.nops, self.nacc, self.last = nops, nacc, last
        self.unused_iters, self.sinks = unused_iters, sinks  # unused iterators / unused computed tensors


class _Prune(Exception):
    def __init__(self, rule: str) -> None:
        self.rule = rule


@dataclass
class HardwareSpec:
    """Capacity the concrete mode checks on every operator (bytes per block)."""

    cache_bytes: int
    dtype_bytes: int = 4


@dataclass
class BlockSearch:
    """Generates the complete block structures of one context (memoized by the caller)."""

    table: ClassTable
    templates: Sequence[Template]
    limits: Limits
    roots: tuple[int, ...]
    root_shapes: tuple[tuple[DimLike, ...], ...]
    stats: Stats
    budget: Budget
    hardware: HardwareSpec | None = None
    env: Mapping[str, int] = field(default_factory=dict)
    compiled: list[CompiledTemplate] | None = None   # the block templates tabulated over the table (shareable)

    def __post_init__(self) -> None:
        if self.compiled is None:
            self.compiled = compile_templates(self.table, self.templates)

    # --- entry points -------------------------------------------------------------------------
    def run(self, ctx: BlockContext) -> list[BlockStruct]:
        """Symbolic mode: one DFS for the context."""
        self.stats.block_searches += 1
        csp = M.MapCSP(ctx.domains(), len(ctx.inputs), gridless=ctx.gridless)
        out = list(self._start(ctx, csp, None, ()))
        self.stats.csp_solves += csp.solves
        return out

    def run_concrete(self, ctx: BlockContext, sizes_for: object) -> list[BlockStruct]:
        """Concrete mode (Mirage-style): enumerate map assignments and sizes up front, one DFS per
        combination. ``sizes_for(ctx, grid_columns, loop_column)`` yields (g0, g1, g2, F) tuples."""
        dom = ctx.domains()
        n = len(ctx.inputs)
        gvars = [M.mvar(i, M.G) for i in range(n)]
        lvars = [M.mvar(i, M.L) for i in range(n)]
        cols = [c for c in M.solve_column([], dom, gvars) if any(v != M.NONE for v in c.values())]
        cols.sort(key=lambda a: M.signature(a, n))
        loops = list(M.solve_column([], dom, lvars))
        out: list[BlockStruct] = []
        for grid in M.grid_choices(cols, n):
            for loop in loops:
                for sizes in sizes_for(ctx, grid, loop):  # type: ignore[operator]
                    self.budget.check_time()
                    self.stats.block_searches += 1
                    csp = M.MapCSP(dom, n, fixed=(grid, loop))
                    out.extend(self._start(ctx, csp, (grid, loop), tuple(sizes)))
                    self.stats.csp_solves += csp.solves
        return out

    # --- DFS ----------------------------------------------------------------------------------
    def _start(self, ctx: BlockContext, csp: M.MapCSP, fixed: tuple | None, sizes: tuple) -> Iterator[BlockStruct]:
        tensors = []
        for i, (cls, shape) in enumerate(ctx.inputs):
            tshape = tuple(None if _is_one(s) else (s, i, d) for d, s in enumerate(shape))
            tensors.append(BT("iter", (), (i,), cls, tshape, "pre", frozenset({i}), None))
        cons: frozenset = frozenset()
        if not csp.satisfiable(cons):
            return
        st = _State(tuple(tensors), (0,) * len(tensors), cons, 0, 0, (-1,), len(tensors), 0)
        self._ctx, self._csp, self._fixed, self._sizes = ctx, csp, fixed, sizes
        self._max_out = self._max_outputs()
        yield from self._dfs(st)

    def _dfs(self, st: _State) -> Iterator[BlockStruct]:
        self.budget.tick()
        self.stats.states_block += 1
        if st.nops:
            yield from self._complete(st)
        if st.nops >= self.limits.max_block_ops:
            return
        for tmpl_i, tmpl, srcs, cls in self._candidates(st):
            try:
                child = self._apply(st, tmpl_i, tmpl, srcs, cls)
            except _Prune as p:
                self.stats.pruned[p.rule] += 1
                continue
            yield from self._dfs(child)

    def _candidates(self, st: _State) -> Iterator[tuple[int, Template, tuple[int, ...], int]]:
        """Canonical candidates that pass the sub-expression test, as (template index, template, operands,
        result class). Operands are found through the tabulated class maps, so failing ones cost nothing;
        they are counted in bulk as ``abstract`` prunes."""
        ts = st.tensors
        n = len(ts)
        last = st.last
        considered = hits = over = 0
        # The operator bound, checked here before a candidate is built (most candidates of deep states fail
        # it: 648k of 898k in the tiny Llama's causal attention, each built, then rejected by a raise). Unused
        # iterators and surplus unused tensors must be absorbed by the remaining operators (each takes at most
        # two and leaves one): an operator of cost 1 on k unused operands, ku of them iterators, leaves the
        # state within the bound iff k >= kmin and ku >= kumin; a free permute (of an unused iterator) iff
        # free_ok. Where the worst candidate (k = 0) passes, nothing is checked.
        uses, mo = st.uses, self._max_out
        rem1 = self.limits.max_block_ops - st.nops - 1
        U, S = st.unused_iters, st.sinks
        kmin, kumin = U + S + 1 - rem1 - mo, U - 2 * rem1
        tight = kmin > 0 or kumin > 0
        if tight:
            un = [1 if u == 0 else 0 for u in uses]
            ui = [1 if u == 0 and t.op == "iter" else 0 for u, t in zip(uses, ts)]
            free_ok = U + S - rem1 - 1 <= mo and U - 1 <= 2 * (rem1 + 1)
            unu = [j for j in range(n) if un[j]]     # unused tensors, in order
            uit = [j for j in range(n) if ui[j]]     # unused iterators
        for level in range(max(last[0], 0), n):
            cl = ts[level].cls
            first = level == last[0]
            for ti, ct in enumerate(self.compiled):
                if ct.arity == 1:
                    if first and (level, ti, (level,)) <= last:
                        continue
                    considered += 1
                    r = ct.umap.get(cl)
                    if r is not None:
                        hits += 1
                        if tight and not (free_ok if ui[level] and ct.t.kind == "permute"
                                          else un[level] >= kmin and ui[level] >= kumin):
                            over += 1
                        else:
                            yield ti, ct.t, (level,), r
                    continue
                comm = ct.t.op in COMMUTATIVE
                considered += level + 1 + (0 if comm else level)
                if tight and (un[level] < kmin or ui[level] < kumin):
                    # the other operand must be an unused tensor (an unused iterator where ku is short) other
                    # than this one; the rest fail the bound, counted without a lookup
                    if un[level] + 1 < kmin or ui[level] + 1 < kumin:
                        others = []
                    else:
                        pool = uit if ui[level] < kumin else unu
                        others = pool[:bisect_left(pool, level)]
                    over_pairs = level + 1 - len(others) + (0 if comm else level - len(others))
                    hits += over_pairs
                    over += over_pairs
                    right_ops: Sequence[int] = others
                    left_ops: Sequence[int] = others
                else:
                    right_ops, left_ops = range(level + 1), range(level)
                right = ct.right.get(cl)
                if right:
                    for a in right_ops:
                        r = right.get(ts[a].cls)
                        if r is not None and not (first and (level, ti, (a, level)) <= last):
                            hits += 1
                            yield ti, ct.t, (a, level), r
                if not comm:
                    left = ct.left.get(cl)
                    if left:
                        for a in left_ops:
                            r = left.get(ts[a].cls)
                            if r is not None and not (first and (level, ti, (level, a)) <= last):
                                hits += 1
                                yield ti, ct.t, (level, a), r
        self.stats.pruned["abstract"] += considered - hits
        if over:
            self.stats.pruned["limits"] += over

    # --- one operator -------------------------------------------------------------------------
    def _budget(self, st: _State, t: Template, srcs: tuple[int, ...]) -> tuple[int, int, int]:
        """(unused iterators, unused computed tensors, operator cost) after adding ``t`` on ``srcs``."""
        ts, uses = st.tensors, st.uses
        unused_iters, sinks = st.unused_iters, st.sinks + 1
        for j in (srcs if len(srcs) == 1 or srcs[0] != srcs[1] else srcs[:1]):
            if uses[j] == 0:
                if ts[j].op == "iter":
                    unused_iters -= 1
                else:
                    sinks -= 1
        # a permute of an iterator nothing has used yet is a view of the input (a strided read in the
        # generated code): it does not count against max_block_ops, so a program that reads an input
        # transposed (x @ w.T, a Linear weight as stored) has the same operator budget as one that does
        # not. At most one per iterator is free (the iterator is then used).
        free = t.kind == "permute" and ts[srcs[0]].op == "iter" and uses[srcs[0]] == 0
        return unused_iters, sinks, 0 if free else 1

    def _apply(self, st: _State, ti: int, t: Template, srcs: tuple[int, ...], cls: int) -> _State:
        ts = st.tensors
        unused_iters, sinks, cost = self._budget(st, t, srcs)
        xs = [ts[s] for s in srcs]
        if t.kind == "permute" and xs[0].op == "iter":
            ins, i = self._ctx.inputs, xs[0].arg[0]
            if any(ins[j] == ins[i] for j in range(i + 1, len(ins))):
                # one input given twice (KernelSearch.twice: x and x.T of x @ x.T) is read permuted through
                # its later copy: the states that permute the earlier one are the same states with the copies
                # swapped (softmax(x @ x.T / 8) on [64, 64]: 120k -> 21.6k block states, the same 8 verified)
                raise _Prune("canonical")
        if t.kind == "permute" and xs[0].op != "iter":
            if xs[0].op == "permute":
                raise _Prune("structural")  # two permutes are one permute (or none)
            if xs[0].tmpl is not None and xs[0].tmpl.kind == "unary":
                raise _Prune("canonical")  # permute(f(x)) == f(permute(x)) for element-wise f: keep the latter
        if self._ctx.axes:
            self._check_axes(t, xs)
        new: list[M.Constraint] = []
        post = [x for x in xs if x.phase == "post"]
        if t.op == "acc":
            if post:
                raise _Prune("structural")  # the builder's rule: no accumulating a post-loop value
            if st.nacc >= self.limits.max_accumulators:
                raise _Prune("limits")
            new.append(M.looped(xs[0].cone))  # accumulating an invariant value would just scale it by F
            phase = "post"
        elif post:
            phase = "post"
            for x in xs:  # a value used after the loop must be loop-invariant
                if x.phase != "post":
                    new.extend(M.not_looped(x.cone))
        else:
            phase = "pre"
        shape = self._shape(t, xs, new)
        if t.op == "acc":  # the accumulated tile is the same region in every iteration
            for d in shape:
                if d is not None:
                    new.append(("ne", M.mvar(d[1], M.L), d[2]))
        for x in ts:
            if x.cls == cls and x.phase == phase and _same_tshape(x.shape, shape):
                raise _Prune("duplicate")
        cons = st.cons
        if new:
            cons = cons | frozenset(new)
            if len(cons) != len(st.cons) and not self._csp.satisfiable(cons):
                raise _Prune("maps")
            new = []
        if self._sizes and self.hardware is not None:
            self._check_hardware(ts, shape)
        cone = frozenset().union(*(x.cone for x in xs))
        pg, pl = _partials(t, xs, new)
        if new:
            before = cons
            cons = cons | frozenset(new)
            if len(cons) != len(before) and not self._csp.satisfiable(cons):
                raise _Prune("partial")
        bt = BT(t.op, srcs, t.arg if t.op == "acc" else t.absolute_arg(len(xs[0].shape)), cls, shape, phase,
                cone, t, pg, pl)
        uses = list(st.uses)
        for j in set(srcs):
            uses[j] += 1
        uses.append(0)
        return _State((*ts, bt), tuple(uses), cons, st.nops + cost, st.nacc + (t.op == "acc"),
                      (max(srcs), ti, srcs), unused_iters, sinks)

    def _check_axes(self, t: Template, xs: list[BT]) -> None:
        """Rule ``axes`` (:mod:`prism.search.axes`): no reduction, row-wise operator or contraction over a kept
        axis of the program, and no element-wise pairing (or product batch) of a kept axis with another. The
        kernel level's twin is :func:`prism.search.axes.after`; written out here on the tiles' origins because
        this runs for every candidate tile operator (calling ``after`` on per-call flag tuples: the grouped
        Linear's two-level search 11.5 -> 12.4 s)."""
        kept = self._ctx.kept
        k = t.kind
        pairs: list[tuple[TDim, TDim]] = []
        if k in ("reduce", "rowwise"):
            s = xs[0].shape
            d = len(s) + t.arg[0]
            if 0 <= d < len(s) and kept(s[d]):
                raise _Prune("axes")
        elif k == "acc1":
            s = xs[0].shape
            if t.arg[0] != "sum" and s and kept(s[-1]):
                raise _Prune("axes")
        elif k in ("matmul", "acc2"):
            a, b = xs[0].shape, xs[1].shape
            if len(a) >= 2 and len(b) >= 2:
                if kept(a[-1]) or kept(b[-2]):
                    raise _Prune("axes")
                pairs = list(zip(reversed(a[:-2]), reversed(b[:-2])))
        elif k == "binary":
            pairs = list(zip(reversed(xs[0].shape), reversed(xs[1].shape)))
        for x, y in pairs:
            if x is not None and y is not None:
                fx, fy = kept(x), kept(y)
                if fx is not None and fy is not None and fx != fy:
                    raise _Prune("axes")

    def _shape(self, t: Template, xs: list[BT], new: list[M.Constraint]) -> tuple[TDim, ...]:
        k = t.kind
        if k in ("unary",):
            return xs[0].shape
        if k == "binary":
            return _broadcast(xs[0].shape, xs[1].shape, new)
        if k == "matmul" or (k == "acc2"):
            return _matmul(xs[0].shape, xs[1].shape, new)
        if k == "permute":
            (perm,) = t.arg
            s = xs[0].shape
            if len(perm) != len(s):
                raise _Prune("dims")
            return tuple(s[p] for p in perm)
        if k in ("reduce", "rowwise"):
            s = xs[0].shape
            d = len(s) + t.arg[0]
            if not 0 <= d < len(s):
                raise _Prune("dims")
            if s[d] is None:
                raise _Prune("structural")  # reducing a size-1 dim does nothing
            new.extend(M.unsplit((s[d][1], s[d][2])))  # a row-wise op must see the whole row
            return s[:d] + (None,) + s[d + 1:] if k == "reduce" else s
        if k == "acc1":
            s = xs[0].shape
            if t.arg[0] == "sum":
                return s
            if not s or s[-1] is None:
                raise _Prune("structural")
            return s[:-1] + (None,)
        raise AssertionError(k)  # pragma: no cover

    def _check_hardware(self, ts: tuple[BT, ...], shape: tuple[TDim, ...]) -> None:
        hw = self.hardware
        assert hw is not None and self._fixed is not None
        total = _tile_elems(shape, self._fixed, self._sizes, self.env) + sum(
            _tile_elems(x.shape, self._fixed, self._sizes, self.env) for x in ts)
        if total * hw.dtype_bytes > hw.cache_bytes:
            raise _Prune("hardware")

    # --- completion ---------------------------------------------------------------------------
    def _max_outputs(self) -> int:
        """Savers a complete structure may have: the last kernel operator saves program outputs only (at most
        one per program output), any other up to ``max_block_outputs``."""
        if self._ctx.final:
            return max(1, min(len(self.roots), self.limits.max_block_outputs))
        return self.limits.max_block_outputs

    def _root_of(self, x: BT, taken: list[int]) -> int | None:
        """The first program output (index into ``roots``) not in ``taken`` that tile ``x`` computes whole
        (same abstract class and full shape), else None."""
        full = tuple(1 if d is None else d[0] for d in x.shape)
        for k, (r, rs) in enumerate(zip(self.roots, self.root_shapes)):
            if k not in taken and x.cls == r and len(rs) == len(full) and all(_beq(a, b) for a, b in zip(full, rs)):
                return k
        return None

    def _complete(self, st: _State) -> Iterator[BlockStruct]:
        """The complete structures of ``st``: its unused tensors saved (the sinks) and, for a program with
        several outputs, a second structure that also saves every tile the block uses further that is one of
        the remaining program outputs (``h`` of ``h = x + r; y = f(h)``), so one kernel can produce them all."""
        ts, uses = st.tensors, st.uses
        sinks = []
        for i, x in enumerate(ts):
            if uses[i]:
                continue
            if x.op == "iter":
                return
            sinks.append(i)
        if not sinks or len(sinks) > self._max_out:
            return
        taken: list[int] = []
        if self._ctx.final:  # every saved tensor is a different program output
            for i in sinks:
                k = self._root_of(ts[i], taken)
                if k is None:
                    self.stats.pruned["final"] += 1
                    return
                taken.append(k)
        s = self._structure(st, tuple(sinks))
        if s is not None:
            yield s
        if len(self.roots) < 2:
            return
        extra = []
        for i, x in enumerate(ts):
            if uses[i] and x.op != "iter" and len(taken) + len(extra) < len(self.roots):
                k = self._root_of(x, taken)
                if k is not None:
                    taken.append(k)
                    extra.append(i)
        if extra and len(sinks) + len(extra) <= self._max_out:
            s = self._structure(st, tuple(sorted(sinks + extra)))
            if s is not None:
                yield s

    def _structure(self, st: _State, saved: tuple[int, ...]) -> BlockStruct | None:
        """The structure of ``st`` saving ``saved`` (with the saver constraints), or None if unsatisfiable."""
        ts = st.tensors
        ctx = self._ctx
        out_shapes = tuple(tuple(1 if d is None else d[0] for d in ts[i].shape) for i in saved)
        n = len(ctx.inputs)
        new: list[M.Constraint] = []
        every = tuple(M.mvar(a, M.G) for a in range(n))
        for k, i in enumerate(saved):
            x = ts[i]
            if x.phase == "pre":  # saved without an accumulator: must not change per iteration
                new.extend(M.not_looped(x.cone))
            for j, d in enumerate(x.shape):
                if d is None:
                    new.append(("ne", M.ovar(k), j))
                else:  # the grid dim that splits a tile dim concatenates the blocks' tiles along it
                    new.append(M.iff(M.mvar(d[1], M.G), d[2], M.ovar(k), j))
            # a grid dim that splits nothing this output depends on would sum identical copies
            new.append(("imp_any", every, tuple(M.mvar(a, M.G) for a in sorted(x.cone))))
            # blocks' tiles are added (omap NONE) exactly when they are partial sums over the grid column
            new.append(("save_partial", M.lits(x.pg, M.G), M.ovar(k), every))
            self._csp.domains[M.ovar(k)] = (M.NONE, *range(len(x.shape)))
        cons = st.cons | frozenset(new)
        if not self._csp.satisfiable(cons):
            self.stats.pruned["maps"] += 1
            return None
        self.stats.block_structures += 1
        return BlockStruct(ctx, ts, saved, cons, tuple(ts[i].cls for i in saved), out_shapes,
                           self._fixed, self._sizes)


# linear in x: permute, and the element-wise operators and reductions marked linear (OpDef.linear)
LINEAR = frozenset(("permute", *(n for n, o in OPS.items() if o.linear)))


def _partials(t: Template, xs: list[BT], new: list) -> tuple[frozenset, frozenset]:
    """Partial sums may only flow through linear operators until a sum accumulator (loop) or a
    partial-sum saver (grid) completes them: record that as constraints; return the result's (pg, pl)."""
    op = t.op
    empty: frozenset = frozenset()
    if op in LINEAR:
        return xs[0].pg, xs[0].pl
    if op in ("add", "sub"):
        new.extend(M.same_partial(xs[0].pg, xs[1].pg, M.G) + M.same_partial(xs[0].pl, xs[1].pl, M.L))
        return xs[0].pg | xs[1].pg, xs[0].pl | xs[1].pl
    if op in ("mul", "matmul"):
        a, b = xs
        new.extend(M.not_both(a.pg, b.pg, M.G) + M.not_both(a.pl, b.pl, M.L))
        pg, pl = a.pg | b.pg, a.pl | b.pl
        if op == "matmul" and a.shape[-1] is not None:
            o = (a.shape[-1][1], a.shape[-1][2])
            pg, pl = pg | {o}, pl | {o}
        return pg, pl
    if op == "div":
        new.extend(M.not_partial(xs[1].pg, M.G) + M.not_partial(xs[1].pl, M.L))
        return xs[0].pg, xs[0].pl
    if op != "acc":  # every other operator is non-linear in its operands
        for x in xs:
            new.extend(M.not_partial(x.pg, M.G) + M.not_partial(x.pl, M.L))
        return empty, empty
    kind = t.arg[0]
    x = xs[0]
    last = x.shape[-1] if x.shape else None
    if kind == "sum":
        return x.pg, empty
    if kind == "sum_last":
        return (x.pg | {(last[1], last[2])}) if last is not None else x.pg, empty
    # rms, max, softmax_*: non-linear in x; their reduction over x's last dim must not be split by the grid
    new.extend(M.not_partial(x.pg, M.G) + M.not_partial(x.pl, M.L))
    if last is not None:
        new.append(("ne", M.mvar(last[1], M.G), last[2]))
    if kind == "softmax_matmul":
        v = xs[1]
        new.extend(M.not_partial(v.pl, M.L))
        return v.pg, empty
    return empty, empty


def _broadcast(a: tuple[TDim, ...], b: tuple[TDim, ...], new: list) -> tuple[TDim, ...]:
    n = max(len(a), len(b))
    pa = (None,) * (n - len(a)) + a
    pb = (None,) * (n - len(b)) + b
    out = []
    for x, y in zip(pa, pb):
        if x is None:
            out.append(y)
        elif y is None:
            out.append(x)
        else:
            if not _beq(x[0], y[0]):
                raise _Prune("dims")
            new.extend(M.same_split((x[1], x[2]), (y[1], y[2])))
            out.append(x)
    return tuple(out)


def _matmul(a: tuple[TDim, ...], b: tuple[TDim, ...], new: list) -> tuple[TDim, ...]:
    if len(a) < 2 or len(b) < 2:
        raise _Prune("dims")
    x, y = a[-1], b[-2]
    if (x is None) != (y is None):
        raise _Prune("dims")  # a contraction against a broadcast dim
    if x is not None:
        if not _beq(x[0], y[0]):
            raise _Prune("dims")
        new.extend(M.same_split((x[1], x[2]), (y[1], y[2])))
    batch = _broadcast(a[:-2], b[:-2], new)
    return (*batch, a[-2], b[-1])


def split_factor(origin: tuple[int, int], grid: Sequence[Mapping], loop: Mapping, sizes: Sequence[int]) -> int:
    """How much the parallel dims of a concrete assignment divide the data dim ``origin``."""
    i, d = origin
    f = 1
    for p, col in enumerate(grid):
        if col[M.mvar(i, M.G)] == d:
            f *= sizes[p]
    if loop[M.mvar(i, M.L)] == d:
        f *= sizes[3]
    return f


def _tile_elems(shape: tuple[TDim, ...], fixed: tuple, sizes: tuple, env: Mapping[str, int]) -> int:
    """Elements of a tile under a concrete assignment (grid columns, loop column) and sizes (g0, g1, g2, F)."""
    grid, loop = fixed
    total = 1
    for d in shape:
        if d is None:
            continue
        full = d[0] if isinstance(d[0], int) else evaluate(d[0], env)
        total *= max(1, full // split_factor((d[1], d[2]), grid, loop, sizes))
    return total


def canonical_term(s: BlockStruct) -> str:
    """The structure as a term from its saved tensors (commutative operands sorted): two structures with
    the same term are the same block graph up to operator order."""
    memo: dict[int, str] = {}

    def term(k: int) -> str:
        if k not in memo:
            t = s.tensors[k]
            if t.op == "iter":
                memo[k] = f"in{t.arg[0]}"
            else:
                subs = [term(j) for j in t.src]
                if t.op in COMMUTATIVE:
                    subs.sort()
                memo[k] = f"{t.tmpl}({','.join(subs)})"
        return memo[k]
    return " | ".join(sorted(term(k) for k in s.outputs))
