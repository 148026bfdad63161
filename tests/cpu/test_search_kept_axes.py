"""The second level of the default search (two kernel operators) ends by itself: the kept-axes rule and the re-read
bound end a grouped int8 Linear's (prism.search.axes, KernelSearch._lower) and leave the candidates of programs they
prune in unchanged; block estimates shared across combinations of assignments end attention prefill's.

Measured need: with the default limits (two kernel operators) the search of a grouped Linear at 8 rows,
[2048, 2048] in groups of 32, ran to its 60 s limit (2.2M states); its second level built kernel tensors that
summed the product over its output columns (the abstraction cannot tell them from the product) and last
operators that read the weight a second time. Now it ends by itself at about 155k states. The state limit
below is what it could not finish within with either part missing (590k states with the rule alone)."""

from __future__ import annotations

import pytest
from search_programs import grouped_linear

import prism.search.axes as axes_mod
from prism.ir.graph import Graph
from prism.search import Limits, driver, search
from prism.search.driver import StopReason

pytestmark = pytest.mark.cpu


def test_grouped_linear_two_level_search_ends_within_the_state_limit() -> None:
    r = search(grouped_linear(2048, 2048, rows=8), Limits(state_limit=400_000, time_limit=600.0), cache=False)
    assert r.stop_reason is StopReason.EXHAUSTED, (r.stop_reason, r.stats.states)
    assert r.stats.pruned["axes"] > 0
    assert r.candidates and all(c.verdict.ok for c in r.candidates)
    assert r.candidates[0].cost.kernels == 1   # the fused kernel over the int8 weight still ranks first


def _rms_linear() -> Graph:
    g = Graph("axes_rms_linear")
    x, w = g.input("x", ("n", 256)), g.input("w", (256, 512))
    g.output(g.matmul(g.rms_norm(x), w), "y")
    return g


def _softmax_scores() -> Graph:
    g = Graph("axes_scores")
    q, k = g.input("q", (4, 16, 64)), g.input("k", (4, 128, 64))
    g.output(g.softmax(g.mul_scalar(g.matmul(q, g.permute(k, (0, 2, 1))), 0.125), -1), "p")
    return g


def _lora() -> Graph:
    g = Graph("axes_lora")
    x, w = g.input("x", ("n", 256)), g.input("w", (256, 256))
    a, b = g.input("a", (256, 16)), g.input("b", (16, 256))
    g.output(g.add(g.matmul(x, w), g.matmul(g.matmul(x, a), b)), "y")
    return g


@pytest.mark.parametrize("make", [_rms_linear, _softmax_scores, _lora, lambda: grouped_linear(128, 256, rows=4)])
def test_the_rule_leaves_the_candidates_unchanged(make, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    """The same candidates, at the same estimated costs, with and without the rule (it prunes states: the
    search's own count says so)."""
    g = make()
    env = {s: 8 for s in g.symbols()}
    on = search(g, Limits(time_limit=600.0), env=env, cache=False)
    real = axes_mod.kept_axes
    monkeypatch.setattr(driver, "kept_axes", lambda core: {k: (None,) * len(v) for k, v in real(core).items()})
    off = search(g, Limits(time_limit=600.0), env=env, cache=False)
    assert on.stop_reason is off.stop_reason is StopReason.EXHAUSTED
    assert on.candidates and [round(c.cost.seconds, 12) for c in on.candidates] == [
        round(c.cost.seconds, 12) for c in off.candidates]
    assert off.stats.pruned["axes"] == 0 and on.stats.states <= off.stats.states


def test_two_operator_enumeration_estimates_each_block_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """Level 2 costs the product of two customized operators' map assignments; each operator's block estimate is
    computed once per assignment and shared (cost.estimate's memo). Measured need: W4's prefill with the default
    limits spent 24 of its 30 s costing 20.9k combinations, two block estimates each; now its search ends in
    8 s. Here (attention prefill, [1, 2, 128, 32] x [1, 2, 256, 32]): every 97th combination is costed again
    without the memo and must give the same report."""
    import prism.search.cost as cost
    from prism.workloads.library import WORKLOADS

    calls = {"block": 0, "checked": 0, "n": 0}
    block, estimate = cost.estimate_block, cost.estimate

    def counting(*a, **k):  # type: ignore[no-untyped-def]
        calls["block"] += 1
        return block(*a, **k)

    def checked(ops, choice, shapes, env, m=None, memo=None):  # type: ignore[no-untyped-def]
        got = estimate(ops, choice, shapes, env, m, memo)
        calls["n"] += 1
        if calls["n"] % 97 == 0:
            calls["checked"] += 1
            assert estimate(ops, choice, shapes, env, m) == got
        return got

    monkeypatch.setattr(cost, "estimate_block", counting)
    monkeypatch.setattr(driver, "estimate", checked)
    g = WORKLOADS["W4"].program(dict(b=1, h=2, q=128, kv=256, D=32))
    r = search(g, Limits(time_limit=600.0), env={s: 8 for s in g.symbols()}, cache=False)
    assert r.stop_reason is StopReason.EXHAUSTED and r.candidates
    assert calls["checked"] > 10 and r.stats.map_assignments > 4 * (calls["block"] - 2 * calls["checked"])
