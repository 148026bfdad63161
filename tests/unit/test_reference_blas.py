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
