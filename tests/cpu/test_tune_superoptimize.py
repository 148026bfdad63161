"""prism.superoptimize end to end on a small program: search (small limits) -> verify -> tune -> compile.

Counters, not timings, prove that cache hits skip the search and the tuning."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import prism
from prism.api import DERIVE_SLACK, clear_memory_caches
from prism.errors import PrismError
from prism.runtime import store
from prism.search import Limits
from prism.tune import STATS, reset_stats

pytestmark = pytest.mark.cpu

LIMITS = Limits(max_kernel_ops=1, time_limit=30, max_results=3)


def _program() -> prism.Graph:
    g = prism.Graph("rmsnorm_linear_small")
    X, W = g.input("X", ("n", 256)), g.input("W", (256, 512))
    g.output(g.matmul(g.rms_norm(X), W), "Y")
    return g


@pytest.fixture(scope="module", autouse=True)
def _own_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    d = tmp_path_factory.mktemp("superopt-cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PRISM_CACHE_DIR", str(d))
        clear_memory_caches()
        yield d
    clear_memory_caches()


def _inputs(n: int, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"X": rng.standard_normal((n, 256), dtype=np.float32),
            "W": rng.standard_normal((256, 512), dtype=np.float32)}


def _check(y: np.ndarray, x: dict[str, np.ndarray]) -> None:
    ref = _program().evaluate({k: v.astype(np.float64) for k, v in x.items()}, dtype=np.float64)["Y"]
    assert y.shape == ref.shape and np.all(np.isfinite(y))
    scale = np.sqrt(np.mean(ref ** 2))
    assert np.max(np.abs(y - ref) / (np.abs(ref) + scale)) <= 2e-4


def test_superoptimized_kernel_matches_the_reference_at_every_shape() -> None:
    k = prism.superoptimize(_program(), limits=LIMITS)
    assert k.implementations and all(i.how == "formal+numeric" for i in k.implementations)
    for n in (8, 7, 1):  # 7: no power of two divides it; 1: a single row
        x = _inputs(n, seed=n)
        _check(k(**x), x)
        spec = k.specialize(n=n)
        assert spec.check.passed and spec.tuning.best.status == "ok"
        assert spec.check.checks and all(c.runner == "compiled kernel" for c in spec.check.checks)


def test_cache_hits_skip_search_and_tuning() -> None:
    clear_memory_caches()
    reset_stats()
    k = prism.superoptimize(_program(), limits=LIMITS)
    assert STATS.searches + STATS.search_cache_hits == 1
    k(**_inputs(16))
    assert STATS.tunings == 1
    k(**_inputs(16, seed=1))                      # same shape, same object: in memory
    assert (STATS.tunings, STATS.tune_memory_hits) == (1, 1)
    before = (STATS.searches, STATS.compiles)
    clear_memory_caches()                         # as a new process would: disk caches only
    k2 = prism.superoptimize(_program(), limits=LIMITS)
    assert STATS.search_cache_hits >= 1 and STATS.searches == before[0]
    x = _inputs(16, seed=2)
    _check(k2(**x), x)
    assert STATS.tune_cache_hits == 1 and STATS.tunings == 1 and STATS.compiles == before[1]
    # the entry records that this very kernel (the kernel cache's key: C text, compiler, flags, machine) passed
    # its check at this shape when tuned: the check is not repeated on load
    s16 = k2.specialize(n=16)
    assert s16.from_cache and s16.check_cached and (STATS.final_checks, STATS.checks_cached) == (1, 1)
    assert "not repeated on load" in k2.explain(n=16)
    k3 = prism.superoptimize(_program(), limits=LIMITS)   # same process: the search result is reused
    assert STATS.search_memory_hits == 1
    k3(**_inputs(3))                              # a new shape: tuned, never searched again
    assert STATS.tunings == 2 and STATS.searches == before[0]


def test_a_cached_winner_whose_kernel_is_not_the_checked_one_is_checked_again(_own_cache: Path) -> None:
    """The record of a passed check covers one kernel: where the entry names another (a new compiler, other
    flags, a changed code generator, an edited entry with a valid checksum), the winner is compiled and checked
    again on load, and the entry then records the kernel checked."""
    k = prism.superoptimize(_program(), limits=LIMITS)
    k(**_inputs(40))
    path = next(p for p in _entries(_own_cache) if json.loads(p.read_text())["payload"]["result"]["env"] == {"n": 40})
    d = json.loads(path.read_text())
    assert d["payload"]["checked"]["kernel"]
    d["payload"]["checked"]["kernel"] = "0" * 64
    d["sha256"] = store.digest(d["payload"])
    path.write_text(json.dumps(d))
    clear_memory_caches()
    reset_stats()
    k2 = prism.superoptimize(_program(), limits=LIMITS)
    s = k2.specialize(n=40)
    assert s.from_cache and s.check_cached is None and s.check.passed
    assert (STATS.final_checks, STATS.checks_cached, STATS.tunings) == (1, 0, 0)
    # the entry now records the kernel that was checked: the next process does not check it again
    d = json.loads(path.read_text())
    assert d["payload"]["checked"]["kernel"] != "0" * 64 and d["sha256"] == store.digest(d["payload"])
    clear_memory_caches()
    reset_stats()
    s = prism.superoptimize(_program(), limits=LIMITS).specialize(n=40)
    assert s.check_cached and (STATS.final_checks, STATS.checks_cached) == (0, 1)


def test_tuning_and_the_final_check_share_one_draw(monkeypatch: pytest.MonkeyPatch) -> None:
    """The inputs are drawn once per new shape: the final check of the winner starts from the tuner's draw
    (drawing and converting large weights again dominated the time to serve a new shape)."""
    from prism.verify import numeric as NU
    real, draws = NU.standard_normal_inputs, []

    def counted(*a: object, **kw: object) -> dict[str, np.ndarray]:
        draws.append(a[1])
        return real(*a, **kw)
    k = prism.superoptimize(_program(), limits=LIMITS)   # searched (and verified: its own draws) first, so the
    monkeypatch.setattr(NU, "standard_normal_inputs", counted)   # test does not depend on an earlier one's
    reset_stats()
    spec = k.specialize(n=13)
    assert STATS.tunings == 1 and STATS.final_checks >= 1 and spec.check.passed
    assert len(draws) == 1 and {c.kind for c in spec.check.checks} == {"normal", "hostile", "tiny"}
    clear_memory_caches()
    spec = prism.superoptimize(_program(), limits=LIMITS).specialize(n=13)  # a tuning-cache hit of the same
    assert spec.from_cache and spec.check_cached and len(draws) == 1   # kernel: its recorded check serves


def _entries(root: Path) -> list[Path]:
    return sorted((root / "tune" / "results").rglob("*.json"))


@pytest.mark.parametrize("damage", ["garbage", "checksum", "winner"])
def test_a_corrupt_tuning_entry_is_rebuilt(_own_cache: Path, damage: str) -> None:
    k = prism.superoptimize(_program(), limits=LIMITS)
    k(**_inputs(24))
    path = next(p for p in _entries(_own_cache) if json.loads(p.read_text())["payload"]["result"]["env"] == {"n": 24})
    d = json.loads(path.read_text())
    if damage == "garbage":
        path.write_text("{ this is not json")
    elif damage == "checksum":
        d["payload"]["result"]["rows"][0]["params"] = {"g0": 999}
        path.write_text(json.dumps(d))
    else:  # a well-formed entry whose winner is not a valid row: detected on use
        d["payload"]["result"]["winner"] = 99
        d["sha256"] = store.digest(d["payload"])
        path.write_text(json.dumps(d))
    clear_memory_caches()
    reset_stats()
    k2 = prism.superoptimize(_program(), limits=LIMITS)
    x = _inputs(24, seed=5)
    _check(k2(**x), x)
    assert STATS.rebuilds == 1 and STATS.tunings == 1 and STATS.tune_cache_hits == 0
    assert store.load(path, "tuning").payload is not None  # rewritten whole


def test_explain_shows_graph_proof_code_and_table() -> None:
    k = prism.superoptimize(_program(), limits=LIMITS)
    text = k.explain(n=8)
    for part in ("block_graph", "proof: formal+numeric", "proved", "compiled check at this shape: numeric check passed",
                 "tuning table", "Spearman", "generated C", "prism_entry"):
        assert part in text, part


def test_torch_tensors_and_output_buffers() -> None:
    torch = pytest.importorskip("torch")
    k = prism.superoptimize(_program(), limits=LIMITS)
    x = _inputs(8, seed=9)
    y = k(**{n: torch.from_numpy(v) for n, v in x.items()})
    assert isinstance(y, torch.Tensor)
    _check(y.numpy(), x)
    out = np.empty((8, 512), np.float32)
    assert k.call(x, out=out) is out
    _check(out, x)


def test_verbose_progress_is_printed(capsys: pytest.CaptureFixture[str]) -> None:
    clear_memory_caches()
    k = prism.superoptimize(_program(), limits=LIMITS, verbose=2)
    k(**_inputs(5))
    err = capsys.readouterr().err
    assert "search:" in err and "tuned at n=5" in err


@pytest.mark.fault  # issue 12 item 6: also part of the fault tier
def test_a_contended_tuning_is_stored_marked_served_and_retuned(monkeypatch: pytest.MonkeyPatch) -> None:
    """Measured under contention -> stored marked; the next process serves it (counted) instead of tuning
    again; ``retune_contended`` (``prism cache retune``) measures it again and, quiet, clears the mark."""
    from prism.api import contended_entries, retune_contended
    from prism.tune import tuner
    clear_memory_caches()
    reset_stats()
    monkeypatch.setenv("PRISM_TUNE_CONTENTION_LIMIT", "0.25")

    class Busy:  # another process took a whole core while the candidates were measured
        def start(self) -> None: ...

        def stop(self) -> float:
            return 1.0
    monkeypatch.setattr(tuner, "CpuMeter", Busy)
    k = prism.superoptimize(_program(), limits=LIMITS)
    x = _inputs(11)   # a shape no other test of this module uses
    _check(k(**x), x)
    assert STATS.tunings == 1 and STATS.contended_tunings == 1
    assert k.specialize(n=11).tuning.contention == 1.0
    (path,) = [p for p in contended_entries() if store.load(p, "tuning").payload["key"]["shapes"]["X"][0] == 11]
    clear_memory_caches()
    k2 = prism.superoptimize(_program(), limits=LIMITS)
    _check(k2(**x), x)
    assert STATS.tunings == 1 and STATS.tune_cache_hits == 1 and STATS.contended_served == 1  # served, not re-tuned
    assert k2.specialize(n=11).from_cache
    rows = retune_contended()                          # still busy: measured again, stays marked
    assert any(r.path == str(path) and r.status == "still contended" for r in rows)
    assert STATS.tunings == 1 + len(rows) and path in contended_entries()
    monkeypatch.setenv("PRISM_TUNE_CONTENTION_LIMIT", "inf")   # quiet now
    rows = retune_contended()
    assert all(r.status == "retuned" for r in rows) and rows
    assert contended_entries() == []
    clear_memory_caches()
    before = STATS.contended_served
    prism.superoptimize(_program(), limits=LIMITS)(**x)
    assert STATS.contended_served == before and STATS.tune_cache_hits == 2


def test_contention_limit_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    from prism.tune.contention import WARN_CORES, contention_limit
    monkeypatch.delenv("PRISM_TUNE_CONTENTION_LIMIT", raising=False)
    assert contention_limit() == WARN_CORES
    monkeypatch.setenv("PRISM_TUNE_CONTENTION_LIMIT", "inf")
    assert contention_limit() == float("inf")
    monkeypatch.setenv("PRISM_TUNE_CONTENTION_LIMIT", "lots")
    with pytest.raises(ValueError, match="PRISM_TUNE_CONTENTION_LIMIT"):
        contention_limit()


def test_one_kernel_object_per_program_and_options() -> None:
    """Equal pieces of a model (a decoder's layers) get one kernel object: its tunings are shared."""
    clear_memory_caches()
    a = prism.superoptimize(_program(), limits=LIMITS)
    assert prism.superoptimize(_program(), limits=LIMITS) is a
    assert prism.superoptimize(_program(), limits=LIMITS, top_k=2) is not a


def _small() -> prism.Graph:
    """A program of its own (the other tests' tunings of ``_program`` are in the module's cache)."""
    g = prism.Graph("rmsnorm_linear_derive")
    X, W = g.input("X", ("n", 128), "float32"), g.input("W", (128, 192), "float32")
    g.output(g.matmul(g.rms_norm(X), W), "Y")
    return g


def _run_small(k: prism.SuperKernel, n: int) -> None:
    rng = np.random.default_rng(n)
    x = {"X": rng.standard_normal((n, 128), dtype=np.float32), "W": rng.standard_normal((128, 192), dtype=np.float32)}
    ref = _small().evaluate({a: v.astype(np.float64) for a, v in x.items()}, dtype=np.float64)["Y"]
    y = k(**x)
    assert np.max(np.abs(y - ref) / (np.abs(ref) + np.sqrt(np.mean(ref ** 2)))) <= 2e-4


def test_derive_serves_a_nearby_shape_with_the_tuned_winner_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    """derive=True: a new n within a factor of 2 of a tuned one takes its winner -- compiled and checked at the
    new shape, not measured; farther shapes are tuned where PRISM_DERIVE_FAR=0 (else derived too and recorded
    pending: test_a_far_shape_is_derived_at_once_recorded_pending_and_tuned_by_retune); a new process derives
    from the disk cache's tunings."""
    monkeypatch.setenv("PRISM_DERIVE_FAR", "0")
    clear_memory_caches()
    reset_stats()
    k = prism.superoptimize(_small(), limits=LIMITS, derive=True)
    # multiples of 16: the winner's tiles of n (chosen at 16) divide them, so the derived kernels compile
    for n, tunings, derived in ((16, 1, 0), (32, 1, 1), (64, 2, 1)):
        _run_small(k, n)
        assert (STATS.tunings, STATS.tune_derived) == (tunings, derived), n
    s32 = k.specialize(n=32)
    assert s32.derived_from == {"n": 16} and s32.check.passed
    # the winner compiled at 32; or a candidate measured within DERIVE_SLACK of it that has compiled code at 32
    # (the pre-build's template at 17); or -- where neither has and the winner's sGraph is row-separable -- two
    # calls of the kernel tuned at 16 (api._derived: a split of at most SPLIT_FIRST_RUNS calls first)
    from prism.ir.dims import resolve_params
    best = s32.tuning.best
    close = [resolve_params(r.params, {"n": 32}) for r in s32.tuning.rows
             if r.status == "ok" and r.measured_s <= best.measured_s * DERIVE_SLACK]
    assert resolve_params(s32.params, {"n": 32}) in close or s32.split == ((16, "tuned"), (16, "tuned")), s32.params
    assert k.specialize(n=64).derived_from is None  # 4x from 16; 32 is derived, never an anchor itself
    clear_memory_caches()                          # as a new process would
    k2 = prism.superoptimize(_small(), limits=LIMITS, derive=True)
    _run_small(k2, 128)                            # 2x of 64 (on disk), 8x of 16
    assert k2.specialize(n=128).derived_from == {"n": 64} and (STATS.tunings, STATS.tune_derived) == (2, 2)
    k3 = prism.superoptimize(_small(), limits=LIMITS)   # derive off (the default): tuned
    _run_small(k3, 80)
    assert STATS.tunings == 3


def test_derive_adapts_the_winners_sizes_to_a_length_they_do_not_divide(monkeypatch: pytest.MonkeyPatch) -> None:
    """A new n that the tuned winner's grid sizes do not divide (17, prime) takes, compiled and checked there
    and not tuned, another candidate of the tuning measured within api.DERIVE_SLACK of the winner that is
    valid at 17, or else the same sGraph with the valid sizes nearest to the winner's (api._derived). (17 is the
    shape the pre-build derives right after tuning 16: off here, so that the call at 17 derives it.)"""
    from prism.api import DERIVE_SLACK
    monkeypatch.setenv("PRISM_PREBUILD", "0")
    clear_memory_caches()
    reset_stats()
    g = prism.Graph("rmsnorm_linear_derive_prime")
    X, W = g.input("X", ("n", 128), "float32"), g.input("W", (128, 160), "float32")
    g.output(g.matmul(g.rms_norm(X), W), "Y")
    k = prism.superoptimize(g, limits=LIMITS, derive=True)
    rng = np.random.default_rng(0)
    w = rng.standard_normal((128, 160), dtype=np.float32)
    for n in (16, 17, 24):
        x = rng.standard_normal((n, 128), dtype=np.float32)
        ref = g.evaluate({"X": x.astype(np.float64), "W": w.astype(np.float64)}, dtype=np.float64)["Y"]
        y = k(X=x, W=w)
        assert np.max(np.abs(y - ref) / (np.abs(ref) + np.sqrt(np.mean(ref ** 2)))) <= 2e-4, n
    assert (STATS.tunings, STATS.tune_derived) == (1, 2)
    s16, s17 = k.specialize(n=16), k.specialize(n=17)
    assert s17.derived_from == {"n": 16} and s17.check.passed
    # every size symbol of the derived kernel divides what it splits at 17 (the IR re-checks each)
    s17.implementation.graph.instantiate({"n": 17, **s17.params})
    try:   # the 16-winner's own sizes at 17: where they do not fit, the derived kernel's differ
        s16.implementation.graph.instantiate({"n": 17, **s16.params})
        fits = True
    except PrismError:
        fits = False
    same = (s17.implementation.index, s17.params) == (s16.implementation.index, s16.params)
    assert fits == same
    close = [(r.sgraph, r.params) for r in s16.tuning.rows
             if r.status == "ok" and r.measured_s <= s16.tuning.best.measured_s * DERIVE_SLACK]
    assert same or (s17.implementation.index, s17.params) in close or \
        s17.implementation.index == s16.implementation.index   # the winner's sGraph, its nearest sizes


def test_the_shape_one_past_a_tuned_one_is_derived_right_after_the_tuning(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """api.SuperKernel._prebuild: right after tuning at n, n + 1 is derived -- its template built and checked --
    so the call at n + 1 costs no check, tuning or compile (later values of that template's region are served
    from it too: measured on llama-1b, docs/codegen.md). With PRISM_PREBUILD=0 the call at n + 1 derives it."""
    g = prism.Graph("rms_linear_prebuild")
    X, W = g.input("X", ("n", 128), "float32"), g.input("W", (96, 128), "float32")
    g.output(g.matmul(g.rms_norm(X), g.permute(W, (1, 0))), "Y")
    rng = np.random.default_rng(0)
    w = rng.standard_normal((96, 128), dtype=np.float32)

    def run(k: object, n: int) -> None:
        x = rng.standard_normal((n, 128), dtype=np.float32)
        ref = g.evaluate({"X": x.astype(np.float64), "W": w.astype(np.float64)}, dtype=np.float64)["Y"]
        y = k(X=x, W=w)  # type: ignore[operator]
        assert np.max(np.abs(y - ref) / (np.abs(ref) + np.sqrt(np.mean(ref ** 2)))) <= 2e-4, n

    def work() -> tuple[int, ...]:
        return (STATS.final_checks, STATS.template_checks_below, STATS.tunings, STATS.tune_derived, STATS.compiles)

    for prebuild in ("1", "0"):
        monkeypatch.setenv("PRISM_PREBUILD", prebuild)
        monkeypatch.setenv("PRISM_CACHE_DIR", str(tmp_path / prebuild))
        clear_memory_caches()
        reset_stats()
        k = prism.superoptimize(g, limits=LIMITS, derive=True)
        run(k, 32)
        s33 = k._specs.get((("n", 33),))
        assert (s33 is not None) == (prebuild == "1")
        # the winner is measured: where it is not valid at 33 (a loop of 2 chunks), n + 1 took another candidate
        # and _prebuild_winner built the winner further on and the shapes up to RESIDUE_REACH past (the next test);
        # those are the only other pre-builds
        s32 = k.specialize(n=32)
        other = s33 is not None and (s33.implementation.index, s33.params) != (s32.implementation.index, s32.params)
        past = [key for key in k._specs if key[0][1] > 33]
        assert not past or other, past
        assert STATS.tunings == 1 and STATS.template_prebuilt == (1 + len(past) if prebuild == "1" else 0)
        if s33 is not None:
            assert s33.derived_from == {"n": 32} and s33.check.passed and s33.check.instantiations
        before = work()
        run(k, 33)
        if prebuild == "1":
            assert work() == before and k.specialize(n=33) is s33
        else:
            assert STATS.tune_derived == before[3] + 1 and STATS.tunings == before[2]
            assert k.specialize(n=33).derived_from == {"n": 32}


def test_the_prebuild_builds_the_winner_where_the_shape_one_past_took_another_candidate(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """api.SuperKernel._prebuild_winner: a winner that is not valid at n + 1 (here a loop of 2 chunks over n, tuned at
    n = 32) leaves n + 1 to another candidate; its own template is then built at the next value it is valid at
    (34) and checked, so a later even length runs compiled code (no gcc run), with the float64 reference's
    values; the template's TEMPLATE_CHECKS checks are run then, at its cheapest values. Before, the first even length
    compiled it (llama-1b float32's prefill attention at 190: 1.8 s)."""
    from prism.api import RESIDUE_REACH, TEMPLATE_CHECKS, WINNER_REACH
    monkeypatch.setenv("PRISM_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("PRISM_PREBUILD", "0")   # the tuning first; the pre-build below, with the winner set
    clear_memory_caches()
    reset_stats()
    g = prism.Graph("softmax_then_matmul_over_n")
    X, W = g.input("X", (8, "n")), g.input("W", ("n", 40))
    g.output(g.matmul(g.softmax(X, -1), W), "Y")
    k = prism.superoptimize(g, limits=LIMITS, derive=True)
    spec = k.specialize(n=32)
    res = spec.tuning
    loops = [i for i, r in enumerate(res.rows) if r.status == "ok" and "F" in r.params]
    assert loops and len([r for r in res.rows if r.status == "ok"]) >= 2, [r.params for r in res.rows]
    res.winner = loops[0]
    res.rows[loops[0]].params = {**res.rows[loops[0]].params, "F": 2}   # valid at even n only
    win = res.best
    monkeypatch.setenv("PRISM_PREBUILD", "1")
    k._prebuild({"n": 32}, spec)
    s33 = k._specs[(("n", 33),)]
    assert s33.params != dict(win.params) and s33.split is None   # another candidate at 33
    s34 = k._specs.get((("n", 34),))
    assert s34 is not None and s34.params == dict(win.params) and s34.check.passed, (s34, WINNER_REACH)
    assert k._covers(win, None, {"n": 40})
    t = s34.kernel.specialize(n=34).template   # checked at its cheapest values there, not by a later length
    assert t is not None and len(t.checks) == TEMPLATE_CHECKS, t
    # and every shape up to RESIDUE_REACH past the tuned one is derived now (each residue of a dim the winner's
    # grid must divide takes a candidate of its own: its first length compiled it)
    assert all((("n", 32 + j),) in k._specs for j in range(1, RESIDUE_REACH + 1)), sorted(k._specs)
    rng = np.random.default_rng(0)
    compiles = STATS.compiles
    for n in (35, 37):   # odd lengths: the candidate derived at 33 and 35, no compile
        x, w = rng.standard_normal((8, n)).astype(np.float32), rng.standard_normal((n, 40)).astype(np.float32)
        ref = g.evaluate({"X": x.astype(np.float64), "W": w.astype(np.float64)}, dtype=np.float64)["Y"]
        assert np.max(np.abs(np.asarray(k(X=x, W=w)) - ref)) <= 1e-5 * np.max(np.abs(ref)), n
    for n in (34, 40):
        x, w = rng.standard_normal((8, n)).astype(np.float32), rng.standard_normal((n, 40)).astype(np.float32)
        ref = g.evaluate({"X": x.astype(np.float64), "W": w.astype(np.float64)}, dtype=np.float64)["Y"]
        assert np.max(np.abs(np.asarray(k(X=x, W=w)) - ref)) <= 1e-5 * np.max(np.abs(ref)), n
        assert k.specialize(n=n).params == dict(win.params)
    assert STATS.compiles == compiles


def test_when_every_measured_candidate_fails_the_final_check_the_next_ones_are_tuned(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """top_k candidates are measured; if the final numeric check rejects all of them, the tuner measures
    the next ones (never an unchecked kernel); after api.RETUNE_ROUNDS more failing rounds it raises."""
    from prism import api

    clear_memory_caches()
    k = prism.superoptimize(_program(), limits=LIMITS, top_k=1)
    real = api.SuperKernel._check
    rejected: list[tuple] = []

    def first_rejected(self, impl, env, params, kernel, tuned=None):  # type: ignore[no-untyped-def]
        c = real(self, impl, env, params, kernel, tuned)
        if not rejected:   # the first candidate checked: rejected as a wrong kernel would be
            rejected.append((impl.index, dict(params)))
            return _Failed(c)
        return c

    monkeypatch.setattr(api.SuperKernel, "_check", first_rejected)
    # shapes no other test of this module uses: a tuning on disk would be served (and re-checked) instead
    x = _inputs(19, seed=3)
    _check(k(**x), x)
    spec = k.specialize(n=19)
    assert spec.check.passed and len(rejected) == 1
    assert (spec.implementation.index, spec.params) != rejected[0]

    checked = []
    monkeypatch.setattr(api.SuperKernel, "_check", lambda *a, **kw: checked.append(1) or _Failed(None))
    with pytest.raises(api.NoVerifiedKernelError, match="final numeric check"):
        k.specialize(n=41)
    assert len(checked) == 1 + api.RETUNE_ROUNDS  # top_k=1: one candidate per round


class _Failed:
    """A check result that did not pass."""

    passed = False

    def __init__(self, inner: object) -> None:
        self.inner = inner
        self.checks: list = []

    def __str__(self) -> str:
        return "FAIL (rejected by the test)"


def test_derived_shapes_share_a_template_instead_of_a_compile_each() -> None:
    """Shapes derived from one tuned winner (the same sGraph and sizes) are served by templates of their guard
    regions (codegen/template.py): a few compiles for 29 new lengths, each kernel checked at its shape. (A
    dim that a grid splits is not templated where the blocks' rows choose the micro-kernels: their text
    pins the value; here n is the softmax's and the contraction's length.) A template's first check runs every
    input kind, its later ones the normal draw only."""
    clear_memory_caches()
    reset_stats()
    from prism import api
    assert api.TEMPLATE_CHECKS == 3
    g = prism.Graph("softmax_matmul_templates")
    X, V = g.input("X", (8, "n"), "float32"), g.input("V", ("n", 64), "float32")
    g.output(g.matmul(g.softmax(g.mul_scalar(X, 0.125), -1), V), "Y")
    k = prism.superoptimize(g, limits=LIMITS, derive=True)
    rng = np.random.default_rng(1)
    k(X=rng.standard_normal((8, 40), dtype=np.float32), V=rng.standard_normal((40, 64), dtype=np.float32))
    compiles = STATS.compiles
    for n in range(41, 70):
        x = {"X": rng.standard_normal((8, n), dtype=np.float32), "V": rng.standard_normal((n, 64), dtype=np.float32)}
        x["X"][3, n // 2] = 300.0   # hostile: one score dominates its row
        ref = g.evaluate({a: v.astype(np.float64) for a, v in x.items()}, dtype=np.float64)["Y"]
        y = k(**x)
        assert np.max(np.abs(y - ref) / (np.abs(ref) + np.sqrt(np.mean(ref ** 2)))) <= 2e-4, n
        s = k.specialize(n=n)
        assert s.derived_from == {"n": 40} and s.check.passed and "pr_dim_n" in s.source, n
    (kern,) = k._kernels.values()
    assert not kern.template_failures and 1 <= len(kern._templates) <= 4
    assert STATS.compiles == compiles   # the tuner compiled nothing more: no new length was tuned
    # each template's first api.TEMPLATE_CHECKS shapes were checked on their own; later ones reuse them
    # (checked where they were served, or at cheaper values of their region: template.check_points)
    checked = {tuple(sorted(e.items())) for t, *_ in kern._templates for r in t.checks for e in r.instantiations}
    assert STATS.template_served == 29 - len({c for c in checked if 41 <= dict(c)["n"] < 70})
    assert len(checked) <= 3 * len(kern._templates)
    assert STATS.template_served >= 29 - 3 * len(kern._templates) and all(len(t.checks) <= 3 for t, *_ in
                                                                        kern._templates)
    served = [n for n in range(41, 70) if all(i["n"] != n for i in k.specialize(n=n).check.instantiations)]
    assert len(served) == STATS.template_served
    assert "served by a template of its guard region" in k.explain(n=served[-1])   # says where its check ran
    # a template's first check runs every input kind, its later ones (other values of the region) the normal one
    for t, *_ in kern._templates:
        kinds = [{c.kind for c in r.checks} for r in t.checks]
        assert kinds[0] >= {"normal", "hostile", "tiny"} and all(ks == {"normal"} for ks in kinds[1:]), kinds
    assert any(len(t.checks) > 1 for t, *_ in kern._templates)


def test_a_later_process_takes_a_templates_recorded_checks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A template's checks are recorded under the kernel cache (keyed by the compiled template and the program):
    a later process (here: memory caches cleared) serves the template's region with no check of its own, and a
    record of another program is not taken."""
    monkeypatch.setenv("PRISM_CACHE_DIR", str(tmp_path))
    clear_memory_caches()
    g = prism.Graph("softmax_matmul_recorded")
    X, V = g.input("X", (8, "n"), "float32"), g.input("V", ("n", 64), "float32")
    g.output(g.matmul(g.softmax(g.mul_scalar(X, 0.125), -1), V), "Y")
    rng = np.random.default_rng(2)

    def run(k: object, n: int) -> None:
        x = {"X": rng.standard_normal((8, n), dtype=np.float32), "V": rng.standard_normal((n, 64), dtype=np.float32)}
        ref = g.evaluate({a: v.astype(np.float64) for a, v in x.items()}, dtype=np.float64)["Y"]
        y = k(**x)  # type: ignore[operator]
        assert np.max(np.abs(y - ref) / (np.abs(ref) + np.sqrt(np.mean(ref ** 2)))) <= 2e-4, n

    k = prism.superoptimize(g, limits=LIMITS, derive=True)
    for n in range(40, 50):
        run(k, n)
    (kern,) = k._kernels.values()
    assert kern._templates and all(t.record_key for t, *_ in kern._templates)
    records = list((tmp_path / "checks").glob("*.json"))
    assert records and all(json.loads(p.read_text()) for p in records)

    clear_memory_caches()
    reset_stats()
    k2 = prism.superoptimize(g, limits=LIMITS, derive=True)
    run(k2, 40)   # the tuned shape: its tuning entry's record
    checks = STATS.final_checks
    for n in range(41, 50):
        run(k2, n)
    assert STATS.final_checks == checks and STATS.template_checks_recorded >= 3
    assert STATS.template_served + STATS.checks_cached == 10   # n=40: the tuning entry's record

    # a template with fewer recorded checks than api.TEMPLATE_CHECKS (checked where served: no cheaper value of
    # its region here): a shape recorded is not checked again, another one is
    from prism.codegen import template
    monkeypatch.setattr(template, "check_points", lambda *a: [])
    monkeypatch.setenv("PRISM_CACHE_DIR", str(tmp_path / "second"))
    clear_memory_caches()
    k4 = prism.superoptimize(g, limits=LIMITS, derive=True)
    run(k4, 40)
    run(k4, 41)
    clear_memory_caches()
    reset_stats()
    k5 = prism.superoptimize(g, limits=LIMITS, derive=True)
    run(k5, 40)
    run(k5, 41)
    assert STATS.final_checks == 0 and STATS.checks_cached == 2
    assert "recorded when this very template" in k5.explain(n=41)
    run(k5, 44)
    assert STATS.final_checks == 1
    monkeypatch.setenv("PRISM_CACHE_DIR", str(tmp_path))

    for p in records:   # records of another program only: checked again
        p.write_text(json.dumps({"another program": next(iter(json.loads(p.read_text()).values()))}))
    clear_memory_caches()
    reset_stats()
    k3 = prism.superoptimize(g, limits=LIMITS, derive=True)
    for n in range(40, 50):
        run(k3, n)
    assert STATS.final_checks > 0 and STATS.template_checks_recorded == 0


def test_prefill_lengths_prime_ones_included_are_served_by_a_few_checked_templates() -> None:
    """A prefill-shaped program (rms_norm then X @ W^T over L rows, bfloat16) tuned at one length and called at
    every length up to 2x of it, primes included: no length is tuned again, every one is derived and checked
    (on its own or by its template's checks), the results match float64, and a handful of templates serve them
    all (api._derived: grids that follow L, the tuning's close candidates; matmul.rows_vary and nt_row_runs:
    the products' text independent of L) -- not a kernel per length."""
    clear_memory_caches()
    reset_stats()
    g = prism.Graph("rms_linear_prefill_lengths")
    X, W = g.input("X", ("L", 256), "bfloat16"), g.input("W", (192, 256), "bfloat16")
    g.output(g.matmul(g.rms_norm(X), g.permute(W, (1, 0))), "Y")
    k = prism.superoptimize(g, limits=LIMITS, derive=True)
    rng = np.random.default_rng(3)
    w = torch.randn(192, 256, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    k(X=torch.randn(64, 256).to(torch.bfloat16), W=w)
    tunings = STATS.tunings
    lengths = list(range(65, 128))
    for n in lengths:
        x = torch.from_numpy(rng.standard_normal((n, 256), dtype=np.float32)).to(torch.bfloat16)
        ref = g.evaluate({"X": x.double().numpy(), "W": w.double().numpy()}, dtype=np.float64)["Y"]
        y = k(X=x, W=w).double().numpy()
        assert np.max(np.abs(y - ref)) <= 2e-2 * np.max(np.abs(ref)), n   # bfloat16 output
        s = k.specialize(L=n)
        assert s.derived_from == {"L": 64} and s.check.passed, n
    assert STATS.tunings == tunings
    templates = [t for kern in k._kernels.values() for t, *_ in kern._templates]
    assert 1 <= len(templates) <= 6, [kern.template_failures for kern in k._kernels.values()]
    # each length served by a template checked at other lengths, or as a split whose parts are (api._split)
    assert STATS.template_served + STATS.tune_split >= len(lengths) - 3 * len(templates)


def _tuned_at_6(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    """The program superoptimized in an empty cache at ``tmp_path`` (statistics reset) and tuned at n = 6."""
    monkeypatch.setenv("PRISM_CACHE_DIR", str(tmp_path))
    clear_memory_caches()
    reset_stats()
    k = prism.superoptimize(_program(), limits=LIMITS, derive=True)
    x = _inputs(6)
    _check(k(**x), x)
    return k


def test_a_far_shape_is_derived_at_once_recorded_pending_and_tuned_by_retune(tmp_path: Path,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """A shape more than api.DERIVE_WINDOW from every tuned one is served from the nearest tuning (compiled and
    checked, never tuned on the call) and recorded as pending in the tuning cache; a later process derives it
    again without a second record; ``retune_contended`` (``prism cache retune``) tunes it, and from then on it is
    served from its own tuning. ``PRISM_DERIVE_FAR=0``: tuned on first use, as before."""
    from prism import api
    from prism.api import contended_entries, retune_contended
    k = _tuned_at_6(tmp_path, monkeypatch)
    assert STATS.tunings == 1 and contended_entries() == []
    far = _inputs(6 * 8 + 3)   # 8.5x: far beyond the window
    assert 51 / 6 > api.DERIVE_WINDOW
    _check(k(**far), far)
    s = k.specialize(n=51)
    assert STATS.tunings == 1 and STATS.tune_derived_far == 1 and s.derived_from == {"n": 6} and s.check.passed
    (pending,) = contended_entries()
    assert store.load(pending, "tuning").payload["pending"] == {"derived_from": {"n": 6}}

    clear_memory_caches()   # a later process: derived again (the record is no tuning), not recorded twice
    k2 = prism.superoptimize(_program(), limits=LIMITS, derive=True)
    _check(k2(**far), far)
    assert STATS.tunings == 1 and k2.specialize(n=51).derived_from == {"n": 6} and contended_entries() == [pending]

    rows = retune_contended()
    assert [r.status for r in rows] == ["tuned (was pending)"] and STATS.tunings == 2
    assert contended_entries() == []
    clear_memory_caches()
    hits = STATS.tune_cache_hits
    k3 = prism.superoptimize(_program(), limits=LIMITS, derive=True)
    _check(k3(**far), far)
    assert STATS.tunings == 2 and STATS.tune_cache_hits == hits + 1 and k3.specialize(n=51).derived_from is None

    monkeypatch.setenv("PRISM_DERIVE_FAR", "0")
    clear_memory_caches()
    k4 = prism.superoptimize(_program(), limits=LIMITS, derive=True)
    y = _inputs(2 * 51 * 3)   # far from 6 and 51
    _check(k4(**y), y)
    assert STATS.tunings == 3 and k4.specialize(n=306).derived_from is None


def test_far_shapes_record_one_pending_entry_per_octave(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A dim that moves one step at a time far from its tuning (a decode past twice its tuned KV length) records one
    pending entry per octave of the shape, not one per value: each record serialized the program and its sGraphs
    (llama-1b w8a8, KV 260-400 after a tuning at 129: 5.8 ms per new length, 140 records; now 0.7 ms, one record)."""
    from prism.api import contended_entries
    k = _tuned_at_6(tmp_path, monkeypatch)
    for n in range(51, 64):   # far (more than api.DERIVE_WINDOW from 6), one octave: 32-63
        xn = _inputs(n)
        _check(k(**xn), xn)
    assert STATS.tunings == 1 and STATS.tune_derived_far == 13
    assert len(contended_entries()) == 1
    x70 = _inputs(70)   # the next octave: a record of its own
    _check(k(**x70), x70)
    assert STATS.tunings == 1 and len(contended_entries()) == 2


def test_a_new_templates_checks_run_at_cheaper_values_of_its_region(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """A template served first at a large value runs its TEMPLATE_CHECKS checks at cheap values of its guard region
    below it (codegen/template.check_points: its smallest, one with the low bits set, one from half) -- the first
    with every input kind -- and then serves that value and the region's others with no check of their own; a
    template whose code fails at those values is not used (here: the shape is tuned instead)."""
    from prism import api
    from prism.codegen.template import check_points
    monkeypatch.setenv("PRISM_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("PRISM_PREBUILD", "0")   # the template is first built at 120 here, not at 65 after tuning
    monkeypatch.setattr(api, "SPLIT_FIRST_RUNS", 0)   # the winner at 120, not 64 + 56 (its parts: test_split.py)
    clear_memory_caches()
    reset_stats()
    g = prism.Graph("rms_linear_cheap_checks")
    X, W = g.input("X", ("L", 256), "bfloat16"), g.input("W", (192, 256), "bfloat16")
    g.output(g.matmul(g.rms_norm(X), g.permute(W, (1, 0))), "Y")
    w = torch.randn(192, 256, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)

    def run(k: object, n: int) -> None:
        x = torch.from_numpy(np.random.default_rng(n).standard_normal((n, 256), dtype=np.float32)).to(torch.bfloat16)
        ref = g.evaluate({"X": x.double().numpy(), "W": w.double().numpy()}, dtype=np.float64)["Y"]
        y = k(X=x, W=w).double().numpy()  # type: ignore[operator]
        assert np.max(np.abs(y - ref)) <= 2e-2 * np.max(np.abs(ref)), n

    k = prism.superoptimize(g, limits=LIMITS, derive=True)
    run(k, 64)
    run(k, 120)
    s = k.specialize(L=120)
    (t,) = [t for kern in k._kernels.values() for t, *_ in kern._templates]
    at = [i["L"] for r in t.checks for i in r.instantiations]
    assert s.derived_from == {"L": 64} and len(at) == api.TEMPLATE_CHECKS and all(v < 120 for v in at)
    assert len(set(at)) == len(at) and all(t.holds({"L": v}) for v in at) and any(v % 8 == 7 for v in at)
    assert STATS.template_checks_below == api.TEMPLATE_CHECKS
    kinds = [{c.kind for c in r.checks} for r in t.checks]
    assert kinds[0] >= {"normal", "hostile", "tiny"} and all(ks == {"normal"} for ks in kinds[1:])
    assert [i["L"] for i in s.check.instantiations] == at   # where the served value's check ran
    checks = STATS.final_checks
    for n in (101, 77):
        run(k, n)
    assert STATS.final_checks == checks   # served by the checked template
    # other values of the region once those are done; none below the region's smallest value (which values the
    # region holds depends on the code the host's tuning chose: 2-8 are in it on the Intel host of 2026-12-01)
    lo = min(v for v in range(1, 121) if t.trace.holds({"L": v}))
    assert check_points(t.trace, {"L": 120}, 3, [{"L": v} for v in at]) and not check_points(t.trace, {"L": lo}, 3, [])
    assert check_points(t.trace, {"L": lo + 1}, 3, []) == [{"L": lo}]

    # a template failing at the cheap values is not used: the shape is tuned (its own check at its own value)
    clear_memory_caches()
    monkeypatch.setenv("PRISM_CACHE_DIR", str(tmp_path / "second"))
    real = api.SuperKernel._check

    def failing_below(self: object, impl: object, env: dict, params: dict, kernel: object, tuned: object = None,
                      kinds: object = None) -> object:
        r = real(self, impl, env, params, kernel, tuned, kinds)  # type: ignore[arg-type]
        return r if env["L"] >= 250 or tuned is not None else _Failed(r)
    monkeypatch.setattr(api.SuperKernel, "_check", failing_below)
    k2 = prism.superoptimize(g, limits=LIMITS, derive=True)
    run(k2, 64 * 2)   # the tuned shape at 128 (its own check passes)
    tunings = STATS.tunings
    run(k2, 250)
    assert STATS.tunings == tunings + 1 and k2.specialize(L=250).derived_from is None


def _norm(n: int | str) -> prism.Graph:
    g = prism.Graph("rmsnorm_scale_twin")
    X, W = g.input("X", (n, 256), "float32"), g.input("W", (1, 256), "float32")
    g.output(g.mul(g.rms_norm(X), W), "Y")
    return g


def _run_norm(k: prism.SuperKernel, n: int) -> None:
    rng = np.random.default_rng(n)
    x = {"X": rng.standard_normal((n, 256), dtype=np.float32), "W": rng.standard_normal((1, 256), dtype=np.float32)}
    ref = _norm(n).evaluate({a: v.astype(np.float64) for a, v in x.items()}, dtype=np.float64)["Y"]
    y = k(**x)
    assert np.max(np.abs(y - ref) / (np.abs(ref) + np.sqrt(np.mean(ref ** 2)))) <= 2e-4


def test_a_symbolic_program_derives_from_its_fixed_shape_twins_tuning() -> None:
    """Under Dynamo's default a prompt length compiles a static graph and the next length a dynamic one whose
    pieces are the same programs over a symbolic length: the symbolic program at a value near a tuned twin's
    takes that twin's winner (api.SuperKernel._twin_anchors: the tuning renumbered to its own sGraphs), compiled
    and checked, not tuned again; a value more than DERIVE_WINDOW from every twin is derived too (served at once,
    recorded as pending) where the moved dim is at least api.FAR_TWIN_MIN at both ends, and tuned where it is not
    (a prefill length is not derived from a decode step's GEMV)."""
    clear_memory_caches()
    reset_stats()
    static = prism.superoptimize(_norm(48), limits=LIMITS, derive=True)
    _run_norm(static, 48)
    assert (STATS.tunings, STATS.tune_derived) == (1, 0)
    sym = prism.superoptimize(_norm("n"), limits=LIMITS, derive=True)
    assert sym is not static and sym.program.symbols() == {"n"}
    (env, res), = sym._twin_anchors()
    assert env == {"n": 48} and res.best.params == static.specialize().params
    _run_norm(sym, 56)
    s56 = sym.specialize(n=56)
    assert s56.derived_from == {"n": 48} and s56.check.passed
    assert (STATS.tunings, STATS.tune_derived) == (1, 1)
    _run_norm(sym, 200)                     # > 2x from 48, both ends >= FAR_TWIN_MIN: derived (far)
    assert sym.specialize(n=200).derived_from == {"n": 48} and STATS.tunings == 1 and STATS.tune_derived_far == 1
    _run_norm(sym, 10)                      # > 2x from 48 and below FAR_TWIN_MIN: its own tuning
    assert sym.specialize(n=10).derived_from is None and STATS.tunings == 2
    # the very value the twin was tuned at (a dynamic prefill graph called at the first prompt's length again):
    # the twin's winner, checked, not a tuning of its own (llama-1b int8w-g32-bf16 tuned 12 pieces again there)
    _run_norm(sym, 48)
    s48 = sym.specialize(n=48)
    assert s48.derived_from == {"n": 48} and s48.check.passed and STATS.tunings == 2
    # the twin's winner, or a candidate of its tuning measured within DERIVE_SLACK of it whose template another value
    # compiled already (api.SuperKernel._derived: 56 took one where the winner's grid does not divide it)
    from prism.ir.dims import resolve_params
    tuned = static.specialize().tuning
    close = [resolve_params(r.params, {"n": 48}) for r in tuned.rows
             if r.status == "ok" and r.measured_s <= tuned.best.measured_s * DERIVE_SLACK]
    assert resolve_params(s48.params, {"n": 48}) in close, (s48.params, close)


def test_a_shape_called_before_skips_binding_and_keeps_every_check(monkeypatch: pytest.MonkeyPatch) -> None:
    """SuperKernel.call: input shapes seen before go straight to their kernel (no Graph.bind, no specialize: ~6 of
    the ~15 µs a small kernel's call cost from Python), and that kernel still checks every buffer: a wrong dtype or
    a non-contiguous array at the same shape is an InputError naming the fix; a new shape binds again."""
    from prism.errors import InputError
    k = prism.superoptimize(_program(), limits=LIMITS)
    x = _inputs(8)
    _check(k(**x), x)
    binds = []
    real = prism.Graph.bind
    monkeypatch.setattr(prism.Graph, "bind",
                        lambda self, shapes: (binds.append(1) if self is k.program else None) or real(self, shapes))
    x2 = _inputs(8, seed=1)
    _check(k(**x2), x2)
    assert binds == []
    with pytest.raises(InputError, match="dtype"):
        k(X=x2["X"].astype(np.float64), W=x2["W"])
    with pytest.raises(InputError, match="contiguous"):
        k(X=np.asfortranarray(x2["X"]), W=x2["W"])
    assert binds == []
    with pytest.raises(InputError, match="missing"):
        k.call({"X": x2["X"]})
    x3 = _inputs(6)
    _check(k(**x3), x3)
    assert binds


def test_the_tuning_key_digest_is_the_materials_at_every_shape(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A tuning entry's file is named by the digest of its key (program, sGraphs, shapes, machine), so that caches
    written before stay valid; the shape is in the name (SuperKernel._cache_path)."""
    k = _tuned_at_6(tmp_path, monkeypatch)
    names = set()
    for n in (6, 7, 51, 6):
        path, material = k._cache_path({"n": n})
        assert material["shapes"] == {"X": [n, 256], "W": [256, 512]}
        assert path.name == store.digest(material)[:32] + ".json"
        names.add(path.name)
    assert len(names) == 3
    assert (tmp_path / "tune" / "results" / k.program.key / k._cache_path({"n": 6})[0].name).exists()
