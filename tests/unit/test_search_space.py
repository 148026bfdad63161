"""Generation and pruning on tiny programs: operator set, dimension matching, canonical order, symmetry
breaking, partial sums, budgets and stop reasons."""

from __future__ import annotations

import pytest

from prism.ir.graph import Graph
from prism.search import maps as M
from prism.search.abstract import TreeAlgebra, graph_exprs
from prism.search.block import canonical_term
from prism.search.build import assignments
from prism.search.driver import _Context, _Payload, machine
from prism.search.egraph import LaxEGraph
from prism.search.program import peel
from prism.search.space import Limits, derive_opset
from prism.search.stats import Budget, Stats, StopReason, StopSearch

pytestmark = pytest.mark.unit


def _graph(kind: str) -> Graph:
    g = Graph(kind)
    x = g.input("X", ("n", 8))
    w = g.input("W", (8, 16))
    if kind == "matmul":
        y = g.matmul(x, w)
    elif kind == "exp_matmul":
        y = g.exp(g.matmul(x, w))
    elif kind == "two_unary":
        y = g.add(g.relu(x), g.sigmoid(x))
        g.output(y, "Y")
        return g
    elif kind == "scaled":
        y = g.mul_scalar(g.matmul(x, w), 0.25)
    else:
        raise AssertionError(kind)
    g.output(y, "Y")
    return g


def _structs(g: Graph, limits: Limits) -> tuple[list, Stats]:
    prog = peel(g)
    eg = LaxEGraph(graph_exprs(prog.core, TreeAlgebra()))
    from prism.ir.serialize import graph_to_json
    ctx = _Context(_Payload(graph_to_json(prog.core), eg.table, limits, "symbolic", {"n": 4}, machine()))
    stats = Stats()
    ks = ctx.kernel_search(limits.max_kernel_ops, stats, Budget.starting_now(60, 10**7))
    cands = list(ks.dfs(ks.initial()))
    structs = [s for c in cands for op in c.ops if op.custom for s in op.structs]
    return structs, stats


def test_operator_set_comes_from_the_program() -> None:
    g = _graph("scaled")
    eg = LaxEGraph(graph_exprs(g, TreeAlgebra()))
    names = {str(t) for t in derive_opset(g, eg.table.ops())}
    assert "mul_scalar(0.25,)" in names  # the program's constant, not a made-up one
    assert "acc.sum" in names and "matmul" in names
    assert not any(n.startswith("acc.softmax") for n in names)  # no exp in the target: pruned up front
    assert not any(n.startswith("acc.rms") for n in names)      # no rms_norm: no eps to give it


def test_dimension_matching_prunes_and_constrains() -> None:
    structs, stats = _structs(_graph("matmul"), Limits(max_kernel_ops=1, max_block_ops=3))
    assert stats.pruned["dims"] > 0  # e.g. mul(X, W): [n, 8] against [8, 16]
    assert structs, "X @ W must be found"
    for s in structs:
        # every assignment splits X's columns exactly when it splits W's rows (x.tile[1] == w.tile[0])
        for grid, loop in assignments(s):
            for col in (*grid, loop):
                c = M.G if col is not loop else M.L
                assert (col[M.mvar(0, c)] == 1) == (col[M.mvar(1, c)] == 0)


def test_canonical_order_generates_no_permutation_duplicates() -> None:
    structs, _ = _structs(_graph("two_unary"), Limits(max_kernel_ops=1, max_block_ops=3))
    terms = [canonical_term(s) for s in structs]
    assert terms and len(terms) == len(set(terms))


def test_symmetry_breaking_yields_each_grid_permutation_class_once() -> None:
    structs, _ = _structs(_graph("matmul"), Limits(max_kernel_ops=1, max_block_ops=2))
    for s in structs:
        seen = set()
        for grid, loop in assignments(s):
            key = (frozenset(M.signature(c, len(s.ctx.inputs)) for c in grid), tuple(sorted(loop.items())))
            assert key not in seen
            seen.add(key)


def _split_k(s: object, grid: tuple) -> bool:
    return any(col[M.mvar(0, M.G)] == 1 for col in grid)


def test_partial_sums_only_through_linear_operators() -> None:
    # X @ W may be split along the contraction (partial sums added by the saver) ...
    structs, _ = _structs(_graph("matmul"), Limits(max_kernel_ops=1, max_block_ops=2))
    assert any(_split_k(s, g) for s in structs for g, _ in assignments(s))
    # ... exp(X @ W) may not: exp of a partial sum is not a partial sum of exp
    structs, _ = _structs(_graph("exp_matmul"), Limits(max_kernel_ops=1, max_block_ops=3))
    assert structs
    assert not any(_split_k(s, g) for s in structs for g, _ in assignments(s))


def test_budget_stop_reasons() -> None:
    b = Budget.starting_now(60, 3)
    b.tick(), b.tick(), b.tick()
    with pytest.raises(StopSearch) as e:
        b.tick()
    assert e.value.reason is StopReason.STATE_LIMIT
    b = Budget.starting_now(-1, 100)
    with pytest.raises(StopSearch) as e:
        b.tick()
    assert e.value.reason is StopReason.TIME_LIMIT


def test_stats_round_trip() -> None:
    s = Stats(states_block=5, verified=2)
    s.pruned["abstract"] += 7
    s.seconds["generate"] = 1.5
    t = Stats.from_json(s.to_json())
    assert t.states == 5 and t.verified == 2 and t.pruned["abstract"] == 7 and t.seconds["generate"] == 1.5


def test_limits_reject_nonsense() -> None:
    from prism.errors import PrismError
    with pytest.raises(PrismError, match="max_block_ops"):
        Limits(max_block_ops=0)


def test_search_reports_the_stop_reason() -> None:
    from prism.search import search
    from prism.workloads import WORKLOADS
    w = WORKLOADS["W2"]
    s = w.shapes[0]
    r = search(w.program(s), Limits(state_limit=500, max_results=1), env=w.env(s), cache=False)
    assert r.stop_reason is StopReason.STATE_LIMIT and r.stats.states <= 502
    r = search(w.program(s), Limits(time_limit=1e-3, max_results=1), env=w.env(s), cache=False)
    assert r.stop_reason is StopReason.TIME_LIMIT
    assert all(c.verdict.ok for c in r.candidates)  # whatever is returned is verified


def _vector_max(shape: tuple) -> Graph:
    g = Graph("row scale")
    x = g.input("X", shape)
    g.output(g.mul_scalar(g.max(g.abs(x), 1), 1 / 127), "S")
    return g


def test_a_reduction_of_a_vector_is_one_block_without_a_grid() -> None:
    """A block whose inputs have at most one dim above 1 may have no grid (block.BlockContext.gridless): the max of
    a row at one row ([1, K], the W8A8 row scale at decode) has no dim left to split over blocks -- reductions are
    never split across them -- so before it the space held no implementation and the piece ran in PyTorch. The
    search now returns verified one-block candidates (grid (1,), proved: translate drops a size-1 grid dim), while
    a context with a dim to split keeps requiring a used grid."""
    from prism.ir.block import BlockGraph
    from prism.search import search
    structs, _ = _structs(_vector_max((1, 2048)), Limits(max_kernel_ops=1, max_block_ops=4))
    assert structs and all(s.ctx.gridless for s in structs)
    assert all(len(g) == 1 and all(v == M.NONE for v in g[0].values()) for s in structs for g, _ in assignments(s))
    r = search(_vector_max((1, 2048)), Limits(max_results=4), cache=False)
    assert r.candidates and all(c.verdict.ok and "formal" in c.verdict.how for c in r.candidates)
    blocks = [n.arg[0] for c in r.candidates for n in c.graph.nodes if isinstance(n.arg and n.arg[0], BlockGraph)]
    assert blocks and all(b.grid == (1,) for b in blocks)
    structs, _ = _structs(_vector_max((4, 2048)), Limits(max_kernel_ops=1, max_block_ops=4))
    assert structs and not any(s.ctx.gridless for s in structs)
    assert all(any(v != M.NONE for v in g[0].values()) for s in structs for g, _ in assignments(s))
