"""The reference interpreter runs NumPy's BLAS on one thread (prism/reference/kernel.py: spinning OpenBLAS workers
slowed the Prism kernels timed after a reference 2.5x on a 2-core machine), and restores the pool afterwards."""

from __future__ import annotations

import numpy as np
import pytest

import prism
import prism.reference.kernel as RK

pytestmark = pytest.mark.unit

threadpoolctl = pytest.importorskip("threadpoolctl")


def _blas_threads() -> list[int]:
    return [i["num_threads"] for i in threadpoolctl.threadpool_info() if i["user_api"] == "blas"]


def test_the_reference_runs_blas_on_one_thread_and_restores_it(monkeypatch: pytest.MonkeyPatch) -> None:
    before = _blas_threads()
    if not before:
        pytest.skip("NumPy reports no BLAS thread pool here")
    seen: list[list[int]] = []
    real = RK.apply

    def spy(*a: object, **k: object) -> object:
        seen.append(_blas_threads())
        return real(*a, **k)

    monkeypatch.setattr(RK, "apply", spy)
    g = prism.Graph("mm")
    A, B = g.input("A", (64, 64)), g.input("B", (64, 64))
    g.output(g.matmul(A, B), "C")
    a = np.random.default_rng(0).standard_normal((64, 64)).astype(np.float32)
    out = g.evaluate({"A": a, "B": a}, dtype=np.float64)["C"]
    assert np.allclose(out, a.astype(np.float64) @ a.astype(np.float64))
    assert seen and all(all(n == 1 for n in s) for s in seen)
    assert _blas_threads() == before


def test_a_blas_library_loaded_later_is_limited_too(monkeypatch: pytest.MonkeyPatch) -> None:
    """The controller is made again when modules were imported since (SciPy's own OpenBLAS, loaded by JAX
    after the first reference ran, kept 2 threads)."""
    import sys
    import types

    with RK._one_blas_thread():
        pass
    first = RK._BLAS[0]
    with RK._one_blas_thread():
        pass
    assert RK._BLAS[0] is first  # nothing imported: the same controller (made once: 0.5 ms)
    monkeypatch.setitem(sys.modules, "prism_test_new_module", types.ModuleType("prism_test_new_module"))
    with RK._one_blas_thread():
        assert RK._BLAS[0] is not first
        assert all(n == 1 for n in _blas_threads())


@pytest.mark.parametrize("a_shape,b_shape", [
    ((37, 16), (16, 9)),              # M cut (B whole: its rows are K)
    ((3, 37, 16), (3, 16, 9)),        # the batch cut in both
    ((1, 5, 37, 16), (1, 5, 16, 9)),  # a batch of 1 first: the next axis
    ((1, 37, 16), (4, 16, 9)),        # A broadcast over the batch
    ((4, 37, 16), (16, 9)),           # B 2-D under a batched A
    ((37, 16), (16, 16)),             # K == M: B still whole
])
def test_a_large_product_runs_in_blocks_equal_to_one_call(monkeypatch: pytest.MonkeyPatch, a_shape: tuple,
                                                          b_shape: tuple) -> None:
    """numpy_ops: a product over PARALLEL_MIN_FLOPS runs on every core in blocks of the output's first axis with a
    block per worker (threads of NumPy matmuls into parts of one output): the whole call's result, to the last
    bits of float64 (the BLAS may take a block's edge rows by another kernel: measured at most 4 ulps)."""
    from prism.reference import numpy_ops as N
    monkeypatch.setattr(N, "PARALLEL_MIN_FLOPS", 0)
    monkeypatch.setattr(N, "usable_cores", lambda: 2)
    calls: list[tuple] = []
    real = N._product_in_parts
    monkeypatch.setattr(N, "_product_in_parts", lambda *a: calls.append(a[3:]) or real(*a))
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal(a_shape), rng.standard_normal(b_shape)
    got = N.apply("matmul", [a, b], ())
    assert len(calls) == 1 and got.shape == np.matmul(a, b).shape
    ref = np.matmul(a, b)
    assert np.max(np.abs(got - ref)) <= 8 * np.finfo(np.float64).eps * np.max(np.abs(ref)), calls
    monkeypatch.setattr(N, "PARALLEL_MIN_FLOPS", 2 * a.size * b.shape[-1] * 8)   # below it: one call
    assert np.array_equal(N.apply("matmul", [a, b], ()), np.matmul(a, b)) and len(calls) == 1


def test_a_composite_step_in_a_pool_thread_runs_whole(monkeypatch: pytest.MonkeyPatch) -> None:
    """What runs in the reference pool's threads is not cut again (no waiting on the pool from inside it)."""
    from prism.reference import numpy_ops as N
    monkeypatch.setattr(N, "PARALLEL_MIN_FLOPS", 0)
    monkeypatch.setattr(N, "usable_cores", lambda: 2)
    a, b = np.ones((8, 4)), np.ones((4, 3))
    assert N._product_parts(a, b) is not None
    assert N._pool().submit(N._product_parts, a, b).result() is None
