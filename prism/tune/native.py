"""The machine's physical limits, measured: peak FP32 FLOP/s (an FMA loop) and DRAM bandwidth (a triad).

Both are small C kernels compiled once like every generated kernel (``prism.runtime.cache``: ``cc -O3
-march=native -fopenmp``, cached by a hash of source, flags and compiler version) and loaded with
ctypes, so they run with the same OpenMP threading as Prism's generated code. Without a C compiler a
NumPy fallback is used and labelled as a lower bound: its triad makes a temporary (5 array passes
counted as 3) and its "peak" is a large matmul.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from prism.errors import PrismError

# GCC vector extensions of the register's width: 64 bytes with AVX-512, 32 without (a 64-byte vector on an
# AVX2 Zen 3 host became pairs of halves shuffled through the stack: 13 GFLOP/s on 2 cores). NACC independent
# chains hide the FMA latency on every x86 core we know (latency 4-5 x 2 pipes) and fit the registers.
_SOURCE = r"""
#include <omp.h>
#include <stdlib.h>
#if defined(__linux__)
#include <sys/mman.h>
#endif

#if defined(__AVX512F__)
#define LANES 16
#else
#define LANES 8
#endif
typedef float v16 __attribute__((vector_size(LANES * 4)));
#define NACC 12

static volatile float g_sink;

double prism_bench_peak(long iters, int nthreads) {
    double t0 = omp_get_wtime();
    float sink = 0.0f;
    #pragma omp parallel num_threads(nthreads) reduction(+:sink)
    {
        v16 acc[NACC];
        v16 b, c;
        for (int k = 0; k < LANES; k++) { b[k] = 1.0000001f; c[k] = 1e-7f * (float)(k + 1); }
        for (int j = 0; j < NACC; j++) for (int k = 0; k < LANES; k++) acc[j][k] = (float)(j + k) * 1e-3f;
        for (long i = 0; i < iters; i++) {
            #pragma GCC unroll 12
            for (int j = 0; j < NACC; j++) acc[j] = acc[j] * b + c;
        }
        v16 s = acc[0];
        for (int j = 1; j < NACC; j++) s += acc[j];
        sink += s[0] + s[LANES - 1];
    }
    double t = omp_get_wtime() - t0;
    g_sink = sink;
    return t;
}

int prism_bench_flops_per_iter(void) { return NACC * LANES * 2; }

static float *ta, *tb, *tc;
static long tn;

/* 2 MiB-aligned, huge pages requested where the kernel has them on request (THP "madvise"): a stream
   over 4 KiB pages pays a TLB walk per page, which generated kernels over large weights need not */
static float *huge_alloc(long n) {
    const size_t align = (size_t)1 << 21;
    size_t bytes = ((size_t)n * sizeof(float) + align - 1) / align * align;
    float *p = aligned_alloc(align, bytes);
#if defined(__linux__) && defined(MADV_HUGEPAGE)
    if (p) madvise(p, bytes, MADV_HUGEPAGE);
#endif
    return p;
}

int prism_bench_triad_init(long n, int nthreads) {
    free(ta); free(tb); free(tc);
    ta = huge_alloc(n);
    tb = huge_alloc(n);
    tc = huge_alloc(n);
    if (!ta || !tb || !tc) return -1;
    tn = n;
    /* first touch by the threads that use the pages */
    #pragma omp parallel for schedule(static) num_threads(nthreads)
    for (long i = 0; i < n; i++) { ta[i] = 0.0f; tb[i] = 1.0f; tc[i] = 2.0f; }
    return 0;
}

void prism_bench_triad_free(void) {
    free(ta); free(tb); free(tc);
    ta = tb = tc = 0;
    tn = 0;
}

/* the length of the arrays the triad runs over (0: freed; they are one set per process) */
long prism_bench_triad_size(void) { return tn; }

/* best-of-reps seconds of a[i] = b[i] + s*c[i] with ordinary (temporal) stores */
double prism_bench_triad(int reps, int nthreads) {
    double best = 1e30;
    const float s = 3.0f;
    for (int r = 0; r < reps; r++) {
        double t0 = omp_get_wtime();
        #pragma omp parallel for schedule(static) num_threads(nthreads)
        for (long i = 0; i < tn; i++) ta[i] = tb[i] + s * tc[i];
        double t = omp_get_wtime() - t0;
        if (t < best) best = t;
    }
    return best;
}

static float read_sum(const float *p, long n, int nthreads) {
    float s = 0.0f;
    const v16 *v = (const v16 *)p;
    long nv = n / (4 * LANES) * 4;
    #pragma omp parallel num_threads(nthreads) reduction(+:s)
    {
        v16 a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0};
        #pragma omp for schedule(static)
        for (long i = 0; i < nv; i += 4) { a0 += v[i]; a1 += v[i + 1]; a2 += v[i + 2]; a3 += v[i + 3]; }
        v16 t = a0 + a1 + a2 + a3;
        for (int k = 0; k < LANES; k++) s += t[k];
    }
    return s;
}

/* best-of-reps seconds of a read-only sum over the triad's b and c arrays (2 x n floats, nothing written):
   the limit of a kernel that streams weights, which the triad (a third of it written) under-states */
double prism_bench_read(int reps, int nthreads) {
    double best = 1e30;
    float sink = 0.0f;
    for (int r = 0; r < reps; r++) {
        double t0 = omp_get_wtime();
        sink += read_sum(tb, tn, nthreads) + read_sum(tc, tn, nthreads);
        double t = omp_get_wtime() - t0;
        if (t < best) best = t;
    }
    g_sink = sink;
    return best;
}
"""

TRIAD_FLOATS = 1 << 24          # 64 MiB per array, 192 MiB in all: far beyond any L3 we target
TRIAD_REPS = 3


def find_cc() -> str | None:
    return os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")


def cc_version(cc: str) -> str:
    try:
        out = subprocess.run([cc, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return out.splitlines()[0].strip() if out else "unknown"


def _load_lib() -> ctypes.CDLL:
    """The probes, compiled and cached like every generated kernel (prism.runtime.cache: checksummed,
    atomic, a private fallback directory when the cache is read-only)."""
    from prism.runtime.cache import load
    lib, _ = load(_SOURCE, ("prism_bench_peak", "prism_bench_triad", "prism_bench_triad_init",
                            "prism_bench_triad_free", "prism_bench_triad_size", "prism_bench_read"))
    return lib


@dataclass
class Limits:
    """Measures peak FLOP/s and triad bandwidth with ``threads`` threads; ``method`` says how."""

    threads: int
    method: str
    _lib: ctypes.CDLL | None = None
    _np_arrays: tuple[np.ndarray, ...] | None = None
    _ready: bool = False    # the triad arrays are allocated (the C library's are shared: see release)

    @classmethod
    def load(cls, threads: int, use_c: bool = True) -> Limits:
        cc = find_cc() if use_c else None
        if cc is not None:
            try:
                lib = _load_lib()
            except (OSError, PrismError):   # no usable compiler: the NumPy fallback below, labelled so
                lib = None
            if lib is not None:
                lib.prism_bench_peak.restype = ctypes.c_double
                lib.prism_bench_peak.argtypes = [ctypes.c_long, ctypes.c_int]
                lib.prism_bench_flops_per_iter.restype = ctypes.c_int
                lib.prism_bench_triad_init.restype = ctypes.c_int
                lib.prism_bench_triad_init.argtypes = [ctypes.c_long, ctypes.c_int]
                lib.prism_bench_triad.restype = ctypes.c_double
                lib.prism_bench_triad.argtypes = [ctypes.c_int, ctypes.c_int]
                lib.prism_bench_triad_free.restype = None
                lib.prism_bench_triad_size.restype = ctypes.c_long
                lib.prism_bench_read.restype = ctypes.c_double
                lib.prism_bench_read.argtypes = [ctypes.c_int, ctypes.c_int]
                return cls(threads, f"C ({cc_version(cc)}, -O3 -march=native -fopenmp, OpenMP)", lib)
        return cls(threads, "NumPy fallback (no C compiler): lower bounds", None)

    def _arrays(self) -> None:
        """Allocate (and first-touch) the triad arrays if they are not: :meth:`release` frees them."""
        if self._lib is not None:
            if self._lib.prism_bench_triad_init(TRIAD_FLOATS, self.threads) != 0:
                raise MemoryError(f"could not allocate the triad arrays (3 x {TRIAD_FLOATS * 4 >> 20} MiB)")
        else:
            self._np_arrays = tuple(np.full(TRIAD_FLOATS, v, dtype=np.float32) for v in (0.0, 1.0, 2.0, 0.0))
        self._ready = True

    def release(self) -> None:
        """Free the triad arrays (192 MiB; the C library keeps one set for every Limits of the process): the
        tuner measures the machine once and then keeps nothing of it (a model's first start-up held them
        to the end: +192 MiB of its memory added)."""
        if self._lib is not None:
            self._lib.prism_bench_triad_free()
        self._np_arrays = None
        self._ready = False

    def peak_flops(self, seconds: float = 0.5) -> float:
        """Peak FP32 FLOP/s: the best of 3 runs of an FMA loop sized to take about ``seconds``."""
        if self._lib is None:
            return _numpy_matmul_flops(seconds)
        per_iter = self._lib.prism_bench_flops_per_iter() * self.threads
        iters = 10_000
        while (t := self._lib.prism_bench_peak(iters, self.threads)) < seconds / 4:
            iters *= 2
        best = min([t] + [self._lib.prism_bench_peak(iters, self.threads) for _ in range(2)])
        return per_iter * iters / best

    def _ensure_arrays(self) -> None:
        # the C library's arrays are one set per process: another Limits' release() (the tuner's machine
        # measurement, inside a bench run from empty caches) freed them under this one, whose triads then ran
        # over no elements and reported 350,000-460,000 GB/s beside every case (2026-11-28)
        if not self._ready or (self._lib is not None and self._lib.prism_bench_triad_size() != TRIAD_FLOATS):
            self._arrays()

    def read_bandwidth(self) -> float:
        """DRAM read bandwidth in bytes/s: a read-only sum over two of the triad's arrays (128 MiB, huge pages
        requested), best of ``TRIAD_REPS``. The limit of a kernel that streams weights and writes little;
        the triad under-states it (Zen 5 host, 2 threads: 53-56 GB/s read where the triad said 47-50)."""
        nbytes = 2 * 4 * TRIAD_FLOATS
        self._ensure_arrays()
        if self._lib is not None:
            return nbytes / self._lib.prism_bench_read(TRIAD_REPS, self.threads)
        assert self._np_arrays is not None
        _, b, c, _ = self._np_arrays
        return nbytes / _best_seconds(lambda: (b.sum(), c.sum()))

    def triad_bandwidth(self) -> float:
        """DRAM bandwidth in bytes/s, STREAM convention: 3 arrays x 4 bytes per element (no write-allocate
        traffic counted), best of ``TRIAD_REPS``."""
        nbytes = 3 * 4 * TRIAD_FLOATS
        self._ensure_arrays()
        if self._lib is not None:
            return nbytes / self._lib.prism_bench_triad(TRIAD_REPS, self.threads)
        assert self._np_arrays is not None
        a, b, c, tmp = self._np_arrays
        return nbytes / _best_seconds(lambda: np.add(b, np.multiply(c, np.float32(3.0), out=tmp), out=a))


def _best_seconds(fn: Callable[[], object], reps: int = TRIAD_REPS) -> float:
    """The best of ``reps`` timed calls of ``fn`` (the NumPy fallbacks of the stream meters)."""
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def _numpy_matmul_flops(seconds: float) -> float:
    n = 2048
    a = np.ones((n, n), dtype=np.float32)
    b = np.ones((n, n), dtype=np.float32)
    a @ b
    best = float("inf")
    t_end = time.perf_counter() + seconds
    while time.perf_counter() < t_end:
        t0 = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - t0)
    return 2 * n ** 3 / best
