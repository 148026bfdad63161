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
# log(1+f) = f - (f^2/2 - s (f^2/2 + R(s^2))), s = f / (2 + f): R(z) = z (2/3 + 2z/5 + 2z^2/7 + 2z^3/9), the
# atanh series (its next term is below 1e-9 relative for |s| <= 0.172, the range after normalizing)
LOG_POLY = (2 / 3, 2 / 5, 2 / 7, 2 / 9)
# log(1+f) = f - f^2/2 + f^3 L(f) on f in [sqrt(2)/2 - 1, sqrt(2) - 1], no division (softplus's log1p of e^-|x|):
# fit_poly(lambda f: (log1p(f) - f + f*f/2) / f**3, sqrt(.5) - 1, sqrt(2) - 1, 7)
LOG1P_POLY = (0.333333283662796, -0.25000298023223877, 0.20001468062400818, -0.16642245650291443,
              0.14202195405960083, -0.12972284853458405, 0.12712183594703674, -0.0810127854347229)
# erf(x) = x P(x^2) on |x| < 1; erfc(x) = exp(-x^2) Q(1/x) on 1 <= |x| < 4 (erf rounds to +-1 beyond 3.92)
ERF_SMALL = (1.128379225730896, -0.3761262893676758, 0.11283625662326813, -0.02685539983212948,
             0.0051912181079387665, -0.0008034842903725803, 7.933480083011091e-05)
ERFC_BIG = (0.00027494734968058765, 0.5589597225189209, 0.04260832443833351, -0.4739525616168976,
            0.5021983981132507, -0.24920706450939178, 0.029910484328866005, 0.02566162496805191,
            -0.008870315738022327)
# erfc(x) = exp(-x^2) Q(1/x) on [0.5, 1] and [4, 10]: exact gelu's 1 + erf(x/sqrt2) for x < -0.7 is erfc
ERFC_MID = (-0.01872595213353634, 0.6811120510101318, -0.2991009056568146, 0.059594351798295975,
            0.014737676829099655, -0.013098904862999916, 0.003392924787476659, -0.00032768832170404494)
ERFC_TAIL = (8.916455044527538e-06, 0.5638455748558044, 0.0054041254334151745, -0.3260990381240845,
             0.19203820824623108, 0.03741644695401192)
# sin(r) = r + r^3 S(r^2), cos(r) = 1 - r^2/2 + r^4 C(r^2) on |r| <= pi/4
SIN_POLY = (-0.1666666567325592, 0.008332823403179646, -0.0001959840301424265)
COS_POLY = (0.041666630655527115, -0.0013885844964534044, 2.42210353462724e-05)
# pi/2 = PIO2_1 + PIO2_2 + PIO2_3 to ~72 bits (each the float32 rounding of what is left); the reduction
# subtracts n times each with one FMA (one rounding of the exact x - n*PIO2_1), so it is accurate for
# |n| < 2^22, i.e. |x| < 6.6e6
PIO2_1, PIO2_2, PIO2_3 = 1.5707963705062866, -4.371138828673793e-08, -1.7151245100058819e-15


def fit_exp_poly(degree: int = EXP_POLY_DEGREE) -> tuple[float, ...]:
    """Fit q(r) = (e^r - 1 - r) / r^2 on [-ln2/2, ln2/2]; returns float32-rounded monomial coefficients."""
    from numpy.polynomial import chebyshev as C
    h = math.log(2) / 2
    r = np.cos(np.linspace(0, np.pi, 20001)) * h
    with np.errstate(all="ignore"):
        q = np.where(np.abs(r) > 1e-4, (np.expm1(r) - r) / r ** 2, 0.5 + r / 6 + r * r / 24)
    mono = C.cheb2poly(C.chebfit(r / h, q, degree)) / h ** np.arange(degree + 1)
    return tuple(float(np.float32(c)) for c in mono)


def fit_poly(fn: object, lo: float, hi: float, degree: int, var: object = None) -> tuple[float, ...]:
    """Least-squares fit of ``fn`` on Chebyshev nodes of [lo, hi] as a polynomial in ``var(x)`` (default x);
    float32-rounded monomial coefficients. Regenerates the tables above, e.g. ``ERFC_BIG``:
    ``fit_poly(lambda x: erfc(x) * exp(x * x), 1, 4, 8, var=lambda x: 1 / x)`` (vectorized erfc)."""
    from numpy.polynomial import chebyshev as C
    from numpy.polynomial import polynomial as P
    x = (np.cos(np.linspace(0, np.pi, 20001)) * (hi - lo) + (hi + lo)) / 2
    v = var(x) if callable(var) else x
    y = fn(x)  # type: ignore[operator]
    vlo, vhi = float(np.min(v)), float(np.max(v))
    c = C.chebfit((2 * v - vlo - vhi) / (vhi - vlo), y, degree)
    mono = P.Polynomial(C.cheb2poly(c))(P.Polynomial([-(vlo + vhi) / (vhi - vlo), 2 / (vhi - vlo)])).coef
    return tuple(float(np.float32(k)) for k in mono)


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


# Low-precision storage (prism.ir.dtypes): values are float32 in registers; loads widen exactly, stores round to
# nearest even (bfloat16: the top 16 bits of the float32 after adding 0x7fff plus the lowest kept bit; NaN kept
# a quiet NaN, overflow to inf as IEEE rounding does). Scalar forms vectorize inside `omp simd` loops; the
# vector loads (pr_v8_*, pr_v16_*, and *_n for the first n elements, the rest 0) serve the matmul micro-kernels.
STORAGE = """/* storage conversions: bfloat16 and float16 (uint16_t bits), int8 */
PR_INLINE float pr_ld_bf16(uint16_t h) { return pr_bits_f((uint32_t)h << 16); }
PR_INLINE uint16_t pr_st_bf16(float x) {
  uint32_t u = pr_f_bits(x);
  uint16_t r = (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
  return x != x ? (uint16_t)((u >> 16) | 0x40u) : r;
}
PR_INLINE float pr_round_bf16(float x) { return pr_ld_bf16(pr_st_bf16(x)); }
/* float16 bits -> float32, exact: a normal number rebiases its exponent (+112 << 23), a subnormal one is its
   10-bit integer times 2^-24 (no float32 subnormal is involved, so DAZ/FTZ cannot touch it), inf and NaN keep
   their payload under an all-ones exponent (a NaN quieted, as vcvtph2ps does) */
PR_INLINE float pr_ld_f16(uint16_t b) {
  const uint32_t em = b & 0x7fffu, s = (uint32_t)(b & 0x8000u) << 16;
  const uint32_t big = (em << 13) | 0x7f800000u | (em > 0x7c00u ? 0x00400000u : 0u);
  const uint32_t n = em >= 0x7c00u ? big : (em << 13) + 0x38000000u;
  const float f = em < 0x0400u ? (float)(int32_t)em * 0x1p-24f : pr_bits_f(n);
  return pr_bits_f(pr_f_bits(f) | s);
}
/* float32 -> float16 bits, rounded to nearest even: a normal result adds the rounding bias (0xfff plus the lowest
   kept bit) after rebiasing the exponent, so a carry rounds up into the exponent (65520 and above give inf); a
   subnormal one is read off the float32 sum |x| + 0.5, whose ulp is float16's subnormal step 2^-24 (the addition
   rounds to nearest even); a NaN stays a quiet NaN with its high payload. Every candidate is formed in the high
   half of a 32-bit word and the result shifted down at the end: computed in the low half, gcc narrowed the selects
   to 16 bits where the result is stored and then could not vectorize them next to 32-bit loads (a loop of
   ld * round -> st stayed scalar: 0.38 ms against 0.08 for rms_norm's [128, 2048] piece) */
PR_INLINE uint16_t pr_st_f16(float x) {
  const uint32_t u = pr_f_bits(x), a = u & 0x7fffffffu;
  const uint32_t inf = a > 0x7f800000u ? 0x7e000000u | ((a << 3) & 0x03ff0000u) : 0x7c000000u;
  const uint32_t sub = (pr_f_bits(pr_bits_f(a) + 0.5f) - 0x3f000000u) << 16;
  const uint32_t nrm = ((a - 0x38000000u + 0xfffu + ((a >> 13) & 1u)) << 3) & 0xffff0000u;
  return (uint16_t)(((u & 0x80000000u) | (a >= 0x47800000u ? inf : a < 0x38800000u ? sub : nrm)) >> 16);
}
/* pr_ld_f16(pr_st_f16(x)) in 32-bit arithmetic (the narrowing in between kept gcc from vectorizing the pair):
   the mantissa rounded to 10 bits (nearest even), a subnormal result as (|x| + 0.5) - 0.5, 65520 and above inf,
   a NaN quieted with its high payload */
PR_INLINE float pr_round_f16(float x) {
  const uint32_t u = pr_f_bits(x), s = u & 0x80000000u, a = u & 0x7fffffffu;
  const uint32_t nrm = (a + 0xfffu + ((a >> 13) & 1u)) & 0xffffe000u;
  const uint32_t sub = pr_f_bits((pr_bits_f(a) + 0.5f) - 0.5f);
  const uint32_t big = a > 0x7f800000u ? (a & 0xffffe000u) | 0x00400000u : 0x7f800000u;
  return pr_bits_f(s | (a >= 0x477ff000u ? big : a < 0x38800000u ? sub : nrm));
}
PR_INLINE float pr_ld_i8(int8_t q) { return (float)q; }
/* a float value quantized to int8 as the IR's cast (ir/elementwise.py): truncated toward zero, saturated at -128 and
   127, NaN -> 0 (a NaN fails both comparisons and is selected away at the end) */
PR_INLINE float pr_round_i8(float x) {
  float t = truncf(x);
  t = t < -128.0f ? -128.0f : (t > 127.0f ? 127.0f : t);
  return x != x ? 0.0f : t;
}
PR_INLINE int8_t pr_st_i8(float x) { return (int8_t)pr_round_i8(x); }
#if defined(__AVX2__)
PR_INLINE __m256 pr_v8_bf16(const uint16_t* p) {
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i*)p)), 16));
}
PR_INLINE __m256 pr_v8_i8(const int8_t* p) {
  return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i*)p)));
}
#if defined(__F16C__)
PR_INLINE __m256 pr_v8_f16(const uint16_t* p) { return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)p)); }
/* one float16 as pr_ld_f16 (exact), by vcvtph2ps: a grouped product's scale per group (microkernels.gdot_kernel) */
PR_INLINE float pr_ld1_f16(uint16_t h) { return _cvtsh_ss(h); }
#else
PR_INLINE float pr_ld1_f16(uint16_t h) { return pr_ld_f16(h); }
PR_INLINE __m256 pr_v8_f16(const uint16_t* p) {
  float t[8];
  for (int i = 0; i < 8; i++) t[i] = pr_ld_f16(p[i]);
  return _mm256_loadu_ps(t);
}
#endif
#define PR_V_N(W, E, T, V) PR_INLINE V pr_v##W##_##E##_n(const T* p, long n) { \\
  T t[W]; memset(t, 0, sizeof t); for (long i = 0; i < n; i++) t[i] = p[i]; return pr_v##W##_##E(t); }
PR_V_N(8, bf16, uint16_t, __m256)
PR_V_N(8, f16, uint16_t, __m256)
PR_V_N(8, i8, int8_t, __m256)
#endif
#if defined(__AVX512F__)
PR_INLINE __m512 pr_v16_bf16(const uint16_t* p) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i*)p)), 16));
}
PR_INLINE __m512 pr_v16_i8(const int8_t* p) {
  return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i*)p)));
}
PR_INLINE __m512 pr_v16_f16(const uint16_t* p) { return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)p)); }
/* (p[0], p[s]) as one 32-bit pair, p[0] in the low half: a vdpbf16ps operand (microkernels.nn_pairs) */
PR_INLINE int pr_pair_bf16(const uint16_t* p, long s) {
  if (s == 1) { int32_t u; memcpy(&u, p, 4); return u; }
  return (int)((uint32_t)p[0] | ((uint32_t)p[s] << 16));
}
PR_V_N(16, bf16, uint16_t, __m512)
PR_V_N(16, f16, uint16_t, __m512)
PR_V_N(16, i8, int8_t, __m512)
#endif
"""


def prelude() -> str:
    q = _horner("r", EXP_POLY)
    return f"""/* prism generated code: prelude */
{SYSTEM_HEADERS}
#define PR_INLINE static inline __attribute__((always_inline))
#define PR_NOINLINE static __attribute__((noinline))

PR_INLINE float pr_bits_f(uint32_t u) {{ float f; memcpy(&f, &u, 4); return f; }}
PR_INLINE uint32_t pr_f_bits(float f) {{ uint32_t u; memcpy(&u, &f, 4); return u; }}
{STORAGE}
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

/* e^x for x <= 0 (or NaN): one power-of-two factor instead of two (no overflow to handle, and results below
   2^-126 -- x < ln(2^-126) = -87.33654 -- are 0 rather than subnormal); the exponentials of x - max(x)
   (softmax, log_softmax, logsumexp, online softmax), of -|x| (softplus) and of -x^2 (erf). Same reduction
   and polynomial as pr_exp: the same ulp. */
PR_INLINE float pr_exp_le0(float x) {{
  float xc = x < -87.33654f ? -87.33654f : x;
  float t = xc * {c_float(1 / math.log(2))} + 12582912.0f;
  float n = t - 12582912.0f;
  int32_t ni = (int32_t)(pr_f_bits(t) - 0x4B400000u);
  float r = xc - n * {c_float(LN2_HI)};
  r = r - n * {c_float(LN2_LO)};
  float p = (r * r) * {q} + r + 1.0f;
  float y = p * pr_bits_f((uint32_t)(ni + 127) << 23);
  return x < -87.33654f ? 0.0f : y;
}}

/* e^x - 1, accurate near 0: 2^n (e^r - 1) + (2^n - 1) on |x| <= 20, e^x - 1 above, -1 below */
PR_INLINE float pr_expm1(float x) {{
  float xc = x > 20.0f ? 20.0f : (x < -20.0f ? -20.0f : x);
  float t = xc * {c_float(1 / math.log(2))} + 12582912.0f;
  float n = t - 12582912.0f;
  int32_t ni = (int32_t)(pr_f_bits(t) - 0x4B400000u);
  float r = xc - n * {c_float(LN2_HI)};
  r = r - n * {c_float(LN2_LO)};
  float em1 = (r * r) * {q} + r;       /* e^r - 1 */
  float s = pr_bits_f((uint32_t)(ni + 127) << 23);
  float y = s * em1 + (s - 1.0f);
  y = x > 20.0f ? pr_exp(x) - 1.0f : y;
  return x < -20.0f ? -1.0f : y;
}}

/* log(x): x = 2^e m with m in [sqrt(2)/2, sqrt(2)), log(m) by the atanh series (LOG_POLY); subnormals
   scaled by 2^23 first; log(0) = -inf, log(x < 0) = NaN, log(inf) = inf, NaN -> NaN */
PR_INLINE float pr_log(float x) {{
  int32_t sub = x < 1.17549435e-38f;
  float xs = x * (sub ? 8388608.0f : 1.0f);
  uint32_t u = pr_f_bits(xs);
  int32_t big = (u & 0x007fffffu) > 0x003504f3u;  /* mantissa above sqrt(2): use m / 2 */
  int32_t e = (int32_t)((u >> 23) & 0xffu) - 127 - 23 * sub + big;
  float m = pr_bits_f((u & 0x007fffffu) | (big ? 0x3f000000u : 0x3f800000u));
  float f = m - 1.0f;
  float s = f / (2.0f + f);
  float z = s * s;
  float hf = 0.5f * f * f;
  float R = z * {_horner("z", LOG_POLY)};
  float ef = (float)e;
  float y = ef * {c_float(LN2_HI)} + (f - (hf - (s * (hf + R) + ef * {c_float(LN2_LO)})));
  y = x == 0.0f ? -INFINITY : y;
  y = x < 0.0f ? NAN : y;
  y = x == INFINITY ? INFINITY : y;
  return x != x ? x : y;
}}

/* log(1 + x), accurate near 0: log(u) * x / (u - 1) with u = 1 + x rounded */
PR_INLINE float pr_log1p(float x) {{
  float u = 1.0f + x;
  float y = pr_log(u) * (x / (u - 1.0f));
  y = u == 1.0f ? x : y;
  return x == INFINITY ? x : y;
}}

/* log(1 + u) for u in [0, 1] (or NaN), without a division: f = u below sqrt(2) - 1 (exact), else
   log(1 + u) = ln 2 + log(1 + (u - 1) / 2); log(1 + f) = f - f^2/2 + f^3 LOG1P_POLY(f) */
PR_INLINE float pr_log1p_01(float u) {{
  int32_t big = u > 0.41421356f;
  float f = big ? (u - 1.0f) * 0.5f : u;
  float y = f - 0.5f * f * f + (f * f * f) * {_horner("f", LOG1P_POLY)};
  return big ? y + {c_float(math.log(2))} : y;
}}

/* log(1 + e^x) = max(x, 0) + log(1 + e^-|x|) (e^-|x| in (0, 1]: no overflow, no division); softplus with beta
   1, threshold 20, as PyTorch: x above 20 */
PR_INLINE float pr_softplus_core(float x) {{
  return (x > 0.0f ? x : 0.0f) + pr_log1p_01(pr_exp_le0(-fabsf(x)));
}}
PR_INLINE float pr_softplus(float x) {{ return x > 20.0f ? x : pr_softplus_core(x); }}

/* erf: x P(x^2) on |x| < 1 (ERF_SMALL), 1 - e^(-x^2) Q(1/|x|) on 1 <= |x| < 4 (ERFC_BIG), +-1 beyond */
PR_INLINE float pr_erf(float x) {{
  float a = fabsf(x);
  float z = x * x;
  float small = x * {_horner("z", ERF_SMALL)};
  float ac = a < 1.0f ? 1.0f : (a > 4.0f ? 4.0f : a);
  float t = 1.0f / ac;
  float big = 1.0f - pr_exp_le0(-(ac * ac)) * {_horner("t", ERFC_BIG)};
  big = a >= 4.0f ? 1.0f : big;
  float y = a < 1.0f ? small : copysignf(big, x);
  return x != x ? x : y;
}}

/* sin and cos: x = n pi/2 + r, |r| <= pi/4 (three parts of pi/2, each subtracted with one FMA): 1.5 ulp up to
   |x| = 1e6, 1.4e-6 absolute up to 6.5e6, NaN beyond (see docs/codegen.md); inf -> NaN */
PR_INLINE float pr_sincos_r(float x, int32_t* q) {{
  float t = x * {c_float(2 / math.pi)} + 12582912.0f;
  float n = t - 12582912.0f;
  *q = (int32_t)(pr_f_bits(t) - 0x4B400000u);
  float r = fmaf(-n, {c_float(PIO2_1)}, x);
  r = fmaf(-n, {c_float(PIO2_2)}, r);
  r = fmaf(-n, {c_float(PIO2_3)}, r);
  /* beyond the range the reduction is not exact: NaN (visible), never a wrong finite value; x - x: NaN for inf */
  return (fabsf(x) > 6.5e6f ? NAN : r) + (x - x);
}}
PR_INLINE float pr_sin_poly(float r) {{ float z = r * r; return r + (r * z) * {_horner("z", SIN_POLY)}; }}
PR_INLINE float pr_cos_poly(float r) {{
  float z = r * r;
  return 1.0f - 0.5f * z + (z * z) * {_horner("z", COS_POLY)};
}}
PR_INLINE float pr_sin(float x) {{
  int32_t q;
  float r = pr_sincos_r(x, &q);
  float s = pr_sin_poly(r), c = pr_cos_poly(r);
  float y = (q & 1) ? c : s;
  return (q & 2) ? -y : y;
}}
PR_INLINE float pr_cos(float x) {{
  int32_t q;
  float r = pr_sincos_r(x, &q);
  float s = pr_sin_poly(r), c = pr_cos_poly(r);
  float y = (q & 1) ? -s : c;
  return (q & 2) ? -y : y;
}}

PR_INLINE float pr_sigmoid(float x) {{ return 1.0f / (1.0f + pr_exp(-x)); }}
PR_INLINE float pr_silu(float x) {{ return x / (1.0f + pr_exp(-x)); }}
PR_INLINE float pr_tanh(float x) {{
  float ax = fabsf(x);
  float e = pr_expm1(2.0f * (ax > 9.0f ? 9.0f : ax));
  float t = ax > 9.0f ? 1.0f : e / (e + 2.0f);
  return copysignf(t, x);
}}
/* exact gelu, 0.5 x (1 + erf(x/sqrt2)); for x/sqrt2 = -z < -0.5 the factor is erfc(z) = e^(-z^2) Q(1/z),
   from the table of z's range (ERFC_MID, ERFC_BIG, ERFC_TAIL), so its relative error stays bounded */
PR_INLINE float pr_gelu(float x) {{
  float a = x * {c_float(1 / math.sqrt(2))};
  float z = -a;
  float zm = z < 0.5f ? 0.5f : (z > 1.0f ? 1.0f : z), tm = 1.0f / zm;
  float zb = z < 1.0f ? 1.0f : (z > 4.0f ? 4.0f : z), tb = 1.0f / zb;
  float zt = z < 4.0f ? 4.0f : (z > 10.0f ? 10.0f : z), tt = 1.0f / zt;
  float q = z < 1.0f ? {_horner("tm", ERFC_MID)} : (z < 4.0f ? {_horner("tb", ERFC_BIG)} : {_horner("tt", ERFC_TAIL)});
  float x2 = x * x;                              /* a^2 = x^2 / 2 = (x2 + x2err) / 2 exactly (FMA) */
  float a2 = 0.5f * x2, a2err = 0.5f * fmaf(x, x, -x2);
  float one_plus = z >= 0.5f ? pr_exp(-a2) * (1.0f - a2err) * q : 1.0f + pr_erf(a);
  one_plus = z > 14.0f ? 0.0f : one_plus;  /* e^(-z^2) underflows (and x^2 may overflow) */
  return 0.5f * x * one_plus;
}}
PR_INLINE float pr_gelu_tanh(float x) {{
  return 0.5f * x * (1.0f + pr_tanh({c_float(math.sqrt(2 / math.pi))} * (x + 0.044715f * x * x * x)));
}}
PR_INLINE float pr_max(float a, float b) {{ return a != a ? a : (a > b ? a : b); }}  /* NaN propagates */
PR_INLINE float pr_square(float x) {{ return x * x; }}
PR_INLINE float pr_relu(float x) {{ return x < 0.0f ? 0.0f : x; }}
PR_INLINE long pr_minl(long a, long b) {{ return a < b ? a : b; }}
{_op_helpers()}

int prism_max_threads(void) {{ return omp_get_max_threads(); }}
/* prism generated code: end of prelude */
"""
