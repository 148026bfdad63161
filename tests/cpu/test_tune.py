"""The tuner on hand-written sGraphs (what the search returns): compile in parallel, measure, score
failures +inf, pick the fastest correct candidate. No assertion on timing values."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import pytest

import prism
from prism.errors import CompileError
from prism.tune import STATS, TuningError, detect, reset_stats, tune
from prism.tune import measure as MS
from prism.verify import numeric as NU
from prism.workloads import WORKLOADS

pytestmark = pytest.mark.cpu
Mutant = Callable[[int, int], prism.Graph]

SHAPE = {"n": 8, "d": 256, "m": 512}
ENV = {"n": 8}


def _w1() -> tuple[prism.Graph, prism.Graph]:
    w = WORKLOADS["W1"]
    return w.hand_written(SHAPE), w.program(SHAPE)


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
    ranks = sorted(row.model_rank for row in r.rows)
    assert ranks[0] == 0 and len(set(ranks)) == 3  # the model's favourite and two others (select's diversity)
    blocks = {tuned.instances[i].estimate.min_blocks for i in range(len(r.rows))}
    assert len(blocks) >= 2   # near-ties of one sGraph: the measurement sees more than one block count
    assert r.candidates > 3 and r.top1_ratio is not None and r.top1_ratio >= 1.0
    x64, _ = NU.normal_reference(prog, ENV, seed=3)
    x = MS.typed_inputs(prog, x64)
    assert all(a.ctypes.data % 64 == 0 and a.dtype == np.float32 and np.array_equal(a, x64[k].astype(np.float32))
               for k, a in x.items())
    y = tuned.kernels[r.winner](**x)
    np.testing.assert_allclose(y, _reference(prog, x), rtol=1e-4, atol=1e-4 * np.abs(y).max())


def test_wrong_results_and_compile_errors_score_infinity(w1_without_rms: Mutant,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
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
    r = tune([w1_without_rms(256, 512), hand], prog, ENV, detect(measure=False), top_k=5, measure_s=0.1).result
    by_status = {row.status for row in r.rows}
    assert {"wrong result", "compile error", "ok"} <= by_status
    for row in r.rows:
        assert (row.status == "ok") == math.isfinite(row.measured_s)
        if row.status == "wrong result":
            assert row.sgraph == 0 and row.error > 1e-3 and "tolerance" in row.detail
    assert r.best.sgraph == 1
    assert STATS.compile_failures == 1 and STATS.wrong_results >= 1
    assert "compile error" in r.table() and "wrong result" in r.table()


def test_all_candidates_failing_is_an_error(w1_without_rms: Mutant) -> None:
    _, prog = _w1()
    with pytest.raises(TuningError, match="wrong result"):
        tune([w1_without_rms(256, 512)], prog, ENV, detect(measure=False), top_k=2, measure_s=0.05)


def test_threads_are_honoured(monkeypatch: pytest.MonkeyPatch) -> None:
    hand, prog = _w1()
    monkeypatch.setenv("PRISM_NUM_THREADS", "1")
    m = detect(measure=False)
    assert m.threads == 1
    r = tune([hand], prog, ENV, m, top_k=2, measure_s=0.05).result
    assert r.machine["threads"] == 1 and r.best.status == "ok"


def test_machine_measurement_keeps_no_memory() -> None:
    """The triad's arrays (3 x 64 MiB) are freed after measuring, and allocated again when measured again
    (a model's first start-up kept them to the end of the process: +192 MiB)."""
    import ctypes
    import os

    from prism.tune.native import TRIAD_FLOATS, Limits

    def rss_mib() -> float:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20

    lim = Limits.load(1)
    before = rss_mib()
    assert lim.triad_bandwidth() > 0
    held = rss_mib() - before
    assert held >= 0.8 * 3 * 4 * TRIAD_FLOATS / 2**20
    lim.release()
    assert rss_mib() - before < 0.1 * held
    assert lim.triad_bandwidth() > 0   # measured again after a release
    lim.release()
