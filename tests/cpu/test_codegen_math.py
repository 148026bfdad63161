"""The vectorized math of the generated code against numpy in float64 (docs/codegen.md quotes these
bounds): exp within 1 ulp over its whole normal range, tanh and sigmoid within 3 ulp, special values."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

import prism
from prism.codegen.prelude import EXP_POLY, fit_exp_poly

pytestmark = pytest.mark.cpu

F32 = np.finfo(np.float32)


@pytest.fixture(scope="module")
def lib() -> ctypes.CDLL:
    g = prism.Graph()
    g.output(g.exp(g.input("X", (16,))), "Y")
    return prism.compile(g).specialize().lib


def run(lib: ctypes.CDLL, fn: str, x: np.ndarray) -> np.ndarray:
    x = np.ascontiguousarray(x, np.float32)
    y = np.empty_like(x)
    getattr(lib, fn)(ctypes.c_void_p(x.ctypes.data), ctypes.c_void_p(y.ctypes.data), ctypes.c_long(x.size))
    return y


def float_sweep(lo: float, hi: float, step: int = 997) -> np.ndarray:
    """Every ``step``-th float32 in [lo, hi] (by bit pattern), both signs handled."""
    out = []
    for bound, sign in ((hi, 1.0), (-lo, -1.0)):
        if bound > 0:
            bits = np.arange(0, np.float32(bound).view(np.int32), step, dtype=np.int32)
            out.append(sign * bits.view(np.float32))
    return np.concatenate(out)


def ulp_error(y: np.ndarray, ref: np.ndarray) -> np.ndarray:
    return np.abs(y.astype(np.float64) - ref) / np.spacing(np.abs(ref).astype(np.float32)).astype(np.float64)


def test_exp_within_one_ulp(lib: ctypes.CDLL) -> None:
    x = float_sweep(-104.0, 89.0)
    y = run(lib, "prism_test_exp", x)
    ref = np.exp(x.astype(np.float64))
    normal = (ref >= F32.tiny) & (ref <= float(F32.max))
    assert ulp_error(y[normal], ref[normal]).max() < 1.0
    sub = ref < F32.tiny  # subnormal results: within one unit of the smallest subnormal
    assert np.abs(y[sub] - ref[sub]).max() <= 2.0 ** -149
    assert np.all(np.isinf(y[ref > float(F32.max)]))


def test_exp_special_values(lib: ctypes.CDLL) -> None:
    x = np.array([0, -np.inf, np.inf, np.nan, -105, -1e30, 89, 1e30, 88.72283935546875, 88.7228], np.float32)
    y = run(lib, "prism_test_exp", x)
    assert y[0] == 1.0 and y[1] == 0.0 and y[2] == np.inf and np.isnan(y[3])
    assert y[4] == 0.0 and y[5] == 0.0 and y[6] == np.inf and y[7] == np.inf
    assert y[8] == np.inf and np.isfinite(y[9])  # the overflow threshold, as numpy's float32 exp


def test_tanh_and_sigmoid_within_three_ulp(lib: ctypes.CDLL) -> None:
    x = float_sweep(-20.0, 20.0)
    t = run(lib, "prism_test_tanh", x)
    ref = np.tanh(x.astype(np.float64))
    nz = ref != 0
    assert ulp_error(t[nz], ref[nz]).max() < 3.0
    assert np.all(t[x == 0] == 0)
    xs = float_sweep(-87.0, 87.0)
    s = run(lib, "prism_test_sigmoid", xs)
    sref = 1 / (1 + np.exp(-xs.astype(np.float64)))
    big = sref > F32.tiny
    assert ulp_error(s[big], sref[big]).max() < 3.0
    ext = run(lib, "prism_test_sigmoid", np.array([-np.inf, np.inf, -200, 200], np.float32))
    assert list(ext) == [0.0, 1.0, 0.0, 1.0]
    assert list(run(lib, "prism_test_tanh", np.array([-np.inf, np.inf, -30, 30], np.float32))) == [-1, 1, -1, 1]


def test_exp_polynomial_is_reproducible() -> None:
    """The coefficients in the prelude are what the documented fit produces."""
    assert fit_exp_poly() == EXP_POLY
