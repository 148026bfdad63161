"""The runtime: disk cache (reuse, corruption, staleness, concurrency-safe layout), compile errors, and
every kind of bad call rejected before native code runs."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import numpy as np
import pytest
import torch
from cg_helpers import assert_close

import prism
from prism.codegen import generate
from prism.errors import CompileError, InputError, UnsupportedError
from prism.runtime import cache
from prism.runtime.kernel import num_threads
from prism.workloads import WORKLOADS

pytestmark = pytest.mark.cpu


def small_graph(scale: float = 0.5) -> prism.Graph:
    """Y = silu(X @ W) * scale with a symbolic batch dim (``scale`` makes distinct sources)."""
    g = prism.Graph("small")
    X, W = g.input("X", ("n", 32)), g.input("W", (32, 48))
    g.output(g.mul_scalar(g.silu(g.matmul(X, W)), scale), "Y")
    return g


def reference(x: np.ndarray, w: np.ndarray, scale: float = 0.5) -> np.ndarray:
    z = x.astype(np.float64) @ w.astype(np.float64)
    return z / (1 + np.exp(-z)) * scale


@pytest.fixture
def fresh_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("PRISM_CACHE_DIR", str(tmp_path))
    cache._LOADED.clear()
    cache.reset_stats()
    return tmp_path


@pytest.fixture
def xw(rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    return rng.standard_normal((5, 32)).astype(np.float32), rng.standard_normal((32, 48)).astype(np.float32)


# --- cache ---------------------------------------------------------------------------------------

def _damage(path: Path, data: bytes) -> None:
    """Replace a cache file (new inode, like another process would): overwriting in place would also
    corrupt the copy this process has already mapped."""
    tmp = path.with_name(path.name + ".damaged")
    tmp.write_bytes(data)
    tmp.replace(path)


def _entry(root: Path) -> tuple[Path, Path, Path]:
    (so,) = root.glob("so/*/*.so")
    return so.with_suffix(".c"), so, so.with_suffix(".json")


def test_second_compile_hits_the_disk_cache(fresh_cache: Path, xw) -> None:
    x, w = xw
    prism.compile(small_graph())(X=x, W=w)
    assert (cache.STATS.misses, cache.STATS.hits) == (1, 0)
    src, so, meta = _entry(fresh_cache)
    assert src.read_text().startswith("/* prism generated code")
    assert json.loads(meta.read_text())["size"] == so.stat().st_size
    cache._LOADED.clear()  # as a new process would: nothing loaded yet
    y = prism.compile(small_graph())(X=x, W=w)
    assert (cache.STATS.misses, cache.STATS.hits, cache.STATS.rebuilds) == (1, 1, 0)
    assert_close(y, reference(x, w), "cached kernel")


def test_same_process_reuses_the_loaded_library(fresh_cache: Path, xw) -> None:
    x, w = xw
    prism.compile(small_graph())(X=x, W=w)
    prism.compile(small_graph())(X=x, W=w)
    assert cache.STATS.misses == 1 and cache.STATS.memo_hits == 1 and cache.STATS.loads == 1


@pytest.mark.parametrize("damage", ["truncate_so", "garbage_so", "stale_sidecar", "missing_sidecar"])
def test_corrupt_or_stale_entry_is_rebuilt(fresh_cache: Path, xw, damage: str) -> None:
    x, w = xw
    prism.compile(small_graph())(X=x, W=w)
    _, so, meta = _entry(fresh_cache)
    if damage == "truncate_so":
        _damage(so, so.read_bytes()[: so.stat().st_size // 2])
    elif damage == "garbage_so":
        _damage(so, b"\x7fELF not really" * 100)
    elif damage == "stale_sidecar":
        m = json.loads(meta.read_text())
        m["sha256"] = "0" * 64
        _damage(meta, json.dumps(m).encode())
    else:
        meta.unlink()
    cache._LOADED.clear()
    y = prism.compile(small_graph())(X=x, W=w)
    assert cache.STATS.rebuilds == 1 and cache.STATS.misses == 2
    assert_close(y, reference(x, w), f"rebuilt after {damage}")
    _, so2, meta2 = _entry(fresh_cache)
    assert json.loads(meta2.read_text())["size"] == so2.stat().st_size


def test_an_entry_that_fails_to_load_is_rebuilt(fresh_cache: Path, xw) -> None:
    """A .so whose sidecar matches but that dlopen rejects (e.g. written by a broken toolchain). The
    entry is forged for a source this process never loaded (dlopen would reuse a loaded path)."""
    x, w = xw
    source = generate(small_graph(0.125).instantiate({"n": 5})).source
    key = cache.cache_key(source)
    _, so, meta = cache._paths(key)
    so.parent.mkdir(parents=True)
    so.write_bytes(b"not a shared object")
    meta.write_text(json.dumps({"key": key, "size": so.stat().st_size, "sha256": cache._sha256(so)}))
    y = prism.compile(small_graph(0.125))(X=x, W=w)
    assert cache.STATS.hits == 1 and cache.STATS.rebuilds == 1
    assert_close(y, reference(x, w, 0.125), "rebuilt after a failed load")


def _gcc() -> bool:
    return cache._is_gcc(tuple(cache.compiler()))


@pytest.mark.skipif(not _gcc(), reason="precompiled headers are used with gcc only")
def test_precompiled_headers_change_nothing_in_the_shared_object(fresh_cache: Path, xw,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    x, w = xw
    y = prism.compile(small_graph(0.375))(X=x, W=w)
    _, so, meta = _entry(fresh_cache)
    used = json.loads(meta.read_text())["precompiled_header"]
    assert used and Path(used).is_file() and Path(used + ".gch").stat().st_size > 0
    assert Path(used).read_text() in so.with_suffix(".c").read_text()  # the source includes them itself
    with_pch = so.read_bytes()
    monkeypatch.setenv("PRISM_PCH", "0")
    monkeypatch.setenv("PRISM_CACHE_DIR", str(fresh_cache / "other"))
    cache._LOADED.clear()
    assert cache.precompiled_header() is None
    prism.compile(small_graph(0.375))(X=x, W=w)
    _, so2, meta2 = _entry(fresh_cache / "other")
    assert json.loads(meta2.read_text())["precompiled_header"] is None
    assert so2.read_bytes() == with_pch  # gcc's output is the same byte for byte
    assert_close(y, reference(x, w, 0.375), "compiled with the precompiled header")


@pytest.mark.skipif(not _gcc(), reason="precompiled headers are used with gcc only")
def test_a_damaged_precompiled_header_is_dropped_and_the_compile_still_works(fresh_cache: Path, xw) -> None:
    x, w = xw
    header = cache.precompiled_header()
    assert header is not None
    gch = Path(str(header) + ".gch")
    _damage(gch, gch.read_bytes()[:100_000])  # truncated: gcc stops with "cannot read PCH file"
    y = prism.compile(small_graph(0.625))(X=x, W=w)
    assert_close(y, reference(x, w, 0.625), "compiled without the damaged header")
    _, _, meta = _entry(fresh_cache)
    assert json.loads(meta.read_text())["precompiled_header"] is None
    assert not gch.exists() and cache.precompiled_header() is None  # dropped in this process
    cache._PCH.clear()                                              # a new process builds it again
    assert cache.precompiled_header() == header and gch.stat().st_size > 100_000


def test_concurrent_compiles_of_one_source_agree(fresh_cache: Path, xw) -> None:
    x, w = xw
    results: list[np.ndarray] = []
    errors: list[BaseException] = []

    def work() -> None:
        try:
            results.append(prism.compile(small_graph(0.25))(X=x, W=w))
        except BaseException as e:  # pragma: no cover - reported below
            errors.append(e)
    threads = [threading.Thread(target=work) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert cache.STATS.misses == 1
    for y in results:
        assert_close(y, reference(x, w, 0.25), "concurrent compile")
    assert not list(fresh_cache.glob("so/*/*.tmp*")), "temporary files left behind"


def test_compile_failure_names_the_source_and_the_compiler_message(fresh_cache: Path) -> None:
    with pytest.raises(CompileError) as e:
        cache.load("int broken( { this is not C }\n")
    msg = str(e.value)
    (src,) = fresh_cache.glob("so/*/*.c")
    assert str(src) in msg and "error" in msg.lower() and "command:" in msg
    assert not list(fresh_cache.glob("so/*/*.so")), "no shared object for a failed compile"


def test_missing_compiler_is_a_clear_error(fresh_cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PRISM_CC", "/nonexistent/cc")
    with pytest.raises(CompileError, match="PRISM_CC"):
        prism.compile(small_graph(0.75)).specialize(n=3)


# --- calling -------------------------------------------------------------------------------------

def test_symbolic_batch_compiles_per_size_and_exposes_source(xw) -> None:
    x, w = xw
    k = prism.compile(small_graph())
    with pytest.raises(InputError, match="specialize"):
        _ = k.source
    assert_close(k(X=x, W=w), reference(x, w), "n=5")
    assert "prism_entry" in k.source
    x2 = np.ascontiguousarray(np.concatenate([x, x]))
    assert_close(k(X=x2, W=w), reference(x2, w), "n=10")
    with pytest.raises(InputError, match="2 compiled variants"):
        _ = k.source
    assert "prism_entry" in k.specialize(n=10).source


def test_torch_in_torch_out_and_zero_copy_out(xw) -> None:
    x, w = xw
    k = prism.compile(small_graph())
    y = k(X=torch.from_numpy(x), W=torch.from_numpy(w))
    assert isinstance(y, torch.Tensor) and y.dtype == torch.float32
    assert_close(y.numpy(), reference(x, w), "torch")
    out = torch.empty(5, 48)
    assert k.call({"X": torch.from_numpy(x), "W": w}, out=out) is out
    assert_close(out.numpy(), reference(x, w), "torch out")
    buf = np.full((5, 48), np.nan, np.float32)
    assert k.call({"X": x, "W": w}, out=buf) is buf
    assert_close(buf, reference(x, w), "numpy out")


def test_several_outputs_come_back_as_a_dict(rng: np.random.Generator) -> None:
    g = prism.Graph()
    X = g.input("X", (4, 8))
    g.output(g.exp(X), "E")
    g.output(g.sum(X, -1), "S")
    g.output(X, "X_copy")
    x = rng.standard_normal((4, 8)).astype(np.float32)
    out = prism.compile(g)(X=x)
    assert set(out) == {"E", "S", "X_copy"}
    assert_close(out["E"], np.exp(x.astype(np.float64)), "E")
    assert_close(out["S"], x.astype(np.float64).sum(-1, keepdims=True), "S")
    assert np.array_equal(out["X_copy"], x) and out["X_copy"].ctypes.data != x.ctypes.data


def test_missing_params_are_rejected_at_compile_time() -> None:
    w = WORKLOADS["W1"]
    with pytest.raises(UnsupportedError, match=r"\['F', 'G'\]"):
        prism.compile(w.hand_written(w.shapes[0]))
    with pytest.raises(UnsupportedError, match="bound from the input shapes"):
        prism.compile(w.hand_written(w.shapes[0]), params={**w.params(w.shapes[0]), "n": 8})


def _bad_calls(x: np.ndarray, w: np.ndarray) -> list[tuple[str, dict, str]]:
    return [
        ("wrong shape", {"X": x, "W": w[:16]}, r"input 'W': dim 0 must be 32"),
        ("wrong rank", {"X": x[0], "W": w}, r"input 'X': expected rank 2"),
        ("wrong dtype", {"X": x.astype(np.float64), "W": w}, r"input 'X': expected dtype float32, got float64"),
        ("missing input", {"X": x}, r"missing input\(s\) \['W'\]"),
        ("unknown input", {"X": x, "W": w, "Z": x}, r"unknown input\(s\) \['Z'\]"),
        ("non-contiguous", {"X": x, "W": np.asfortranarray(w)}, r"input 'W': the array is not C-contiguous"),
        ("torch non-contiguous", {"X": x, "W": torch.from_numpy(w.T.copy()).T}, r"input 'W': the tensor is not "
                                                                                  "contiguous"),
        ("torch dtype", {"X": torch.from_numpy(x).double(), "W": w}, r"input 'X': expected dtype torch.float32"),
        ("not an array", {"X": x.tolist(), "W": w}, r"input 'X': expected a numpy.ndarray or a torch.Tensor"),
    ]


@pytest.mark.parametrize("case", range(9), ids=[c[0] for c in _bad_calls(np.zeros((5, 32)), np.zeros((32, 48)))])
def test_bad_call_is_rejected_before_native_code_runs(xw, case: int) -> None:
    x, w = xw
    k = prism.compile(small_graph())
    k(X=x, W=w)  # compiled; the sentinel output below must stay untouched by a rejected call
    what, inputs, match = _bad_calls(x, w)[case]
    sentinel = np.full((5, 48), 7.0, np.float32)
    with pytest.raises(InputError, match=match):
        k.call(inputs, out=sentinel)
    assert np.all(sentinel == 7.0), f"{what}: native code ran"


def test_bad_output_buffers_are_rejected(xw) -> None:
    x, w = xw
    k = prism.compile(small_graph())
    with pytest.raises(InputError, match=r"output 'Y': expected shape \(5, 48\), got \(5, 47\)"):
        k.call({"X": x, "W": w}, out=np.empty((5, 47), np.float32))
    with pytest.raises(InputError, match="read-only"):
        ro = np.empty((5, 48), np.float32)
        ro.flags.writeable = False
        k.call({"X": x, "W": w}, out=ro)
    big = np.zeros(5 * 48 + 32 * 48, np.float32)
    with pytest.raises(InputError, match="overlaps input 'W'"):
        k.call({"X": x, "W": big[240:].reshape(32, 48)}, out=big[200:440].reshape(5, 48))
    with pytest.raises(InputError, match="missing"):
        k.call({"X": x, "W": w}, out={})


def test_thread_count_from_environment(xw, monkeypatch: pytest.MonkeyPatch) -> None:
    x, w = xw
    k = prism.compile(small_graph())
    ref = reference(x, w)
    for n in ("1", "2", "3"):
        monkeypatch.setenv("PRISM_NUM_THREADS", n)
        assert num_threads(99) == int(n)
        assert_close(k(X=x, W=w), ref, f"{n} threads")
    monkeypatch.setenv("PRISM_NUM_THREADS", "zero")
    with pytest.raises(InputError, match="PRISM_NUM_THREADS must be a positive integer"):
        k(X=x, W=w)
    monkeypatch.delenv("PRISM_NUM_THREADS")
    assert num_threads(5) == 5


def test_params_may_depend_on_the_bound_batch_dims(rng: np.random.Generator) -> None:
    w = WORKLOADS["W1"]
    s = w.shapes[0]
    seen: list[dict] = []

    def params(env: dict[str, int]) -> dict[str, int]:
        seen.append(dict(env))
        return {"G": 4 if env["n"] < 8 else 8, "F": 2}
    k = prism.compile(w.hand_written(s), params=params)
    for n in (4, 8):
        x = {"X": rng.standard_normal((n, s["d"])).astype(np.float32),
             "W": rng.standard_normal((s["d"], s["m"])).astype(np.float32)}
        (ref,) = w.program(s).evaluate(x, dtype=np.float64).values()
        assert_close(k(**x), ref, f"n={n}")
    assert seen == [{"n": 4}, {"n": 8}]
    assert "grid=(4,)" in k.specialize(n=4).source and "grid=(8,)" in k.specialize(n=8).source


def test_unsupported_dtype_is_a_clear_error() -> None:
    g = prism.Graph()
    g.output(g.exp(g.input("X", (4,), "float64")), "Y")
    with pytest.raises(UnsupportedError, match="no float64 path"):
        prism.compile(g)
