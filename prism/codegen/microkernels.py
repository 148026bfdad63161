"""Register-blocked SIMD micro-kernels for tile matmul (AVX-512, AVX2 and portable C).

``nn`` (B row-major, the weight case): ``C[MR x NV*W] (beta) A[MR x K] @ B[K x NV*W]``. The sums of
the C block live in MR*NV vector registers, starting from the first product (never from C: see
ACC_CHUNK); each step loads NV vectors of one B row (one contiguous run of the weight) and broadcasts
MR scalars of A. Then beta: 0 C = sum, 1 C += sum, 2 C = C * cs[r] + sum (the online-softmax rescale,
fused). The last vector of a panel may be partial (``tail`` lanes, masked loads/stores).

``nt`` (B given transposed, K contiguous in both operands: Q @ K^T): per C row, W keys at a time, one
accumulator per key over K, then one transpose-and-add network turns W accumulators into one vector
of W dot products (instead of W horizontal reductions); the vector kernels sum any K in the three
levels of ACC_CHUNK.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable

import numpy as np

from prism.codegen.isa import ISA, bf16_dot, i8_dot, l1d_bytes, l2_bytes
from prism.codegen.tiles import ctype, ld

# How the tn and grouped micro-kernels (a Linear's products) are declared: not inlined. A template over a prompt's
# length holds up to 8 of a product's kernels (the blocks' shapes and the last block's tails), each called from 2-4
# places, and gcc inlined every call: llama-1b bf16's linear+add template took 1.51 s inlined, 0.64 s not (gcc 12
# -O3, Zen 5 VM). Each call runs a whole K chunk: that template at 141 / 128 rows 4.21 / 3.42 ms inlined, 4.11 / 3.34
# not (/tmp ctypes timing of the two builds of one source, alternating, 2 threads). The nn and nt kernels (attention:
# K = a head's 64 per call) stay inlined: not inlining them too took the prefill attention's template from 1.15 to
# 0.67 s of gcc but llama-1b bf16's 128-token prefill from 116.9-122.3 ms to 121.6-125.4 (warm caches, the same
# tunings, processes alternating); with only these not inlined 116.0-122.6. PRISM_KERNEL_INLINE=1 inlines them too.
LINKAGE = "PR_INLINE" if os.environ.get("PRISM_KERNEL_INLINE", "0").strip() == "1" else "PR_NOINLINE"

# Software prefetch of B, PF_ROWS rows ahead, into L2 (prefetcht1). A weight tile is a column strip of a
# row-major matrix: every row is a new 4 KiB page, which the hardware prefetchers do not cross. Measured
# on the 2-core Zen 4 VM (W1 n=8 d=4096, one thread): 7.5 GB/s without, 20 GB/s with (distance 24-48
# rows all within 2%; prefetcht0 was slower), and no cost when B is cache-resident.
PF_ROWS = 32
PF_KEYS = 16  # nt: prefetch the Bt rows (keys) this many rows ahead
PF_AHEAD = 4096  # nt, one key at a time: prefetch the key stream this many bytes ahead (nt_single_keys)
# nn over B rows of at most PF_SHORT_ROW bytes (attention's V, head dims of 64-256): PF_AHEAD bytes ahead, not
# PF_ROWS rows (nn_prefetch_rows); nt over K chunks of keys stored back to back within PF_SHORT_ROW bytes each:
# no software prefetch (nt_chunk_prefetch)
PF_SHORT_ROW = 1024

# Summation order of every contraction (K). One running sum per output over all of K (a single FMA
# chain, as this code had) has an rms rounding error growing like K*u/sqrt(6) for unit-variance products
# (u = 2^-24): 3-12x torch.matmul's (MKL) from K = 2048 on. BLAS adds the sums of K blocks of a few
# hundred into C. Here three levels: ACC_CHUNK products per output summed in registers that start from
# the chunk's first product, ACC_GROUP chunk sums added into a group sum, the group sums added into C;
# the error variance is ~ u^2/6 * (K*ACC_CHUNK + K*ACC_GROUP + K^2/ACC_ROWS), which grows like BLAS's.
# Measured (32 x K x 32, standard normal, rms error / u, torch in brackets): K = 2048: 119 (183),
# 8192: 256 (418), 32768: 646 (1026), 131072: 1972 (3249). A chunk of 128 halves the bookkeeping but
# simulates at 0.75-1.0x torch's largest error at K = 2048: too close for a bound that must hold. Cost
# of 64: ~1% of a long-K 8x3 call in cache (a vector add and a spill per accumulator per 64 k-steps);
# none for the K-chunk calls of 8-32 rows of matmul.py, which are one chunk each.
ACC_CHUNK = 64
ACC_GROUP = 8
ACC_ROWS = ACC_CHUNK * ACC_GROUP  # K rows of one group sum (callers that cut K into calls use it too)

# max rows per micro-kernel, and the widest panel (vectors) for a given row count: accumulators
# MR*NV + NV B vectors + 1 broadcast must fit the register file
MR_MAX = {"avx512": 8, "avx2": 6, "portable": 8}
ITEMSIZE = {"f32": 4, "bf16": 2, "f16": 2, "i8": 1}


def nv_max(isa: ISA, mr: int) -> int:
    if isa.name == "portable":
        return 4
    cap = 8 if isa.name == "avx512" else 4
    return max(1, min(cap, (isa.nregs - 2) // (mr + 1)))


def lanes(isa: ISA) -> int:
    return isa.width if isa.vector else 16  # the portable path thinks in 16-column strips


class _V:
    """Vector intrinsics of one ISA (as C text)."""

    def __init__(self, isa: ISA) -> None:
        self.isa = isa
        self.p = "_mm512" if isa.name == "avx512" else "_mm256"

    def mask(self, tail: int | str) -> str:
        """The mask of a vector's first ``tail`` lanes: an int, or a C expression (RT_TAIL: a run-time count)."""
        if isinstance(tail, str):
            if self.isa.name == "avx512":
                return f"(__mmask16)((1u << ({tail})) - 1)"
            return f"_mm256_cmpgt_epi32(_mm256_set1_epi32((int)({tail})), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7))"
        if self.isa.name == "avx512":
            return f"(__mmask16)0x{(1 << tail) - 1:x}"
        return "_mm256_setr_epi32(" + ", ".join("-1" if i < tail else "0" for i in range(8)) + ")"

    def load(self, p: str, tail: int | str = 0, elem: str = "f32") -> str:
        """A vector of floats from ``p`` (``tail``: only that many lanes, the rest 0; an int, or a C
        expression for typed loads); ``elem``: the storage, converted exactly (prelude's pr_v<W>_<elem>)."""
        if elem != "f32":
            fn = f"pr_v{self.isa.width}_{elem}"
            return f"{fn}_n({p}, {tail})" if tail else f"{fn}({p})"
        if not tail:
            return f"{self.p}_loadu_ps({p})"
        if self.isa.name == "avx512":
            return f"_mm512_maskz_loadu_ps({self.mask(tail)}, {p})"
        return f"_mm256_maskload_ps({p}, {self.mask(tail)})"

    def store(self, p: str, v: str, tail: int | str = 0) -> str:
        if not tail:
            return f"{self.p}_storeu_ps({p}, {v});"
        if self.isa.name == "avx512":
            return f"_mm512_mask_storeu_ps({p}, {self.mask(tail)}, {v});"
        return f"_mm256_maskstore_ps({p}, {self.mask(tail)}, {v});"

    def zero(self) -> str:
        return f"{self.p}_setzero_ps()"

    def set1(self, x: str) -> str:
        return f"{self.p}_set1_ps({x})"

    def fma(self, a: str, b: str, c: str) -> str:
        return f"{self.p}_fmadd_ps({a}, {b}, {c})"

    def mul(self, a: str, b: str) -> str:
        return f"{self.p}_mul_ps({a}, {b})"

    def add(self, a: str, b: str) -> str:
        return f"{self.p}_add_ps({a}, {b})"

    def sum_lanes(self, dst: str, v: str) -> str:
        """C statements declaring ``float dst``, the sum of vector ``v``'s lanes by a shuffle tree."""
        if self.isa.name == "avx512":
            return f"float {dst} = _mm512_reduce_add_ps({v});"
        h = f"{dst}_h"
        return (f"__m128 {h} = _mm_add_ps(_mm256_castps256_ps128({v}), _mm256_extractf128_ps({v}, 1));\n"
                f"    {h} = _mm_add_ps({h}, _mm_movehl_ps({h}, {h}));\n"
                f"    float {dst} = _mm_cvtss_f32(_mm_add_ss({h}, _mm_movehdup_ps({h})));")


F32 = ("f32", "f32")


def _suffix(elems: tuple[str, str]) -> str:
    """Name suffix of a micro-kernel whose A and B are stored as ``elems`` (none for float32)."""
    return "" if elems == F32 else f"_{elems[0]}_{elems[1]}"


# ``tail`` of an nn micro-kernel whose column count is an argument (``tn``, 0..nv*W) rather than part of its text:
# vector j takes clamp(tn - j*W, 0, W) lanes (masked loads and stores; a vector of none is computed on zeros and
# not stored). The last panel of a product whose column count varies in a template (matmul.py: cols_vary).
RT_TAIL = "tn"


def nn_sig(elems: tuple[str, str] = F32, tail: int | str = 0) -> str:
    a, b = (ctype(e) for e in elems)
    return (f"(long K, const {a}* restrict A, long sa0, long sa1, const {b}* restrict B, long sb0, "
            "float* restrict C, long sc0, int beta, const float* restrict cs"
            + (f", int {RT_TAIL})" if tail == RT_TAIL else ")"))


def nn_pairs(isa: ISA, elems: tuple[str, str]) -> bool:
    """Whether the nn kernels of ``elems`` take B's rows two at a time with ``vdpbf16ps``: both operands
    bfloat16 on a machine with AVX512_BF16. Rows k and k + 1 of B are interleaved in registers
    (``vpunpcklwd``/``vpunpckhwd``: 32 columns of the two rows -> two vectors of 16 column pairs) and
    multiplied by the broadcast pair (A[r, k], A[r, k + 1]): the same exact products as the widening loads,
    summed in float32 two per lane and step. The unpack leaves a vector's lanes in an order of its own (columns
    0-3, 8-11, ... in one, 4-7, 12-15, ... in the other); the sums are put back in column order once per call,
    before C is touched. Measured need (Zen 5 VM, 2 threads, W3's two bfloat16 [4096, 11008] weights in the
    K-chunk sweep of matmul.py, standalone C, three alternating runs): the widening kernel read 32-35 GB/s,
    this one 46-52 (the float32 kernel beside it 48-51, a bfloat16 weight at half its bytes); in a faster phase
    of the host 43-45 against 62-70."""
    return isa.name == "avx512" and elems == ("bf16", "bf16") and bf16_dot(isa)


def nn_name(isa: ISA, mr: int, nv: int, tail: int | str, blocked: bool = False, elems: tuple[str, str] = F32) -> str:
    return (f"pr_nn_{isa.name}_{mr}x{nv}" + (f"_t{tail}" if tail else "") + ("_kb" if blocked else "")
            + _suffix(elems) + ("_dp" if nn_pairs(isa, elems) else ""))


def _pair_load(n: int, tail: int | str, p: str) -> str:
    """n (32 or 16) bfloat16 of one B row at ``p`` as integer lanes; with ``tail`` the columns past it read as
    zero: an int, the lanes of the group's last 16-column vector; a C expression, the group's columns (0..n)."""
    if isinstance(tail, str):
        return (f"_mm512_maskz_loadu_epi16((__mmask32)((1ull << ({tail})) - 1), {p})" if n == 32
                else f"_mm256_maskz_loadu_epi16((__mmask16)((1u << ({tail})) - 1), {p})")
    if n == 32:
        return (f"_mm512_maskz_loadu_epi16((__mmask32)0x{(1 << (16 + tail)) - 1:x}, {p})" if tail
                else f"_mm512_loadu_si512((const void*)({p}))")
    return (f"_mm256_maskz_loadu_epi16((__mmask16)0x{(1 << tail) - 1:x}, {p})" if tail
            else f"_mm256_loadu_si256((const __m256i*)({p}))")


def _pair_order(n: int) -> list[int]:
    """For the sums of ``n`` (32 or 16) columns of unpacked row pairs: the lane (0-31 over the two vectors of
    a 32-column group, 0-15 for a 16-column one) that holds each column, in column order."""
    lane_col = ([8 * (i // 4) + i % 4 for i in range(16)] + [8 * (i // 4) + 4 + i % 4 for i in range(16)]
                if n == 32 else [8 * (i // 4) + i % 4 for i in range(8)] + [8 * (i // 4) + 4 + i % 4 for i in range(8)])
    where = {c: lane for lane, c in enumerate(lane_col)}
    return [where[c] for c in range(n)]


def nn_prefetch_rows(row_bytes: str) -> str:
    """A C expression: how many rows of B ahead the nn kernels prefetch, for B rows ``row_bytes`` apart.

    PF_ROWS rows for long rows: a panel of a wide weight is a column strip, every row a new page (see PF_ROWS).
    Short rows (at most PF_SHORT_ROW bytes: attention's V with a head dim of 64-256) are one stream that the
    panel walks nearly front to back; there PF_ROWS rows reached 8-32 KiB ahead, and PF_AHEAD bytes (the
    distance that keeps a GEMV's key stream at the read bandwidth, ``nt_row_stream``) is better. W6 (GQA
    decode, b = 8, S = 4096: 134 MB of K and V per call, from DRAM) with the generated kernels in a C harness,
    2 threads, three runs, against the kernels of before (with the nt change of ``nt_chunk_prefetch``):
    bfloat16 V rows (256 B) 16 rows ahead 1.08-1.09x, 32 rows (before) 1.00; float32 (512 B) 8 rows ahead
    1.00-1.14x."""
    return (f"({row_bytes} > {PF_AHEAD // PF_ROWS} && {row_bytes} <= {PF_SHORT_ROW} ? {PF_AHEAD} / ({row_bytes})"
            f" : {PF_ROWS})")


def nt_chunk_prefetch(keys_stride: int | str, K: int | str, elem: str) -> bool:
    """Whether an nt call over a K chunk prefetches the keys ahead (``nt_kernel``'s ``prefetch``): not where
    the keys are stored back to back (their stride is K) in at most PF_SHORT_ROW bytes each -- attention's
    keys over a head dim, one sequential stream the hardware prefetchers follow. The prefetches, one per key
    per line PF_KEYS keys ahead, only took load slots there: W6 b = 8, S = 4096 (see ``nn_prefetch_rows``),
    bfloat16 1.03-1.07x without them (1.08-1.09x together with the nn distance), float32 0.97-1.20x (1.00-1.14x
    together). Keys of a weight (rows thousands of elements long, read in chunks at the row stride) keep them."""
    short = isinstance(K, int) and K * ITEMSIZE[elem] <= PF_SHORT_ROW
    return not (short and isinstance(keys_stride, int) and keys_stride == K)


def nn_kernel(isa: ISA, mr: int, nv: int, tail: int | str, blocked: bool = False,
              elems: tuple[str, str] = F32) -> str:
    """C[mr x cols] (beta) A @ B with cols = nv*W (the last vector has ``tail`` lanes if tail > 0; RT_TAIL:
    cols = the argument ``tn``, 0..nv*W).

    The products are summed in the C block's registers, starting from the first one, and the sum is then
    combined with C (beta 0: C = sum, 1: C += sum, 2: C = C * cs[row] + sum). Without ``blocked`` the
    caller guarantees K <= ACC_CHUNK (the K-chunk calls of matmul.py); ``blocked`` takes any K in the
    three levels of ``ACC_CHUNK``: chunks in registers, the chunk sums of a group in ``s`` (registers or
    stack),
    each group sum into C (beta for the first group). The group bookkeeping runs between chunks only:
    a call of one chunk costs the same as a plain loop, and the short variant keeps it out of the
    K-chunk calls entirely (its per-call tests cost 5% of an 8x2 call of 32 rows).
    """
    name = nn_name(isa, mr, nv, tail, blocked, elems)
    ea, eb = elems
    if not isa.vector:
        return _nn_portable(name, mr, nv, tail, elems)
    pairs = nn_pairs(isa, elems)
    v, W = _V(isa), isa.width
    L: list[str] = [f"PR_INLINE void {name}{nn_sig(elems, tail)} {{"]
    acc = [[f"c{r}_{j}" for j in range(nv)] for r in range(mr)]
    L.append(f"  {isa.vtype} " + ", ".join(x for row in acc for x in row) + ";")
    if not pairs:  # the prefetch distance: nn_prefetch_rows
        L.append(f"  const long pfo = {nn_prefetch_rows(f'sb0 * {ITEMSIZE[eb]}')} * sb0;")
    cells = [(r, j, (r * nv + j) * W) for r in range(mr) for j in range(nv)]
    # one prefetch per 64 bytes of the panel row PF_ROWS ahead, plus its last element: rows of a
    # weight that is not 64-byte aligned straddle one more cache line
    cols = (nv - 1) * W + (tail if isinstance(tail, int) and tail else W)
    ind = "    " if blocked else "  "
    rt = tail == RT_TAIL
    if rt:   # each vector's lanes (RT_TAIL)
        L.append("  const long " + ", ".join(f"tn{j} = tn <= {j * W} ? 0 : tn >= {(j + 1) * W} ? {W} : tn - {j * W}"
                                             for j in range(nv)) + ";")

    def tl(j: int) -> int | str:
        return f"tn{j}" if rt else tail if j == nv - 1 else 0

    def cell(r: int, j: int) -> str:
        return f"C + {r} * sc0 + {j * W}"

    def step(first: bool) -> None:
        """One k; the first of a chunk multiplies, so no register is zeroed."""
        i2 = ind + "  "
        L.append(f"{i2}const {ctype(eb)}* Bk = B + k * sb0;")
        L.append(f"{i2}const {ctype(ea)}* Ak = A + k * sa1;")
        per_line = 64 // ITEMSIZE[eb]   # elements of B per cache line
        for off in [*range(0, cols, per_line), cols - 1]:
            L.append(f"{i2}__builtin_prefetch(Bk + pfo + {off}, 0, 2);")
        for j in range(nv):
            L.append(f"{i2}{isa.vtype} b{j} = {v.load(f'Bk + {j * W}', tl(j), eb)};")
        if mr > 1:  # keep each B vector in a register: gcc otherwise re-reads it as a memory operand per row
            L.append(f"{i2}__asm__(\"\" : " + ", ".join(f'\"+v\"(b{j})' for j in range(nv)) + ");")
        for r in range(mr):
            L.append(f"{i2}{{ {isa.vtype} a = {v.set1(ld(ea, f'Ak[{r} * sa0]'))};")
            L.extend(f"{i2}  {acc[r][j]} = {v.mul('a', f'b{j}') if first else v.fma('a', f'b{j}', acc[r][j])};"
                     for j in range(nv))
            L.append(f"{i2}}}")

    # pairs: B's vectors in groups of 32 columns (two vectors from one unpack) and a last group of 16 if nv is odd
    groups = [(j, min(2, nv - j)) for j in range(0, nv, 2)]

    def pair_step(single: bool) -> None:
        """Rows k and k + 1 (``single``: row k alone, the odd last row of a chunk, paired with zeros)."""
        i2 = ind + "  "
        L.append(f"{i2}const uint16_t* Bk = B + k * sb0;")
        L.append(f"{i2}const uint16_t* Ak = A + k * sa1;")
        if blocked and not single:   # a column strip walked down K: the next rows are new pages
            for row in ("", " + sb0"):
                for off in [*range(0, cols, 32), cols - 1]:
                    L.append(f"{i2}__builtin_prefetch(Bk{row} + {PF_ROWS} * sb0 + {off}, 0, 2);")
        for j, n in groups:
            t = (f"{tl(j)} + {tl(j + 1)}" if n == 2 else tl(j)) if rt else tl(j + n - 1)
            if n == 2:
                r1 = "_mm512_setzero_si512()" if single else _pair_load(32, t, f"Bk + sb0 + {j * W}")
                L.append(f"{i2}const __m512i r{j} = {_pair_load(32, t, f'Bk + {j * W}')}, q{j} = {r1};")
                L.append(f"{i2}const __m512bh b{j} = (__m512bh)_mm512_unpacklo_epi16(r{j}, q{j}), "
                         f"b{j + 1} = (__m512bh)_mm512_unpackhi_epi16(r{j}, q{j});")
            else:
                r1 = "_mm256_setzero_si256()" if single else _pair_load(16, t, f"Bk + sb0 + {j * W}")
                L.append(f"{i2}const __m256i r{j} = {_pair_load(16, t, f'Bk + {j * W}')}, q{j} = {r1};")
                L.append(f"{i2}const __m512bh b{j} = (__m512bh)_mm512_inserti64x4(_mm512_castsi256_si512("
                         f"_mm256_unpacklo_epi16(r{j}, q{j})), _mm256_unpackhi_epi16(r{j}, q{j}), 1);")
        for r in range(mr):
            pair = f"(int)Ak[{r} * sa0]" if single else f"pr_pair_bf16(Ak + {r} * sa0, sa1)"
            L.append(f"{i2}{{ const __m512bh a = (__m512bh)_mm512_set1_epi32({pair});")
            L.extend(f"{i2}  {acc[r][j]} = _mm512_dpbf16_ps({acc[r][j]}, b{j}, a);" for j in range(nv))
            L.append(f"{i2}}}")

    def column_order() -> None:
        """pairs: the sums back in column order (see nn_pairs)."""
        for j, n in groups:
            if n == 2:
                lo, hi = _pair_order(32)[:16], _pair_order(32)[16:]
                L.append(f"{ind}{{ const __m512i i0 = _mm512_setr_epi32({', '.join(map(str, lo))}), "
                         f"i1 = _mm512_setr_epi32({', '.join(map(str, hi))});")
                for r in range(mr):
                    a, b = acc[r][j], acc[r][j + 1]
                    L.append(f"{ind}  {{ const __m512 t0 = _mm512_permutex2var_ps({a}, i0, {b}), "
                             f"t1 = _mm512_permutex2var_ps({a}, i1, {b}); {a} = t0; {b} = t1; }}")
                L.append(f"{ind}}}")
            else:
                L.append(f"{ind}{{ const __m512i i0 = _mm512_setr_epi32({', '.join(map(str, _pair_order(16)))});")
                L.extend(f"{ind}  {acc[r][j]} = _mm512_permutexvar_ps(i0, {acc[r][j]});" for r in range(mr))
                L.append(f"{ind}}}")

    def flush(bt: str) -> None:
        """Combine the sum with C (beta 1 is beta 2 with the factor 1: C * 1 + sum is exactly C + sum). The
        empty asm after each row keeps gcc from loading all of C's block first, while every accumulator
        is still live: it spilled them, and W4's PV product (8x3 calls of 32 rows) ran 5% slower."""
        if pairs:
            column_order()
        L.append(f"{ind}if ({bt} == 0) {{")
        L.extend(f"{ind}  {v.store(cell(r, j), acc[r][j], tl(j))}" for r, j, _ in cells)
        L.append(f"{ind}}} else {{")
        for r in range(mr):
            L.append(f"{ind}  {{ {isa.vtype} s = {v.set1(f'{bt} == 2 ? cs[{r}] : 1.0f')};")
            L.extend(f"{ind}    {v.store(cell(r, j), v.fma(v.load(cell(r, j), tl(j)), 's', acc[r][j]), tl(j))}"
                     for j in range(nv))
            if mr > 1:
                L.append(f'{ind}    __asm__("" ::: "memory");')
            L.append(f"{ind}  }}")
        L.append(f"{ind}}}")

    def chunk(k0: str, k1: str) -> None:
        if pairs:
            L.append(f"{ind}" + " ".join(f"{x} = _mm512_setzero_ps();" for row in acc for x in row))
            L.append(f"{ind}for (long k = {k0}; k + 1 < {k1}; k += 2) {{")
            pair_step(False)
            L.append(f"{ind}}}")
            L.append(f"{ind}if (({k1} - {k0}) & 1) {{")
            L.append(f"{ind}  const long k = {k1} - 1;")
            pair_step(True)
            L.append(f"{ind}}}")
            return
        L.append(f"{ind}{{")
        L.append(f"{ind}  const long k = {k0};")
        step(True)
        L.append(f"{ind}}}")
        L.append(f"{ind}for (long k = {'1' if k0 == '0' else k0 + ' + 1'}; k < {k1}; k++) {{")
        step(False)
        L.append(f"{ind}}}")

    if not blocked:
        chunk("0", "K")
        flush("beta")
        L.append("}")
        return "\n".join(L) + "\n"
    # the group's sum of chunk sums: vector variables, so small blocks keep them in registers (8x1:
    # 16 of 32) and large ones let the compiler spill them (8x3)
    L.append(f"  {isa.vtype} " + ", ".join(f"s{r}_{j} = {v.zero()}" for r, j, _ in cells) + ";")
    L.append("  int bt = beta;")
    L.append(f"  for (long k0 = 0; k0 < K; k0 += {ACC_CHUNK}) {{")
    L.append(f"    const long k1 = pr_minl(K, k0 + {ACC_CHUNK});")
    chunk("k0", "k1")
    L.append(f"    if (k0 % {ACC_ROWS}) {{  /* not the group's first chunk */")
    L.extend(f"      {acc[r][j]} = {v.add(acc[r][j], f's{r}_{j}')};" for r, j, _ in cells)
    L.append("    }")
    L.append(f"    if (k1 < K && k1 % {ACC_ROWS}) {{  /* more chunks in this group */")
    L.extend(f"      s{r}_{j} = {acc[r][j]};" for r, j, _ in cells)
    L.append("      continue;")
    L.append("    }")
    flush("bt")
    L.append("    bt = 1;")
    L.append("  }")
    L.append("}")
    return "\n".join(L) + "\n"


def _nn_portable(name: str, mr: int, nv: int, tail: int | str, elems: tuple[str, str] = F32) -> str:
    width = nv * 16
    cols: int | str = tail if tail == RT_TAIL else (nv - 1) * 16 + (tail or 16)
    ea, eb = elems
    pf = (f"      for (int j = 0; j < {cols}; j += 16) __builtin_prefetch(Bk + {PF_ROWS} * sb0 + j, 0, 2);\n"
          f"      __builtin_prefetch(Bk + {PF_ROWS} * sb0 + {cols} - 1, 0, 2);\n")
    return f"""PR_INLINE void {name}{nn_sig(elems, tail)} {{
  float c[{mr}][{width}], t[{mr}][{width}];
  int bt = beta;
  for (long k0 = 0; k0 < K; k0 += {ACC_CHUNK}) {{
    const long k1 = pr_minl(K, k0 + {ACC_CHUNK});
    for (int r = 0; r < {mr}; r++) {{
      #pragma omp simd
      for (int j = 0; j < {cols}; j++) c[r][j] = 0.0f;
    }}
    for (long k = k0; k < k1; k++) {{
      const {ctype(eb)}* Bk = B + k * sb0;
{pf}      for (int r = 0; r < {mr}; r++) {{
        const float a = {ld(ea, "A[r * sa0 + k * sa1]")};
        #pragma omp simd
        for (int j = 0; j < {cols}; j++) c[r][j] += a * {ld(eb, "Bk[j]")};
      }}
    }}
    const int more = k1 < K && k1 % {ACC_ROWS};  /* more chunks in this group */
    for (int r = 0; r < {mr}; r++) {{
      #pragma omp simd
      for (int j = 0; j < {cols}; j++) {{
        if (k0 % {ACC_ROWS}) c[r][j] += t[r][j];
        if (more) t[r][j] = c[r][j];
      }}
    }}
    if (more) continue;
    for (int r = 0; r < {mr}; r++) {{
      const float s = bt == 2 ? cs[r] : 1.0f;
      #pragma omp simd
      for (int j = 0; j < {cols}; j++) C[r * sc0 + j] = bt == 0 ? c[r][j] : C[r * sc0 + j] * s + c[r][j];
    }}
    bt = 1;
  }}
}}
"""


def blocked_sum(var: str, term: str, K: str, ind: str = "") -> list[str]:
    """C lines setting ``float var`` to the sum of ``term`` (an expression of ``k``) over k < K, in the
    three levels of ``ACC_CHUNK`` (each chunk a vectorized OpenMP reduction); the loop names are scoped."""
    return [f"{ind}float {var} = 0.0f;",
            f"{ind}for (long s0_ = 0; s0_ < {K}; s0_ += {ACC_ROWS}) {{",
            f"{ind}  const long s1_ = pr_minl({K}, s0_ + {ACC_ROWS});",
            f"{ind}  float g_ = 0.0f;",
            f"{ind}  for (long k0_ = s0_; k0_ < s1_; k0_ += {ACC_CHUNK}) {{",
            f"{ind}    const long k1_ = pr_minl(s1_, k0_ + {ACC_CHUNK});",
            f"{ind}    float p_ = 0.0f;",
            f"{ind}    #pragma omp simd reduction(+:p_)",
            f"{ind}    for (long k = k0_; k < k1_; k++) p_ += {term};",
            f"{ind}    g_ += p_;",
            f"{ind}  }}",
            f"{ind}  {var} += g_;",
            f"{ind}}}"]


# --- nt: dot products with a transpose-and-add reduction ------------------------------------------

def _sim_shuffle_f32x4(a: np.ndarray, b: np.ndarray, imm: int) -> np.ndarray:
    ch = [(a if k < 2 else b)[4 * ((imm >> (2 * k)) & 3):4 * ((imm >> (2 * k)) & 3) + 4] for k in range(4)]
    return np.concatenate(ch)


def _sim_shuffle_ps512(a: np.ndarray, b: np.ndarray, imm: int) -> np.ndarray:
    out = np.empty_like(a)
    for lane in range(4):
        base = 4 * lane
        for k in range(4):
            src = a if k < 2 else b
            out[base + k] = src[base + ((imm >> (2 * k)) & 3)]
    return out


_LEVELS_512 = (("f32x4", 0x44, 0xEE), ("f32x4", 0x88, 0xDD), ("ps", 0x44, 0xEE), ("ps", 0x88, 0xDD))


def _hsum16_order() -> list[int]:
    """Which input vector's sum lands in each lane of the AVX-512 network (found by simulating it)."""
    vs = [np.zeros((16, 16)) for _ in range(16)]  # track coefficients: vs[i][lane] = one-hot over inputs
    for i in range(16):
        vs[i][:, i] = 1.0
    for kind, lo, hi in _LEVELS_512:
        shuf = _sim_shuffle_f32x4 if kind == "f32x4" else _sim_shuffle_ps512
        nxt = []
        for a, b in zip(vs[0::2], vs[1::2]):
            nxt.append(np.stack([shuf(a[:, k], b[:, k], lo) + shuf(a[:, k], b[:, k], hi) for k in range(16)], 1))
        vs = nxt
    (res,) = vs
    order = []
    for lane in range(16):
        src = np.nonzero(res[lane])[0]
        assert len(src) == 1 and res[lane, src[0]] == 16.0
        order.append(int(src[0]))
    return order


@functools.cache
def _hsum_avx512() -> str:
    """The AVX-512 reduction network's C (constant, so made once: simulating it took 2.5 ms, paid by every nt
    product's code generation -- 0.15 s of a new prompt length's 0.75 s prefill on llama-small)."""
    pos = _hsum16_order()        # lane L holds the sum of network input pos[L]
    feed = [0] * 16
    for lane, p in enumerate(pos):
        feed[p] = lane            # so feed input p with accumulator `lane`
    L = ["/* lane j of the result = sum of the lanes of v[j] */",
         "PR_INLINE __m512 pr_hsum16(const __m512* v) {"]
    L.append("  __m512 x0[16] = {" + ", ".join(f"v[{f}]" for f in feed) + "};")
    n, src = 16, "x0"
    for lvl, (kind, lo, hi) in enumerate(_LEVELS_512, 1):
        n //= 2
        dst = f"x{lvl}"
        L.append(f"  __m512 {dst}[{n}];")
        fn = "_mm512_shuffle_f32x4" if kind == "f32x4" else "_mm512_shuffle_ps"
        L.append("  #pragma GCC unroll 8")
        L.append(f"  for (int i = 0; i < {n}; i++) {dst}[i] = _mm512_add_ps({fn}({src}[2 * i], {src}[2 * i + 1], "
                 f"0x{lo:X}), {fn}({src}[2 * i], {src}[2 * i + 1], 0x{hi:X}));")
        src = dst
    L.append(f"  return {src}[0];")
    L.append("}")
    return "\n".join(L) + "\n"


_HSUM_AVX2 = """/* lane j of the result = sum of the lanes of v[j] */
PR_INLINE __m256 pr_hsum8(const __m256* v) {
  __m256 h01 = _mm256_hadd_ps(v[0], v[1]), h23 = _mm256_hadd_ps(v[2], v[3]);
  __m256 h45 = _mm256_hadd_ps(v[4], v[5]), h67 = _mm256_hadd_ps(v[6], v[7]);
  __m256 a = _mm256_hadd_ps(h01, h23), b = _mm256_hadd_ps(h45, h67);
  return _mm256_add_ps(_mm256_permute2f128_ps(a, b, 0x20), _mm256_permute2f128_ps(a, b, 0x31));
}
"""

def nt_sig(elems: tuple[str, str] = F32) -> str:
    a, b = (ctype(e) for e in elems)
    return (f"(long K, const {a}* restrict A, long sa0, const {b}* restrict Bt, long sb0, float* restrict C, "
            "long sc0, int beta, const float* restrict cs)")


# R x J shapes of the nt micro-kernel: R rows of A times J rows of Bt, R*J = W accumulators reduced by
# one transpose-and-add network. More rows per kernel = fewer loads per FMA (R + J loads per R*J FMAs).
NT_SHAPES = {"avx512": ((4, 4), (2, 8), (1, 16)), "avx2": ((2, 4), (1, 8)), "portable": ((1, 1),)}


def nt_dot(isa: ISA, elems: tuple[str, str]) -> bool:
    """Whether the nt kernels of ``elems`` sum with ``vdpbf16ps``: both operands stored as bfloat16 on a
    machine with AVX512_BF16. One instruction multiplies 32 bfloat16 pairs exactly and adds them in pairs
    into 16 float32 lanes (two float32 additions per lane, as two FMAs would): the same sums as widening
    both operands and using FMAs, in a third of the instructions (no widening loads). Only for bfloat16
    on both sides: a float32 operand would have to be rounded to bfloat16 (a precision the program did
    not ask for) or split into two or three bfloat16 parts, which costs more than the widening it saves.
    The nt form needs no repacking: its lanes are summed whole at the end, so which k pairs a lane
    holds does not matter."""
    return elems == ("bf16", "bf16") and bf16_dot(isa)


def nt_idot(isa: ISA, elems: tuple[str, str]) -> bool:
    """Whether the nt kernels of ``elems`` sum with ``vpdpbusd``: int8 on both sides (quantized activations times
    int8 weights) on a machine with AVX512_VNNI (:func:`_nt_kernel_idot`)."""
    return elems == ("i8", "i8") and i8_dot(isa)


def nt_row_stream(isa: ISA, elems: tuple[str, str], whole_k: bool, K: int | str) -> bool:
    """Whether a single-row nt product over a whole K whose row and keys are stored as ``elems`` takes one
    key at a time, prefetching along the keys PF_AHEAD bytes ahead (``nt_kernel``'s single dot product): on
    AVX-512, when the row (K elements of ``elems[0]``) fits in half the L1 data cache.

    A GEMV's keys are then one sequential stream per thread, prefetched far enough ahead that the stream
    keeps up with the read bandwidth. Measured on the 2-core Zen 5 VM (L1d 48 KiB; 2 threads, keys cycled
    from DRAM through 10 matrices, the generated kernels in one standalone C harness, medians; a read-only
    sum of the same bytes beside them), GB/s. Columns: 16 keys with the next block prefetched (int8 keys and
    float32 before this), 8 keys prefetched 16 rows ahead (16-bit keys before), one key without prefetch
    (float16 before), one key prefetching 4 KiB ahead (now), the read:

    | keys [N, K] | 16 keys | 8 keys | 1 key | 1 key, 4 KiB ahead | read |
    |---|---|---|---|---|---|
    | int8 5632 x 2048 | 31.4 | 36.9 | 43.5 | 46.4 | 51.0 |
    | int8 11008 x 4096 | 34.1 | 34.6 | 38.8 | 43.0 | 44.3 |
    | int8 2048 x 5632 | 37.1 | 37.1 | 32.7 | 45.4 | 50.5 |
    | int8 4096 x 11008 (row 43 KiB) | 35.9 | 37.1 | 20.3 | 32.9 | 46.1 |
    | bf16 5632 x 2048 | 37.0 | 36.1 | 40.9 | 43.8 | 38.4 |
    | bf16 2048 x 5632 | 40.9 | 37.0 | 44.6 | 46.1 | 46.0 |
    | f16 5632 x 2048 | 35.8 | 33.8 | 44.6 | 47.1 | 46.9 |
    | f16 2048 x 5632 | 36.5 | 37.9 | 42.5 | 49.5 | 47.9 |
    | f32 4096 x 4096 | 42.2 | 43.2 | 46.5 | 48.0 | 47.5 |

    2 and 8 KiB ahead were within a few % of 4 KiB. A float32 row longer than about half the L1 (int8 4096 x
    11008: 43 KiB of float32 row) is evicted by the key stream and re-read from L2 for every key: one key at
    a time then lost (20-33 GB/s), and 2-4 keys sharing the row loads reached 40-41 (hand-written harness), so
    such rows keep the key blocks below. ``PRISM_ROW_STREAM=0`` turns it off (the key blocks everywhere).

    Not for a 16-bit row against int8 keys (int8 weight-only on a bfloat16 model): one key at a time widens the
    row again for every key (``vpmovzxwd``, ``vpslld``: two more vector instructions per 16 weights beside the
    key's three), where a block of 16 keys widens it once. Measured on the 2-core Zen 4 VM (512-bit instructions
    issued as two halves), llama-1b int8w-bf16 decode, two models in one process (each its own Dynamo backend),
    10 rounds alternating, warm caches: 19.13 ms per step with the row stream, 16.58 without (paired 0.866).
    A float32 row against the same int8 keys keeps it: without it the int8w model's step took 1.04x as long
    (17.65 -> 18.35 ms), and bfloat16 keys were level (paired 1.013). The float16 row is left out on the same
    argument (not measured)."""
    if os.environ.get("PRISM_ROW_STREAM", "").strip() == "0":
        return False
    if ITEMSIZE[elems[0]] == 2 and elems[1] == "i8":
        return False
    return (whole_k and isa.name == "avx512" and isinstance(K, int)
            and K * ITEMSIZE[elems[0]] <= l1d_bytes() // 2)


def nt_prefetch(isa: ISA, elems: tuple[str, str], whole_k: bool, K: int | str = 0,
                keys_stride: int | str | None = None) -> bool:
    """Whether the nt kernels of ``isa`` whose row and keys are stored as ``elems`` prefetch the keys PF_KEYS
    rows ahead into L2.

    Calls over K chunks do (the first row group of each key block only, ``matmul.emit_nt``): each call starts
    new lines of J rows. Calls over a whole K (GEMV rows: each key row one stream) read J sequential streams,
    which the hardware prefetchers follow but do not start early at the next key block's rows (new pages).
    Prefetching the next block (J = PF_KEYS = 16 keys on AVX-512) while this one streams, measured on the 2-core
    Zen 4 VM, 2 threads, from DRAM and from L3 (a standalone C harness, medians of 41-201 calls, the same run):
    int8 keys K = 2048 20.4 -> 27.5 GB/s, K = 5632 26.4 -> 30.8, nothing lost in L3 (one prefetch per four
    16-weight steps); llama-1b int8w decode kernels 19.4 -> 14.7 ms per step. Wider keys gain 3-9 % from DRAM
    (float32 29.4 -> 31.7, bfloat16 27.5 -> 29.3, within the host's drift) and lose 23-27 % in L3 (a prefetch
    per 16-float step takes load slots: float32 113 -> 82 GB/s); a prefetch every second line, or of each row's
    first 512 bytes only, did not keep the gain without the loss. On the AVX2 Zen host (J = 8: two blocks ahead)
    the int8 prefetch cost 7 % from DRAM (docs/bench.md). So int8 keys on AVX-512 only, and the single-row
    kernels of ``nt_single_keys`` (one key at a time: only with ``nt_row_stream``'s prefetch along the keys).
    Calls over K chunks: ``nt_chunk_prefetch`` of the keys' row stride ``keys_stride`` (None: they prefetch)."""
    if not whole_k:
        return keys_stride is None or nt_chunk_prefetch(keys_stride, K, elems[1])
    if isa.name != "avx512":
        return False
    single = nt_single_keys(isa, elems, whole_k, K)
    if single == 1:
        return nt_row_stream(isa, elems, whole_k, K)
    return ITEMSIZE[elems[1]] == 1 or single is not None


def nt_single_keys(isa: ISA, elems: tuple[str, str], whole_k: bool, K: int | str = 0) -> int | None:
    """The key block of a single-row nt kernel over a whole K whose row and keys are stored as ``elems``, where
    it is not NT_SHAPES's (None: NT_SHAPES's).

    One key at a time with prefetch along the keys where ``nt_row_stream`` says so (every storage pair; a row
    that fits in half the L1). Otherwise, as measured before that:

    16-bit keys against a row of the same storage (``elems``: the row's, the keys'; bfloat16 x bfloat16 with
    ``vdpbf16ps``, float16 x float16) on AVX-512 take 8 keys per block, prefetched PF_KEYS rows ahead
    (``nt_prefetch``; other pairs keep 16 keys and no prefetch: not measured). Measured on
    the 2-core Zen 4 VM, 2 threads, a llama-1b decode step's 57 GEMVs (852 MB, rounds rotating, one process):
    the 16-key kernel without prefetch against a C harness of the same pattern and of others -- bfloat16,
    8 keys + prefetch 0.875 of Prism's time, 4 keys + prefetch 0.884, 16 keys + prefetch 0.939, 16 keys
    without 0.960, a torch sum of the same bytes 0.952; float16 likewise (0.862 with 8 keys + prefetch,
    0.905 with 16); with 24 MB of weights (mostly L3) 8 keys + prefetch took 0.585 of the time. Fewer
    concurrent key streams per thread, each prefetched a block ahead, is what llama.cpp's row-at-a-time
    kernels also get (without the prefetch: 1.09x Prism's time).

    float16 keys (against a float16 or float32 row) take one key at a time on AVX-512: the single-key kernel,
    four accumulators, no software prefetch -- the order of llama.cpp's ``ggml_vec_dot_f16``. Measured on the
    2-core Zen 5 VM (2 threads, the generated kernels of both forms called from one process, weights cycled
    from DRAM, two runs each): llama-1b float16's decode pieces 0.80-0.87x the 8-key kernel's time (LM head
    3.30 -> 2.68 ms, the fused MLP with its float32 row 1.28 -> 1.08 ms), single Linears 4096 x 4096, 11008 x
    4096, 4096 x 11008 and 768 x 3072 0.81-0.96x, 1024 x 1024 (in L2) 1.00-1.02x. The 8-key kernel loses 12-20 %
    of the stream to the widening loads (docs/codegen.md, "Widening GEMVs"); bfloat16 (``vdpbf16ps``, one
    instruction per line) and float32 keys lost with one key at a time (1.06-1.09x, 0.90-1.33x). Measured on the
    Zen 5 host only (on Zen 4, above, one key at a time was measured for bfloat16: 1.09x; that kernel had no
    prefetch along the keys)."""
    if nt_row_stream(isa, elems, whole_k, K):
        return 1
    if whole_k and isa.name == "avx512" and elems[1] == "f16":
        return 1
    if whole_k and isa.name == "avx512" and elems[0] == elems[1] and ITEMSIZE[elems[1]] == 2:
        return 8
    return None


def nt_name(isa: ISA, r: int, j: int, elems: tuple[str, str] = F32, prefetch: bool = True) -> str:
    if r * j == 1:  # the single dot product prefetches along its own row (PF_AHEAD), only when asked
        flag = "_pfa" if prefetch and isa.vector else ""
    else:
        flag = "" if prefetch or not isa.vector else "_npf"
    return (f"pr_nt_{isa.name}_{r}x{j}" + _suffix(elems) + ("_dp" if nt_dot(isa, elems) else "")
            + ("_vnni" if nt_idot(isa, elems) else "") + flag)


def nt_helpers(isa: ISA) -> tuple[str, str]:
    """(name, text) of the reduction network the nt kernels of ``isa`` need."""
    if isa.name == "avx512":
        return "pr_hsum16", _hsum_avx512()
    return "pr_hsum8", _HSUM_AVX2


def _nt_levels(tot: str, grp: str, chunk: str, add: Callable[[str, str], str], gr: int,
               lo: str = "k0", hi: str = "k1", n: str = "K") -> str:
    """The chunk loop's last two levels, stated once for every nt (and grouped dot) kernel form: the chunk sum
    starts or joins its group (of ``gr`` values of K); a finished group starts or joins the total. ``lo``, ``hi``:
    the chunk's bounds, ``n`` the end (the grouped kernels count groups: g0, g1, Gn)."""
    return (f"{grp} = {lo} % {gr} ? {add(grp, chunk)} : {chunk};\n"
            f"    if ({hi} == {n} || {hi} % {gr} == 0) {tot} = {lo} < {gr} ? {grp} : {add(tot, grp)};")


def _scalar_add(x: str, y: str) -> str:
    return f"{x} + {y}"


def _zmm_add(x: str, y: str) -> str:
    return f"_mm512_add_ps({x}, {y})"


def _nt_outputs(L: list[str], R: int, J: int, pairs: bool, W: int, store: str, update: str) -> None:
    """The end of a multi-key nt kernel: the total's lanes (``store``: into ``t``) into C, each R x J output its
    lane (``pairs``: key j's two lanes j and J + j added)."""
    L.append(f"  float t[{W}] __attribute__((aligned(64)));")
    L.append(f"  {store}")
    for r in range(R):
        for j in range(J):
            t = f"t[{j}] + t[{J + j}]" if pairs else f"t[{r * J + j}]"
            L.append(f"  {{ const float s = {t}; float* c = C + {r} * sc0 + {j}; " + update.format(r=r) + " }")
    L.append("}")


def nt_kernel(isa: ISA, R: int, J: int, elems: tuple[str, str] = F32, prefetch: bool = True) -> str:
    """C[r, j] (beta) sum_k A[r*sa0 + k] * Bt[j*sb0 + k] for r < R, j < J (K contiguous in both).

    Vector kernels take any K and sum it in the three levels of ACC_CHUNK themselves: ACC_CHUNK steps
    per lane in registers that start from zero, reduced by the network into one vector of R*J chunk
    sums, ACC_GROUP of those into a group sum, the group sums into the total. So a caller may hand a
    GEMV row its whole K in one call: each key row is then read front to back, one stream per key,
    which the hardware prefetchers follow (cutting K into calls read every row in pieces at the row
    stride: int8 W1 at n = 1 ran at a third of a plain GEMV's speed).

    ``prefetch``: software prefetch of the keys PF_KEYS rows ahead (the next key block for J = 16), one
    per 64-byte line of each key row (``nt_prefetch`` says when)."""
    name = nt_name(isa, R, J, elems, prefetch)
    ea, eb = elems
    sig = nt_sig(elems)
    update = "c[0] = beta == 0 ? s : beta == 1 ? c[0] + s : c[0] * cs[{r}] + s;"
    if not isa.vector:
        rows = []
        for r in range(R):
            for j in range(J):
                rows.append(f"""  {{ float s = 0.0f;
    #pragma omp simd reduction(+:s)
    for (long k = 0; k < K; k++) s += {ld(ea, f"A[{r} * sa0 + k]")} * {ld(eb, f"Bt[{j} * sb0 + k]")};
    float* c = C + {r} * sc0 + {j};
    {update.format(r=r)} }}""")
        return f"PR_INLINE void {name}{sig} {{\n" + "\n".join(rows) + "\n}\n"
    if nt_idot(isa, elems):
        return _nt_kernel_idot(R, J, prefetch, name, sig, update)
    v, W = _V(isa), isa.width
    vt = isa.vtype
    hs = "pr_hsum16" if W == 16 else "pr_hsum8"
    ch, gr = W * ACC_CHUNK, W * ACC_ROWS  # elements of K per chunk and per group
    dot = nt_dot(isa, elems)
    # S: elements of K per step (vdpbf16ps takes two per lane, so a lane still sums K / W products per chunk)
    S = 2 * W if dot else W
    fma = (lambda a, b, c: f"_mm512_dpbf16_ps({c}, {a}, {b})") if dot else v.fma
    lt = "__m512bh" if dot else vt  # the type of a loaded operand vector
    # steps per prefetch: one prefetch per key per 64-byte line of Bt (a prefetch per step issued the
    # same line up to 8 times over for int8 keys)
    line_steps = U = max(1, 64 // (S * ITEMSIZE[eb]))
    # a single row against W / 2 keys (nt_single_keys): two accumulators per key, taken by alternate steps, so the
    # reduction network still turns W accumulators into W sums (key j's two are lanes j and J + j)
    pairs = R == 1 and 2 * J == W
    if pairs:
        U = max(U, 2)

    def mload_of(elem: str) -> str:
        """A masked load of the K tail (``km``: the float32 mask; typed storage: the count K - K0)."""
        if dot:
            return "(__m512bh)_mm512_maskz_loadu_epi16(km, {p})"
        if elem != "f32":
            return v.load("{p}", "K - K0", elem)
        return "_mm512_maskz_loadu_ps(km, {p})" if W == 16 else "_mm256_maskload_ps({p}, km)"
    if dot:
        mtail = "(__mmask32)((1u << (K % 32)) - 1)"
        mtype = "__mmask32"
    elif W == 16:
        mtail = "(__mmask16)((1u << (K % 16)) - 1)"
        mtype = "__mmask16"
    else:
        mtail = "_mm256_cmpgt_epi32(_mm256_set1_epi32((int)(K % 8)), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7))"
        mtype = "__m256i"
    if dot:
        full = ("(__m512bh)_mm512_loadu_si512((const void*)({p}))",) * 2
    else:
        full = (v.load("{p}", 0, ea), v.load("{p}", 0, eb))
    if R * J == 1:  # a single dot product (tails, GEMV rows one key at a time): its lanes added per chunk
        # four accumulators taken in turn (a float16 GEMV runs every key through it: nt_single_keys); one would
        # be a chain of dependent FMAs. ``prefetch``: one prefetch per 64-byte line of the key, PF_AHEAD bytes
        # ahead (into the next keys near a key's end: a GEMV's rows are one stream per thread)
        pf_lines = 4 * S * ITEMSIZE[eb] // 64
        pf = [f"      __builtin_prefetch((const char*)(Bt + k) + {PF_AHEAD + 64 * i}, 0, 1);"
              for i in range(pf_lines)] if prefetch and pf_lines else []
        steps = "\n".join(pf + [
            f"      {a} = {fma(full[0].format(p=f'A + k + {u * S}'), full[1].format(p=f'Bt + k + {u * S}'), a)};"
            for u, a in enumerate(("acc", "acc1", "acc2", "acc3"))])
        # the chunk's lanes added by a shuffle tree (its order is the verifier's float32 reassociation like any
        # other), not stored and added one by one (16 dependent scalar adds per key and chunk). Both forms in one
        # process, interleaved, 2 threads: an int8-key GEMV 5632 x 2048 from L3 292 -> 254 us (paired 0.87),
        # 11008 x 4096 from DRAM 0.93, bfloat16 keys 0.95, float32 keys level
        return f"""PR_INLINE void {name}{sig} {{
  float s = 0.0f, g = 0.0f;
  for (long k0 = 0; k0 < K; k0 += {ch}) {{
    const long k1 = pr_minl(K, k0 + {ch}), K0 = k1 - (k1 - k0) % {S};
    {vt} acc = {v.zero()}, acc1 = {v.zero()}, acc2 = {v.zero()}, acc3 = {v.zero()};
    long k = k0;
    for (; k + {4 * S} <= K0; k += {4 * S}) {{
{steps}
    }}
    for (; k < K0; k += {S}) acc = {fma(full[0].format(p="A + k"), full[1].format(p="Bt + k"), "acc")};
    if (K0 < k1) {{
      const {mtype} km = {mtail}; (void)km;
      acc = {fma(mload_of(ea).format(p="A + K0"), mload_of(eb).format(p="Bt + K0"), "acc")};
    }}
    acc = {v.add(v.add("acc", "acc1"), v.add("acc2", "acc3"))};
    {v.sum_lanes("cs_", "acc")}
    {_nt_levels("s", "g", "cs_", _scalar_add, gr)}
  }}
  float* c = C;
  {update.format(r=0)}
}}
"""
    assert R * J == W or pairs
    L = [f"PR_INLINE void {name}{sig} {{",
         f"  {vt} tot = {v.zero()}, grp = {v.zero()};",
         f"  for (long k0 = 0; k0 < K; k0 += {ch}) {{",
         f"    const long k1 = pr_minl(K, k0 + {ch}), K0 = k1 - (k1 - k0) % {S};",
         f"    {vt} " + ", ".join(f"acc{i} = {v.zero()}" for i in range(W)) + ";",
         "    long k = k0;"]

    def step(loads: tuple[str, str], k: str, prefetch_keys: bool, half: int = 0) -> None:
        la, lb = loads
        L.append("     {")
        for r in range(R):
            L.append(f"      {lt} a{r} = {la.format(p=f'A + {r} * sa0 + {k}')};")
        if J > 1:  # as for B: keep the A vectors in registers
            L.append("      __asm__(\"\" : " + ", ".join(f'\"+v\"(a{r})' for r in range(R)) + ");")
        for j in range(J):
            if prefetch_keys:
                L.append(f"      __builtin_prefetch(Bt + {PF_KEYS + j} * sb0 + {k}, 0, 2);")
            L.append(f"      {{ {lt} b = {lb.format(p=f'Bt + {j} * sb0 + {k}')};")
            if R > 1:
                L.append('        __asm__("" : "+v"(b));')
            for r in range(R):
                a = r * J + j + half * J
                L.append(f"        acc{a} = {fma(f'a{r}', 'b', f'acc{a}')};")
            L.append("      }")
        L.append("     }")
    L.append(f"    for (; k + {S * U} <= K0; k += {S * U}) {{")
    for u in range(U):
        step(full, f"k + {u * S}" if u else "k", prefetch and u % line_steps == 0, u % 2 if pairs else 0)
    L.append("    }")
    if U > 1:
        L.append(f"    for (; k < K0; k += {S}) {{")
        step(full, "k", False)
        L.append("    }")
    L.append("    if (K0 < k1) {")
    L.append(f"      const {mtype} km = {mtail};" + (" (void)km;" if elems != F32 else ""))
    step((mload_of(ea), mload_of(eb)), "K0", False)
    L.append("    }")
    L.append(f"    const {vt} v[{W}] = {{" + ", ".join(f"acc{i}" for i in range(W)) + "};")
    L.append(f"    const {vt} cs_ = {hs}(v);")
    L.append(f"    {_nt_levels('tot', 'grp', 'cs_', v.add, gr)}")
    L.append("  }")
    _nt_outputs(L, R, J, pairs, W, v.store("t", "tot"), update)
    return "\n".join(L) + "\n"


def _nt_kernel_idot(R: int, J: int, prefetch: bool, name: str, sig: str, update: str) -> str:
    """nt_kernel for int8 rows against int8 keys with ``vpdpbusd`` (AVX512_VNNI; 16 lanes, 64 int8 per step).
    ``vpdpbusd`` multiplies unsigned by signed bytes, so each key is read as ``b + 128`` (its sign bit flipped: u8
    in [0, 255], every int8 value) against the signed row, and each row's sum is taken beside it with a vector of
    ones: ``sum (b + 128) a - 128 sum a = sum a b``, exact for every pair of int8 values (the sign trick -- |a|
    against b negated where a < 0 -- would be wrong for b = -128). One correction per row, not per key: a 1 x 16
    kernel keeps 16 accumulators and one correction in registers. The products of a chunk (W * ACC_CHUNK values
    of K, 64 per lane: |sum| < 2^20) are summed exactly in int32, converted to float32 exactly, then reduced and
    added in the float levels of the other nt kernels. Per 64 values of K and key: one load, one flip and R
    ``vpdpbusd``, where widening both sides costs two widening loads and an FMA per 16 values."""
    W, S = 16, 64
    ch, gr = W * ACC_CHUNK, W * ACC_ROWS
    single = R * J == 1
    pairs = R == 1 and 2 * J == W
    assert single or pairs or R * J == W
    nacc = 4 if single else W
    ncor = 4 if single else R   # one per row (single: one per unrolled step, so no chain of dependent adds)
    U = 4 if single else (2 if pairs else 1)
    L = [f"PR_INLINE void {name}{sig} {{",
         "  const __m512i x80 = _mm512_set1_epi8((char)0x80), ones = _mm512_set1_epi8(1);",
         "  float s = 0.0f, g = 0.0f;" if single else "  __m512 tot = _mm512_setzero_ps(), grp = _mm512_setzero_ps();",
         f"  for (long k0 = 0; k0 < K; k0 += {ch}) {{",
         f"    const long k1 = pr_minl(K, k0 + {ch}), K0 = k1 - (k1 - k0) % {S};",
         "    __m512i " + ", ".join(f"acc{i} = _mm512_setzero_si512()" for i in range(nacc)) + ";",
         "    __m512i " + ", ".join(f"cor{j} = _mm512_setzero_si512()" for j in range(ncor)) + ";",
         "    long k = k0;"]

    def step(k: str, u: int, masked: bool) -> None:
        load = (lambda p: f"_mm512_maskz_loadu_epi8(km, {p})") if masked else (lambda p: f"_mm512_loadu_si512({p})")
        L.append("     {")
        rows = 1 if single else R
        for r in range(rows):
            c = u if single else r
            L.append(f"      __m512i a{r} = {load(f'A + {r} * sa0 + {k}')};")
            L.append(f"      cor{c} = _mm512_dpbusd_epi32(cor{c}, ones, a{r});")
        if rows > 1:   # keep the rows in registers (as the other nt kernels)
            L.append("      __asm__(\"\" : " + ", ".join(f'\"+v\"(a{r})' for r in range(rows)) + ");")
        for j in range(1 if single else J):
            if prefetch and not masked:
                pf = (f"(const char*)(Bt + {k}) + {PF_AHEAD}" if single else f"Bt + {PF_KEYS + j} * sb0 + {k}")
                L.append(f"      __builtin_prefetch({pf}, 0, {1 if single else 2});")
            # (a masked key loads zeros, +128 after the flip, against the masked row's zeros: nothing added)
            L.append(f"      {{ const __m512i b = _mm512_xor_si512({load(f'Bt + {j} * sb0 + {k}')}, x80);")
            accs = [u if single else (j + (u % 2) * J if pairs else r * J + j) for r in range(rows)]
            for r, a in enumerate(accs):
                L.append(f"        acc{a} = _mm512_dpbusd_epi32(acc{a}, b, a{r});")
            if not single:   # as in tn_kernel_i8: without it gcc 12 kept the 4 x 4 and 2 x 8 sums on the stack
                L.append("        __asm__(\"\" : " + ", ".join(f'\"+v\"(acc{a})' for a in accs) + ");")
            L.append("      }")
        L.append("     }")
    L.append(f"    for (; k + {S * U} <= K0; k += {S * U}) {{")
    for u in range(U):
        step(f"k + {u * S}" if u else "k", u, False)
    L.append("    }")
    if U > 1:
        L.append(f"    for (; k < K0; k += {S}) {{")
        step("k", 0, False)
        L.append("    }")
    L.append("    if (K0 < k1) {")
    L.append("      const __mmask64 km = (__mmask64)((1ull << (k1 - K0)) - 1);")
    step("K0", 0, True)
    L.append("    }")
    if single:
        L.append("    const __m512i ai = _mm512_add_epi32(_mm512_add_epi32(acc0, acc1), _mm512_add_epi32(acc2, acc3));")
        L.append("    const __m512i ci = _mm512_add_epi32(_mm512_add_epi32(cor0, cor1), _mm512_add_epi32(cor2, cor3));")
        L.append("    const float cs_ = _mm512_reduce_add_ps(_mm512_cvtepi32_ps("
                 "_mm512_sub_epi32(ai, _mm512_slli_epi32(ci, 7))));")
        L.append(f"    {_nt_levels('s', 'g', 'cs_', _scalar_add, gr)}")
        L.append("  }")
        L.append("  float* c = C;")
        L.append("  " + update.format(r=0))
        L.append("}")
        return "\n".join(L) + "\n"
    vals = []
    for i in range(W):
        r = 0 if pairs else i // J
        owns = not pairs or i < J   # pairs: key j's two accumulators take the row's correction once
        vals.append(f"_mm512_cvtepi32_ps(_mm512_sub_epi32(acc{i}, _mm512_slli_epi32(cor{r}, 7)))" if owns
                    else f"_mm512_cvtepi32_ps(acc{i})")
    L.append("    const __m512 v[16] = {" + ", ".join(vals) + "};")
    L.append("    const __m512 cs_ = pr_hsum16(v);")
    L.append(f"    {_nt_levels('tot', 'grp', 'cs_', _zmm_add, gr)}")
    L.append("  }")
    _nt_outputs(L, R, J, pairs, W, "_mm512_store_ps(t, tot);", update)
    return "\n".join(L) + "\n"


# --- tn: an nt product of bfloat16 run as C^T = Bt @ A^T with A packed in k pairs ---------------------------
# (matmul.emit_matmul's "tn" path). Each lane holds one output, so no tile ends in a transpose-and-add: the
# keys' k pairs are broadcast (vpbroadcastd of two bfloat16) against TN_MV vectors of 16 rows of A, packed as
# 32-bit pairs [K / 2][ldm] (matmul.emit_tn). Measured on the Zen 5 VM (2 threads, bf16 [1024, 2048] x
# [5632, 2048]^T, standalone C): 6 keys x 4 vectors 930-1030 GFLOP/s, the 4x4 nt kernel 845-864, oneDNN
# 887; 8 x 3 910-960, 4 x 6 920-970, 12 x 2 920-955, 7 x 4 750-820.
TN_RN = 6   # keys per micro-kernel
TN_MV = 4   # vectors of 16 rows of A per micro-kernel
TN_MC = 256   # packed rows per chunk, against which every block of keys runs (matmul.emit_tn)


def tn_shape(keys: str, rows: str = "bf16") -> tuple[int, int]:
    """(keys per micro-kernel, vectors of 16 rows) of the tn form whose keys are stored as ``keys``: TN_RN x TN_MV,
    but 12 keys against one vector of 16 rows for int8 keys (converted a block at a time into a bfloat16 panel),
    the kernel called once per 16 rows whatever their count (the lanes past the rows compute nothing used).

    Measured on the Zen 4 VM, bfloat16 rows against int8 keys ([m, 2048] @ [5632, 2048]^T, 2 threads, medians of
    20-40 rounds, each form in its own process): m = 16 with 12 keys 1246 us, 24 keys 1394 (16 and 20 were no
    better); m = 32 12 x 1 2173 against 12 x 2 2180 (6 and 8 x 2 2064-2290 in two other runs); m = 48 3004 against 8
    x 3 3230; m = 128 7204 against 6 x 4 7562; m = 512 29338 against 31181. bfloat16 keys, broadcast in place from
    12 rows of the weight, took 12199 us at 128 rows against 6 x 4's 7218: they keep TN_RN x TN_MV. One shape for
    every row count also keeps a template over the rows (a prompt's length) one text: shapes chosen by the row
    count (12 x 1 to 16 rows, 12 x 2 to 32, 8 x 3 to 48, 6 x 4 from 64) made each crossing a new template of every
    product (llama-1b int8w-bf16 from a 24-token prompt: new lengths 36 and 60 +4.8 and +4.3 s).
    (Vectors of 8 rows, 256-bit ``vdpbf16ps``, for 8 rows against int8 keys: 1372 us against the nt kernels'
    1167 -- the same instruction count as 16 rows, so no faster than them; not kept.) int8 rows against int8 keys
    (``vpdpbusd``, :func:`tn_kernel_i8`) keep TN_RN x TN_MV: their keys are broadcast in place, as bfloat16's."""
    return (12, 1) if keys == "i8" and rows != "i8" else (TN_RN, TN_MV)


def _tn_prefetch(rn: int, step: int, elem_bytes: int) -> str:
    """The tn kernels' prefetch of the next block of keys (``pf``: its first key, ``spf``: its key stride, both in
    bytes; the same k range as this call's): a line of each of its rn keys where k starts a 64-byte line of them.
    Measured need (Zen 5 VM, float32 [128, 2048] x [2816, 2048]^T per thread, both threads, the weights from
    DRAM): 200 GFLOP/s per core without it, 240 with it (the kernel alone from L1: 266; peak 271)."""
    per_line = 64 // elem_bytes
    return (f"      if ((k & {per_line - 1}) < {step}) {{ " + " ".join(
        f"_mm_prefetch(pf + {r} * spf + k * {elem_bytes}, _MM_HINT_T0);" for r in range(rn)) + " }")


def tn_name(rn: int, mv: int, form: str = "bf16_dp") -> str:
    return f"pr_tn_avx512_{rn}x{mv}_{form}"


def tn_kernel_f32(rn: int, mv: int, pf_bytes: int = 4) -> str:
    """The tn kernel's float32 form (float32 and float16 products, matmul.emit_tn): Ct[r * sct + m] (beta)
    sum_k Bt[r * sb0 + k] * A[m, k] for r < rn, m < 16 * mv, over K <= ACC_ROWS, with ``Xp`` A's rows transposed
    to float32, row k of A's columns at ``Xp[k * ldm + m]``, and Bt float32 keys (a float16 weight's keys
    converted by the caller, a panel at a time; ``pf_bytes``: the element size of the keys it prefetches). The
    summation order of :func:`tn_kernel`."""
    return _tn_text(tn_name(rn, mv, f"f32_pf{pf_bytes}"), "float", rn, mv, 1, pf_bytes, "k * ldm", "__m512",
                    _tn_f32_keys(rn, mv))


def _tn_f32_keys(rn: int, mv: int) -> list[str]:
    """The float32 tn kernels' step per key: its element broadcast against the mv row vectors."""
    return [f"      {{ const __m512 b = _mm512_set1_ps(Bt[{r} * sb0 + k]);\n"
            + "\n".join(f"        a{r}_{v} = _mm512_fmadd_ps(b, x{v}, a{r}_{v});" for v in range(mv)) + "\n      }"
            for r in range(rn)]


def tn_kernel(rn: int, mv: int, pf_bytes: int = 2) -> str:
    """Ct[r * sct + m] (beta) sum_k Bt[r * sb0 + k] * A[m, k] for r < rn, m < 16 * mv, over K <= ACC_ROWS (one
    group of the summation order): ``Xp`` holds A's k pairs, pair p of row m at ``Xp[p * ldm + m]`` (32 bits:
    the even k in the low half, as ``vdpbf16ps`` pairs them). K even. Chunks of ACC_CHUNK products per lane
    (32 steps of two) start from zero in registers; their sums are added into the group sum (on the stack);
    the group sum is stored (beta 0) or added (beta 1) into Ct. ``pf_bytes``: the element size of the keys it
    prefetches (1: int8 keys, converted into a bfloat16 panel by the caller)."""
    return _tn_text(tn_name(rn, mv, "bf16_dp" if pf_bytes == 2 else f"bf16_dp_pf{pf_bytes}"), "uint16_t", rn, mv,
                    2, pf_bytes, "(k >> 1) * ldm", "__m512bh", _tn_pair_keys(rn, mv))


def _tn_pair_keys(rn: int, mv: int) -> list[str]:
    """The bfloat16 tn kernels' step per key: its k pair broadcast (32 bits) against the mv row vectors."""
    return [f"      {{ int32_t p; memcpy(&p, Bt + {r} * sb0 + k, 4);\n"
            "        const __m512bh b = (__m512bh)_mm512_set1_epi32(p);\n"
            + "\n".join(f"        a{r}_{v} = _mm512_dpbf16_ps(a{r}_{v}, b, x{v});" for v in range(mv)) + "\n      }"
            for r in range(rn)]


def tn_kernel_i8(rn: int, mv: int) -> str:
    """The tn kernel of int8 rows against int8 keys with ``vpdpbusd`` (AVX512_VNNI; the W8A8 form over many rows):
    Ct[r * sct + m] (beta) sum_k Bt[r * sb0 + k] * A[m, k] for r < rn, m < 16 * mv, over K <= ACC_ROWS (one
    group; K a multiple of 4). ``Xp`` holds A's k quads, quad q of row m at ``Xp[q * ldm + m]`` (32 bits), each byte
    stored as ``a + 128`` (its sign bit flipped by the packing: matmul.emit_tn), the unsigned operand; each key's
    4 bytes are broadcast as they are, the signed one, so a lane sums ``(a + 128) b`` over 4 k per instruction and
    ``sum (a + 128) b - 128 sum b = sum a b``: each key's sum over the call's K is taken after the products (64
    bytes per ``vpdpbusd`` against ones: 1/(16 mv) of the products' instructions) and subtracted once. Exact for
    every int8 value incl. -128: the call's products sum in int32 (|sum (a + 128) b| <= 255 * 128 * 512 < 2^31)
    to |sum a b| <= 2^23, converted exactly; the calls' sums (groups of K) are added in float into Ct as the other
    tn kernels'. Per 4 k: mv row loads, rn broadcasts and rn * mv ``vpdpbusd`` of 64 products -- twice the
    products per instruction of ``vdpbf16ps`` -- where the nt kernels end every tile with a transpose-and-add."""
    cells = [(r, v) for r in range(rn) for v in range(mv)]
    L = [f"{LINKAGE} void {tn_name(rn, mv, 'i8_dp')}(long K, const int8_t* restrict Bt, long sb0, const char* pf, "
         "long spf, const float* restrict Xp, long ldm, float* restrict Ct, long sct, int beta) {",
         "  " + " ".join(f"__m512i a{r}_{v} = _mm512_setzero_si512();" for r, v in cells),
         "  for (long k = 0; k < K; k += 4) {",
         "    const float* xp = Xp + (k >> 2) * ldm;",
         _tn_prefetch(rn, 4, 1).replace("      ", "    ", 1)]
    L.extend(f"    const __m512i x{v} = _mm512_loadu_si512(xp + {16 * v});" for v in range(mv))
    for r in range(rn):
        L.append(f"    {{ int32_t p; memcpy(&p, Bt + {r} * sb0 + k, 4);")
        L.append("      const __m512i b = _mm512_set1_epi32(p);")
        L.extend(f"      a{r}_{v} = _mm512_dpbusd_epi32(a{r}_{v}, x{v}, b);" for v in range(mv))
        # the key's accumulators in registers after its products (an empty asm that reads and writes them):
        # inlined into its caller's loops, gcc 12 otherwise kept them on the stack (a load and a store per
        # vpdpbusd)
        L.append("      __asm__(\"\" : " + ", ".join(f'\"+v\"(a{r}_{v})' for v in range(mv)) + ");")
        L.append("    }")
    L.append("  }")
    # the sums are stored as they are, then each key's sum is taken and subtracted in a loop over the keys that gcc
    # does not unroll: with the keys' corrections in registers through the products (their broadcasts hoisted)
    # or the sums kept in registers through the key sums' loops (the array replaced by its scalars), gcc 12 kept
    # the accumulators on the stack inside the product loop (a load and a store per vpdpbusd: 101 G MAC/s)
    L.append(f"  __m512i s_[{rn * mv}];")
    L.extend(f"  s_[{i}] = a{r}_{v};" for i, (r, v) in enumerate(cells))
    L += ["  const __m512i ones = _mm512_set1_epi8(1);",
          "  #pragma GCC unroll 1",
          f"  for (long r = 0; r < {rn}; r++) {{",
          "    const int8_t* b = Bt + r * sb0;",
          "    __m512i t0 = _mm512_setzero_si512(), t1 = _mm512_setzero_si512();",
          "    long k = 0;",
          "    for (; k + 128 <= K; k += 128) {",
          "      t0 = _mm512_dpbusd_epi32(t0, ones, _mm512_loadu_si512(b + k));",
          "      t1 = _mm512_dpbusd_epi32(t1, ones, _mm512_loadu_si512(b + k + 64));",
          "    }",
          "    for (; k < K; k += 64) t0 = _mm512_dpbusd_epi32(t0, ones, _mm512_maskz_loadu_epi8("
          "K - k >= 64 ? ~0ull : (__mmask64)((1ull << (K - k)) - 1), b + k));",
          "    const __m512i c = _mm512_set1_epi32(_mm512_reduce_add_epi32(_mm512_add_epi32(t0, t1)) * 128);",
          f"    for (long v = 0; v < {mv}; v++) {{",
          "      float* p = Ct + r * sct + 16 * v;",
          f"      const __m512 g = _mm512_cvtepi32_ps(_mm512_sub_epi32(s_[r * {mv} + v], c));",
          "      _mm512_storeu_ps(p, beta ? _mm512_add_ps(_mm512_loadu_ps(p), g) : g);",
          "    }",
          "  }"]
    L.append("}")
    return "\n".join(L) + "\n"


TN_AMX_RN = 32   # keys per call of the AMX tn kernel (two tiles of 16; fewer at run time for a last block)
TN_AMX_K = 32    # k per tile step (a tile row is 64 bytes: 32 bfloat16)


def tn_amx_rows() -> int:
    """Packed rows per chunk of the AMX tn form (matmul.emit_tn): as many as fill half the L2 with the chunk's
    packed rows (ACC_ROWS / 2 pairs of 4 bytes each: 1 KiB a row), 256 to 1024. Every block of keys is read once
    per chunk. Measured on the Intel VM of 2026-12-01 (2 MiB L2; bfloat16 [m, 2048] x [5632, 2048]^T, 2 threads):
    m = 1024 14.8 ms with 256 rows, 12.5 with 512, 11.8 with 1024; m = 128 unchanged (one chunk)."""
    return max(256, min(1024, l2_bytes() // 2 // (ACC_ROWS * 2)))


def _amx_keys(name: str, ptype: str, dp: str) -> str:
    """The C function ``name`` that runs a step's key tiles (elements ``ptype``, tile product ``dp``) against the row
    tiles already loaded."""
    return f"""/* the key tile at p and, where r1, the one a1 elements on (row stride sa bytes),
   against the row tiles 6 (and 7 where two) into C tiles 0-3 */
PR_INLINE void {name}(const {ptype}* p, long sa, long a1, int two, int r1) {{
  _tile_loadd(4, p, sa);
  {dp}(0, 4, 6);
  if (two) {dp}(1, 4, 7);
  if (r1) {{
    _tile_loadd(5, p + a1, sa);
    {dp}(2, 5, 6);
    if (two) {dp}(3, 5, 7);
  }}
}}
"""


# what every AMX tn kernel shares (matmul.emit_tn needs it before them): the tile configuration, the process's grant,
# the next block's prefetch and one step of 32 k
TN_AMX_HEAD = """typedef struct {
  uint8_t palette, start; uint8_t rsv[14]; uint16_t colsb[16]; uint8_t rows[16];
} pr_tilecfg;
static int pr_amx_granted = 0;
extern long syscall(long number, ...);   /* <unistd.h>'s */
PR_NOINLINE void pr_amx_grant(void) {
  /* the process's permission for the tile data (Linux: arch_prctl ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA); the
     Python side asked for it before generating this code (codegen.isa.tile_bf16): this is for a process that loads
     the library without generating it */
  syscall(158, 0x1023, 18);
  pr_amx_granted = 1;
}
/* the tn kernels' tiles for a block of rn keys (at most 32): C 0-3 ([keys 0-15 | 16-31] x [rows 0-15 | 16-31]), A 4-5
   (16 keys x 32 k each, the second for keys 16-31), B 6-7 (16 k pairs x 16 rows); the keys past 16 (0: none) */
PR_INLINE int pr_amx_configure(long rn) {
  pr_tilecfg c;
  memset(&c, 0, sizeof c);
  c.palette = 1;
  const int r0 = rn < 16 ? (int)rn : 16, r1 = (int)rn - r0;
  for (int t = 0; t < 8; t++) { c.colsb[t] = 64; c.rows[t] = 16; }
  c.rows[0] = c.rows[1] = c.rows[4] = (uint8_t)r0;
  c.rows[2] = c.rows[3] = c.rows[5] = (uint8_t)(r1 ? r1 : 1);
  /* the configuration's stores kept: a compiler that does not see ldtilecfg read its operand may drop them (then
     every tile instruction faults; llama.cpp's AMX kernels did so under gcc 12, its PR 26954) */
  __asm__ volatile("" : : "r"(&c) : "memory");
  _tile_loadconfig(&c);
  return r1;
}
/* the next block's keys into L2 (pf its first key, spf the key stride, kb this step's byte offset in a key): a line of
   each key and step once over a call, the pass of 32 rows from m its share */
PR_INLINE void pr_amx_prefetch(const char* pf, long spf, long kb, long m, long rows) {
  const long q = m >> 5, np = (rows + 31) >> 5;
  for (long r = q * 32 / np; r < (q + 1) * 32 / np; r++) _mm_prefetch(pf + r * spf + kb, _MM_HINT_T1);
}
""" + _amx_keys("pr_amx_keys", "uint16_t", "_tile_dpbf16ps") + """
/* the row tiles of a step: the packed rows at xp (the second tile 16 rows on, where two) */
PR_INLINE void pr_amx_rows(const float* xp, long ldm, int two) {
  _tile_loadd(6, xp, ldm * 4);
  if (two) _tile_loadd(7, xp + 16, ldm * 4);
}
/* one step of 32 k into C tiles 0-3 */
PR_INLINE void pr_amx_step(const uint16_t* p, long sa, long a1, const float* xp, long ldm, int two, int r1) {
  pr_amx_rows(xp, ldm, two);
  pr_amx_keys(p, sa, a1, two, r1);
}
/* C tiles 0-3 of the block of 32 rows from m (keys 16-31 where r1, rows 16-31 where two): loaded from Ct (beta) or
   zeroed; stored into Ct */
PR_INLINE void pr_amx_c_load(const float* Ct, long sct, long m, int two, int r1, int beta) {
  if (beta) {
    _tile_loadd(0, Ct + m, sct * 4);
    if (two) _tile_loadd(1, Ct + m + 16, sct * 4);
    if (r1) { _tile_loadd(2, Ct + 16 * sct + m, sct * 4); if (two) _tile_loadd(3, Ct + 16 * sct + m + 16, sct * 4); }
  } else {
    _tile_zero(0); _tile_zero(1); _tile_zero(2); _tile_zero(3);
  }
}
/* C tiles 0-3 into a dense buffer of four 16 x 16 tiles (4 KiB: float32 or int32 sums) */
PR_INLINE void pr_amx_c_stash(void* T, int two, int r1) {
  _tile_stored(0, T, 64);
  if (two) _tile_stored(1, (char*)T + 1024, 64);
  if (r1) { _tile_stored(2, (char*)T + 2048, 64); if (two) _tile_stored(3, (char*)T + 3072, 64); }
}
PR_INLINE void pr_amx_c_store(float* Ct, long sct, long m, int two, int r1) {
  _tile_stored(0, Ct + m, sct * 4);
  if (two) _tile_stored(1, Ct + m + 16, sct * 4);
  if (r1) { _tile_stored(2, Ct + 16 * sct + m, sct * 4); if (two) _tile_stored(3, Ct + 16 * sct + m + 16, sct * 4); }
}
"""


def tn_amx_stage_name(key_bytes: int) -> str:
    return "pr_tn_amx_stage_bf16" if key_bytes == 2 else "pr_tn_amx_stage_i8"


# a key's 32 values at k into the staged panel: bfloat16 as they are, int8 converted (exact)
_TN_AMX_STAGE = {
    2: "_mm512_store_si512((void*)d, _mm512_loadu_si512((const void*)s))",
    1: "const __m512 lo = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i*)s))); "
       "const __m512 hi = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i*)(s + 16)))); "
       "_mm512_store_si512((void*)d, (__m512i)_mm512_cvtne2ps_pbh(hi, lo))",
}


def tn_amx_stage(key_bytes: int) -> str:
    """The AMX tn kernels' staging of the step at ``k`` of a block's ``rn`` keys into the tile-ordered panel ``P``
    (``[K / 32][32 keys][32 k]``, each A tile 1 KiB contiguous), from bfloat16 (``key_bytes`` 2) or int8 keys."""
    kt = "uint16_t" if key_bytes == 2 else "int8_t"
    return (f"PR_INLINE void {tn_amx_stage_name(key_bytes)}(const {kt}* restrict Bt, long sb0, long rn, long k, "
            "uint16_t* restrict P) {\n"
            "  for (long r = 0; r < rn; r++) {\n"
            f"    const {kt}* s = Bt + r * sb0 + k;\n"
            "    uint16_t* d = P + k * 32 + r * 32;\n"
            f"    {_TN_AMX_STAGE[key_bytes]};\n"
            "  }\n"
            "}\n")


def tn_amx_name(key_bytes: int = 2) -> str:
    return "pr_tn_amx_bf16" if key_bytes == 2 else "pr_tn_amx_bf16_i8"


TN_AMX_TEXT = """PR_NOINLINE void NAME(long K, const KT* restrict Bt, long sb0, const char* pf, long spf,
                                const float* restrict Xp, long ldm, float* restrict Ct, long sct, int beta, long rn,
                                long rows) {
  if (!pr_amx_granted) pr_amx_grant();
  /* the block's keys staged as whole tiles: a step's keys while the first rows' products of the step before run */
  uint16_t P[32 * ACC] __attribute__((aligned(64)));
  /* one block of 32 rows reads each key tile once: the keys in place then (staging cost 60 % of such a call) */
  const int direct = DIRECT && rows <= 32;
  const long sa = direct ? sb0 * 2 : 64, a1 = direct ? 16 * sb0 : 16 * 32;
  if (!direct) STAGE(Bt, sb0, rn, 0, P);
  const int r1 = pr_amx_configure(rn);
  for (long m = 0; m < rows; m += 32) {
    const int two = rows - m >= 32;
    pr_amx_c_load(Ct, sct, m, two, r1, beta);
    for (long k = 0; k < K; k += 32) {
      if (!direct && m == 0 && k + 32 < K) STAGE(Bt, sb0, rn, k + 32, P);
      pr_amx_prefetch(pf, spf, k * PFB, m, rows);
      pr_amx_step(direct ? (const uint16_t*)Bt + k : P + k * 32, sa, a1, Xp + (k >> 1) * ldm + m, ldm, two, r1);
    }
    pr_amx_c_store(Ct, sct, m, two, r1);
  }
}
"""


def tn_kernel_amx(key_bytes: int = 2) -> str:
    """The tn kernel on the AMX tiles (codegen.isa.tile_bf16; matmul.emit_tn): Ct[r * sct + m] (beta) sum_k
    Bt[r * sb0 + k] * A[m, k] for r < rn (at most TN_AMX_RN), m < rows (a multiple of 16), over K (a multiple of
    TN_AMX_K), ``Xp`` A's k pairs as :func:`tn_kernel`'s -- the layout of a ``tdpbf16ps`` B tile: 16 k pairs by 16
    rows, one 32-bit pair per row --, the keys the A tiles (16 keys by 32 k), so C^T = Bt A^T tile by tile, as the
    other tn kernels. The keys are staged a step ahead into a tile-ordered panel (:func:`tn_amx_stage`; int8 keys
    converted, exact); bfloat16 keys of a call of at most 32 rows are read in place. Per 32 k: two key tiles, two row
    tiles, four ``tdpbf16ps`` into four C tiles (32 keys x 32 rows), loaded from Ct (beta) or zeroed, stored into Ct
    after the call's K: the products exact, summed in float32 (K <= ACC_ROWS per call, as the other forms' groups).
    The configuration (each tile's rows for ``rn``) is loaded at every call: one call runs every row of a chunk.
    ``pf``/``spf``: the next block's keys, prefetched a line per key and step over the call's passes of 32 rows.
    Measured need: docs/codegen.md, "tn on the AMX tiles". (Needs TN_AMX_HEAD and :func:`tn_amx_stage` before it.)"""
    return (TN_AMX_TEXT.replace("NAME", tn_amx_name(key_bytes)).replace("PFB", str(key_bytes))
            .replace("KT", "uint16_t" if key_bytes == 2 else "int8_t").replace("STAGE", tn_amx_stage_name(key_bytes))
            .replace("DIRECT", "1" if key_bytes == 2 else "0").replace("ACC", str(ACC_ROWS)))


TN_AMX_GROUPED_TEXT = """PR_INLINE void NAME_add(const float* restrict T, float* restrict Ct, long sct, long m, long rn,
                             int two, int first, const FT* restrict S, long ssr, long ssg, long cg) {
  /* one group's four C tiles (stored in T) times each key's scale of the group, into Ct */
  for (long r = 0; r < rn; r++) {
    const __m512 sv = _mm512_set1_ps(SCALE);
    const float* t = T + (r >> 4) * 512 + (r & 15) * 16;
    float* o = Ct + r * sct + m;
    for (int v = 0; v <= two; v++) {
      const __m512 x = _mm512_loadu_ps(t + 256 * v);
      _mm512_storeu_ps(o + 16 * v,
                       first ? _mm512_mul_ps(x, sv) : _mm512_fmadd_ps(x, sv, _mm512_loadu_ps(o + 16 * v)));
    }
  }
}
PR_NOINLINE void NAME(long K, const int8_t* restrict Bt, long sb0, const char* pf, long spf,
                                const float* restrict Xp, long ldm, float* restrict Ct, long sct, int beta, long rn,
                                long rows, const FT* restrict S, long ssr, long ssg) {
  if (!pr_amx_granted) pr_amx_grant();
  uint16_t P[32 * ACC] __attribute__((aligned(64)));
  /* two groups' C tiles: a group's tiles are stored into one half while the group before is scaled from the other
     (a tile store's data is read by vector loads only once it has left the store buffer) */
  float T[2][4 * 256] __attribute__((aligned(64)));
  STAGE(Bt, sb0, rn, 0, P);
  const int r1 = pr_amx_configure(rn);
  for (long m = 0; m < rows; m += 32) {
    const int two = rows - m >= 32;
    for (long g0 = 0; g0 < K; g0 += GS) {
      float* Tc = T[(g0 / GS) & 1];
      _tile_zero(0); _tile_zero(1); _tile_zero(2); _tile_zero(3);
      for (long k = g0; k < g0 + GS; k += 32) {
        if (m == 0 && k + 32 < K) STAGE(Bt, sb0, rn, k + 32, P);
        pr_amx_prefetch(pf, spf, k, m, rows);
        pr_amx_step(P + k * 32, 64, 16 * 32, Xp + (k >> 1) * ldm + m, ldm, two, r1);
      }
      pr_amx_c_stash(Tc, two, r1);
      if (g0 > 0)
        NAME_add(T[(g0 / GS - 1) & 1], Ct, sct, m, rn, two, !beta && g0 == GS, S, ssr, ssg, g0 / GS - 1);
    }
    NAME_add(T[(K / GS - 1) & 1], Ct, sct, m, rn, two, !beta && K == GS, S, ssr, ssg, K / GS - 1);
  }
}
"""


def tn_amx_grouped_name(G: int, fel: str) -> str:
    return f"pr_tn_amx_bf16_i8_g{G}_f{fel}"


def tn_kernel_amx_grouped(isa: ISA, G: int, fel: str) -> str:
    """The grouped tn kernel on the AMX tiles (:func:`tn_kernel_grouped`'s product: int8 keys with a scale per group
    of ``G`` values of K, a multiple of TN_AMX_K, against bfloat16 rows; matmul.emit_tn): per 32 rows, each group's
    ``tdpbf16ps`` steps summed from zero in four C tiles, stored (4 KiB on the stack) and added into Ct times each
    key's scale of the group (one FMA per 16 outputs; the first group of a call without beta stores). The keys are
    staged as :func:`tn_kernel_amx`'s (converted to bfloat16, exact); ``rn`` keys (at most 32) and ``rows`` (a
    multiple of 16) at run time. The program's exact grouped sum: each group's products summed in float32 and
    multiplied by its scale, as the AVX-512 form. (Needs TN_AMX_HEAD and :func:`tn_amx_stage` (1) before it.)"""
    return (TN_AMX_GROUPED_TEXT.replace("NAME", tn_amx_grouped_name(G, fel)).replace("FT", ctype(fel))
            .replace("GS", str(G)).replace("ACC", str(ACC_ROWS)).replace("STAGE", tn_amx_stage_name(1))
            .replace("SCALE", _gdot_factor(isa, (fel,), "r * ssr + cg * ssg", "S")))


TN_AMX_SPLIT_TEXT = """/* a key's 32 int8 at k times its group's bfloat16 scale as two bfloat16 panels: hi = q * s
   cut to its top 8 significant bits (the float32's low 16 bits cleared), lo = the rest. q * s has at most 16
   significant bits (8 and 8): exact in float32; lo has at most 8 (exact in bfloat16); both convert exactly, and
   hi + lo = q * s */
PR_INLINE void NAME_stage(const int8_t* restrict Bt, long sb0, long rn, long k, uint16_t* restrict Ph,
                          uint16_t* restrict Pl, const uint16_t* restrict S, long ssr, long ssg) {
  const __m512 top = _mm512_castsi512_ps(_mm512_set1_epi32((int)0xFFFF0000u));
  for (long r = 0; r < rn; r++) {
    const int8_t* q = Bt + r * sb0 + k;
    const __m512 s = _mm512_set1_ps(pr_ld_bf16(S[r * ssr + k / GS * ssg]));
    const __m512 f0 = _mm512_mul_ps(pr_v16_i8(q), s), f1 = _mm512_mul_ps(pr_v16_i8(q + 16), s);
    const __m512 h0 = _mm512_and_ps(f0, top), h1 = _mm512_and_ps(f1, top);
    _mm512_store_si512((void*)(Ph + k * 32 + r * 32), (__m512i)_mm512_cvtne2ps_pbh(h1, h0));
    _mm512_store_si512((void*)(Pl + k * 32 + r * 32),
                       (__m512i)_mm512_cvtne2ps_pbh(_mm512_sub_ps(f1, h1), _mm512_sub_ps(f0, h0)));
  }
}
PR_NOINLINE void NAME(long K, const int8_t* restrict Bt, long sb0, const char* pf, long spf,
                      const float* restrict Xp, long ldm, float* restrict Ct, long sct, int beta, long rn,
                      long rows, const uint16_t* restrict S, long ssr, long ssg) {
  if (!pr_amx_granted) pr_amx_grant();
  uint16_t Ph[32 * ACC] __attribute__((aligned(64))), Pl[32 * ACC] __attribute__((aligned(64)));
  NAME_stage(Bt, sb0, rn, 0, Ph, Pl, S, ssr, ssg);
  const int r1 = pr_amx_configure(rn);
  for (long m = 0; m < rows; m += 32) {
    const int two = rows - m >= 32;
    pr_amx_c_load(Ct, sct, m, two, r1, beta);
    for (long k = 0; k < K; k += 32) {
      if (m == 0 && k + 32 < K) NAME_stage(Bt, sb0, rn, k + 32, Ph, Pl, S, ssr, ssg);
      pr_amx_prefetch(pf, spf, k, m, rows);
      pr_amx_rows(Xp + (k >> 1) * ldm + m, ldm, two);
      pr_amx_keys(Ph + k * 32, 64, 16 * 32, two, r1);
      pr_amx_keys(Pl + k * 32, 64, 16 * 32, two, r1);
    }
    pr_amx_c_store(Ct, sct, m, two, r1);
  }
}
"""


def tn_amx_split_name(G: int) -> str:
    return f"pr_tn_amx_bf16_i8_g{G}_split"


def tn_kernel_amx_split(G: int) -> str:
    """The grouped tn kernel on the AMX tiles for bfloat16 scales (matmul.emit_tn; the arguments of
    :func:`tn_kernel_amx_grouped`): each key's int8 values times its group's scale, ``q * s`` -- exact in float32: 8
    and 8 significant bits -- staged as two bfloat16 panels, ``hi`` (q * s cut to 8 significant bits) and ``lo`` (the
    rest: at most 8 significant bits), both exact in bfloat16, so ``hi + lo = q * s`` exactly; both run through the
    tiles into the same C tiles over the whole call's K, as the plain kernel's (:func:`tn_kernel_amx`). The grouped
    sum reassociated (each product x * q * s exact as x * hi + x * lo, summed in float32), where the grouped kernel
    stored the four C tiles and scaled them into Ct at every group. Twice the tile products and 1.5x the tile loads
    of the plain kernel; no stores per group. (Needs TN_AMX_HEAD before it.)"""
    assert G % TN_AMX_K == 0
    return (TN_AMX_SPLIT_TEXT.replace("NAME", tn_amx_split_name(G)).replace("GS", str(G))
            .replace("ACC", str(ACC_ROWS)))


TN_AMX_I8_K = 64   # k per int8 tile step (a tile row is 64 bytes: 64 int8)
# K per call of the int8 tile kernel (matmul.emit_tn's group of K for it): twice ACC_ROWS, so the packed quads of a
# row fill 1 KiB, the bfloat16 form's pairs (tn_amx_rows), and each block of 32 rows converts its sums once per 1024 k
TN_AMX_I8_KMAX = 1024


def tn_amx_i8_name(kmax: int) -> str:
    return f"pr_tn_amx_i8_i8_k{kmax}"


TN_AMX_I8_TEXT = """/* a key's 64 int8 at k into the staged panel ([K / 64][32 keys][64 k]: 1 KiB per A tile) */
PR_INLINE void pr_tn_amx_stage_i8_i8(const int8_t* restrict Bt, long sb0, long rn, long k, int8_t* restrict P) {
  for (long r = 0; r < rn; r++)
    _mm512_store_si512((void*)(P + k * 32 + r * 64), _mm512_loadu_si512((const void*)(Bt + r * sb0 + k)));
}
/* (a step of 64 k: tdpbssd, signed bytes on both sides, summed in int32) */
""" + _amx_keys("pr_amx_keys_i8", "int8_t", "_tile_dpbssd") + """
/* a block of 32 rows' four C tiles (int32 sums, stored in T) into Ct as float: stored, or added where beta */
PR_INLINE void pr_tn_amx_i8_out(const int32_t* restrict T, float* restrict Ct, long sct, long m, long rn, int two,
                                int beta) {
  for (long r = 0; r < rn; r++) {
    const int32_t* t = T + (r >> 4) * 512 + (r & 15) * 16;
    float* o = Ct + r * sct + m;
    for (int v = 0; v <= two; v++) {
      const __m512 x = _mm512_cvtepi32_ps(_mm512_load_si512((const void*)(t + 256 * v)));
      _mm512_storeu_ps(o + 16 * v, beta ? _mm512_add_ps(_mm512_loadu_ps(o + 16 * v), x) : x);
    }
  }
}
PR_NOINLINE void NAME(long K, const int8_t* restrict Bt, long sb0, const char* pf, long spf,
                      const float* restrict Xp, long ldm, float* restrict Ct, long sct, int beta, long rn,
                      long rows) {
  if (!pr_amx_granted) pr_amx_grant();
  int8_t P[32 * KMAX] __attribute__((aligned(64)));
  /* two blocks' C tiles: a block's tiles are stored into one half while the block before is converted from the other
     (a tile store's data is read by vector loads only once it has left the store buffer) */
  int32_t T[2][4 * 256] __attribute__((aligned(64)));
  const int direct = rows <= 32;
  const long sa = direct ? sb0 : 64, a1 = direct ? 16 * sb0 : 16 * 64;
  if (!direct) pr_tn_amx_stage_i8_i8(Bt, sb0, rn, 0, P);
  const int r1 = pr_amx_configure(rn);
  for (long m = 0; m < rows; m += 32) {
    const int two = rows - m >= 32;
    int32_t* Tc = T[(m >> 5) & 1];
    _tile_zero(0); _tile_zero(1); _tile_zero(2); _tile_zero(3);
    for (long k = 0; k < K; k += 64) {
      if (!direct && m == 0 && k + 64 < K) pr_tn_amx_stage_i8_i8(Bt, sb0, rn, k + 64, P);
      pr_amx_prefetch(pf, spf, k, m, rows);
      pr_amx_rows(Xp + (k >> 2) * ldm + m, ldm, two);
      pr_amx_keys_i8(direct ? Bt + k : P + k * 32, sa, a1, two, r1);
    }
    pr_amx_c_stash(Tc, two, r1);
    if (m > 0) pr_tn_amx_i8_out(T[((m >> 5) - 1) & 1], Ct, sct, m - 32, rn, 1, beta);
  }
  const long ml = (rows - 1) >> 5 << 5;
  pr_tn_amx_i8_out(T[(ml >> 5) & 1], Ct, sct, ml, rn, rows - ml >= 32, beta);
}
"""


def tn_kernel_amx_i8(kmax: int) -> str:
    """The tn kernel of int8 rows against int8 keys on the AMX tiles (codegen.isa.tile_int8; matmul.emit_tn, the W8A8
    form over many rows): Ct[r * sct + m] (beta) sum_k Bt[r * sb0 + k] * A[m, k] for r < rn (at most TN_AMX_RN),
    m < rows (a multiple of 16), over K (a multiple of TN_AMX_I8_K, at most ``kmax``). ``Xp`` A's k quads as
    :func:`tn_kernel_i8`'s but as they are (no sign flip) -- the layout of a ``tdpbssd`` B tile: 16 quads by 16 rows --,
    the keys the A tiles (16 keys by 64 k, staged into a tile-ordered panel a step ahead, or read in place by a call of
    at most 32 rows), so C^T = Bt A^T tile by tile. Per 64 k: two key tiles, two row tiles, four ``tdpbssd`` into four
    int32 C tiles (32 keys x 32 rows), stored after the call's K and converted into Ct (one block of rows behind).
    Exact for every int8 value incl. -128: |sum| <= 128 * 128 * kmax < 2^24 for kmax <= 1024, an integer float32
    holds. (Needs TN_AMX_HEAD before it.)"""
    assert kmax % TN_AMX_I8_K == 0 and 128 * 128 * kmax <= 2 ** 24
    return TN_AMX_I8_TEXT.replace("NAME", tn_amx_i8_name(kmax)).replace("KMAX", str(kmax))


# keys x vectors of 16 rows of the grouped tn kernel. Measured on the Zen 5 VM (2 threads, bfloat16 [m, 2048] x int8
# [5632, 2048]^T through prism.optimize, groups of 32, three alternations of processes, load 1.3-1.7): m = 128 6 x 4
# 3.62-3.79 ms against 12 x 1 (tn_shape's for int8 keys) 3.98-4.33; m = 1024 28.4-29.9 against 31.9-32.5. (The
# per-channel form beside it moved the same way, 3.28-3.39 against 3.71-3.89 and 26.6-27.3 against 30.0; it keeps
# 12 x 1, chosen on the Zen 4 VM where 6 x 4 was 5-6 % slower: not measured again there.)
TN_GROUPED_SHAPE = (6, 4)


def tn_grouped_name(rn: int, mv: int, G: int, fel: str, rows: str = "bf16") -> str:
    return f"pr_tn_avx512_{rn}x{mv}_{'bf16_dp' if rows == 'bf16' else 'f32'}_g{G}_f{fel}"


def tn_kernel_grouped(isa: ISA, rn: int, mv: int, G: int, fel: str, rows: str = "bf16") -> str:
    """The tn kernel of a grouped product (int8 weights with a scale per group of ``G`` values of K on a bfloat16
    model; matmul.emit_grouped): Ct[r * sct + m] (beta) sum_c S[r * ssr + c * ssg] * sum_{k in group c}
    Bt[r * sb0 + k] * A[m, k] for r < rn, m < 16 * mv, over K (a multiple of G, G even) of this call, the groups
    c counted from the call's first. ``Bt``: the keys' int8 values converted into a bfloat16 panel by the caller
    (exact), ``Xp``: A's k pairs as :func:`tn_kernel`'s. Each group's G / 2 ``vdpbf16ps`` steps start from zero
    in registers (the products exact, two float32 additions per lane and step); the group sum times its key's
    scale (a broadcast, one FMA per accumulator and group) is added into the call's sum (on the stack), which is
    stored (beta 0) or added (beta 1) into Ct. The program's exact grouped sum: ``q * s`` is never rounded (it
    can have 16 significant bits), the scale multiplies each group's float32 dot product as the program writes
    it. Per group, rn * mv * G / 2 ``vdpbf16ps`` and rn * mv FMAs: 1/16 more instructions than the per-channel
    form at G = 32, where the float32 form (each block of keys dequantized, ``q * s`` exact in float32, then FMAs)
    takes twice the products' instructions."""
    if rows == "f32":   # float32 rows: the keys converted into a float32 panel, FMAs (tn_kernel_f32's steps)
        return _tn_text(tn_grouped_name(rn, mv, G, fel, rows), "float", rn, mv, 1, 1, "k * ldm", "__m512",
                        _tn_f32_keys(rn, mv), scales=(isa, G, fel))
    return _tn_text(tn_grouped_name(rn, mv, G, fel), "uint16_t", rn, mv, 2, 1, "(k >> 1) * ldm", "__m512bh",
                    _tn_pair_keys(rn, mv), scales=(isa, G, fel))


def _tn_text(name: str, bt: str, rn: int, mv: int, kstep: int, pf_bytes: int, xrow: str, xtype: str,
             keys: list[str], scales: tuple[ISA, int, str] | None = None) -> str:
    """The tn kernels' common text: chunks of ACC_CHUNK products per lane start from zero in registers, in steps of
    ``kstep`` k (``keys``: per key, its broadcast and products against the ``mv`` row vectors at ``Xp + xrow``);
    the chunk sums are added into the group sum (on the stack), which is stored (beta 0) or added (beta 1) into
    Ct. ``scales`` = (isa, G, factor dtype): a grouped product's (:func:`tn_kernel_grouped`): chunks of G, each
    chunk's sums multiplied by its key's factor ``S[r * ssr + c * ssg]`` as they are added."""
    cells = [(r, v) for r in range(rn) for v in range(mv)]
    cast = "" if xtype == "__m512" else f"({xtype})"
    inc = "k++" if kstep == 1 else f"k += {kstep}"
    chunk = ACC_CHUNK if scales is None else scales[1]
    extra = "" if scales is None else f", const {ctype(scales[2])}* restrict S, long ssr, long ssg"
    # (a grouped kernel was the first not inlined: a template's 8 of them, gcc 1.41 -> 0.86 s; docs/codegen.md)
    L = [f"{LINKAGE} void {name}(long K, const {bt}* restrict Bt, long sb0, "
         f"const char* pf, long spf, const float* restrict Xp, long ldm, float* restrict Ct, long sct, "
         f"int beta{extra}) {{",
         f"  __m512 g[{rn * mv}];",
         f"  for (long c0 = 0; c0 < K; c0 += {chunk}) {{",
         # (a grouped call's K is a multiple of G: each chunk's trip count a constant)
         f"    const long c1 = {'pr_minl(K, c0 + ' + str(chunk) + ')' if scales is None else 'c0 + ' + str(chunk)};",
         "    " + " ".join(f"__m512 a{r}_{v} = _mm512_setzero_ps();" for r, v in cells),
         f"    for (long k = c0; k < c1; {inc}) {{",
         f"      const float* xp = Xp + {xrow};",
         _tn_prefetch(rn, kstep, pf_bytes)]
    L.extend(f"      const {xtype} x{v} = {cast}_mm512_loadu_ps(xp + {16 * v});" for v in range(mv))
    L.extend(keys)
    L.append("    }")
    first, later = "a{r}_{v}", "_mm512_add_ps(g[{i}], a{r}_{v})"
    if scales is not None:
        isa, G, fel = scales
        L.append(f"    const long c = c0 / {G};")
        L.extend(f"    const __m512 s{r} = _mm512_set1_ps("
                 + _gdot_factor(isa, (fel,), f"{r} * ssr + c * ssg", "S") + ");" for r in range(rn))
        first, later = "_mm512_mul_ps(a{r}_{v}, s{r})", "_mm512_fmadd_ps(a{r}_{v}, s{r}, g[{i}])"
    L.append("    if (c0 == 0) {")
    L.extend(f"      g[{i}] = " + first.format(r=r, v=v, i=i) + ";" for i, (r, v) in enumerate(cells))
    L.append("    } else {")
    L.extend(f"      g[{i}] = " + later.format(r=r, v=v, i=i) + ";" for i, (r, v) in enumerate(cells))
    L.append("    }")
    L.append("  }")
    for i, (r, v) in enumerate(cells):
        p = f"Ct + {r} * sct + {16 * v}"
        L.append(f"  _mm512_storeu_ps({p}, beta ? _mm512_add_ps(_mm512_loadu_ps({p}), g[{i}]) : g[{i}]);")
    L.append("}")
    return "\n".join(L) + "\n"


# --- grouped products: per-group scaled dot products (int8 weights with a scale per group of G values of K) ------
# (matmul.emit_grouped). C[m, j] = sum_g f(g, m, j) * sum_{k < G} A[m, g*G + k] * B[j, g*G + k], where A's row and
# B's key are each one contiguous run of Gn * G elements and f is the product of up to two factors read at a stride
# per group (a weight's group scales [N, Gn]; a quantized row's group scales [M, Gn]).

def gdot_lanes(isa: ISA, G: int) -> int:
    """Vector lanes of the grouped dot product of groups of ``G`` values on ``isa`` (1: the scalar form, where G
    is not a multiple of the vector width)."""
    return isa.width if isa.vector and G % isa.width == 0 else 1


GDOT_ROWS = (8, 4, 2)   # row counts of the grouped dot kernels that share each dequantized key (matmul.emit_grouped)


def gdot_sig(elems: tuple[str, str], fel: tuple[str, ...], rows: int = 1) -> str:
    a, b = (ctype(e) for e in elems)
    fs = ", ".join(f"const {ctype(e)}* restrict f{i}, long f{i}g" for i, e in enumerate(fel))
    if rows == 1:
        return f"(long Gn, const {a}* restrict A, const {b}* restrict B, {fs})"
    return f"(long Gn, const {a}* restrict A, long sa, const {b}* restrict B, {fs}, float* restrict C, long sc)"


def gdot_name(isa: ISA, G: int, elems: tuple[str, str], fel: tuple[str, ...], prefetch: bool, rows: int = 1) -> str:
    vec = gdot_lanes(isa, G) > 1
    return (f"pr_gdot_{isa.name if vec else 'scalar'}_g{G}" + (f"_r{rows}" if rows > 1 else "") + _suffix(elems)
            + "_f" + "".join(fel) + ("_pfa" if prefetch and vec else ""))


GDOT_TILE = (4, 4)   # rows x keys of the grouped tile kernel (matmul.emit_grouped, from 4 rows)
# ... from 8 rows where the ISA has 32 vector registers: each key vector dequantized once for 8 rows (the 4 x 4 tile
# dequantizes it once per 4); batch-8 decode of [8, 2048] x [5632, 2048]^T (docs/codegen.md, "Grouped products")
GDOT_TILE8 = (8, 2)


def _gdot_factor(isa: ISA, fel: tuple[str, ...], at: str, array: str = "f{i}") -> str:
    """The product of the factors ``f<i>[at]`` (``array``: their names) as a float: a float16 one by vcvtph2ps where
    there are vectors (``pr_ld1_f16``; pr_ld_f16's bit operations per group took a GEMV of [5632, 2048] from 134 to
    187 us)."""
    return " * ".join((f"pr_ld1_f16({array.format(i=i)}[{at.format(i=i)}])" if e == "f16" and isa.vector
                       else ld(e, f"{array.format(i=i)}[{at.format(i=i)}]")) for i, e in enumerate(fel))


def gdot_tile_name(isa: ISA, G: int, elems: tuple[str, str], fel: tuple[str, ...],
                   tile: tuple[int, int] = GDOT_TILE) -> str:
    R, J = tile
    return f"pr_gdot_{isa.name}_g{G}_{R}x{J}" + _suffix(elems) + "_f" + "".join(fel)


def gdot_tile_kernel(isa: ISA, G: int, elems: tuple[str, str], fel: tuple[str, ...],
                     tile: tuple[int, int] = GDOT_TILE) -> str:
    """``void NAME(Gn, A, sa, B, sb, f0, f0g, f0j[, f1...], C, sc)``: ``tile``'s R rows of A (row stride sa) against
    J keys of B (key stride sb), every row with the same factors (key j's at ``g * fig + j * fij``), C[r * sc + j].
    Per group: the R rows' vectors loaded once, each key's vectors dequantized in registers once (widened, times its
    factor) and FMA'd into the R x J accumulators (one register each): the rows are read once per J keys where the
    row kernels read them once per key (8 rows of 2048 floats, 64 KiB, from L2 for every key: batch-8 decode of a
    [*, 2048] x [5632, 2048]^T product 783 us against the per-channel form's 440). Chunk levels as ``gdot_kernel``.
    Vector ISAs and G a multiple of the width only (``gdot_lanes``)."""
    R, J = tile
    W = gdot_lanes(isa, G)
    assert W > 1
    name = gdot_tile_name(isa, G, elems, fel, tile)
    ea, eb = elems
    a, b = (ctype(e) for e in elems)
    fs = ", ".join(f"const {ctype(e)}* restrict f{i}, long f{i}g, long f{i}j" for i, e in enumerate(fel))
    sig = f"(long Gn, const {a}* restrict A, long sa, const {b}* restrict B, long sb, {fs}, float* restrict C, long sc)"
    v = _V(isa)
    vt = isa.vtype
    nvec = G // W
    gc = max(2, (W * ACC_CHUNK // G) // 2 * 2)
    gr = gc * ACC_GROUP

    def factor(j: int) -> str:
        return _gdot_factor(isa, fel, f"g * f{{i}}g + {j} * f{{i}}j")
    body = []
    if tile != GDOT_TILE8:   # every row's group in registers, then key by key
        for r in range(R):
            body += [f"      const {vt} a{r}_{i} = {v.load(f'A + {r} * sa + g * {G} + {i * W}', 0, ea)};"
                     for i in range(nvec)]
        for j in range(J):
            body.append(f"      {{ const {vt} f = {v.set1(factor(j))};")
            for i in range(nvec):
                wv = v.mul(v.load(f"B + {j} * sb + g * {G} + {i * W}", 0, eb), "f")
                body.append(f"        {{ const {vt} w = {wv};")
                body += [f"          acc{r}{j} = {v.fma(f'a{r}_{i}', 'w', f'acc{r}{j}')};" for r in range(R)]
                body.append("        }")
            body.append("      }")
    else:   # the keys' factors in registers, the rows one vector at a time (16 sums, 8 rows, 2 factors: 27 registers)
        body += [f"      const {vt} fv{j} = {v.set1(factor(j))};" for j in range(J)]   # (f<i>: the factors)
        for i in range(nvec):
            body.append("      {")
            body += [f"        const {vt} a{r} = {v.load(f'A + {r} * sa + g * {G} + {i * W}', 0, ea)};"
                     for r in range(R)]
            for j in range(J):
                wv = v.mul(v.load(f"B + {j} * sb + g * {G} + {i * W}", 0, eb), f"fv{j}")
                body.append(f"        {{ const {vt} w = {wv};")
                body += [f"          acc{r}{j} = {v.fma(f'a{r}', 'w', f'acc{r}{j}')};" for r in range(R)]
                body.append("        }")
            body.append("      }")
    accs = ", ".join(f"acc{r}{j} = {v.zero()}" for r in range(R) for j in range(J))
    sums = []
    for r in range(R):
        for j in range(J):
            k = r * J + j
            sums.append(f"    {{ {v.sum_lanes('c', f'acc{r}{j}')}\n      "
                        f"{_nt_levels(f's[{k}]', f't[{k}]', 'c', _scalar_add, gr, 'g0', 'g1', 'Gn')} }}")
    nl = "\n"
    return f"""{LINKAGE} void {name}{sig} {{
  float s[{R * J}] = {{0}}, t[{R * J}] = {{0}};
  for (long g0 = 0; g0 < Gn; g0 += {gc}) {{
    const long g1 = pr_minl(Gn, g0 + {gc});
    {vt} {accs};
    for (long g = g0; g < g1; g++) {{
{nl.join(body)}
    }}
{nl.join(sums)}
  }}
  for (int r = 0; r < {R}; r++)
    for (int j = 0; j < {J}; j++) C[r * sc + j] = s[r * {J} + j];
}}
"""


def gdot_kernel(isa: ISA, G: int, elems: tuple[str, str], fel: tuple[str, ...], prefetch: bool = True,
                rows: int = 1) -> str:
    """``float NAME(Gn, A, B, f0, f0g[, f1, f1g])``: sum over Gn groups of (f0[g * f0g] * f1[g * f1g]) times the dot
    product of the group's G values of A and B (any storage, widened exactly to float32). ``rows`` R > 1: ``void
    NAME(Gn, A, sa, B, f0, f0g, ..., C, sc)`` for R rows of A (row stride sa) against the one key B, every row with
    the same factors (a weight's group scales), row r's result stored at ``C[r * sc]``. ``fel``: each factor's
    storage (float32, or float16 / bfloat16 scales read as stored: one conversion per group, no pass over them).

    One row: per group, the G / W vector products summed in one register (the first a multiply), then scaled by
    the group's factor into one of two accumulators taken in turn by alternate groups (no single chain of
    dependent FMAs). R rows: each key vector is dequantized in registers once (widened, times the group's factor)
    and serves the R rows' FMAs, into two accumulators per row up to 4 rows (one from 8: enough chains): the
    per-group scaling costs one multiply per W weights instead of one FMA per row and group (batch-8 decode of a
    [*, 2048] x [5632, 2048]^T product: 1.03 ms with a 4-row form scaling each row's group sums, against 0.45 for
    the per-channel form's 4 x 4 nt kernel). As the nt kernels, the accumulators restart every chunk of about
    W * ACC_CHUNK values of K, whose sums join a group sum of ACC_GROUP chunks and the group sums the total (the
    error grows like BLAS's, see ACC_CHUNK). ``prefetch``: one prefetch per 64-byte line of B, PF_AHEAD bytes
    ahead (a GEMV's keys are one stream per thread, as ``nt_kernel``'s single dot product)."""
    name = gdot_name(isa, G, elems, fel, prefetch, rows)
    ea, eb = elems
    sig = gdot_sig(elems, fel, rows)
    W = gdot_lanes(isa, G)
    R = rows

    def factor(g: str) -> str:
        return _gdot_factor(isa, fel, f"({g}) * f{{i}}g")
    if W == 1:
        if R == 1:
            return f"""PR_INLINE float {name}{sig} {{
  float s = 0.0f;
  for (long g = 0; g < Gn; g++) {{
    float d = 0.0f;
    for (long k = 0; k < {G}; k++) d += {ld(ea, f"A[g * {G} + k]")} * {ld(eb, f"B[g * {G} + k]")};
    s += d * ({factor("g")});
  }}
  return s;
}}
"""
        return f"""{LINKAGE} void {name}{sig} {{
  for (long r = 0; r < {R}; r++) {{
    float s = 0.0f;
    for (long g = 0; g < Gn; g++) {{
      float d = 0.0f;
      for (long k = 0; k < {G}; k++) d += {ld(ea, f"A[r * sa + g * {G} + k]")} * {ld(eb, f"B[g * {G} + k]")};
      s += d * ({factor("g")});
    }}
    C[r * sc] = s;
  }}
}}
"""
    v = _V(isa)
    vt = isa.vtype
    gc = max(2, (W * ACC_CHUNK // G) // 2 * 2)   # groups per chunk (even: two accumulators take them in turn)
    gr = gc * ACC_GROUP                            # groups per group sum
    nvec = G // W
    lines_per_pair = max(1, -(-2 * G * ITEMSIZE[eb] // 64))

    def pf(g: str) -> list[str]:
        return [f"      __builtin_prefetch((const char*)(B + ({g}) * {G}) + {PF_AHEAD + 64 * i}, 0, 1);"
                for i in range(lines_per_pair)] if prefetch else []
    # one half-precision scale per group (a bfloat16 / float16 model's), widened per chunk of groups into a float32
    # array, 16 at a time, so each group's broadcast is a load (vbroadcastss from memory) instead of a scalar
    # conversion moved into a vector register and broadcast there (two shuffle-port operations per group beside
    # the two int8 widenings). Measured need (Intel VM, 2 threads, [1, 2048] x int8 g32 [5632, 2048]^T, float32
    # rows): bfloat16 scales 461 us against float32 scales' 340-408
    half = (R == 1 and len(fel) == 1 and fel[0] in ("bf16", "f16") and isa.name == "avx512"
            and os.environ.get("PRISM_GDOT_WIDE_SCALES", "").strip() != "0")
    if R == 1:
        def group(g: str, acc: str) -> list[str]:
            loads = [(v.load(f"A + ({g}) * {G} + {i * W}", 0, ea), v.load(f"B + ({g}) * {G} + {i * W}", 0, eb))
                     for i in range(nvec)]
            out = [f"      {{ {vt} d = {v.mul(*loads[0])};"]
            out += [f"        d = {v.fma(a, b, 'd')};" for a, b in loads[1:]]
            f = f"fw[({g}) - g0]" if half else factor(g)
            out.append(f"        {acc} = {v.fma('d', v.set1(f), acc)}; }}")
            return out
        widen = ""
        if half:
            cvt = ("_mm512_cvtph_ps(h)" if fel[0] == "f16"
                   else "_mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16))")
            widen = f"""
    float fw[{-(-gc // 16) * 16}] __attribute__((aligned(64)));
    if (f0g == 1) {{
      for (long i = 0; i < g1 - g0; i += 16) {{
        const __m256i h = _mm256_maskz_loadu_epi16(g1 - g0 - i >= 16 ? (__mmask16)0xFFFF
                                                   : (__mmask16)((1u << (g1 - g0 - i)) - 1), f0 + g0 + i);
        _mm512_store_ps(fw + i, {cvt});
      }}
    }} else {{
      for (long i = 0; i < g1 - g0; i++) fw[i] = {factor("g0 + i")};
    }}"""
        body = "\n".join(pf("g") + group("g", "acc0") + group("g + 1", "acc1"))
        tail = "\n".join(group("g", "acc0"))
        return f"""PR_INLINE float {name}{sig} {{
  float s = 0.0f, t = 0.0f;
  for (long g0 = 0; g0 < Gn; g0 += {gc}) {{
    const long g1 = pr_minl(Gn, g0 + {gc});{widen}
    {vt} acc0 = {v.zero()}, acc1 = {v.zero()};
    long g = g0;
    for (; g + 2 <= g1; g += 2) {{
{body}
    }}
    if (g < g1) {{
{tail}
    }}
    {v.sum_lanes("c", v.add("acc0", "acc1"))}
    {_nt_levels("s", "t", "c", _scalar_add, gr, "g0", "g1", "Gn")}
  }}
  return s;
}}
"""
    na = 2 if R <= 4 else 1   # accumulators per row

    def rgroup(g: str) -> list[str]:
        out = ["      {", f"        const {vt} f = {v.set1(factor(g))};"]
        for i in range(nvec):
            out.append(f"        {{ const {vt} b = {v.mul(v.load(f'B + ({g}) * {G} + {i * W}', 0, eb), 'f')};")
            for r in range(R):
                a = f"acc{r}_{i % na}"
                out.append(f"          {a} = {v.fma(v.load(f'A + {r} * sa + ({g}) * {G} + {i * W}', 0, ea), 'b', a)};")
            out.append("        }")
        out.append("      }")
        return out
    accs = ", ".join(f"acc{r}_{u} = {v.zero()}" for r in range(R) for u in range(na))
    total = {r: (v.add(f"acc{r}_0", f"acc{r}_1") if na == 2 else f"acc{r}_0") for r in range(R)}
    sums = "\n".join(f"    {{ {v.sum_lanes('c', total[r])}\n      "
                     f"{_nt_levels(f's[{r}]', f't[{r}]', 'c', _scalar_add, gr, 'g0', 'g1', 'Gn')} }}"
                     for r in range(R))
    return f"""{LINKAGE} void {name}{sig} {{
  float s[{R}] = {{0}}, t[{R}] = {{0}};
  for (long g0 = 0; g0 < Gn; g0 += {gc}) {{
    const long g1 = pr_minl(Gn, g0 + {gc});
    {vt} {accs};
    for (long g = g0; g < g1; g++) {{
{chr(10).join(pf("g")[:1] + rgroup("g"))}
    }}
{sums}
  }}
  for (int r = 0; r < {R}; r++) C[r * sc] = s[r];
}}
"""
