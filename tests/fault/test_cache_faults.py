"""Damaged, edited, unwritable and abandoned caches (issue 12, items 2, 3, 5 and the kill -9 line).

Every cache entry that cannot be read, decoded, parsed or checksum-verified is corrupt: rebuilt with one
``CacheWarning``. A cached search result is proved again before it is served. A cache directory that
cannot be written is replaced by a private temporary one, with one warning.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest
from fault_support import LIMITS, rms_linear, run_once

import prism
from prism.api import clear_memory_caches
from prism.errors import CacheWarning
from prism.runtime import cache, store
from prism.tune import STATS, reset_stats

HERE = Path(__file__).parent
REPO = HERE.parent.parent


def _cache_warnings(rec: list[warnings.WarningMessage]) -> list[str]:
    return [str(w.message) for w in rec if issubclass(w.category, CacheWarning)]


def _one(root: Path, pattern: str) -> Path:
    (p,) = sorted(root.glob(pattern))
    return p


def test_undecodable_tuning_entry_is_rebuilt_with_one_warning(_fresh_cache: Path) -> None:
    run_once()
    entry = _one(_fresh_cache, "tune/results/*/*.json")
    entry.write_bytes(b"\xff\xfe")
    reset_stats()
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        run_once()
    msgs = _cache_warnings(rec)
    assert len(msgs) == 1 and "corrupt" in msgs[0] and str(entry) in msgs[0]
    assert STATS.rebuilds == 1 and STATS.tunings == 1
    assert store.load(entry, "tuning").payload is not None   # written again, whole


def test_undecodable_machine_entry_is_rebuilt(_fresh_cache: Path) -> None:
    from prism.tune import machine as M
    M._MEMO.clear()
    M.detect(True)
    entry = _one(_fresh_cache, "tune/machine/*.json")
    entry.write_bytes(b"\xff\xfe")
    M._MEMO.clear()
    reset_stats()
    with pytest.warns(CacheWarning, match="corrupt"):
        m = M.detect(True)
    assert m.measured and STATS.machine_measurements == 1 and STATS.rebuilds == 1
    assert store.load(entry, "machine").payload is not None
    M._MEMO.clear()


@pytest.mark.parametrize("damage", [b"\xff\xfe", b"{not json", b""])
def test_damaged_search_entry_is_searched_again(_fresh_cache: Path, damage: bytes) -> None:
    run_once()
    entry = _one(_fresh_cache, "search/*.json")
    entry.write_bytes(damage)
    reset_stats()
    with pytest.warns(CacheWarning, match="corrupt"):
        run_once()
    assert STATS.searches == 1 and STATS.search_cache_hits == 0
    assert store.load(entry, "search").payload is not None


def _edit_eps(entry: Path, fix_checksum: bool) -> None:
    """Change the rms epsilon of every cached candidate (not the program) so that the file still parses."""
    edits = 0

    def walk(x: object) -> object:
        nonlocal edits
        if isinstance(x, float) and x == 1e-06:
            edits += 1
            return 1.0000001e-06
        if isinstance(x, list):
            return [walk(v) for v in x]
        if isinstance(x, dict):
            return {k: walk(v) for k, v in x.items()}
        return x
    d = json.loads(entry.read_text())
    for c in d["payload"]["candidates"]:
        c["graph"] = walk(c["graph"])
    assert edits
    if fix_checksum:
        d["sha256"] = store.digest(d["payload"])
    entry.write_text(json.dumps(d))


def test_edited_search_entry_fails_its_checksum(_fresh_cache: Path) -> None:
    run_once()
    _edit_eps(_one(_fresh_cache, "search/*.json"), fix_checksum=False)
    reset_stats()
    with pytest.warns(CacheWarning, match="checksum mismatch"):
        run_once()
    assert STATS.searches == 1


def test_edited_search_entry_with_a_valid_checksum_is_proved_again_and_dropped(_fresh_cache: Path) -> None:
    """The structure is re-proved on load: an entry edited consistently (checksum recomputed) no longer
    proves, so it is dropped and searched again, and what is served is verified."""
    run_once()
    _edit_eps(_one(_fresh_cache, "search/*.json"), fix_checksum=True)
    reset_stats()
    clear_memory_caches()
    with pytest.warns(CacheWarning, match="no longer proves"):
        k = prism.superoptimize(rms_linear(), limits=LIMITS, measure_machine=False)
    assert STATS.searches == 1 and not k.search_result.cached
    for impl in k.implementations:
        assert prism.verify(impl.graph, rms_linear()).verified


def test_cache_key_covers_the_verifier() -> None:
    from prism.search import driver
    from prism.verify.egraph import rules_fingerprint
    assert rules_fingerprint() in driver._verifier_key()
    path = driver._cache_path(rms_linear(), LIMITS, "symbolic", {"n": 8}, driver.DEFAULT_AXIOMS)
    rules_fingerprint.cache_clear()
    try:
        with pytest.MonkeyPatch.context() as mp:   # another egglog version: another key
            mp.setattr("importlib.metadata.version", lambda name: "0.0-other")
            assert driver._cache_path(rms_linear(), LIMITS, "symbolic", {"n": 8}, driver.DEFAULT_AXIOMS) != path
    finally:
        rules_fingerprint.cache_clear()


def test_damaged_kernel_sidecar_is_rebuilt(_fresh_cache: Path) -> None:
    run_once()
    for meta in (_fresh_cache / "so").rglob("*.json"):
        meta.write_bytes(b"\xff\xfe")
    cache._LOADED.clear()
    cache.reset_stats()
    with pytest.warns(CacheWarning, match="damaged or stale"):
        run_once()
    assert cache.STATS.rebuilds >= 1 and cache.STATS.hits == 0


def test_damaged_precompiled_header_is_dropped_and_rebuilt(_fresh_cache: Path) -> None:
    run_once()
    gch = _one(_fresh_cache, "pch/*/*.gch")
    header = gch.with_suffix("")
    with open(gch, "r+b") as f:   # same size, damaged in the middle: gcc would ignore it silently
        f.seek(gch.stat().st_size // 2)
        f.write(b"\xff\xfe garbage")
    shutil.rmtree(_fresh_cache / "so")
    cache._LOADED.clear()
    cache._PCH.clear()
    with pytest.warns(CacheWarning, match="precompiled header"):
        run_once(7)
    header.write_bytes(b"\xff\xfe")                  # the text beside it damaged too
    shutil.rmtree(_fresh_cache / "so")
    cache._LOADED.clear()
    cache._PCH.clear()
    with pytest.warns(CacheWarning, match="precompiled header"):
        run_once(9)
    assert cache.precompiled_header() is not None


# --- an unwritable cache directory ----------------------------------------------------------------------

def test_cache_dir_that_cannot_be_created_falls_back_with_one_warning(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    monkeypatch.setenv("PRISM_CACHE_DIR", str(blocker / "cache"))
    reset_stats()
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        run_once()
        run_once(7)
    msgs = _cache_warnings(rec)
    assert len(msgs) == 1 and "PRISM_CACHE_DIR" in msgs[0] and str(blocker / "cache") in msgs[0]
    fb = cache.fallback_dir()
    assert fb is not None and fb.is_dir() and not str(fb).startswith(str(blocker))
    assert STATS.searches == 1 and STATS.search_cache_hits == 1   # the second run read the stand-in


def _unshare_works() -> bool:
    if shutil.which("unshare") is None:
        return False
    r = subprocess.run(["unshare", "-rm", "sh", "-c", "mount --bind -o ro / / 2>/dev/null; true"],
                       capture_output=True, timeout=30)
    return r.returncode == 0


_CHILD = """
import warnings, json
warnings.simplefilter("always")
from fault_support import run_once
from prism.tune import STATS
from prism.errors import CacheWarning
with warnings.catch_warnings(record=True) as rec:
    warnings.simplefilter("always")
    run_once(5)      # the shape tuned before the cache became read-only (if it was populated)
    run_once(7)      # a new shape
print(json.dumps({"stats": STATS.to_json(),
                  "warnings": [str(w.message) for w in rec if issubclass(w.category, CacheWarning)]}))
"""


def _run_read_only(cache_dir: Path) -> dict:
    script = f"mount --bind -o ro {cache_dir} {cache_dir} && exec {sys.executable} -c '{_CHILD}'"
    env = {**os.environ, "PRISM_CACHE_DIR": str(cache_dir), "PYTHONPATH": f"{HERE}{os.pathsep}{REPO}"}
    r = subprocess.run(["unshare", "-rm", "sh", "-c", script], capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not _unshare_works(), reason="needs `unshare -rm` to mount the cache read-only")
def test_read_only_cache_serves_cached_shapes_and_tunes_new_ones(_fresh_cache: Path) -> None:
    run_once(5)
    got = _run_read_only(_fresh_cache)
    s = got["stats"]
    assert s["searches"] == 0 and s["search_cache_hits"] == 2 and s["tune_cache_hits"] == 1 and s["tunings"] == 1
    assert len(got["warnings"]) == 1 and "Read-only file system" in got["warnings"][0]
    assert "PRISM_CACHE_DIR" in got["warnings"][0]


@pytest.mark.skipif(not _unshare_works(), reason="needs `unshare -rm` to mount the cache read-only")
def test_empty_read_only_cache_works(_fresh_cache: Path) -> None:
    _fresh_cache.mkdir(parents=True)
    got = _run_read_only(_fresh_cache)
    s = got["stats"]
    assert s["searches"] == 1 and s["tunings"] == 2 and len(got["warnings"]) == 1


# --- temporary files left by killed processes -----------------------------------------------------------

def _dead_pid() -> int:
    p = subprocess.Popen(["true"])
    p.wait()
    return p.pid


def test_stale_temporary_files_are_removed_on_the_next_start(_fresh_cache: Path) -> None:
    host = cache._HOST
    dead, live = _dead_pid(), os.getpid()
    d = _fresh_cache / "so" / "ab"
    d.mkdir(parents=True)
    stale = [d / f"x.so.{host}-{dead}.k3j2.tmp.so", _fresh_cache / f"search.{host}-{dead}.a1b2.tmp"]
    kept = d / f"y.so.{host}-{live}.q9w8.tmp.so"           # a live process is still writing it
    old = _fresh_cache / "z.json.tmp4242"                    # an older naming, abandoned two days ago
    for p in (*stale, kept, old):
        p.write_bytes(b"partial")
    two_days = time.time() - 2 * 86400
    os.utime(old, (two_days, two_days))
    cache._CLEANED.discard(str(_fresh_cache))
    run_once()
    assert not any(p.exists() for p in (*stale, old)) and kept.exists()


def test_kill_9_during_a_compile_leaves_nothing_behind(_fresh_cache: Path, tmp_path: Path) -> None:
    """A process killed while its compiler runs leaves a temporary .so; the next process removes it."""
    hang = tmp_path / "hanging-cc"
    hang.write_text('#!/bin/sh\ncase " $* " in *" -shared "*) exec sleep 120;; esac\nexec gcc "$@"\n')
    hang.chmod(0o755)
    env = {**os.environ, "PRISM_CACHE_DIR": str(_fresh_cache), "PRISM_CC": str(hang),
           "PYTHONPATH": f"{HERE}{os.pathsep}{REPO}"}
    child = subprocess.Popen([sys.executable, "-c", "from fault_support import run_once; run_once()"], env=env,
                             start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 300
        while not list(_fresh_cache.rglob("*.tmp*")):
            assert child.poll() is None and time.monotonic() < deadline, "the child never started a compile"
            time.sleep(0.1)
    finally:
        os.killpg(child.pid, 9)
        child.wait()
    left = list(_fresh_cache.rglob("*.tmp*"))
    assert left
    cache._CLEANED.discard(str(_fresh_cache))
    run_once()
    assert not any(p.exists() for p in left)



@pytest.mark.parametrize("damage", [b"\x00\xffnot json", b'{"x": 3}', b"[1, 2]", b'{"%s": [1, {"n": "big"}]}'])
def test_damaged_template_check_records_are_ignored(_fresh_cache: Path, damage: bytes) -> None:
    """A template's check record (``<cache>/checks/*.json``) that is garbage, of another program, or holds no
    usable shapes is ignored: the template's shapes are checked as if there were none, and the record is
    written again."""
    import numpy as np
    g = prism.Graph("softmax_matmul_fault_records")
    X, V = g.input("X", (8, "n")), g.input("V", ("n", 64))
    g.output(g.matmul(g.softmax(X, -1), V), "Y")
    rng = np.random.default_rng(0)

    def run(k: object, n: int) -> None:
        x = {"X": rng.standard_normal((8, n), dtype=np.float32), "V": rng.standard_normal((n, 64), dtype=np.float32)}
        ref = g.evaluate({a: v.astype(np.float64) for a, v in x.items()}, dtype=np.float64)["Y"]
        y = k(**x)  # type: ignore[operator]
        assert np.max(np.abs(y - ref)) <= 2e-4 * np.max(np.abs(ref))

    k = prism.superoptimize(g, limits=LIMITS, derive=True)
    for n in range(40, 46):
        run(k, n)
    records = sorted((_fresh_cache / "checks").glob("*.json"))
    assert records
    key = g.key
    for p in records:
        p.write_bytes(damage.replace(b"%s", key.encode()))
    clear_memory_caches()
    reset_stats()
    k2 = prism.superoptimize(g, limits=LIMITS, derive=True)
    for n in range(40, 46):
        run(k2, n)
    assert STATS.template_checks_recorded == 0 and STATS.final_checks >= 1
    assert all(json.loads(p.read_text()).get(key) for p in records)
