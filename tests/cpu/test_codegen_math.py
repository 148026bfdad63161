"""The vectorized math of the generated code against numpy in float64 (docs/codegen.md quotes these
bounds): exp within 1 ulp over its whole normal range, tanh and sigmoid within 3 ulp, special values."""

from __future__ import annotations

import ctypes
import math

import numpy as np
import pytest

import prism
from prism.codegen.prelude import EXP_POLY, fit_exp_poly, prelude
from prism.runtime.cache import load

pytestmark = pytest.mark.cpu

F32 = np.finfo(np.float32)
MATH_FUNCTIONS = ("exp", "exp_le0", "log1p_01", "tanh", "sigmoid", "expm1", "log", "log1p", "softplus", "erf", "gelu",
                  "sin", "cos")


def math_test_source(names: tuple[str, ...] = MATH_FUNCTIONS) -> str:
    """The prelude plus ``prism_test_<name>(x, y, n)``: ``y[i] = pr_<name>(x[i])`` in a ``#pragma omp simd``
    loop (vectorized as in a kernel), one exported function per name. Only these tests compile it: in every
    kernel's source the hooks made each compile 4-5x slower (gcc 12 -O3: 0.74-0.90 s against 0.18-0.24 s
    for a tiny-Llama piece)."""
    hooks = "\n".join(f"void prism_test_{n}(const float* x, float* y, long n) {{\n  #pragma omp simd\n"
                      f"  for (long i = 0; i < n; i++) y[i] = pr_{n}(x[i]);\n}}" for n in names)
    return f"{prelude()}\n/* test hooks: the vectorized math on whole arrays (checked against float64) */\n{hooks}\n"


@pytest.fixture(scope="module")
def lib() -> ctypes.CDLL:
    """The prelude with one exported ``prism_test_<fn>`` array loop per math function, compiled like a kernel
    (same flags, same runtime cache)."""
    names = tuple(f"prism_test_{n}" for n in MATH_FUNCTIONS)
    return load(math_test_source(), names)[0]


def test_kernels_do_not_carry_the_math_test_hooks() -> None:
    """A kernel's source is the prelude and its body: the test hooks above are compiled only here (they made
    every kernel's compile several times slower)."""
    g = prism.Graph()
    g.output(g.exp(g.input("X", (16,))), "Y")
    v = prism.compile(g).specialize()
    assert "prism_test_" not in v.source
    assert not hasattr(v.lib, "prism_test_exp")


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


# --- the math the operators of prism/ir/elementwise.py call (bounds quoted in docs/codegen.md) -----------

_erf = np.vectorize(math.erf, otypes=[np.float64])
_erfc = np.vectorize(math.erfc, otypes=[np.float64])


def _ulp_max(lib: ctypes.CDLL, fn: str, x: np.ndarray, ref: np.ndarray) -> float:
    y = run(lib, fn, x)
    ok = np.isfinite(ref) & (np.abs(ref) >= F32.tiny)
    return float(ulp_error(y[ok], ref[ok]).max())


def test_log_within_one_ulp(lib: ctypes.CDLL) -> None:
    x = float_sweep(0.0, 3.0e38, step=4093)
    x = np.concatenate([x[x > 0], float_sweep(0, 2.0 ** -126, step=977)[1:]])  # normals and subnormals
    x = np.abs(x)
    assert _ulp_max(lib, "prism_test_log", x, np.log(x.astype(np.float64))) < 1.0
    sp = run(lib, "prism_test_log", np.array([0, -0.0, -1, np.inf, -np.inf, np.nan, 1], np.float32))
    assert sp[0] == -np.inf and sp[1] == -np.inf and np.isnan(sp[2]) and sp[3] == np.inf
    assert np.isnan(sp[4]) and np.isnan(sp[5]) and sp[6] == 0.0


def test_log1p_expm1_softplus(lib: ctypes.CDLL) -> None:
    x = float_sweep(-0.999, 1e30, step=2039)
    assert _ulp_max(lib, "prism_test_log1p", x, np.log1p(x.astype(np.float64))) < 2.5
    x = float_sweep(-100.0, 88.7, step=1021)
    assert _ulp_max(lib, "prism_test_expm1", x, np.expm1(x.astype(np.float64))) < 2.0
    x64 = float_sweep(-100.0, 100.0, step=1021).astype(np.float64)
    ref = np.where(x64 > 20, x64, np.logaddexp(0, x64))
    assert _ulp_max(lib, "prism_test_softplus", x64.astype(np.float32), ref) < 3.0
    sp = run(lib, "prism_test_log1p", np.array([-1, -2, np.inf, np.nan, 0, -0.0], np.float32))
    assert sp[0] == -np.inf and np.isnan(sp[1]) and sp[2] == np.inf and np.isnan(sp[3]) and sp[4] == 0
    em = run(lib, "prism_test_expm1", np.array([-np.inf, np.inf, np.nan, 89, -1e30, 88.7], np.float32))
    assert em[0] == -1 and em[1] == np.inf and np.isnan(em[2]) and em[3] == np.inf and em[4] == -1
    assert np.isfinite(em[5])


def test_erf_and_exact_gelu(lib: ctypes.CDLL) -> None:
    x = float_sweep(-6.0, 6.0, step=257)
    assert _ulp_max(lib, "prism_test_erf", x, _erf(x.astype(np.float64))) < 3.0
    sp = run(lib, "prism_test_erf", np.array([0, -0.0, np.inf, -np.inf, np.nan, 1e-40], np.float32))
    assert sp[0] == 0 and sp[2] == 1 and sp[3] == -1 and np.isnan(sp[4]) and sp[5] == np.float32(1e-40) * 0 + sp[5]
    x64 = float_sweep(-12.0, 12.0, step=257).astype(np.float64)
    ref = 0.5 * x64 * _erfc(-x64 / math.sqrt(2))
    # relative to the value: gelu tends to 0 for x -> -inf; the erfc form keeps the relative error bounded
    assert _ulp_max(lib, "prism_test_gelu", x64.astype(np.float32), ref) < 6.0


def test_sin_cos(lib: ctypes.CDLL) -> None:
    x = float_sweep(-1e6, 1e6, step=1031)
    x64 = x.astype(np.float64)
    for fn, ref in (("prism_test_sin", np.sin(x64)), ("prism_test_cos", np.cos(x64))):
        y = run(lib, fn, x).astype(np.float64)
        # absolute 2^-24 * max(1, |x| / 1e4) near the zeros (ulp of the result is meaningless there), else 2 ulp
        ulp = ulp_error(y, ref)
        absolute = np.abs(y - ref) <= 2.0 ** -24 * 1.0
        assert np.all((ulp < 2.0) | absolute), (fn, float(ulp[~absolute].max()))
    sp = run(lib, "prism_test_sin", np.array([0, -0.0, np.inf, np.nan, 1e7, -1e30], np.float32))
    assert sp[0] == 0 and np.isnan(sp[2]) and np.isnan(sp[3])
    assert np.isnan(sp[4]) and np.isnan(sp[5])  # out of range: NaN, never a wrong finite value


def _same_table(fit: tuple[float, ...], table: tuple[float, ...]) -> bool:
    """The fit rounds float64 least-squares coefficients to float32; LAPACK's result differs in the last
    float64 bits between CPUs (an AVX2 Zen 3 host moved one erfc coefficient by one float32 ulp), so a
    coefficient may be off by an ulp of its float32 value."""
    a, b = np.asarray(fit, np.float32), np.asarray(table, np.float32)
    return len(a) == len(b) and bool(np.all(np.abs(a - b) <= np.spacing(np.abs(b))))


def test_polynomial_tables_are_reproducible() -> None:
    from prism.codegen import prelude as P
    h = math.pi / 4
    assert _same_table(P.fit_poly(lambda x: _erfc(x) * np.exp(x * x), 1.0, 4.0, 8, var=lambda x: 1 / x),
                       P.ERFC_BIG)
    assert _same_table(P.fit_poly(lambda r: np.where(np.abs(r) < 1e-4, -1 / 6 + r * r / 120,
                                                     (np.sin(r) - r) / np.where(r == 0, 1, r) ** 3), 1e-6, h, 2,
                                  var=lambda r: r * r), P.SIN_POLY)


def test_exp_le0_as_exp_where_it_applies(lib: ctypes.CDLL) -> None:
    """``pr_exp_le0`` (the exponentials of x - max(x) and of -|x|): within one ulp for results of at least 2^-126,
    0 below (x < ln(2^-126) = -87.33654, instead of a subnormal), NaN for NaN; as ``pr_exp`` bit for bit above."""
    x = float_sweep(-104.0, 0.0, step=101)
    y = run(lib, "prism_test_exp_le0", x)
    ref = np.exp(x.astype(np.float64))
    normal = ref >= F32.tiny
    assert ulp_error(y[normal], ref[normal]).max() < 1.0
    assert np.all(y[x < np.float32(-87.33654)] == 0.0)
    assert np.array_equal(y[normal], run(lib, "prism_test_exp", x)[normal])
    sp = run(lib, "prism_test_exp_le0", np.array([0, -0.0, -np.inf, np.nan, -1e30], np.float32))
    assert sp[0] == 1 and sp[1] == 1 and sp[2] == 0 and np.isnan(sp[3]) and sp[4] == 0


def test_log1p_01_without_a_division(lib: ctypes.CDLL) -> None:
    """``pr_log1p_01`` (softplus's log(1 + e^-|x|)): log1p on [0, 1] within 2 ulp, subnormal arguments
    included (log1p(u) = u there), NaN for NaN; its table is what the documented fit gives. Measured max 1.81 ulp
    (above sqrt(2) - 1 the result is ln 2 + log1p((u - 1) / 2): the polynomial's 1.33 ulp plus one rounding)."""
    from prism.codegen import prelude as P
    u = np.concatenate([float_sweep(0.0, 1.0, step=211), float_sweep(0.0, 2.0 ** -126, step=4099)])
    u = np.abs(u)
    assert _ulp_max(lib, "prism_test_log1p_01", u, np.log1p(u.astype(np.float64))) < 2.0
    tiny = u[(u > 0) & (u < F32.tiny)]
    assert np.array_equal(run(lib, "prism_test_log1p_01", tiny), tiny)
    assert np.isnan(run(lib, "prism_test_log1p_01", np.array([np.nan], np.float32))[0])
    lo, hi = math.sqrt(0.5) - 1, math.sqrt(2) - 1
    fit = P.fit_poly(lambda f: np.where(np.abs(f) < 1e-5, 1 / 3 - f / 4,
                                        (np.log1p(f) - f + f * f / 2) / np.where(f == 0, 1, f) ** 3), lo, hi, 7)
    assert _same_table(fit, P.LOG1P_POLY)
