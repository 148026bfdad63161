"""The C prelude every generated source starts with: includes, and branch-free scalar math that the
compiler vectorizes inside ``#pragma omp simd`` loops (no libm calls on the hot paths, no fast-math).

``exp``: x = n*ln2 + r with |r| <= ln2/2 (Cody-Waite split of ln2, exact with FMA contraction),
e^r = 1 + r + r^2 q(r) with q a degree-5 polynomial fitted by ``fit_exp_poly`` below (Chebyshev
least squares on [-ln2/2, ln2/2], rounded to float32), and 2^n applied as two power-of-two factors so
that results in the subnormal range come out right. Measured accuracy: docs/codegen.md (test:
tests/cpu/test_math.py). ``expm1`` reuses the same reduction for tanh near 0.
"""

from __future__ import annotations

import math

import numpy as np

EXP_POLY_DEGREE = 5
# q(r) = (e^r - 1 - r) / r^2, coefficients of r^0..r^5 as float32 (regenerate with fit_exp_poly()).
EXP_POLY = (0.5, 0.1666666716337204, 0.04166646674275398, 0.0083332983776927, 0.0013933643931522965,
            0.0001989927695831284)
LN2_HI = 0.693359375            # 355/512: n * LN2_HI is exact for |n| < 2^15
LN2_LO = -2.1219444170128554e-04  # float32(ln2 - LN2_HI)


def fit_exp_poly(degree: int = EXP_POLY_DEGREE) -> tuple[float, ...]:
    """Fit q(r) = (e^r - 1 - r) / r^2 on [-ln2/2, ln2/2]; returns float32-rounded monomial coefficients."""
    from numpy.polynomial import chebyshev as C
    h = math.log(2) / 2
    r = np.cos(np.linspace(0, np.pi, 20001)) * h
    with np.errstate(all="ignore"):
        q = np.where(np.abs(r) > 1e-4, (np.expm1(r) - r) / r ** 2, 0.5 + r / 6 + r * r / 24)
    mono = C.cheb2poly(C.chebfit(r / h, q, degree)) / h ** np.arange(degree + 1)
    return tuple(float(np.float32(c)) for c in mono)


def c_float(x: float) -> str:
    """A C float literal that is exactly float32(x)."""
    v = float(np.float32(x))
    if math.isnan(v):
        return "NAN"
    if math.isinf(v):
        return "INFINITY" if v > 0 else "(-INFINITY)"
    if v == 0:
        return "-0.0f" if math.copysign(1, v) < 0 else "0.0f"
    mant, exp = v.hex().split("p")
    mant = mant.rstrip("0").rstrip(".")
    return f"{mant}p{exp}f"


def _horner(var: str, coeffs: tuple[float, ...]) -> str:
    expr = c_float(coeffs[-1])
    for c in reversed(coeffs[:-1]):
        expr = f"({expr} * {var} + {c_float(c)})"
    return expr


# The system headers of every generated source (the runtime precompiles exactly this text: see
# prism.runtime.cache.precompiled_header).
SYSTEM_HEADERS = """#include <math.h>
#include <stdint.h>
#include <string.h>
#include <omp.h>
#if defined(__AVX512F__) || defined(__AVX2__)
#include <immintrin.h>
#endif
"""


def _op_helpers() -> str:
    """The C helpers the element-wise operators' definitions bring (OpDef.c_defs), in registry order."""
    from prism.ir.ops import OPS
    defs = [o.c_defs for o in OPS.values() if o.c_defs]
    return "/* operator helpers (prism/ir/elementwise.py) */\n" + "\n".join(defs) if defs else ""


def prelude() -> str:
    q = _horner("r", EXP_POLY)
    return f"""/* prism generated code: prelude */
{SYSTEM_HEADERS}
#define PR_INLINE static inline __attribute__((always_inline))
#define PR_NOINLINE static __attribute__((noinline))

PR_INLINE float pr_bits_f(uint32_t u) {{ float f; memcpy(&f, &u, 4); return f; }}
PR_INLINE uint32_t pr_f_bits(float f) {{ uint32_t u; memcpy(&u, &f, 4); return u; }}

/* e^x: see prism/codegen/prelude.py; NaN -> NaN, x > 88.72 -> inf, x < -104 -> 0 */
PR_INLINE float pr_exp(float x) {{
  float xc = x < -104.0f ? -104.0f : x;
  xc = xc > 89.0f ? 89.0f : xc;
  float t = xc * {c_float(1 / math.log(2))} + 12582912.0f;  /* 1.5*2^23: rounds x/ln2 into the low bits */
  float n = t - 12582912.0f;
  int32_t ni = (int32_t)(pr_f_bits(t) - 0x4B400000u);
  float r = xc - n * {c_float(LN2_HI)};
  r = r - n * {c_float(LN2_LO)};
  float p = (r * r) * {q} + r + 1.0f;
  int32_t n1 = ni >> 1, n2 = ni - n1;
  float y = p * pr_bits_f((uint32_t)(n1 + 127) << 23) * pr_bits_f((uint32_t)(n2 + 127) << 23);
  return x < -104.0f ? 0.0f : y;
}}

/* e^x - 1 for |x| <= 20, accurate near 0 (used by tanh) */
PR_INLINE float pr_expm1(float x) {{
  float t = x * {c_float(1 / math.log(2))} + 12582912.0f;
  float n = t - 12582912.0f;
  int32_t ni = (int32_t)(pr_f_bits(t) - 0x4B400000u);
  float r = x - n * {c_float(LN2_HI)};
  r = r - n * {c_float(LN2_LO)};
  float em1 = (r * r) * {q} + r;       /* e^r - 1 */
  float s = pr_bits_f((uint32_t)(ni + 127) << 23);
  return s * em1 + (s - 1.0f);
}}

PR_INLINE float pr_sigmoid(float x) {{ return 1.0f / (1.0f + pr_exp(-x)); }}
PR_INLINE float pr_silu(float x) {{ return x / (1.0f + pr_exp(-x)); }}
PR_INLINE float pr_tanh(float x) {{
  float ax = fabsf(x);
  float e = pr_expm1(2.0f * (ax > 9.0f ? 9.0f : ax));
  float t = ax > 9.0f ? 1.0f : e / (e + 2.0f);
  return copysignf(t, x);
}}
PR_INLINE float pr_gelu(float x) {{ return 0.5f * x * (1.0f + erff(x * {c_float(1 / math.sqrt(2))})); }}
PR_INLINE float pr_gelu_tanh(float x) {{
  return 0.5f * x * (1.0f + pr_tanh({c_float(math.sqrt(2 / math.pi))} * (x + 0.044715f * x * x * x)));
}}
PR_INLINE float pr_max(float a, float b) {{ return a != a ? a : (a > b ? a : b); }}  /* NaN propagates */
PR_INLINE float pr_square(float x) {{ return x * x; }}
PR_INLINE float pr_relu(float x) {{ return x < 0.0f ? 0.0f : x; }}
PR_INLINE long pr_minl(long a, long b) {{ return a < b ? a : b; }}
{_op_helpers()}

/* test hooks: the vectorized math on whole arrays (checked against numpy in float64) */
void prism_test_exp(const float* x, float* y, long n) {{
  #pragma omp simd
  for (long i = 0; i < n; i++) y[i] = pr_exp(x[i]);
}}
void prism_test_tanh(const float* x, float* y, long n) {{
  #pragma omp simd
  for (long i = 0; i < n; i++) y[i] = pr_tanh(x[i]);
}}
void prism_test_sigmoid(const float* x, float* y, long n) {{
  #pragma omp simd
  for (long i = 0; i < n; i++) y[i] = pr_sigmoid(x[i]);
}}
int prism_max_threads(void) {{ return omp_get_max_threads(); }}
/* prism generated code: end of prelude */
"""
