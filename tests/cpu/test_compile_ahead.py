"""Compiling tuning candidates ahead (prism/tune/ahead.py, ``SuperKernel.compile_ahead``): the frontend plans each
piece's first tuning right after its search and compiles the candidates on a background thread; the tuning takes
them instead of compiling, the result is the same, and nothing compiles in the background once the graph is
returned (its tunings time kernels)."""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import pytest

import prism
from prism.tune import STATS, ahead, detect, reset_stats
from prism.tune.tuner import plan, tune
from prism.workloads import WORKLOADS

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.cpu

SHAPE = {"n": 8, "d": 256, "m": 512}


def _small(n: int, seed: int) -> prism.Graph:
    g = prism.Graph(f"ahead{seed}")
    a, b = g.input("a", (n, 16)), g.input("b", (16, 24))
    g.output(g.add(g.matmul(a, b), g.input("c", (n, 24))), "y")
    return g


def test_submitted_compiles_are_taken_once_and_queued_ones_are_the_callers(monkeypatch: pytest.MonkeyPatch) -> None:
    g1, g2 = _small(3, 1), _small(5, 2)
    assert ahead.submit([g1, g2, g1]) == 2   # a candidate submitted twice is compiled once
    ahead.drain()
    assert ahead.pending() == 0
    f = ahead.take(g1)
    assert f is not None and f.done()
    k = f.result()
    x = {"a": np.ones((3, 16), np.float32), "b": np.full((16, 24), 2, np.float32), "c": np.ones((3, 24), np.float32)}
    np.testing.assert_array_equal(k(**x), np.full((3, 24), 33, np.float32))
    assert ahead.take(g1) is None   # taken
    ahead.forget()
    assert ahead.take(g2) is None   # done and never taken: dropped
    # a job not started yet is the caller's: take() removes it from the queue
    monkeypatch.setattr(ahead, "_WORKER", [object()])   # no background thread starts
    g3 = _small(4, 3)
    assert ahead.submit([g3]) == 1 and ahead.pending() == 1
    assert ahead.take(g3) is None and ahead.pending() == 0
    ahead.drain()   # nothing left


def test_calls_run_in_the_background_and_drain_runs_those_queued(monkeypatch: pytest.MonkeyPatch) -> None:
    ran: list[str] = []
    assert ahead.submit_call("call-a", lambda: ran.append("a")) == 1
    assert ahead.submit_call("call-a", lambda: ran.append("again")) == 0   # one job per key
    for _ in range(1000):   # the background thread runs it
        if ran:
            break
        time.sleep(0.01)
    ahead.drain()
    assert ran == ["a"]
    ahead.forget()
    monkeypatch.setattr(ahead, "_WORKER", [object()])   # no background thread starts: everything stays queued
    g = _small(6, 5)
    ahead.submit_call("call-c", lambda: ran.append("c"))   # a derivation: drain runs it
    ahead.submit([g])
    ahead.drain()   # the call and the candidate are run by the caller
    assert ran == ["a", "c"] and ahead.pending() == 0
    f = ahead.take(g)
    assert f is not None and not isinstance(f.result(), BaseException)
    ahead.forget()


def test_a_failed_compile_is_the_candidates_result() -> None:
    g = _small(2, 4)
    import prism.tune.ahead as A
    orig = A.compile_graph
    try:
        A.compile_graph = lambda graph: (_ for _ in ()).throw(RuntimeError("no compiler"))
        ahead.submit([g])
        ahead.drain()
    finally:
        A.compile_graph = orig
    f = ahead.take(g)
    assert f is not None and isinstance(f.result(), RuntimeError)


def test_a_tuning_uses_the_plan_made_ahead_only_where_it_is_its_own() -> None:
    w = WORKLOADS["W1"]
    hand, prog = w.hand_written(SHAPE), w.program(SHAPE)
    m = detect(measure=False)
    env = {"n": 8}
    p2 = plan([hand], prog, env, m, top_k=2)
    assert len(p2.chosen) == 2
    ahead.submit([x.graph for x in p2.chosen])
    ahead.drain()
    reset_stats()
    r = tune([hand], prog, env, m, top_k=2, measure_s=0.05, planned=p2).result
    assert STATS.ahead_taken == 2 and len(r.rows) == 2
    assert [(row.sgraph, row.params) for row in r.rows] == [(x.sgraph, dict(x.params)) for x in p2.chosen]
    # another top_k: the plan is not this tuning's; it plans again and compiles what it chose
    reset_stats()
    r3 = tune([hand], prog, env, m, top_k=3, measure_s=0.05, planned=p2).result
    assert len(r3.rows) == 3 and STATS.ahead_taken == 0


class _Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(7)
        self.a, self.b = torch.nn.Linear(48, 80), torch.nn.Linear(80, 48)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.b(torch.relu(self.a(x)))


def _run(monkeypatch: pytest.MonkeyPatch, tmp: Any, on: bool) -> dict[str, int]:
    from prism.frontend import clear_reports
    monkeypatch.setenv("PRISM_CACHE_DIR", str(tmp))   # nothing tuned before: every piece is tuned at its first call
    monkeypatch.setenv("PRISM_AHEAD", "1" if on else "0")
    torch._dynamo.reset()
    clear_reports()
    net = _Net()
    c = torch.compile(net, backend="prism", options={"top_k": 3, "time_limit": 60.0, "measure_machine": False})
    x = torch.randn(6, 48, generator=torch.Generator().manual_seed(1))
    reset_stats()
    seen: list[int] = []
    orig = ahead.drain

    def drain() -> None:
        orig()
        seen.append(ahead.pending())
    monkeypatch.setattr(ahead, "drain", drain)
    with torch.no_grad():
        y = c(x)
        ref = net(x)
    stats = {"ahead": STATS.compiled_ahead, "taken": STATS.ahead_taken, "compiles": STATS.compiles,
             "tunings": STATS.tunings}
    assert seen and all(p == 0 for p in seen)   # the graph was returned with nothing compiling
    err = float((y.double() - ref.double()).abs().max()) / float(ref.double().abs().max())
    assert err <= 1e-4, err
    torch._dynamo.reset()
    return stats


def test_the_frontend_compiles_the_first_tunings_ahead(monkeypatch: pytest.MonkeyPatch,
                                                       tmp_path: Any) -> None:
    on = _run(monkeypatch, tmp_path / "on", True)
    assert on["tunings"] >= 1 and on["ahead"] >= on["tunings"]
    assert on["taken"] == on["ahead"] == on["compiles"]   # every candidate compiled ahead, each taken by its tuning
    off = _run(monkeypatch, tmp_path / "off", False)
    assert off["ahead"] == off["taken"] == 0 and off["tunings"] == on["tunings"]
    # a warm cache: the tunings are on disk, so nothing is planned or compiled ahead
    warm = _run(monkeypatch, tmp_path / "on", True)
    assert warm["tunings"] == 0 and warm["ahead"] == 0


@pytest.mark.parametrize("broken", [False, True])
def test_a_dynamic_graphs_derivations_are_compiled_ahead(monkeypatch: pytest.MonkeyPatch, tmp_path: Any,
                                                         broken: bool) -> None:
    # Dynamo's default: a fixed-shape graph first, a dynamic one at the first new size, whose pieces derive from
    # their fixed-shape twins: each derivation runs ahead (compiles and checks) while the next pieces are searched,
    # and the first call finds it done. broken: a derivation that fails on the background thread leaves the work
    # to the first call (same results)
    import prism.api as A
    from prism.frontend import clear_reports
    early: list[object] = []
    derive_early = A.SuperKernel._derive_early

    def spy(self: Any, env: Any) -> Any:
        if broken:
            early.append(None)
            raise RuntimeError("a bug in a derivation ahead")
        early.append(derive_early(self, env))
        return early[-1]
    monkeypatch.setattr(A.SuperKernel, "_derive_early", spy)
    monkeypatch.setenv("PRISM_CACHE_DIR", str(tmp_path))
    torch._dynamo.reset()
    clear_reports()
    net = _Net()
    c = torch.compile(net, backend="prism", options={"top_k": 2, "time_limit": 60.0, "measure_machine": False})
    with torch.no_grad():
        for n in (6, 9):
            x = torch.randn(n, 48, generator=torch.Generator().manual_seed(n))
            if n == 9:
                reset_stats()
            y, ref = c(x), net(x)
            err = float((y.double() - ref.double()).abs().max()) / float(ref.double().abs().max())
            assert err <= 1e-4, (n, err)
    assert STATS.derived_ahead >= 1 and STATS.tune_derived >= 1 and STATS.tunings == 0
    # every derivation was done ahead (none at the first call), or each at the first call where they all failed
    assert len([s for s in early if s is not None]) == (0 if broken else STATS.tune_derived)
    assert len(early) == STATS.derived_ahead == STATS.tune_derived
    assert ahead.pending() == 0
    torch._dynamo.reset()


def test_a_failure_to_compile_ahead_leaves_the_work_to_the_first_call(monkeypatch: pytest.MonkeyPatch,
                                                                      tmp_path: Any) -> None:
    import prism.api as A

    def broken(self: Any, dims: Any) -> int:
        raise RuntimeError("planning bug")
    monkeypatch.setattr(A.SuperKernel, "compile_ahead", broken)
    stats = _run(monkeypatch, tmp_path, True)   # the graph compiles, tunes at its first call and matches eager
    assert stats["ahead"] == 0 and stats["tunings"] >= 1 and stats["compiles"] >= stats["tunings"]


def _symbolic(seed: int) -> prism.Graph:
    g = prism.Graph(f"held{seed}")
    a, b = g.input("a", ("n", 16)), g.input("b", (16, 24))
    g.output(g.add(g.matmul(a, b), g.input("c", ("n", 24))), "y")
    return g


@pytest.mark.parametrize("when", ["now", "later"])
def test_a_pre_build_runs_in_the_tuning_call_or_at_the_next_release(monkeypatch: pytest.MonkeyPatch, tmp_path: Any,
                                                                    when: str) -> None:
    # SuperKernel._prebuild (the shape one past a tuned one) runs in the call that tuned ("now"), or is held until
    # ahead.release() and then run by the background compiler ("later", the frontend's choice)
    from prism.api import clear_memory_caches
    from prism.search import Limits
    monkeypatch.setenv("PRISM_CACHE_DIR", str(tmp_path))
    clear_memory_caches()
    reset_stats()
    k = prism.superoptimize(_symbolic(1 if when == "now" else 2), limits=Limits(max_kernel_ops=1, time_limit=30),
                            top_k=2, measure_machine=False, derive=True, prebuild=when)
    k.specialize(n=16)
    assert STATS.tunings == 1
    if when == "now":
        assert k.has_spec({"n": 17}) and STATS.template_prebuilt >= 1 and STATS.prebuilt_later == 0
        assert ahead.held() == 0
        return
    assert not k.has_spec({"n": 17}) and STATS.template_prebuilt == 0
    assert STATS.prebuilt_later == 1 and ahead.held() == 1 and ahead.pending() == 0   # held, not queued
    assert ahead.release() == 1 and ahead.held() == 0
    ahead.drain()
    assert k.has_spec({"n": 17}) and STATS.template_prebuilt >= 1
    s17 = k.specialize(n=17)
    assert s17.derived_from == {"n": 16} and s17.check.passed
    x = {"a": np.ones((17, 16), np.float32), "b": np.full((16, 24), 2, np.float32), "c": np.ones((17, 24), np.float32)}
    np.testing.assert_array_equal(k(**x), np.full((17, 24), 33, np.float32))
    ahead.forget()
    monkeypatch.setenv("PRISM_DERIVE_FAR", "0")
    k.specialize(n=40)   # a far shape, tuned: its pre-build is held, and forgotten with the kernels
    assert ahead.held() == 1
    clear_memory_caches()
    assert ahead.held() == 0
    with pytest.raises(prism.InputError, match="prebuild"):
        prism.superoptimize(_symbolic(2), prebuild="soon")


def test_a_dynamic_graphs_first_call_holds_its_pre_builds_for_the_next_compile(monkeypatch: pytest.MonkeyPatch,
                                                                               tmp_path: Any) -> None:
    # the frontend: a dynamic graph's first call tunes its pieces and holds their pre-builds (nothing runs in the
    # background once a graph is returned); the next graph compile runs them beside its searches and drains them;
    # the first new length then finds its kernels built (no tuning, no compile)
    from prism.frontend import clear_reports
    monkeypatch.setenv("PRISM_CACHE_DIR", str(tmp_path))
    torch._dynamo.reset()
    clear_reports()
    net = _Net()
    opts = {"top_k": 2, "time_limit": 60.0, "measure_machine": False}
    c = torch.compile(net, backend="prism", dynamic=True, options=opts)
    other = torch.compile(lambda x: torch.tanh(x) * 3.0 + x, backend="prism", dynamic=True, options=opts)
    reset_stats()
    with torch.no_grad():
        x6 = torch.randn(6, 48, generator=torch.Generator().manual_seed(6))
        y6 = c(x6)
        assert STATS.tunings >= 1 and STATS.prebuilt_later >= 1 and STATS.template_prebuilt == 0
        assert ahead.held() == STATS.prebuilt_later and ahead.pending() == 0
        held = ahead.held()
        other(x6)   # a graph compile: releases the held work and drains it before returning; then its own first
        # call holds its own piece's pre-build
        assert ahead.pending() == 0 and STATS.template_prebuilt >= held
        assert ahead.held() == STATS.prebuilt_later - held
        reset_stats()
        x7 = torch.randn(7, 48, generator=torch.Generator().manual_seed(7))
        y7 = c(x7)
        assert STATS.tunings == 0 and STATS.compiles == 0 and STATS.template_prebuilt == 0   # (and plans 8.. ahead)
    for y, x in ((y6, x6), (y7, x7)):
        ref = net(x)
        err = float((y.double() - ref.double()).abs().max()) / float(ref.double().abs().max())
        assert err <= 1e-4, err
    torch._dynamo.reset()
