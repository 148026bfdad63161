/* prism kernel (avx512); codegen v1 */
#define PRISM_WS_FLOATS ((long)0)
#define PRISM_SCRATCH_FLOATS ((long)80)

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
PR_NOINLINE void blk0(const float* restrict a0, const float* restrict a1, float* restrict o0, float* restrict scr, long scr_stride, int nth) {
  const int nt = nth < 1 ? nth : 1;
  #pragma omp parallel num_threads(nt)
  {
    float* restrict S = scr + (long)omp_get_thread_num() * scr_stride;
    (void)S;
    #pragma omp for schedule(static)
    for (long blk = 0; blk < 2; blk++) {
      const long b0 = blk;
      const float* v1 = a0;
      const float* v2 = a1 + b0 * 16;
      #pragma omp simd
      for (long i8 = 0; i8 < 4; i8++) {
        (S + 64)[i8] = 0.0f;
      }
      for (long it = 0; it < 2; it++) {
        const float* v1i = v1 + it * 32;
        const float* v2i = v2 + it * 1024;
        float* C3 = (S + 0);
        const float* A4 = v1i;
        const float* B5 = v2i;
        for (long kc6 = 0; kc6 < 32; kc6 += 16) {
          const long kn7 = pr_minl(16, 32 - kc6);
          pr_nn_avx512_4x1(kn7, (A4 + kc6 * 1) + (0) * 64, 64, 1, (B5 + kc6 * 32) + 0, 32, C3 + (0) * 16 + 0, 16, (kc6 == 0 ? (it > 0) : 1), 0);
        }
        for (long i9 = 0; i9 < 4; i9++) {
          float s11 = 0.0f;
          #pragma omp simd reduction(+:s11)
          for (long j10 = 0; j10 < 32; j10++) {
            s11 = s11 + pr_square(v1i[i9 * 64 + j10]);
          }
          (S + 64)[i9] = (S + 64)[i9] + s11;
        }
      }
      for (long r12 = 0; r12 < 4; r12++) (S + 64)[r12] = sqrtf((S + 64)[r12] / 0x1p+6f + 0x1.0c6f7ap-20f);
      for (long i13 = 0; i13 < 4; i13++) {
        #pragma omp simd
        for (long i14 = 0; i14 < 16; i14++) {
          (o0 + b0 * 16)[i13 * 32 + i14] = ((S + 0)[i13 * 16 + i14] / (S + 64)[i13]);
        }
      }
    }
  }
}

int prism_entry(void** io, float* ws, int nth) {
  const float* restrict in0 = (const float*)io[0];
  const float* restrict in1 = (const float*)io[1];
  float* restrict out0 = (float*)io[2];
  float* restrict scr = ws + PRISM_WS_FLOATS;
  const long scr_stride = PRISM_SCRATCH_FLOATS;
  (void)scr; (void)scr_stride;
  blk0(in0, in1, out0, scr, scr_stride, nth);
  return 0;
}
