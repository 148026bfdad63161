"""The split-reduction move: one more grid dim splits the data dim the for-loop walks.

Given a found sGraph whose customized operator walks a data dim with its for-loop, accumulates over it
and combines the accumulators after the loop, the move returns a two-step variant:

* **kernel 1**: the same block graph with one more symbolic grid dim ``P`` whose imap splits, for every
  iterator the loop walks, the same data dim as its fmap (iterators the loop does not walk are
  replicated over ``P``). It saves the *accumulators themselves* (per-split partials, concatenated
  along one tile dim that no other grid dim concatenates) instead of the post-loop result;
* **kernel 2**: predefined operators that view the partials as ``[..., P, n, ...]``, merge them over
  the ``P`` axis by the rule of each accumulator kind (``MERGE``) and then apply the post-loop operators
  of the block graph to the merged whole tensors.

The online-softmax accumulators are only mergeable together with the running max of their scores,
so the move adds a ``max`` accumulator over each score tile they consume and weighs their partials by
``exp(m_p - max_p m_p)``. An accumulator kind without a rule (``rms``, ``sum_last``) makes the move not
apply. Nothing here looks at which program the sGraph computes; every variant still has to pass the
verification gate like any other candidate.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from prism.errors import PrismError
from prism.ir import dims as D
from prism.ir.block import ACCUMULATORS, BlockBuilder, BlockGraph
from prism.ir.builder import Tensor
from prism.ir.graph import Graph
from prism.ir.node import Node
from prism.search.cost import CostReport, Machine, graph_cost

MAX_SPLITS = 64   # the representative instantiation tries P in {2, 4, ..., 64}


@dataclass(frozen=True)
class Merge:
    """How partials of one accumulator kind over disjoint chunks of the walked dim combine."""

    reduce: str      # the reduction over the split axis: "sum" | "max"
    rescaled: bool   # online-softmax partial: weigh by exp(m_p - max_p m_p) before reducing


MERGE: dict[str, Merge] = {
    "sum": Merge("sum", False),
    "max": Merge("max", False),
    "softmax_sum": Merge("sum", True),
    "softmax_matmul": Merge("sum", True),
}


@dataclass(frozen=True)
class SplitVariant:
    graph: Graph
    symbol: str        # the new grid dim's size symbol
    walked: tuple[tuple[int, int], ...]   # (block input, data dim) pairs the new grid dim splits

    def describe(self) -> str:
        return f"{self.symbol} splits " + ", ".join(f"in{i} dim {d}" for i, d in self.walked)


@dataclass(frozen=True)
class Refusal:
    reason: str        # a short, countable reason (stats key)
    detail: str = ""


def split_reduction(graph: Graph) -> SplitVariant | Refusal:
    """The split-reduction variant of ``graph`` (one customized operator), or why the move does not apply."""
    custom = [n for n in graph.nodes if n.op == "customized"]
    if len(custom) != 1:
        return Refusal("customized_ops", f"the move rewrites graphs with one customized op, this one has {len(custom)}")
    node = custom[0]
    bg: BlockGraph = node.arg[0]
    plan = _plan(bg)
    if isinstance(plan, Refusal):
        return plan
    try:
        kernel1, symbol, axis, saved = _kernel1(bg, plan)
        g = _rebuild(graph, node, kernel1, symbol, axis, saved, plan)
    except (PrismError, _Refuse) as e:
        return Refusal("build", str(e))
    return SplitVariant(g, symbol, tuple(sorted(plan.walked.items())))


# --- analysis ---------------------------------------------------------------------------------------

class _Refuse(Exception):
    pass


@dataclass
class _Plan:
    walked: dict[int, int]          # input index -> the data dim its fmap walks
    accs: list[Node]                # the block graph's accumulators, in node order
    scores: list[Node]              # score tiles of rescaled accumulators that need a running max
    post: list[Node]                # post-loop tile operators, in node order
    saves: list[Node]


def _plan(bg: BlockGraph) -> _Plan | Refusal:
    if len(bg.grid) >= 3:
        return Refusal("grid_full", f"the block graph already has {len(bg.grid)} grid dims (at most 3)")
    if not all(isinstance(g, D.Dim) for g in bg.grid):
        return Refusal("concrete_grid", f"grid sizes {bg.grid} are not symbols (concrete mode)")
    nodes = bg.nodes
    walked = {n.arg[0]: n.arg[2] for n in nodes if n.op == "iter" and n.arg[2] is not None}
    if not walked or (isinstance(bg.forloop, int) and bg.forloop == 1):
        return Refusal("no_loop", "no iterator walks a for-loop: nothing to split")
    accs = [n for n in nodes if n.op == "acc"]
    missing = sorted({n.arg[0] for n in accs} - set(MERGE))
    if missing:
        return Refusal("no_merge_rule", f"no merge rule for accumulator(s) {missing}; rules exist for {sorted(MERGE)}")
    saves = [n for n in nodes if n.op == "save"]
    for s in saves:
        _, om, fm = s.arg
        if fm is not None or bg.phase[s] != "post":
            return Refusal("in_loop_save", f"output {s.arg[0]} is written inside the loop")
        if any(e is None for e in om):
            return Refusal("partial_saver", f"output {s.arg[0]} adds the blocks' tiles (omap {om})")
    post = [n for n in nodes if bg.phase[n] == "post" and n.op not in ("acc", "save")]
    for n in post:
        if any(bg.phase[s] != "post" for s in n.src):
            return Refusal("post_uses_tile", f"post-loop {n.op} reads a tile computed before the loop")
    scores = list(dict.fromkeys(n.src[0] for n in accs if MERGE[n.arg[0]].rescaled))
    return _Plan(walked, accs, scores, post, saves)


# --- kernel 1: one more grid dim, partials saved ----------------------------------------------------

def _fresh(bg: BlockGraph, taken: set[str]) -> str:
    """The split count's size symbol: ``P<k>`` (same suffix as the op's grid symbols ``g<k>...``). It is
    marked in the block graph (``BlockGraph.splits``), which tells the tuner (:mod:`prism.tune.candidates`)
    that 1 is not worth a candidate: one split is the base sGraph plus a useless combine pass, and the
    base is a candidate of its own."""
    first = sorted(D.symbols(bg.grid[0]))
    sfx = next((s[2:] for s in first if s.startswith("g0")), "")
    k = 0
    while f"P{k}{sfx}" in taken:
        k += 1
    return f"P{k}{sfx}"


def _kernel1(bg: BlockGraph, plan: _Plan) -> tuple[BlockGraph, str, int, list[tuple[Node, Tensor]]]:
    symbol = _fresh(bg, bg.symbols())
    bb = BlockBuilder(grid=(*bg.grid, symbol), forloop=bg.forloop, inputs=bg.inputs, splits=(*bg.splits, symbol))
    new: dict[Node, Tensor] = {}
    for n in bg.nodes:
        if n.op == "iter":
            idx, im, fm = n.arg
            new[n] = bb.iter(idx, (*im, fm), fm)
        elif n.op == "acc":
            kind, vals = n.arg
            new[n] = bb.accumulate(kind, *(new[s] for s in n.src), **dict(zip(ACCUMULATORS[kind].params, vals)))
        elif bg.phase[n] != "post":
            new[n] = bb._apply(n.op, [new[s] for s in n.src], n.arg)
    saved: list[tuple[Node, Tensor]] = [(a, new[a]) for a in plan.accs]
    for x in plan.scores:  # the running max of every score tile an online-softmax accumulator consumes
        have = next((a for a in plan.accs if a.arg[0] == "max" and a.src[0] is x), None)
        if have is None:
            saved.append((x, bb.accumulate("max", new[x])))
    ranks = {len(t.shape) for _, t in saved}
    if len(ranks) != 1:
        raise _Refuse(f"accumulators of different ranks {sorted(ranks)} cannot share a split axis")
    omaps = [_grid_omap(t, bg.grid) for _, t in saved]
    used = {d for om in omaps for d in om}
    axis = next((d for d in range(ranks.pop()) if d not in used), None)
    if axis is None:
        raise _Refuse("every tile dim of the accumulators is concatenated by a grid dim; no axis left for P")
    for (_, t), om in zip(saved, omaps):
        bb.save(t, omap=(*om, axis))
    return bb.build(), symbol, axis, saved


def _grid_omap(t: Tensor, grid: tuple) -> tuple[int, ...]:
    """Per grid dim, the tile dim of ``t`` it splits (the one whose size divides by its symbol)."""
    out = []
    for p, g in enumerate(grid):
        name = min(D.symbols(g))
        dims = [d for d, s in enumerate(t.shape) if name in D.symbols(s)]
        if len(dims) != 1:
            raise _Refuse(f"grid dim {p} ({g}) splits {len(dims)} dims of accumulator tile {D.format_shape(t.shape)}; "
                          "the move needs exactly one")
        out.append(dims[0])
    return tuple(out)


# --- kernel 2: merge the partials, then the post-loop operators -------------------------------------

def _rebuild(graph: Graph, node: Node, kernel1: BlockGraph, symbol: str, axis: int,
             saved: list[tuple[Node, Tensor]], plan: _Plan) -> Graph:
    g = Graph(graph.name)
    new: dict[Node, Tensor] = {}
    results: dict[int, Tensor] = {}
    for n in graph.nodes:
        if n.op == "input":
            name, shape, dt = n.arg
            new[n] = g.input(name, shape, dt)
        elif n.op == "output":
            g.output(new[n.src[0]], n.arg[0])
        elif n is node:
            parts = g.customized(kernel1, [new[s] for s in n.src])
            results = _combine(g, parts, saved, symbol, axis, plan, node)
        elif n.op == "customized":
            raise _Refuse("a second customized op")  # pragma: no cover - excluded by split_reduction
        elif n.op == "result":
            new[n] = results[n.arg[0]]
        else:
            new[n] = g._apply(n.op, [new[s] for s in n.src], n.arg)
    for name, inp in graph.inputs.items():  # declared-but-unused inputs, declaration order
        if name not in g.inputs:
            g.input(name, inp.shape, inp.dtype)
    g._inputs = {k: g._inputs[k] for k in graph.inputs}
    return g


def _combine(g: Graph, parts: tuple[Tensor, ...], saved: list[tuple[Node, Tensor]], symbol: str, axis: int,
             plan: _Plan, node: Node) -> dict[int, Tensor]:
    P = D.sym(symbol)
    split: dict[Node, Tensor] = {}   # per saved accumulator (or score tile for an added max): [..., P, n, ...]
    whole: dict[Node, tuple] = {}    # the merged whole-tensor shape
    for (src, t), part in zip(saved, parts):
        n = t.shape[axis]
        shape = tuple(part.shape)
        split[src] = g.reshape(part, shape[:axis] + (P, n) + shape[axis + 1:])
        whole[src] = shape[:axis] + (n,) + shape[axis + 1:]
    weights: dict[Node, Tensor] = {}
    for x in plan.scores:
        mx = next((a for a in plan.accs if a.arg[0] == "max" and a.src[0] is x), x)
        m = split[mx]
        weights[x] = g.exp(g.sub(m, g.max(m, axis)))
    vals: dict[Node, Tensor] = {}
    for a in plan.accs:
        rule = MERGE[a.arg[0]]
        p = split[a]
        if rule.rescaled:
            p = g.mul(p, weights[a.src[0]])
        r = g.sum(p, axis) if rule.reduce == "sum" else g.max(p, axis)
        vals[a] = g.reshape(r, whole[a])
    for n in plan.post:
        vals[n] = g._apply(n.op, [vals[s] for s in n.src], n.arg)
    out: dict[int, Tensor] = {}
    for s in plan.saves:
        t = vals[s.src[0]]
        want = node.arg[0].output_shapes[s.arg[0]]
        if len(t.shape) != len(want) or not all(D.structurally_equal(a, b) for a, b in zip(t.shape, want)):
            raise _Refuse(f"merged output {s.arg[0]} has shape {D.format_shape(t.shape)}, expected "
                          f"{D.format_shape(want)}")
        out[s.arg[0]] = t
    return out


# --- a representative instantiation for ranking -----------------------------------------------------

def estimate_split(v: SplitVariant, base: Mapping[str, int], env: Mapping[str, int], m: Machine) -> CostReport:
    """The static cost of a variant at its best representative instantiation: the base candidate's grid
    sizes kept, the new grid dim and the for-loop range chosen from powers of two whose product divides the
    walked dims; preferred as in :func:`prism.search.cost.estimate_block` (fits L2, a block per core, time,
    working set)."""
    (bg,) = v.graph.customized_ops()
    loop = sorted(D.symbols(bg.forloop))
    fixed = {k: val for k, val in base.items() if k not in loop}
    span = min(D.evaluate(bg.inputs[i].shape[d], env) if isinstance(bg.inputs[i].shape[d], D.Dim)
               else bg.inputs[i].shape[d] for i, d in v.walked)
    best: tuple | None = None
    for p in (1 << k for k in range(1, MAX_SPLITS.bit_length())):
        for f in (1 << k for k in range(0, span.bit_length())):
            if span % (p * f):
                continue
            params = {**fixed, v.symbol: p, **dict.fromkeys(loop, f)}
            try:
                g = v.graph.instantiate({**env, **params})
            except PrismError:
                continue  # not an exact split at these sizes
            c = graph_cost(g, m, params)
            (kbg,) = g.customized_ops()
            key = (not c.feasible, math.prod(kbg.grid) < m.cores, c.seconds, c.working_set)
            if best is None or key < best[0]:
                best = (key, c)
    if best is None:
        return CostReport(float("inf"), 0, 0, 0, 0, dict(base), False)
    return best[1]
