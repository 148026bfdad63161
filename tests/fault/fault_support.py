"""Small programs and checks shared by the fault tier (test support lives in tests/, not the package)."""

from __future__ import annotations

import numpy as np

import prism
from prism.search import Limits

LIMITS = Limits(max_kernel_ops=1, time_limit=30, max_results=2)


def rms_linear() -> prism.Graph:
    """RMSNorm + Linear, small: searched in about a second."""
    g = prism.Graph("fault_rms_linear")
    X, W = g.input("X", ("n", 64)), g.input("W", (64, 32))
    g.output(g.matmul(g.rms_norm(X), W), "Y")
    return g


def inputs(n: int, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"X": rng.standard_normal((n, 64), dtype=np.float32), "W": rng.standard_normal((64, 32), dtype=np.float32)}


def assert_correct(g: prism.Graph, y: np.ndarray, x: dict[str, np.ndarray], rtol: float = 1e-4) -> None:
    """``y`` against the float64 reference: |y - r| <= rtol * (|r| + rms(r)) everywhere, all finite."""
    (name,) = g.output_names
    ref = g.evaluate({k: v.astype(np.float64) for k, v in x.items()}, dtype=np.float64)[name]
    assert y.shape == ref.shape and np.all(np.isfinite(y))
    scale = np.sqrt(np.mean(ref ** 2))
    assert np.max(np.abs(y - ref) / (np.abs(ref) + scale)) <= rtol


def run_once(n: int = 5) -> None:
    """Superoptimize :func:`rms_linear` and check one call (from a fresh process's point of view)."""
    from prism.api import clear_memory_caches
    clear_memory_caches()
    g = rms_linear()
    k = prism.superoptimize(g, limits=LIMITS, measure_machine=False)
    x = inputs(n)
    assert_correct(g, k(**x), x)
