"""The tuner on hand-written sGraphs (what the search returns): compile in parallel, measure, score
failures +inf, pick the fastest correct candidate. No assertion on timing values."""

from __future__ import annotations

import math

import numpy as np
import pytest

import prism
from prism.errors import CompileError
from prism.ir.block import BlockBuilder
from prism.tune import STATS, TuningError, detect, reset_stats, tune
from prism.tune import measure as MS
from prism.workloads import WORKLOADS

pytestmark = pytest.mark.cpu

SHAPE = {"n": 8, "d": 256, "m": 512}
ENV = {"n": 8}


def _w1() -> tuple[prism.Graph, prism.Graph]:
    w = WORKLOADS["W1"]
    return w.hand_written(SHAPE), w.program(SHAPE)


def _without_rms() -> prism.Graph:
    g = prism.Graph("wrong")
    X, W = g.input("X", ("n", 256)), g.input("W", (256, 512))
    bb = BlockBuilder(grid=("G",), forloop="F", inputs=[X, W])
    acc = bb.accumulate("sum", bb.matmul(bb.iter(0, imap=(None,), fmap=1), bb.iter(1, imap=(1,), fmap=0)))
    bb.save(acc, omap=(1,))
    (y,) = g.customized(bb.build(), [X, W])
    g.output(y, "Y")
    return g


def _reference(prog: prism.Graph, x: dict[str, np.ndarray]) -> np.ndarray:
    return prog.evaluate({k: v.astype(np.float64) for k, v in x.items()}, dtype=np.float64)["Y"]


def test_tune_measures_the_top_k_and_returns_the_fastest_correct() -> None:
    hand, prog = _w1()
    reset_stats()
    tuned = tune([hand], prog, ENV, detect(measure=False), top_k=3, measure_s=0.1)
    r = tuned.result
    assert STATS.compiles == 3 and STATS.measured == 3 and STATS.tunings == 1
    assert len(r.rows) == 3 and all(row.status == "ok" and math.isfinite(row.measured_s) for row in r.rows)
    assert r.best.measured_s == min(row.measured_s for row in r.rows)
    assert sorted(row.model_rank for row in r.rows) == [0, 1, 2]   # the model's top 3 were measured
    assert r.candidates > 3 and r.top1_ratio is not None and r.top1_ratio >= 1.0
    x = MS.aligned_inputs(prog, ENV, seed=3)
    y = tuned.kernels[r.winner](**x)
    np.testing.assert_allclose(y, _reference(prog, x), rtol=1e-4, atol=1e-4 * np.abs(y).max())


def test_wrong_results_and_compile_errors_score_infinity(monkeypatch: pytest.MonkeyPatch) -> None:
    hand, prog = _w1()
    real = MS.compile_graph
    calls = []

    def flaky(g: prism.Graph) -> object:
        calls.append(g)
        if len(calls) == 2:
            raise CompileError("injected compiler failure")
        return real(g)
    monkeypatch.setattr(MS, "compile_graph", flaky)
    reset_stats()
    r = tune([_without_rms(), hand], prog, ENV, detect(measure=False), top_k=5, measure_s=0.1).result
    by_status = {row.status for row in r.rows}
    assert {"wrong result", "compile error", "ok"} <= by_status
    for row in r.rows:
        assert (row.status == "ok") == math.isfinite(row.measured_s)
        if row.status == "wrong result":
            assert row.sgraph == 0 and row.error > 1e-3 and "tolerance" in row.detail
    assert r.best.sgraph == 1
    assert STATS.compile_failures == 1 and STATS.wrong_results >= 1
    assert "compile error" in r.table() and "wrong result" in r.table()


def test_all_candidates_failing_is_an_error() -> None:
    _, prog = _w1()
    with pytest.raises(TuningError, match="wrong result"):
        tune([_without_rms()], prog, ENV, detect(measure=False), top_k=2, measure_s=0.05)


def test_threads_are_honoured(monkeypatch: pytest.MonkeyPatch) -> None:
    hand, prog = _w1()
    monkeypatch.setenv("PRISM_NUM_THREADS", "1")
    m = detect(measure=False)
    assert m.threads == 1
    r = tune([hand], prog, ENV, m, top_k=2, measure_s=0.05).result
    assert r.machine["threads"] == 1 and r.best.status == "ok"
