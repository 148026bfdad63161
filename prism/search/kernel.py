"""Depth-first generation of kernel graphs: predefined operators and customized (block-graph) operators.

A kernel state is the list of available whole tensors (the program's inputs, then every operator's
results), each known by its abstract class and full shape. A move appends a predefined operator
(a template of the operator set applied to whole tensors, shape-checked by the IR's own rules) or a
customized operator over a subset of the tensors, whose block structures come from
:class:`~prism.search.block.BlockSearch` (memoized per context). Moves are generated in canonical
order (no permutation duplicates of independent operators). A state is complete when every program
output is present (same class as the target root and the same shape) and every created tensor is used.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from prism.errors import PrismError
from prism.ir import ops as O
from prism.ir.dims import Dim, DimLike, evaluate
from prism.search.abstract import op_expr, permuted_input
from prism.search.axes import Flags, after, out_axes
from prism.search.block import BlockContext, BlockSearch, BlockStruct, _beq
from prism.search.egraph import ClassTable
from prism.search.space import COMMUTATIVE, FREE_OPS, Limits, Template
from prism.search.stats import Budget, Stats

# a graph with more kernel operators is explored only where its lower bound beats the best verified estimate
# by more than this share: the static model cannot rank structures that close (the tuner measures), and W2 at
# d = 4096 (fused kernel 0.4 % above the bound of any two-kernel graph) spent its 60 s limit on level 2
LEVEL_MARGIN = 0.02


@dataclass(frozen=True)
class KOp:
    """One kernel operator of a candidate: predefined (``tmpl``) or customized (``structs``: the block
    structures with the same outputs -- same classes and shapes -- which the kernel level cannot tell
    apart, so their kernel sub-trees are explored once)."""

    srcs: tuple[int, ...]
    tmpl: Template | None = None
    structs: tuple[BlockStruct, ...] = ()

    @property
    def custom(self) -> bool:
        return bool(self.structs)


@dataclass(frozen=True)
class KernelCandidate:
    """A complete kernel-graph structure: operators in order and, per program output, its tensor."""

    ops: tuple[KOp, ...]
    outputs: tuple[int, ...]
    n_inputs: int
    shapes: tuple[tuple[DimLike, ...], ...] = ()   # full shapes of every kernel tensor (inputs first)

    def describe(self) -> str:
        parts = []
        for op in self.ops:
            if op.custom:
                alts = f" (+{len(op.structs) - 1} alternatives)" if len(op.structs) > 1 else ""
                parts.append(f"customized{list(op.srcs)}{{{op.structs[0].describe()}}}{alts}")
            else:
                parts.append(f"{op.tmpl}{list(op.srcs)}")
        return " ; ".join(parts)


@dataclass(frozen=True)
class _KT:
    cls: int
    shape: tuple[DimLike, ...]
    axes: Flags | None = field(default=None, compare=False)   # per dim: a kept axis? (prism.search.axes)


@dataclass
class _KState:
    tensors: tuple[_KT, ...]
    uses: tuple[int, ...]
    ops: tuple[KOp, ...]
    ncustom: int
    last: tuple


Move = tuple  # ("pre", ti, srcs) | ("custom", subset)


@dataclass
class KernelSearch:
    table: ClassTable
    templates: Sequence[Template]
    limits: Limits
    inputs: tuple[tuple[int, tuple[DimLike, ...]], ...]      # program inputs: (class, shape)
    roots: tuple[int, ...]
    root_shapes: tuple[tuple[DimLike, ...], ...]
    stats: Stats
    budget: Budget
    blocks: BlockSearch
    concrete_sizes: Any = None          # concrete mode: sizes_for(ctx, assignment) for BlockSearch.run_concrete
    memo: dict = field(default_factory=dict)   # BlockContext -> structures (shared by a worker's tasks)
    bound: Bound | None = None          # prune states whose cost lower bound exceeds the best verified cost
    exact: bool = False                 # iterative deepening: only candidates with exactly max_kernel_ops ops
    input_axes: tuple[Flags | None, ...] = ()   # per program input: its kept axes (prism.search.axes)

    def __post_init__(self) -> None:
        self.kernel_templates = [t for t in self.templates if t.kernel]
        # program inputs the target multiplies by their own permutation (x @ x.T): a customized operator may
        # take such an input twice, one block input per way of reading it (a block iterates each input
        # once, so one input cannot give both the rows of x and the columns of x.T unless the whole of x is
        # one tile). Without it only a predefined permute materializing x.T and a deeper kernel graph could
        # express such a program at most sizes: the search of softmax(x @ x.T / 8) on [64, 64] spent its 60 s
        # on level-2 kernel graphs (1.2M block states); with it, 120k states, 3.2 s. Only for a product of
        # the two (an input read two ways in different products, relu(x @ w) @ w.T, gained no candidate
        # and its search took 5x longer).
        tab = self.table
        products = {(a, b) for (op, a, b) in tab.bin if op == "mul"}
        plain = {k: n for n, k in tab.atoms.items() if permuted_input(n) is None}
        self.twice = frozenset(
            i for i, (c, _) in enumerate(self.inputs)
            if c in plain and any(permuted_input(n) == plain[c] and ((c, k) in products or (k, c) in products)
                                  for n, k in tab.atoms.items()))

    def initial(self) -> _KState:
        ax = self.input_axes or (None,) * len(self.inputs)
        ts = tuple(_KT(c if c is not None else -1, s, a) for (c, s), a in zip(self.inputs, ax))
        return _KState(ts, (0,) * len(ts), (), 0, (-1,))

    # --- moves ----------------------------------------------------------------------------------
    def moves(self, st: _KState) -> Iterator[tuple[tuple, Move]]:
        """Canonical moves from ``st`` as (key, move). Created tensors that nothing uses yet must be used
        by the remaining operators (no dead code), so the last operator must take all of them."""
        n = len(st.tensors)
        n_in = len(self.inputs)
        # with several program outputs, an earlier operator may produce one of them: it needs no user (with
        # one output, a state holding it is complete and never extended)
        multi = len(self.roots) > 1
        pending = {i for i in range(n_in, n) if st.uses[i] == 0 and not (multi and self._is_root(st.tensors[i]))}
        remaining = self.limits.max_kernel_ops - len(st.ops)
        if len(pending) > remaining * self.limits.max_block_inputs:
            self.stats.pruned["limits"] += 1
            return
        final = remaining == 1

        def ok(srcs: tuple[int, ...]) -> bool:
            return not final or pending <= set(srcs)

        for level in range(max(st.last[0], 0), n):
            for ti, t in enumerate(self.kernel_templates):
                if t.kind in ("binary", "matmul"):
                    pairs = [(a, level) for a in range(level + 1)]
                    if t.op not in COMMUTATIVE:
                        pairs += [(level, a) for a in range(level)]
                    for srcs in pairs:
                        if ok(srcs):
                            yield (level, 0, ti, srcs), ("pre", ti, srcs)
                elif ok((level,)):
                    yield (level, 0, ti, (level,)), ("pre", ti, (level,))
            if st.ncustom >= self.limits.max_customized or st.tensors[level].cls < 0:
                continue
            others = [i for i in range(level) if st.tensors[i].cls >= 0]
            for k in range(0, min(self.limits.max_block_inputs, level + 1)):
                for rest in itertools.combinations(others, k):
                    subset = (*rest, level)
                    if ok(subset):
                        yield (level, 1, subset), ("custom", subset)
                        if len(subset) < self.limits.max_block_inputs:
                            for i in subset:
                                if i in self.twice:   # the same input read a second way (see __post_init__)
                                    yield (level, 1, (*subset, i)), ("custom", (*subset, i))

    def expand(self, st: _KState, key: tuple, move: Move) -> Iterator[_KState]:
        """Children of ``st`` for one move (a customized move has one child per distinct output signature
        of its block structures)."""
        if key <= st.last:
            return
        final = len(st.ops) == self.limits.max_kernel_ops - 1
        if self.bound is not None:
            free = move[0] == "pre" and self.kernel_templates[move[1]].op in FREE_OPS
            more = 0 if final or not self.exact else self.bound.min_more
            reads = () if free else (move[2] if move[0] == "pre" else move[1])
            if self.bound.exceeded(self._lower(st, reads) + self.bound.launch * ((not free) + more)):
                self.stats.pruned["bound"] += 1
                return
        if move[0] == "pre":
            _, ti, srcs = move
            child = self._apply_pre(st, ti, srcs, key, final)
            if child is not None:
                yield child
            return
        _, subset = move
        axes = tuple(st.tensors[i].axes for i in subset)
        ctx = BlockContext(tuple((st.tensors[i].cls, st.tensors[i].shape) for i in subset), final,
                           axes if any(a is not None for a in axes) else ())
        groups: dict[tuple, list[BlockStruct]] = {}
        for s in self._structs(ctx):
            groups.setdefault((s.out_cls, tuple(tuple(_skey(d) for d in sh) for sh in s.out_shapes)), []).append(s)
        for j, grp in enumerate(groups.values()):
            child = self._apply_custom(st, subset, tuple(grp), (*key, j), final)
            if child is not None:
                yield child

    def _structs(self, ctx: BlockContext) -> list[BlockStruct]:
        r = self.memo.get(ctx)
        if r is None:
            with self.stats.phase("generate.block"):
                if self.concrete_sizes is not None:
                    r = self.blocks.run_concrete(ctx, self.concrete_sizes)
                else:
                    r = self.blocks.run(ctx)
            self.memo[ctx] = r
        return r

    def _apply_pre(self, st: _KState, ti: int, srcs: tuple[int, ...], key: tuple, final: bool) -> _KState | None:
        t = self.kernel_templates[ti]
        xs = [st.tensors[s] for s in srcs]
        if any(x.cls < 0 for x in xs):
            self.stats.pruned["abstract"] += 1
            return None
        rank = len(xs[0].shape)
        arg = t.absolute_arg(rank)
        cls = op_expr(self.table, t.op, arg, [x.cls for x in xs])
        if cls is None:
            self.stats.pruned["abstract"] += 1
            return None
        try:
            shape, _ = O.infer(O.OPS[t.op], tuple(x.shape for x in xs), tuple("f" for _ in xs), arg)
        except PrismError:
            self.stats.pruned["dims"] += 1
            return None
        except (IndexError, ValueError, TypeError):
            self.stats.pruned["dims"] += 1
            return None
        allowed, axes = after(t.kind, arg, [x.axes for x in xs], [x.shape for x in xs], len(shape))
        if not allowed:
            self.stats.pruned["axes"] += 1
            return None
        return self._push(st, srcs, [_KT(cls, shape, axes)], KOp(srcs, tmpl=t), key, final)

    def _apply_custom(self, st: _KState, subset: tuple[int, ...], grp: tuple[BlockStruct, ...], key: tuple,
                      final: bool) -> _KState | None:
        s = grp[0]
        outs = [_KT(c, sh, out_axes(grp, k)) for k, (c, sh) in enumerate(zip(s.out_cls, s.out_shapes))]
        return self._push(st, subset, outs, KOp(subset, structs=grp), key, final, custom=True)

    def _push(self, st: _KState, srcs: tuple[int, ...], outs: list[_KT], op: KOp, key: tuple, final: bool,
              custom: bool = False) -> _KState | None:
        # a permute keeps the abstract class (layouts are invisible to it), so on equal dims (a square
        # transpose) class and shape cannot tell its result from its operand: never a duplicate
        layout = op.tmpl is not None and op.tmpl.op == "permute"
        for o in outs:
            for x in st.tensors:
                if not layout and x.cls == o.cls and len(x.shape) == len(o.shape) and all(
                        _beq(a, b) for a, b in zip(x.shape, o.shape)):
                    self.stats.pruned["duplicate"] += 1
                    return None
        uses = list(st.uses)
        for s in set(srcs):
            uses[s] += 1
        uses.extend(0 for _ in outs)
        child = _KState((*st.tensors, *outs), tuple(uses), (*st.ops, op), st.ncustom + custom, key)
        done = self._outputs(child) is not None
        if final and not done:
            self.stats.pruned["final"] += 1
            return None
        if self.bound is not None:
            more = 0 if done or not self.exact else self.bound.min_more
            if self.bound.exceeded(self._lower(child) + self.bound.launch * more):
                self.stats.pruned["bound"] += 1
                return None
        return child

    def _lower(self, st: _KState, reads: tuple[int, ...] = ()) -> float:
        """A lower bound of the cost model's estimate of every completion of ``st`` (prism.search.cost):
        each program input read and output written once, each intermediate written and read once,
        one launch per non-free operator so far; and each program input read once more by every further
        operator that reads it (``reads``: the operands of a move not yet applied). An operator reads its
        inputs whole -- a predefined one by definition, a customized one because its grid and loop cover
        every input -- so a graph that reads the weight twice pays it twice; without this the second level
        of a grouped int8 Linear's search ([8, 2048] x [2048, 2048]) ran 1114 block searches, most of them
        for last operators that read the weight again."""
        b = self.bound
        assert b is not None
        n_in = len(self.inputs)
        count = [0] * n_in
        for op in st.ops:
            if op.custom or op.tmpl.op not in FREE_OPS:
                for s in set(op.srcs):
                    if s < n_in:
                        count[s] += 1
        for s in set(reads):
            if s < n_in:
                count[s] += 1
        inter = sum((c - 1) * b.size(self.inputs[i][1]) for i, c in enumerate(count) if c > 1)
        for i in range(n_in, len(st.tensors)):
            x = st.tensors[i]
            if not any(x.cls == r and _same_shape(x.shape, rs) for r, rs in zip(self.roots, self.root_shapes)):
                inter += 2 * b.size(x.shape)
        kernels = sum(1 for op in st.ops if op.custom or op.tmpl.op not in FREE_OPS)
        return (b.io_bytes + inter * b.dtype_bytes) / b.bandwidth + kernels * b.launch

    def _is_root(self, x: _KT) -> bool:
        return any(x.cls == r and _same_shape(x.shape, rs) for r, rs in zip(self.roots, self.root_shapes))

    # --- completion and DFS -----------------------------------------------------------------------
    def _outputs(self, st: _KState) -> tuple[int, ...] | None:
        found = []
        for r, rs in zip(self.roots, self.root_shapes):
            hit = None
            for i in range(len(st.tensors) - 1, -1, -1):
                x = st.tensors[i]
                if x.cls == r and len(x.shape) == len(rs) and all(_beq(a, b) for a, b in zip(x.shape, rs)):
                    hit = i
                    break
            if hit is None:
                return None
            found.append(hit)
        return tuple(found)

    def complete(self, st: _KState) -> KernelCandidate | None:
        if not st.ops:
            return None
        outs = self._outputs(st)
        if outs is None:
            return None
        n_in = len(self.inputs)
        for i in range(n_in, len(st.tensors)):
            if st.uses[i] == 0 and i not in outs:
                return None  # a dead operator
        return KernelCandidate(st.ops, outs, n_in, tuple(x.shape for x in st.tensors))

    def dfs(self, st: _KState) -> Iterator[KernelCandidate]:
        self.budget.tick()
        self.stats.states_kernel += 1
        c = self.complete(st)
        if c is not None:
            if not self.exact or len(st.ops) == self.limits.max_kernel_ops:
                self.stats.complete_structures += 1
                yield c
            return  # extending a complete graph only adds dead operators
        if len(st.ops) >= self.limits.max_kernel_ops:
            return
        for key, move in self.moves(st):
            for child in self.expand(st, key, move):
                yield from self.dfs(child)

    def run_move(self, key: tuple, move: Move) -> Iterator[KernelCandidate]:
        """The sub-tree under one first move (a unit of parallel work)."""
        st = self.initial()
        for child in self.expand(st, key, move):
            yield from self.dfs(child)


@dataclass
class Bound:
    """Branch and bound on the static cost model: ``best`` is the best verified estimate so far."""

    best: float
    io_bytes: float                     # program inputs + outputs, bytes
    env: dict
    bandwidth: float
    launch: float
    min_more: int = 1                   # kernels any unfinished state still needs (0 if a free op could finish)
    dtype_bytes: int = 4

    def exceeded(self, lower: float) -> bool:
        return lower * (1 + LEVEL_MARGIN) > self.best

    def size(self, shape: tuple) -> int:
        n = 1
        for d in shape:
            n *= d if isinstance(d, int) else evaluate(d, self.env)
        return n


def _same_shape(a: tuple, b: tuple) -> bool:
    return len(a) == len(b) and all(_beq(x, y) for x, y in zip(a, b))


def _skey(d: DimLike) -> object:
    return ("D", d.terms) if isinstance(d, Dim) else d
