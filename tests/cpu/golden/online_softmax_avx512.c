/* prism kernel (avx512); codegen v1 */
#define PRISM_WS_FLOATS ((long)0)
#define PRISM_SCRATCH_FLOATS ((long)320)

/* lane j of the result = sum of the lanes of v[j] */
PR_INLINE __m512 pr_hsum16(const __m512* v) {
  __m512 x0[16] = {v[0], v[4], v[8], v[12], v[1], v[5], v[9], v[13], v[2], v[6], v[10], v[14], v[3], v[7], v[11], v[15]};
  __m512 x1[8];
  #pragma GCC unroll 8
  for (int i = 0; i < 8; i++) x1[i] = _mm512_add_ps(_mm512_shuffle_f32x4(x0[2 * i], x0[2 * i + 1], 0x44), _mm512_shuffle_f32x4(x0[2 * i], x0[2 * i + 1], 0xEE));
  __m512 x2[4];
  #pragma GCC unroll 8
  for (int i = 0; i < 4; i++) x2[i] = _mm512_add_ps(_mm512_shuffle_f32x4(x1[2 * i], x1[2 * i + 1], 0x88), _mm512_shuffle_f32x4(x1[2 * i], x1[2 * i + 1], 0xDD));
  __m512 x3[2];
  #pragma GCC unroll 8
  for (int i = 0; i < 2; i++) x3[i] = _mm512_add_ps(_mm512_shuffle_ps(x2[2 * i], x2[2 * i + 1], 0x44), _mm512_shuffle_ps(x2[2 * i], x2[2 * i + 1], 0xEE));
  __m512 x4[1];
  #pragma GCC unroll 8
  for (int i = 0; i < 1; i++) x4[i] = _mm512_add_ps(_mm512_shuffle_ps(x3[2 * i], x3[2 * i + 1], 0x88), _mm512_shuffle_ps(x3[2 * i], x3[2 * i + 1], 0xDD));
  return x4[0];
}

PR_INLINE void pr_nt_avx512_4x4_npf(long K, const float* restrict A, long sa0, const float* restrict Bt, long sb0, float* restrict C, long sc0, int beta, const float* restrict cs) {
  __m512 tot = _mm512_setzero_ps(), grp = _mm512_setzero_ps();
  for (long k0 = 0; k0 < K; k0 += 1024) {
    const long k1 = pr_minl(K, k0 + 1024), K0 = k1 - (k1 - k0) % 16;
    __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps(), acc2 = _mm512_setzero_ps(), acc3 = _mm512_setzero_ps(), acc4 = _mm512_setzero_ps(), acc5 = _mm512_setzero_ps(), acc6 = _mm512_setzero_ps(), acc7 = _mm512_setzero_ps(), acc8 = _mm512_setzero_ps(), acc9 = _mm512_setzero_ps(), acc10 = _mm512_setzero_ps(), acc11 = _mm512_setzero_ps(), acc12 = _mm512_setzero_ps(), acc13 = _mm512_setzero_ps(), acc14 = _mm512_setzero_ps(), acc15 = _mm512_setzero_ps();
    long k = k0;
    for (; k + 16 <= K0; k += 16) {
     {
      __m512 a0 = _mm512_loadu_ps(A + 0 * sa0 + k);
      __m512 a1 = _mm512_loadu_ps(A + 1 * sa0 + k);
      __m512 a2 = _mm512_loadu_ps(A + 2 * sa0 + k);
      __m512 a3 = _mm512_loadu_ps(A + 3 * sa0 + k);
      __asm__("" : "+v"(a0), "+v"(a1), "+v"(a2), "+v"(a3));
      { __m512 b = _mm512_loadu_ps(Bt + 0 * sb0 + k);
        __asm__("" : "+v"(b));
        acc0 = _mm512_fmadd_ps(a0, b, acc0);
        acc4 = _mm512_fmadd_ps(a1, b, acc4);
        acc8 = _mm512_fmadd_ps(a2, b, acc8);
        acc12 = _mm512_fmadd_ps(a3, b, acc12);
      }
      { __m512 b = _mm512_loadu_ps(Bt + 1 * sb0 + k);
        __asm__("" : "+v"(b));
        acc1 = _mm512_fmadd_ps(a0, b, acc1);
        acc5 = _mm512_fmadd_ps(a1, b, acc5);
        acc9 = _mm512_fmadd_ps(a2, b, acc9);
        acc13 = _mm512_fmadd_ps(a3, b, acc13);
      }
      { __m512 b = _mm512_loadu_ps(Bt + 2 * sb0 + k);
        __asm__("" : "+v"(b));
        acc2 = _mm512_fmadd_ps(a0, b, acc2);
        acc6 = _mm512_fmadd_ps(a1, b, acc6);
        acc10 = _mm512_fmadd_ps(a2, b, acc10);
        acc14 = _mm512_fmadd_ps(a3, b, acc14);
      }
      { __m512 b = _mm512_loadu_ps(Bt + 3 * sb0 + k);
        __asm__("" : "+v"(b));
        acc3 = _mm512_fmadd_ps(a0, b, acc3);
        acc7 = _mm512_fmadd_ps(a1, b, acc7);
        acc11 = _mm512_fmadd_ps(a2, b, acc11);
        acc15 = _mm512_fmadd_ps(a3, b, acc15);
      }
     }
    }
    if (K0 < k1) {
      const __mmask16 km = (__mmask16)((1u << (K % 16)) - 1);
     {
      __m512 a0 = _mm512_maskz_loadu_ps(km, A + 0 * sa0 + K0);
      __m512 a1 = _mm512_maskz_loadu_ps(km, A + 1 * sa0 + K0);
      __m512 a2 = _mm512_maskz_loadu_ps(km, A + 2 * sa0 + K0);
      __m512 a3 = _mm512_maskz_loadu_ps(km, A + 3 * sa0 + K0);
      __asm__("" : "+v"(a0), "+v"(a1), "+v"(a2), "+v"(a3));
      { __m512 b = _mm512_maskz_loadu_ps(km, Bt + 0 * sb0 + K0);
        __asm__("" : "+v"(b));
        acc0 = _mm512_fmadd_ps(a0, b, acc0);
        acc4 = _mm512_fmadd_ps(a1, b, acc4);
        acc8 = _mm512_fmadd_ps(a2, b, acc8);
        acc12 = _mm512_fmadd_ps(a3, b, acc12);
      }
      { __m512 b = _mm512_maskz_loadu_ps(km, Bt + 1 * sb0 + K0);
        __asm__("" : "+v"(b));
        acc1 = _mm512_fmadd_ps(a0, b, acc1);
        acc5 = _mm512_fmadd_ps(a1, b, acc5);
        acc9 = _mm512_fmadd_ps(a2, b, acc9);
        acc13 = _mm512_fmadd_ps(a3, b, acc13);
      }
      { __m512 b = _mm512_maskz_loadu_ps(km, Bt + 2 * sb0 + K0);
        __asm__("" : "+v"(b));
        acc2 = _mm512_fmadd_ps(a0, b, acc2);
        acc6 = _mm512_fmadd_ps(a1, b, acc6);
        acc10 = _mm512_fmadd_ps(a2, b, acc10);
        acc14 = _mm512_fmadd_ps(a3, b, acc14);
      }
      { __m512 b = _mm512_maskz_loadu_ps(km, Bt + 3 * sb0 + K0);
        __asm__("" : "+v"(b));
        acc3 = _mm512_fmadd_ps(a0, b, acc3);
        acc7 = _mm512_fmadd_ps(a1, b, acc7);
        acc11 = _mm512_fmadd_ps(a2, b, acc11);
        acc15 = _mm512_fmadd_ps(a3, b, acc15);
      }
     }
    }
    const __m512 v[16] = {acc0, acc1, acc2, acc3, acc4, acc5, acc6, acc7, acc8, acc9, acc10, acc11, acc12, acc13, acc14, acc15};
    const __m512 cs_ = pr_hsum16(v);
    grp = k0 % 8192 ? _mm512_add_ps(grp, cs_) : cs_;
    if (k1 == K || k1 % 8192 == 0) tot = k0 < 8192 ? grp : _mm512_add_ps(tot, grp);
  }
  float t[16] __attribute__((aligned(64)));
  _mm512_storeu_ps(t, tot);
  { const float s = t[0]; float* c = C + 0 * sc0 + 0; c[0] = beta == 0 ? s : beta == 1 ? c[0] + s : c[0] * cs[0] + s; }
  { const float s = t[1]; float* c = C + 0 * sc0 + 1; c[0] = beta == 0 ? s : beta == 1 ? c[0] + s : c[0] * cs[0] + s; }
  { const float s = t[2]; float* c = C + 0 * sc0 + 2; c[0] = beta == 0 ? s : beta == 1 ? c[0] + s : c[0] * cs[0] + s; }
  { const float s = t[3]; float* c = C + 0 * sc0 + 3; c[0] = beta == 0 ? s : beta == 1 ? c[0] + s : c[0] * cs[0] + s; }
  { const float s = t[4]; float* c = C + 1 * sc0 + 0; c[0] = beta == 0 ? s : beta == 1 ? c[0] + s : c[0] * cs[1] + s; }
  { const float s = t[5]; float* c = C + 1 * sc0 + 1; c[0] = beta == 0 ? s : beta == 1 ? c[0] + s : c[0] * cs[1] + s; }
  { const float s = t[6]; float* c = C + 1 * sc0 + 2; c[0] = beta == 0 ? s : beta == 1 ? c[0] + s : c[0] * cs[1] + s; }
  { const float s = t[7]; float* c = C + 1 * sc0 + 3; c[0] = beta == 0 ? s : beta == 1 ? c[0] + s : c[0] * cs[1] + s; }
  { const float s = t[8]; float* c = C + 2 * sc0 + 0; c[0] = beta == 0 ? s : beta == 1 ? c[0] + s : c[0] * cs[2] + s; }
  { const float s = t[9]; float* c = C + 2 * sc0 + 1; c[0] = beta == 0 ? s : beta == 1 ? c[0] + s : c[0] * cs[2] + s; }
  { const float s = t[10]; float* c = C + 2 * sc0 + 2; c[0] = beta == 0 ? s : beta == 1 ? c[0] + s : c[0] * cs[2] + s; }
  { const float s = t[11]; float* c = C + 2 * sc0 + 3; c[0] = beta == 0 ? s : beta == 1 ? c[0] + s : c[0] * cs[2] + s; }
  { const float s = t[12]; float* c = C + 3 * sc0 + 0; c[0] = beta == 0 ? s : beta == 1 ? c[0] + s : c[0] * cs[3] + s; }
  { const float s = t[13]; float* c = C + 3 * sc0 + 1; c[0] = beta == 0 ? s : beta == 1 ? c[0] + s : c[0] * cs[3] + s; }
  { const float s = t[14]; float* c = C + 3 * sc0 + 2; c[0] = beta == 0 ? s : beta == 1 ? c[0] + s : c[0] * cs[3] + s; }
  { const float s = t[15]; float* c = C + 3 * sc0 + 3; c[0] = beta == 0 ? s : beta == 1 ? c[0] + s : c[0] * cs[3] + s; }
}

PR_INLINE void pr_nn_avx512_4x1(long K, const float* restrict A, long sa0, long sa1, const float* restrict B, long sb0, float* restrict C, long sc0, int beta, const float* restrict cs) {
  __m512 c0_0, c1_0, c2_0, c3_0;
  const long pfo = (sb0 * 4 > 128 && sb0 * 4 <= 1024 ? 4096 / (sb0 * 4) : 32) * sb0;
  {
    const long k = 0;
    const float* Bk = B + k * sb0;
    const float* Ak = A + k * sa1;
    __builtin_prefetch(Bk + pfo + 0, 0, 2);
    __builtin_prefetch(Bk + pfo + 15, 0, 2);
    __m512 b0 = _mm512_loadu_ps(Bk + 0);
    __asm__("" : "+v"(b0));
    { __m512 a = _mm512_set1_ps(Ak[0 * sa0]);
      c0_0 = _mm512_mul_ps(a, b0);
    }
    { __m512 a = _mm512_set1_ps(Ak[1 * sa0]);
      c1_0 = _mm512_mul_ps(a, b0);
    }
    { __m512 a = _mm512_set1_ps(Ak[2 * sa0]);
      c2_0 = _mm512_mul_ps(a, b0);
    }
    { __m512 a = _mm512_set1_ps(Ak[3 * sa0]);
      c3_0 = _mm512_mul_ps(a, b0);
    }
  }
  for (long k = 1; k < K; k++) {
    const float* Bk = B + k * sb0;
    const float* Ak = A + k * sa1;
    __builtin_prefetch(Bk + pfo + 0, 0, 2);
    __builtin_prefetch(Bk + pfo + 15, 0, 2);
    __m512 b0 = _mm512_loadu_ps(Bk + 0);
    __asm__("" : "+v"(b0));
    { __m512 a = _mm512_set1_ps(Ak[0 * sa0]);
      c0_0 = _mm512_fmadd_ps(a, b0, c0_0);
    }
    { __m512 a = _mm512_set1_ps(Ak[1 * sa0]);
      c1_0 = _mm512_fmadd_ps(a, b0, c1_0);
    }
    { __m512 a = _mm512_set1_ps(Ak[2 * sa0]);
      c2_0 = _mm512_fmadd_ps(a, b0, c2_0);
    }
    { __m512 a = _mm512_set1_ps(Ak[3 * sa0]);
      c3_0 = _mm512_fmadd_ps(a, b0, c3_0);
    }
  }
  if (beta == 0) {
    _mm512_storeu_ps(C + 0 * sc0 + 0, c0_0);
    _mm512_storeu_ps(C + 1 * sc0 + 0, c1_0);
    _mm512_storeu_ps(C + 2 * sc0 + 0, c2_0);
    _mm512_storeu_ps(C + 3 * sc0 + 0, c3_0);
  } else {
    { __m512 s = _mm512_set1_ps(beta == 2 ? cs[0] : 1.0f);
      _mm512_storeu_ps(C + 0 * sc0 + 0, _mm512_fmadd_ps(_mm512_loadu_ps(C + 0 * sc0 + 0), s, c0_0));
      __asm__("" ::: "memory");
    }
    { __m512 s = _mm512_set1_ps(beta == 2 ? cs[1] : 1.0f);
      _mm512_storeu_ps(C + 1 * sc0 + 0, _mm512_fmadd_ps(_mm512_loadu_ps(C + 1 * sc0 + 0), s, c1_0));
      __asm__("" ::: "memory");
    }
    { __m512 s = _mm512_set1_ps(beta == 2 ? cs[2] : 1.0f);
      _mm512_storeu_ps(C + 2 * sc0 + 0, _mm512_fmadd_ps(_mm512_loadu_ps(C + 2 * sc0 + 0), s, c2_0));
      __asm__("" ::: "memory");
    }
    { __m512 s = _mm512_set1_ps(beta == 2 ? cs[3] : 1.0f);
      _mm512_storeu_ps(C + 3 * sc0 + 0, _mm512_fmadd_ps(_mm512_loadu_ps(C + 3 * sc0 + 0), s, c3_0));
      __asm__("" ::: "memory");
    }
  }
}
/* block graph: grid=(2,) forloop=2 */
PR_NOINLINE void blk0(const float* restrict a0, const float* restrict a1, const float* restrict a2, float* restrict o0, float* restrict scr, long scr_stride, int nth) {
  const int nt = nth < 1 ? nth : 1;
  #pragma omp parallel num_threads(nt)
  {
    float* restrict S = scr + (long)omp_get_thread_num() * scr_stride;
    (void)S;
    #pragma omp for schedule(static)
    for (long blk = 0; blk < 2; blk++) {
      const long b0 = blk;
      const float* v1 = a0 + b0 * 64;
      const float* v2 = a1 + b0 * 512;
      const float* v8 = a2 + b0 * 512;
      #pragma omp simd
      for (long i9 = 0; i9 < 4; i9++) {
        (S + 128)[i9] = (-INFINITY);
      }
      #pragma omp simd
      for (long i22 = 0; i22 < 4; i22++) {
        (S + 304)[i22] = 0.0f;
      }
      for (long it = 0; it < 2; it++) {
        const float* v2i = v2 + it * 256;
        float* C3 = (S + 0);
        const float* A4 = v1;
        const float* B5 = v2i;
        for (long j6 = 0; j6 < 16; j6 += 4) {
          pr_nt_avx512_4x4_npf(16, A4 + 0, 16, B5 + j6 * 16, 16, C3 + 0 + j6, 16, 0, 0);
        }
        #pragma omp simd
        for (long i7 = 0; i7 < 64; i7++) {
          (S + 64)[i7] = ((S + 0)[i7] * 0x1p-2f);
        }
        const float* v8i = v8 + it * 256;
        for (long i10 = 0; i10 < 4; i10++) {
          float s12 = -INFINITY;
          int nan13 = s12 != s12;
          #pragma omp simd reduction(max:s12) reduction(|:nan13)
          for (long j11 = 0; j11 < 16; j11++) {
            const float v14 = (S + 64)[i10 * 16 + j11];
            s12 = v14 > s12 ? v14 : s12;
            nan13 |= v14 != v14;
          }
          if (nan13) s12 = NAN;
          (S + 160)[i10] = s12;
        }
        for (long r15 = 0; r15 < 4; r15++) {
          const float mn = pr_max((S + 128)[r15], (S + 160)[r15]);
          (S + 144)[r15] = it == 0 ? 0.0f : pr_exp_le0((S + 128)[r15] - mn);
          (S + 128)[r15] = mn;
        }
        for (long i16 = 0; i16 < 4; i16++) {
          #pragma omp simd
          for (long i17 = 0; i17 < 16; i17++) {
            (S + 176)[i16 * 16 + i17] = pr_exp_le0(((S + 64)[i16 * 16 + i17] - (S + 128)[i16]));
          }
        }
        float* C18 = (S + 240);
        const float* A19 = (S + 176);
        const float* B20 = v8i;
        const float* cs21 = (S + 144);
        pr_nn_avx512_4x1(16, A19 + (0) * 16, 16, 1, B20 + 0, 16, C18 + (0) * 16 + 0, 16, (it > 0 ? 2 : 0), cs21 + 0);
        #pragma omp simd
        for (long i23 = 0; i23 < 4; i23++) {
          (S + 304)[i23] = ((S + 304)[i23] * (S + 144)[i23]);
        }
        for (long i24 = 0; i24 < 4; i24++) {
          float s26 = 0.0f;
          #pragma omp simd reduction(+:s26)
          for (long j25 = 0; j25 < 16; j25++) {
            s26 = s26 + (S + 176)[i24 * 16 + j25];
          }
          (S + 304)[i24] = (S + 304)[i24] + s26;
        }
      }
      for (long i27 = 0; i27 < 4; i27++) {
        #pragma omp simd
        for (long i28 = 0; i28 < 16; i28++) {
          (o0 + b0 * 64)[i27 * 16 + i28] = ((S + 240)[i27 * 16 + i28] / (S + 304)[i27]);
        }
      }
    }
  }
}

int prism_entry(void** io, float* ws, int nth) {
  const float* restrict in0 = (const float*)io[0];
  const float* restrict in1 = (const float*)io[1];
  const float* restrict in2 = (const float*)io[2];
  float* restrict out0 = (float*)io[3];
  float* restrict scr = ws + PRISM_WS_FLOATS;
  const long scr_stride = PRISM_SCRATCH_FLOATS;
  (void)scr; (void)scr_stride;
  blk0(in0, in1, in2, out0, scr, scr_stride, nth);
  return 0;
}
