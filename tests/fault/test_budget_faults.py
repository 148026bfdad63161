"""Budgets on big shapes (issue 12, item 8): ``time_limit`` bounds the call, memory stays bounded.

No test here depends on how fast the machine is: the clock is moved by the test, and memory is counted
with tracemalloc (NumPy reports its buffers to it).
"""

from __future__ import annotations

import logging
import time
import tracemalloc
from typing import Any

import numpy as np
import pytest
from fault_support import LIMITS, inputs, rms_linear

import prism
from prism.api import clear_memory_caches
from prism.search import driver
from prism.search.stats import StopReason


class _Clock:
    """``time`` as the search driver sees it, jumped ``offset`` seconds ahead once ``jump()`` is called."""

    def __init__(self) -> None:
        self.offset = 0.0

    def monotonic(self) -> float:
        return time.monotonic() + self.offset

    def __getattr__(self, name: str) -> Any:
        return getattr(time, name)


def test_verification_stops_at_the_deadline_once_something_is_verified(monkeypatch: pytest.MonkeyPatch,
                                                                        caplog: pytest.LogCaptureFixture) -> None:
    clock = _Clock()
    monkeypatch.setattr(driver, "time", clock)
    real = driver.gate_verify
    calls = []

    def verify_then_jump(g: prism.Graph, program: prism.Graph) -> Any:
        calls.append(g.key)
        v = real(g, program)
        if v.ok:
            clock.offset = 10_000.0   # this verification took "forever": the time limit is spent
        return v
    monkeypatch.setattr(driver, "gate_verify", verify_then_jump)
    with caplog.at_level(logging.WARNING, logger="prism"):
        k = prism.superoptimize(rms_linear(), limits=LIMITS, measure_machine=False)
    r = k.search_result
    assert len(k.implementations) == 1 and r.stats.pruned["verify_budget"] >= 1
    assert r.stop_reason is StopReason.TIME_LIMIT
    x = inputs(3)
    y = k(**x)
    ref = rms_linear().evaluate({n: v.astype(np.float64) for n, v in x.items()}, dtype=np.float64)["Y"]
    assert np.max(np.abs(y - ref)) <= 1e-4 * np.max(np.abs(ref))


def test_a_spent_budget_tunes_fewer_candidates_and_says_so(caplog: pytest.LogCaptureFixture) -> None:
    from prism import api
    k = prism.superoptimize(rms_linear(), limits=LIMITS, measure_machine=False, top_k=6)
    k.options.deadline = time.perf_counter() - 1.0   # the call's time limit is already spent
    with caplog.at_level(logging.WARNING, logger="prism"):
        spec = k.specialize(n=6)
    assert len(spec.tuning.rows) <= api.BUDGET_TOP_K
    assert any("time_limit" in r.getMessage() and "instead of 6" in r.getMessage() for r in caplog.records)


def test_slow_phases_log_where_the_time_went(monkeypatch: pytest.MonkeyPatch,
                                             caplog: pytest.LogCaptureFixture) -> None:
    from prism import api
    monkeypatch.setattr(api, "SLOW_S", 0.0)   # every phase counts as slow
    clear_memory_caches()
    with caplog.at_level(logging.WARNING, logger="prism"):
        prism.superoptimize(rms_linear(), limits=LIMITS, measure_machine=False)(**inputs(2))
    text = "\n".join(r.getMessage() for r in caplog.records)
    assert "the search of 'fault_rms_linear' took" in text and "verify" in text
    assert "tuning 'fault_rms_linear' at n=2 took" in text and "compile" in text


def test_tuning_memory_is_a_small_multiple_of_the_programs_tensors() -> None:
    """Six candidates of a program with a 16 MB output: the tuner keeps one set of output buffers and
    compares in chunks, so its peak is a few times the output, not six float32 copies plus float64 ones."""
    from prism.tune import tune
    from prism.tune.machine import detect
    g = prism.Graph("fault_wide_out")
    A, B = g.input("A", (2048, 64)), g.input("B", (64, 2048))
    g.output(g.matmul(A, B), "Y")
    k = prism.superoptimize(g, limits=LIMITS, measure_machine=False)
    out_bytes = 2048 * 2048 * 4
    tracemalloc.start()
    try:
        tuned = tune([i.graph for i in k.implementations], g, {}, detect(False), top_k=6)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert sum(r.status == "ok" for r in tuned.result.rows) >= 2
    # the output (f32) + its float64 reference (2x) + one chunk of temporaries: well under 5x the output
    assert peak <= 5 * out_bytes, f"peak {peak / 2**20:.0f} MiB for a {out_bytes / 2**20:.0f} MiB output"


def test_chunked_comparison_equals_the_whole_array_one(monkeypatch: pytest.MonkeyPatch) -> None:
    """The numeric check compares in chunks (bounded memory): same error, same non-finite verdicts, and
    positions reported in the array's own coordinates, whatever the chunk size."""
    from prism.verify import numeric
    rng = np.random.default_rng(0)
    r = rng.standard_normal((6, 9))
    c = (r + 1e-5 * rng.standard_normal(r.shape)).astype(np.float32)
    r[2, 3] = c[2, 3] = np.inf
    r[4, 0] = c[4, 0] = np.nan
    whole = numeric._compare(c, r)
    for chunk in (1, 7, 10, 1 << 18):
        monkeypatch.setattr(numeric, "COMPARE_CHUNK", chunk)
        err, why = numeric._compare(c, r)
        assert err == pytest.approx(whole[0], rel=1e-12) and why == whole[1]   # only the rms's summation order
        bad = c.copy()
        bad[5, 7] = np.nan
        err, why = numeric._compare(bad, r)
        assert err == np.inf and "first at (5, 7)" in why
    ref = np.abs(c.astype(np.float64) - r)[np.isfinite(r)] / (np.abs(r[np.isfinite(r)])
                                                              + np.sqrt(np.mean(r[np.isfinite(r)] ** 2)))
    assert whole[0] == pytest.approx(float(ref.max()), rel=1e-12)
