"""Splits: a length no tuned grid divides served as calls of checked kernels on ranges of rows (api._split,
prism/runtime/split.py), against float64, through both call paths; a wrong composite is never returned."""

from __future__ import annotations

import math
import types
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch

import prism
from prism import api
from prism.api import Implementation, Options, SuperKernel, clear_memory_caches
from prism.ir.block import BlockBuilder
from prism.runtime import split as split_mod
from prism.tune import STATS, reset_stats
from prism.tune.tuner import Row, TuneResult

pytestmark = pytest.mark.cpu


@pytest.fixture(autouse=True)
def _own_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("PRISM_CACHE_DIR", str(tmp_path))
    clear_memory_caches()
    reset_stats()
    yield
    clear_memory_caches()


def _program(dtype: str) -> prism.Graph:
    g = prism.Graph("rows_linear")
    x, w = g.input("X", (1, "L", 64), dtype), g.input("W", (48, 64), dtype)
    g.output(g.matmul(g.rms_norm(x), g.permute(w, (1, 0))), "Y")
    return g


def _row_tiled(dtype: str) -> prism.Graph:
    """The program's sGraph with W's rows split by g0 and X's rows by g1 (written here as the search's would be:
    this test is about serving a tuning, not about finding it)."""
    g = prism.Graph("rows_linear")
    x, w = g.input("X", (1, "L", 64), dtype), g.input("W", (48, 64), dtype)
    bb = BlockBuilder(grid=("g0", "g1"), forloop=1, inputs=[x, w])
    t = bb.matmul(bb.rms_norm(bb.iter(0, imap=(None, 1))), bb.transpose(bb.iter(1, imap=(0, None)), 0, 1))
    bb.save(t, omap=(2, 1))
    (y,) = g.customized(bb.build(), [x, w])
    g.output(y, "Y")
    return g


def _kernel(dtype: str) -> tuple[SuperKernel, TuneResult]:
    """A SuperKernel whose tuning at L=64 chose 4 row blocks of 16 (and 2 column blocks), its kernel at 64 built."""
    ns = types.SimpleNamespace
    search = ns(stop_reason=ns(value="test"), stats=ns(states=0), candidates=[], cached=False)
    k = SuperKernel(_program(dtype), search, [Implementation(0, _row_tiled(dtype), "test", "", "")],
                    Options(derive=True))
    res = TuneResult("p", {"L": 64}, {}, {}, [], [Row(0, {"g0": 2, "g1": 4}, 1e-5, 0, "ok", 1e-5)], 0, 1)
    spec = k._from_cached({"L": 64}, res, None)
    assert spec is not None and spec.check.passed
    k._specs[(("L", 64),)] = spec
    return k, res


def _close(y: np.ndarray, x: np.ndarray, w: np.ndarray, dtype: str) -> None:
    ref = _program("float32").evaluate({"X": x, "W": w}, dtype=np.float64)["Y"]
    tol = 2e-2 if dtype == "bfloat16" else 1e-5   # bfloat16: the output's own rounding
    assert y.shape == ref.shape and np.max(np.abs(y - ref)) <= tol * np.max(np.abs(ref))


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_a_length_no_tuned_grid_divides_is_served_as_a_split_of_checked_kernels(dtype: str) -> None:
    """Primes above and below the tuned length, several runs of it, runs of its tile: each served by the kernel
    tuned at 64 on every whole run of 64 rows, then the sGraph with one block along the rows on each run of the
    tuned tile (16) and on the rows left; numerics against float64 through Kernel.call and the frontend's launcher;
    explain() says so. Never tuned again."""
    k, res = _kernel(dtype)
    rng = np.random.default_rng(0)
    w = rng.standard_normal((48, 64)).astype(np.float32)
    tw = torch.from_numpy(w).to(getattr(torch, dtype))
    # 97: the 33 rows left in one call -- the tail kernel's template built at 67's 3 rows serves 2-63 rows (one
    # region: no thread-count or K-chunk threshold of its own), where runs of the tile were cut before
    for n, runs in ((67, [64, 3]), (97, [64, 33]), (131, [64, 64, 3]), (30, [16, 14])):
        spec = k._derived({"L": n}, {"L": 64}, res)
        assert spec is not None and spec.split is not None and spec.check.passed, n
        assert [x for x, _ in spec.split] == runs
        x = rng.standard_normal((1, n, 64)).astype(np.float32)
        tx = torch.from_numpy(x).to(getattr(torch, dtype))
        xr, wr = tx.double().numpy(), tw.double().numpy()   # the rounded inputs
        _close(spec.kernel.call({"X": tx, "W": tw}).double().numpy(), xr, wr, dtype)
        (y,) = spec.kernel.call_tensors([tx, tw])
        _close(y.double().numpy(), xr, wr, dtype)
    assert STATS.tune_split == 4 and STATS.tunings == 0
    k._specs[(("L", 67),)] = k._derived({"L": 67}, {"L": 64}, res)
    text = k.explain(L=67)
    assert "served as calls on ranges of rows" in text and "64 rows (tuned) + 3 rows (g1=1)" in text


def test_a_split_whose_composite_is_wrong_fails_its_check_and_is_not_used(monkeypatch: pytest.MonkeyPatch) -> None:
    """The composite's numeric check can fail: with the tail's output offset lost (it overwrites the first rows),
    _split returns None and the warning says why; no wrong kernel is served."""
    real = split_mod.compose

    def broken(names, n_inputs, output_shapes, calls, env):  # type: ignore[no-untyped-def]
        calls = [(v, {k: o for k, o in off.items() if k != "Y"}) for v, off in calls]
        return real(names, n_inputs, output_shapes, calls, env)
    monkeypatch.setattr(split_mod, "compose", broken)
    k, res = _kernel("float32")
    assert k._split({"L": 67}, {"L": 64}, res) is None
    monkeypatch.setattr(split_mod, "compose", real)
    assert k._split({"L": 67}, {"L": 64}, res) is not None


def test_a_program_that_is_not_row_separable_is_never_split() -> None:
    """Softmax over the rows (each output row depends on every input row): its sGraph with a grid over the rows
    does not exist, and the program's own sGraph (no grid over the rows) proves nothing: no split."""
    g = prism.Graph("col_softmax")
    x = g.input("X", (1, "L", 64))
    g.output(g.softmax(x, 1), "Y")
    k = SuperKernel(g, None, [Implementation(0, g, "test", "", "")], Options(derive=True))
    res = TuneResult("p", {"L": 64}, {}, {}, [], [Row(0, {}, 1e-5, 0, "ok", 1e-5)], 0, 1)
    assert k._split({"L": 67}, {"L": 64}, res) is None


def test_a_programs_splits_reuse_the_first_composites_check(monkeypatch: pytest.MonkeyPatch) -> None:
    """The first SPLIT_CHECKS composites of a program are checked at their length; later ones, whatever their
    parts, are not: they pass their parts the same io orders advanced by the same bytes per row, and each part is
    still a kernel checked at its own length (its own check or its template's)."""
    from prism.runtime.split import SplitKernel
    k, res = _kernel("float32")
    seen: list[int] = []
    real = k._check

    def check(impl, env, params, kernel, tuned=None, kinds=None):  # type: ignore[no-untyped-def]
        if isinstance(kernel, SplitKernel):
            seen.append(env["L"])
        return real(impl, env, params, kernel, tuned, kinds)
    monkeypatch.setattr(k, "_check", check)
    for n in (67, 131, 97, 30):
        assert k._split({"L": n}, {"L": 64}, res) is not None
    assert api.SPLIT_CHECKS == 1 and seen == [67]


def test_the_shape_one_past_a_tuning_is_split_and_the_tail_kernel_built_at_half_a_tile() -> None:
    """_prebuild after a tuning at 64 (4 row blocks of 16): 65 is served as a split (64 + a one-row tail, a
    template of its own), and the tail kernel is also built at 9 rows (half a tile and one), the template the
    other remainders use: 64 + 13 then compiles nothing new."""
    from prism.runtime import cache
    k, res = _kernel("float32")
    k._prebuild({"L": 64}, k._specs[(("L", 64),)])
    s65 = k._specs[(("L", 65),)]
    assert s65.split is not None and [x for x, _ in s65.split] == [64, 1] and s65.split_tile == ("L", "g1", 16)
    (tail,) = [kern for key, kern in k._kernels.items() if dict(key[1]).get("g1") == "1"]
    assert (("L", 9),) in tail._variants and tail._templates
    misses = cache.STATS.misses
    s77 = k._derived({"L": 77}, {"L": 64}, res)
    assert s77 is not None and s77.split is not None and cache.STATS.misses == misses
    # a remainder outside the built regions is cut into runs of lengths the tail kernel has code for: no compile
    # (since 2026-11-29 the tail's template at 9 rows serves every remainder: then each is one call, no compile)
    covered = [r for r in range(1, 64) if tail.covers(L=r)]
    r = next((r for r in range(2, 64) if r not in covered and any(r - x in covered for x in covered)), 37)
    s = k._derived({"L": 64 + r}, {"L": 64}, res)
    assert s is not None and s.split is not None and cache.STATS.misses == misses
    assert len(s.split) == (2 if r in covered else 3) and s.split[0] == (64, "tuned")
    assert all(x in covered for x, _ in s.split[1:])
    rng = np.random.default_rng(2)
    x, w = rng.standard_normal((1, 64 + r, 64)).astype(np.float32), rng.standard_normal((48, 64)).astype(np.float32)
    _close(np.asarray(s.kernel.call({"X": x, "W": w})), x, w, "float32")


def test_a_later_process_takes_the_composite_and_plain_tail_checks_from_their_records(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A split's composite check and the check of a plain (not template) part -- the one-row tail, a dim of 1 -- are
    recorded under their kernels' C (kernel-cache keys): a new kernel object of the same program (a new process)
    serves the same length with no check of its own, and explain() says where the check is recorded. The record
    counts as the program's composite check (SPLIT_CHECKS): another length's composite is not checked either."""
    from prism.runtime.split import SplitKernel
    k, res = _kernel("float32")
    first = k._split({"L": 65}, {"L": 64}, res)   # 64 + a one-row tail
    assert first is not None and [x for x, _ in first.split] == [64, 1]
    clear_memory_caches()
    k2, res2 = _kernel("float32")
    seen: list[tuple[str, int]] = []
    real = k2._check

    def check(impl, env, params, kernel, tuned=None, kinds=None):  # type: ignore[no-untyped-def]
        seen.append(("composite" if isinstance(kernel, SplitKernel) else "part", env["L"]))
        return real(impl, env, params, kernel, tuned, kinds)
    monkeypatch.setattr(k2, "_check", check)
    cached = STATS.checks_cached
    again = k2._split({"L": 65}, {"L": 64}, res2)
    assert again is not None and seen == [] and STATS.checks_cached == cached + 2
    assert again.check.passed and again.kernel.specialize(L=65).gen.source == first.kernel.specialize(L=65).gen.source
    tail = k2._from_cached({"L": 1}, res2, {"g0": 2, "g1": 1}, template=True)
    assert tail is not None and tail.cached_from == "record" and "by this process or an earlier one" in \
        api._check_line(tail)
    rng = np.random.default_rng(1)
    x, w = rng.standard_normal((1, 65, 64)).astype(np.float32), rng.standard_normal((48, 64)).astype(np.float32)
    _close(np.asarray(again.kernel.call({"X": x, "W": w})), x, w, "float32")
    s66 = k2._split({"L": 66}, {"L": 64}, res2)
    assert s66 is not None and s66.split is not None and not any(c == "composite" for c, _ in seen)


def test_the_first_split_derived_without_a_prebuild_builds_and_checks_the_tail_templates(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A split derived from a tuning that had no pre-build (Dynamo's default: the dynamic graph's pieces derive from
    the fixed-shape twins' tunings) builds the tail kernel at 2 rows and at half a tile, their templates checked at
    every value the region offers below a tile (api._build_tails), once per tuning: a later split compiles nothing."""
    from prism.runtime import cache
    k, res = _kernel("float32")
    monkeypatch.setattr(k, "_anchors", lambda material: [({"L": 64}, res)])
    monkeypatch.setattr(k, "_twin_anchors", lambda: [])
    s = k._derive({"L": 67}, {})
    assert s is not None and s.split is not None and s.derived_from == {"L": 64}
    (tail,) = [kern for key, kern in k._kernels.items() if dict(key[1]).get("g1") == "1"]
    assert (("L", 2),) in tail._variants and (("L", 9),) in tail._variants
    t9 = tail.specialize(L=9).template
    assert t9 is not None and len(t9.checks) == api.TEMPLATE_CHECKS
    # below a tile; a check may come from another region of the same compiled text (2-8 and 9-59 rows compile
    # to one text: the record is the text's)
    assert all(i["L"] < 16 for r in t9.checks for i in r.instantiations)
    misses, checks = cache.STATS.misses, STATS.final_checks
    assert k._derive({"L": 64 + 11}, {}).split is not None   # an 11-row tail: the 9-row template's region
    assert cache.STATS.misses == misses and k._tails_built == {((("L", 64),), ("L", "g1", 16))}
    assert STATS.final_checks == checks


def test_a_split_tried_before_the_winner_compiles_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    """_split(first=True) -- the split api._derived tries before a winner with no compiled code -- is None where a
    part would be compiled (the 3-row tail before anything built it) or where it takes more than SPLIT_FIRST_RUNS
    calls and the tuned run is not compute-bound (its row blocks' weight reads over SPLIT_STREAM_SHARE of its
    measured time); the plain _split builds the part, after which the first one serves the length."""
    k, res = _kernel("float32")
    assert k._split({"L": 67}, {"L": 64}, res, first=True) is None
    assert k._split({"L": 67}, {"L": 64}, res) is not None
    s = k._split({"L": 67}, {"L": 64}, res, first=True)
    assert s is not None and [x for x, _ in s.split] == [64, 3]
    k._split({"L": 4 * 64 + 3}, {"L": 64}, res)
    # 5 calls; the weight W (48 x 64 float32, 12 KiB) read by 4 row blocks per run
    bw = k.machine.bandwidth
    share = 4 * 48 * 64 * 4 / bw
    for measured, split in ((share / api.SPLIT_STREAM_SHARE / 2, False), (share / api.SPLIT_STREAM_SHARE * 2, True)):
        monkeypatch.setattr(res.rows[0], "measured_s", measured)
        assert k._stream_share(48 * 64 * 4, 4, measured) == pytest.approx(share / measured)
        s = k._split({"L": 4 * 64 + 3}, {"L": 64}, res, first=True)
        assert (s is not None) == split, (measured, share)
        if split:
            assert s is not None and [x for x, _ in s.split] == [64, 64, 64, 64, 3]
    assert k._stream_share(0, 4, 1e-9) == 0.0 and k._stream_share(1, 4, math.inf) == math.inf
