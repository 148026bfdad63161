"""Lowering of one matmul on views to micro-kernel calls.

``C (beta) A @ B`` with NumPy batch broadcasting over leading dims. Per 2-D product the layout picks
the kernel: B with unit column stride -> ``nn`` (register-blocked, B streamed row by row); B with unit
row stride and A with unit column stride (a transposed operand such as K^T) -> ``nt``; anything else
-> a plain loop nest. ``nn`` splits the rows into groups of at most MR and the columns into panels
that fit the registers; the loop order is panel -> K chunk -> row group, so each panel of B comes from
memory once and is reused from L1 by the other row groups.

Accuracy: K is never one running sum. The micro-kernels sum chunks of ``mk.ACC_CHUNK`` from zero and add
the chunk sums in groups (microkernels.py); where K is cut into calls (the K-chunk loop below, and the
iterations of a block graph's for-loop that accumulate one matmul), the calls of one group of
``mk.ACC_ROWS`` rows add into C for the first group and into a scratch copy ``P`` for the later ones,
and each later group's ``P`` is added into C once (three levels, so the error grows like BLAS's).
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from dataclasses import dataclass, field

from prism.codegen import microkernels as mk
from prism.codegen.cwriter import CWriter, Namer
from prism.codegen.isa import ISA, tile_bf16, tile_int8
from prism.codegen.loops import PAR_MIN, Nest, assign, make_nest, offset, varying
from prism.codegen.tiles import View, ctype, ld
from prism.ir.traced import any_of, concrete, varies

# nt calls over the whole K up to this many rows of C (see emit_matmul)
NT_WHOLE_K_ROWS = 8
# an nt product runs as nn on a transposed copy of B from this many rows of C, up to this K and this many
# floats of B (per product, in the thread's scratch; see emit_matmul)
PACK_NT_MIN_ROWS = 64
PACK_NT_MAX_K = 256
PACK_NT_MAX_FLOATS = 64 * 1024
# a bfloat16 nt product with vdpbf16ps runs as C^T = Bt @ A^T on A packed in k pairs (emit_tn) from this many rows
# of C and this K (a Linear's prefill; attention's scores, K = a head dim, keep the nt kernels)
TN_MIN_ROWS = 64
TN_MIN_K = 256
# bfloat16 rows against int8 keys (int8 weight-only on a bfloat16 model) take it from the first row count past
# the GEMV kernels' (NT_WHOLE_K_ROWS): the nt kernels widen the int8 keys once per row group and multiply with
# FMA, where tn converts each block of keys into bfloat16 once for all rows and multiplies with vdpbf16ps.
# Measured on the Zen 4 VM, 2 threads, bfloat16 x [m, 2048] @ int8 [5632, 2048]^T through prism.optimize (four
# Linears in turn, medians of 40 rounds; the bfloat16 weight's own product beside it): m = 12 1638 -> 1273 us,
# 16 2153 -> 1246, 32 4464 -> 2064-2290, 48 6525 -> 3132 (bfloat16 weight 1321, 1548-1573, 2434-2551, 3230);
# m = 8 stays nt (1125 against tn's 1267: half of the one row vector idle). bfloat16 keys gained nothing from
# tn below 64 rows (1816 against 1928 us at 16, 2572 against 2386 at 32: level). Also tried and not kept: at 2-8
# rows the nt kernels on a bfloat16 panel of each block of 16 int8 keys (vdpbf16ps): m = 8 1084 against 1092 us,
# 4 837 against 596, 2 540 against 513 -- converting a key (two widenings and a vcvtne2ps2bf16 per 32) costs
# more than widening it for the one or two row groups that use it
TN_MIN_ROWS_I8 = NT_WHOLE_K_ROWS + 1
# int8 rows against int8 keys (W8A8) take it from 48 rows: one block of 64 packed rows whatever their count
# (mk.tn_shape), so below that the lanes past the rows cost more than the nt kernels' tile reductions. Measured on
# the Zen 4 VM, one thread, int8 [m, 2048] @ int8 [2048, 2048]^T (one block, alternating), nt against tn: m = 16
# 0.51 / 1.30 ms, 32 1.04 / 1.38, 48 1.37 / 1.35, 64 1.90 / 1.42, 96 2.77 / 2.66, 128 3.73 / 2.69 (nt ~140 G int8
# MAC/s, tn 190-200 at whole blocks; vpdpbusd's own peak measured beside it 235)
TN_MIN_ROWS_I8_I8 = 48
# bfloat16 rows against bfloat16 or int8 keys on the AMX tiles (mk.tn_kernel_amx): from 8 rows. Measured on the Intel
# VM of 2026-12-01 (AMX; bfloat16 [m, 2048] @ [5632, 2048]^T, the weight in L3, 2 threads, tuned through
# prism.superoptimize, oneDNN beside): m = 4 nt 0.47 ms, tiles 0.70; m = 8 0.89 against 0.74 (oneDNN 0.67); m = 16
# 1.78 against 0.74 (0.77); m = 32 3.35 against 0.83 (0.84); m = 48 5.02 against 1.01 (1.05)
TN_MIN_ROWS_AMX = 8
# int8 rows against int8 keys on the AMX tiles (mk.tn_kernel_amx_i8): from 8 rows. Measured on the Intel VM of
# 2026-12-01 (int8 [m, 2048] @ [5632, 2048]^T through prism.optimize, 2 threads, the weight in L3, torch._int_mm
# (oneDNN) beside; tiles / without them): m = 4 nt 0.25 ms; m = 8 0.32 / 0.64 (oneDNN 0.66); 16 0.39 / 0.62 (0.87);
# 32 0.70 / 1.16 (1.13); 128 1.32 / 2.41 (1.54); 512 4.2 / 10.7 (4.8)
TN_MIN_ROWS_I8_AMX = 8


def on_tiles(isa: ISA, elems: tuple[str, str], K: int | str) -> bool:
    """Whether emit_tn runs a product of row and key storage ``elems`` over ``K`` on the AMX tiles."""
    return tiles_take(elems, K, tile_bf16(isa), tile_int8(isa))


def tiles_take(elems: tuple[str, str], K: int | str, bf16_tiles: bool, int8_tiles: bool) -> bool:
    """:func:`on_tiles`' rule given whether the machine's tiles multiply bfloat16 and int8 (the code generator asks
    its ISA, the cost model its ``Machine``): bfloat16 rows against bfloat16 or int8 keys, or int8 against int8, over
    a K of whole tile steps."""
    if not isinstance(K, int):
        return False
    if elems == ("i8", "i8"):
        return int8_tiles and K % mk.TN_AMX_I8_K == 0
    return bf16_tiles and elems in (("bf16", "bf16"), ("bf16", "i8")) and K % mk.TN_AMX_K == 0


def tn_min_rows(elems: tuple[str, str], tiles: bool) -> int:
    """The rows from which a product of row and key storage ``elems`` takes the tn form (emit_tn), ``tiles``: on a
    path with the AMX tiles for that product (isa.tile_bf16 / isa.tile_int8; the cost model's ``Machine.tile_dot``
    / ``tile_idot``)."""
    if elems == ("i8", "i8"):
        return TN_MIN_ROWS_I8_AMX if tiles else TN_MIN_ROWS_I8_I8
    if elems in (("bf16", "bf16"), ("bf16", "i8")) and tiles:
        return TN_MIN_ROWS_AMX
    return TN_MIN_ROWS_I8 if elems == ("bf16", "i8") else TN_MIN_ROWS

# K chunk = B rows per micro-kernel call (see emit_nn): 4 rows per C row, at least 8. Measured on W1
# (d=4096, one thread): n=1 best at 4-8 (sgemv-like streaming, C reloads are cheap), n=8/16 at 32
# (C reloads cost: 16 rows was 8 % slower, 64 rows 10 % slower).


@dataclass
class Support:
    """Helper C functions (micro-kernels) a source needs, each emitted once, in first-use order."""

    isa: ISA
    funcs: dict[str, str] = field(default_factory=dict)

    def need(self, name: str, text: str) -> str:
        self.funcs.setdefault(name, text)
        return name

    def nn(self, mr: int, nv: int, tail: int | str, blocked: bool = False, elems: tuple[str, str] = mk.F32) -> str:
        """The nn micro-kernel; ``blocked`` for calls whose K may exceed ``mk.ACC_CHUNK``; ``elems``: the
        storage of A and B; ``tail`` mk.RT_TAIL: the panel's column count is the call's last argument."""
        mr, nv = concrete(mr), concrete(nv)   # they shape the micro-kernel's text
        if tail != mk.RT_TAIL:
            tail = concrete(tail)
        return self.need(mk.nn_name(self.isa, mr, nv, tail, blocked, elems),
                         mk.nn_kernel(self.isa, mr, nv, tail, blocked, elems))

    def nt(self, r: int, j: int, elems: tuple[str, str] = mk.F32, prefetch: bool = True) -> str:
        r, j = concrete(r), concrete(j)   # they shape the micro-kernel's text
        if self.isa.vector and r * j > 1:
            self.need(*mk.nt_helpers(self.isa))
        return self.need(mk.nt_name(self.isa, r, j, elems, prefetch), mk.nt_kernel(self.isa, r, j, elems, prefetch))

    def text(self) -> str:
        return "\n".join(self.funcs.values())


# Templates (codegen/template.py) serve every value of a dim in a guard region with one text, but the row groups of an
# nn product are balanced (ceil(M / ceil(M / MR)) rows each, + a remainder), so the micro-kernels' row counts --
# part of the text -- change with M: a prefill's attention compiled and checked a template per 8 prompt lengths
# (llama-small bf16: 1.1-1.5 s of a new length's 1.2-1.6 s, once every other piece was served). Under
# ``loops.rows_vary()`` a product of at least 2 * MR rows takes groups of MR rows and its remainder (< MR rows) in runs
# of 4, 2 and 1 chosen at run time by the remainder's bits: one text for every such M, 3 more micro-kernels (and
# at any M where B is small: SMALL_B).
REM_RUNS = (4, 2, 1)   # the remainder's runs (rows), each taken where its bit of the remainder is set
# In a template, an nn product whose B has at most this many elements (in L2: re-read per remainder run at little
# cost) takes the bits plan at any row count, not only from 2 * MR rows: the causal prefill attention's P @ V below
# 32 query rows was a kernel per prompt length (llama-1b's dumped attention over lengths 2-70: 16 per-length kernels
# and 2 templates -> 3 and 7). A weight product (B of millions of elements) keeps the balanced plan below 2 * MR:
# each remainder run would stream the weights again.
SMALL_B = 1 << 16


# Likewise the columns: the last panel's vector count and its last vector's lanes were part of the text, so a
# template of a product whose N varies (the float32 causal prefill attention's scores, Q @ K^T packed as nn with N
# the prompt length) held for one N only: llama-1b float32 compiled and checked an attention kernel per new prompt
# length (0.5-0.7 s each). In a template (``cols_vary``; every nn product, as plain generation at a value of the
# region cannot tell a fixed N from a varying one) the panels are ``nv_max`` vectors wide and the last one's
# rc = N % pw columns run through the nv-vector micro-kernel that takes its column count as an argument
# (mk.RT_TAIL: per-vector masks; vectors past rc compute on zeros). One such kernel per row count, where runs of
# 2^i vectors and a one-vector tail took three: the attention template's gcc time grew by 0.3 s with them. For
# llama's weights the calls are the balanced plan's, but the last panel computes up to nv - 1 spare vectors (under
# 1 % of the columns for N >= 2048; P @ V over a head dim of 128: 144 columns for 128).


@dataclass(frozen=True)
class NNPlan:
    """How an M x N (x K) product is cut: row groups of ``mr`` (+ a remainder group of ``mr_rem``),
    full panels of ``pw`` columns (``nv`` vectors) (+ a last panel of ``nv_last`` vectors, ``tail``
    lanes in its last vector), and K chunks of ``kc``. ``cols_vary``: the last panel's ``rc`` columns are
    cut at run time (``_last_panel``), ``nv_last`` and ``tail`` unused."""

    mr: int
    nfull: int
    mr_rem: int
    nv: int
    pw: int
    npanels: int
    nv_last: int
    tail: int
    rc: int
    kc: int
    bits: bool = False   # the remainder group in runs of REM_RUNS by its bits at run time (rows_vary)
    cols_vary: bool = False

    def panel_tasks(self) -> int:
        """Panels, the last partial one included (always counted where the columns vary)."""
        return self.npanels + 1 if self.cols_vary else self.npanels + (1 if self.rc else 0)


def plan_nn(isa: ISA, M: int, N: int, K: int) -> NNPlan:
    W = mk.lanes(isa)
    # only where M varies (a row count fixed in the template keeps its balanced plan: one text at every value);
    # the test as one guard of the two (traced.any_of): as an ``or`` it recorded K * N <= SMALL_B (a prompt's length
    # up to 512 in the prefill attention's P @ V) or M >= 2 * MR, whichever it evaluated, as a region boundary
    bits = varying() and varies(M) and any_of(lambda: M >= 2 * mk.MR_MAX[isa.name], lambda: K * N <= SMALL_B)
    if bits:
        mr = mk.MR_MAX[isa.name]
        nfull = M // mr
        mr_rem = M - nfull * mr
    else:
        ngroups = -(-M // mk.MR_MAX[isa.name])
        mr = -(-M // ngroups)
        nfull, mr_rem = divmod(M, mr)
    nvmax = mk.nv_max(isa, mr)
    # in a template the chunk is not cut to K: K <= chunk was a region boundary of its own (the prefill attention's
    # P @ V over a prompt's length: a new template at 33 tokens after 24, 1.4 s of gcc); emit_nn and _grouped
    # then always write the chunk loop, which runs once where K fits a chunk
    kc = max(8, 4 * mr) if varying() else min(K, max(8, 4 * mr))
    assert kc <= mk.ACC_CHUNK, "the K-chunk calls use the unblocked micro-kernel"
    if varying():   # plain generation at a value of a template's region must print the same: at every N
        pw = nvmax * W
        npanels, rc = divmod(N, pw)
        return NNPlan(mr, nfull, mr_rem, nvmax, pw, npanels, 0, 0, rc, kc, bits, cols_vary=True)
    nvec = -(-N // W)
    npan = -(-nvec // nvmax)
    nv = -(-nvec // npan)
    pw = nv * W
    npanels, rc = divmod(N, pw)
    nv_last, tail = (-(-rc // W), rc % W) if rc else (0, 0)
    return NNPlan(mr, nfull, mr_rem, nv, pw, npanels, nv_last, tail, rc, kc, bits)


def _last_panel(w: CWriter, nm: Namer, p: NNPlan, j0: str, panel: Callable[[str, int, int | str, str], None]) -> None:
    """A ``cols_vary`` plan's last panel, its ``p.rc`` columns (0 <= rc < pw) from column ``j0``: one call of the
    nv-vector micro-kernel that takes its column count as an argument (mk.RT_TAIL), where rc > 0.
    ``panel(j0, nv, tail, tn)`` emits the calls over the rows (``tn``: the run-time column count)."""
    rc = nm("rc")
    w.line(f"const long {rc} = {p.rc};")
    with w.block(f"if ({rc})"):
        panel(j0, p.nv, mk.RT_TAIL, rc)


def _remainder_runs(w: CWriter, nm: Namer, p: NNPlan, call: Callable[[int, str], None]) -> None:
    """The remainder group of a ``bits`` plan: a run of R rows (REM_RUNS) where R's bit of the remainder is set,
    after the runs of the higher bits."""
    rem = nm("rem")
    w.line(f"const long {rem} = {p.mr_rem};")
    for r in REM_RUNS:
        with w.block(f"if ({rem} & {r})"):
            call(r, f"{p.nfull * p.mr} + ({rem} & {(2 * REM_RUNS[0] - 2 * r)})")


def _nn_call(w: CWriter, fn: str, K: str | int, a: str, sa0: int, sa1: int, b: str, sb0: int, c: str, sc0: int,
             beta: str, cs: str, r0: str, ro: str, jo: str, tn: str) -> None:
    """One call of the nn micro-kernel ``fn`` on the rows from ``r0`` (``ro``: as printed in an offset) and the
    columns from ``jo``; ``tn``: the run-time column count of an mk.RT_TAIL kernel, else ""."""
    csr = "0" if cs == "0" else f"{cs} + {r0}"
    w.line(f"{fn}({K}, {a} + {ro} * {sa0}, {sa0}, {sa1}, {b} + {jo}, {sb0}, {c} + {ro} * {sc0} + {jo}, "
           f"{sc0}, {beta}, {csr}" + (f", {tn});" if tn else ");"))


def _nn_calls(w: CWriter, sup: Support, p: NNPlan, j0: str, nv: int, tail: int | str, K: str, a: str, sa0: int,
              sa1: int, b: str, sb0: int, c: str, sc0: int, beta: str, cs: str, nm: Namer,
              elems: tuple[str, str], tn: str = "") -> None:
    """The calls for one panel starting at column ``j0``, over all row groups (``tn``: the panel's run-time column
    count, where ``tail`` is mk.RT_TAIL)."""
    def call(mr: int, r0: str) -> None:
        _nn_call(w, sup.nn(mr, nv, tail, elems=elems), K, a, sa0, sa1, b, sb0, c, sc0, beta, cs, r0, f"({r0})", j0, tn)
    if not p.bits and p.nfull == 1:
        call(p.mr, "0")
    elif p.bits or p.nfull > 1:
        g = nm("g")
        with w.block(f"for (long {g} = 0; {g} < {p.nfull}; {g}++)"):
            call(p.mr, f"{g} * {p.mr}")
    if p.bits:
        _remainder_runs(w, nm, p, call)
    elif p.mr_rem:
        call(p.mr_rem, str(p.nfull * p.mr))


Scratch = Callable[[int], str]  # floats -> C pointer expression to that many floats of this thread's scratch


def parallel_nn(p: NNPlan, M: int, N: int, K: int, par: str | None) -> bool:
    """Whether a kernel-level nn product runs as one task per (row group, panel), each over the whole K."""
    return bool(par) and M * N * K >= PAR_MIN * 4 and (p.bits or p.panel_tasks() * (p.nfull + bool(p.mr_rem)) > 1)


def emit_nn(w: CWriter, nm: Namer, sup: Support, M: int, N: int, K: int, a: str, sa0: int, sa1: int, b: str,
            sb0: int, c: str, sc0: int, beta: str, cs: str = "0", par: str | None = None,
            elems: tuple[str, str] = mk.F32) -> None:
    p = plan_nn(sup.isa, M, N, K)
    if parallel_nn(p, M, N, K, par):
        _emit_nn_parallel(w, nm, sup, p, M, N, K, a, sa0, sa1, b, sb0, c, sc0, beta, cs, par, elems)
        return
    if not varying() and p.kc >= K:
        _nn_panels(w, nm, sup, p, str(K), a, sa0, sa1, b, sb0, c, sc0, beta, cs, elems)
        return
    # K chunks outermost: every B row of a chunk is read across all panels within a short time, so
    # the DRAM stream of a weight strip stays sequential per row (and row groups reuse it from L1)
    kv, kn = nm("kc"), nm("kn")
    with w.block(f"for (long {kv} = 0; {kv} < {K}; {kv} += {p.kc})"):
        w.line(f"const long {kn} = pr_minl({p.kc}, {K} - {kv});")
        _nn_panels(w, nm, sup, p, kn, f"({a} + {kv} * {sa1})", sa0, sa1, f"({b} + {kv} * {sb0})", sb0, c, sc0,
                   f"({kv} == 0 ? {beta} : 1)", cs, elems)


def _grouped(w: CWriter, nm: Namer, product: Callable[[str, str, str, str], None], M: int, N: int, K: int,
             kr: int, grp: int, c: str, sc0: int, pbuf: str | None, beta: str, it: str, F: int,
             chunk_loop: bool = False) -> None:
    """The sum over ``F`` iterations (of ``it``) of K rows each, cut into calls of ``kr`` rows (call ``gc``
    of ``F * nch``) whose sums are added in groups of ``grp`` calls: group 0 into C, each later group into
    ``pbuf`` (C's layout), which is then added into C once. ``pbuf`` None: there is only group 0.
    ``product(kv, kn, target, beta)`` emits the calls for rows [kv, kv + kn) of this iteration. ``chunk_loop``: the
    loop over chunks is written even where K fits one (a template's nn product: K within one chunk is then no
    region boundary)."""
    nch = -(-K // kr)

    def body(kv: str, kn: str) -> None:
        if pbuf is None:
            product(kv, kn, c, f"({kv} == 0 ? {beta} : 1)" if kv != "0" else beta)
            return
        gc, tp, bt = nm("gc"), nm("T"), nm("bt")
        many = chunk_loop or nch > 1   # (chunk_loop first: comparing a traced nch would record a guard)
        terms = ([f"{it} * {nch}" if many else it] if F > 1 else []) + ([f"{kv} / {kr}"] if many else [])
        w.line(f"const long {gc} = {' + '.join(terms)};")
        w.line(f"float* {tp} = {gc} < {grp} ? {c} : {pbuf};")
        w.line(f"const int {bt} = {gc} % {grp} ? 1 : {gc} ? 0 : {beta};")
        product(kv, kn, tp, bt)
        with w.block(f"if ({gc} >= {grp} && ({gc} % {grp} == {grp - 1} || {gc} == {F * nch - 1}))"):
            assign(w, nm, View(c, (M, N), (sc0, 1)), View(pbuf, (M, N), (sc0, 1)), "+=")

    if not chunk_loop and nch == 1:   # (chunk_loop first: comparing a traced nch would record a guard)
        body("0", str(K))
        return
    kv, kn = nm("kc"), nm("kn")
    with w.block(f"for (long {kv} = 0; {kv} < {K}; {kv} += {kr})"):
        w.line(f"const long {kn} = pr_minl({kr}, {K} - {kv});")
        body(kv, kn)


def _nn_panels(w: CWriter, nm: Namer, sup: Support, p: NNPlan, K: str, a: str, sa0: int, sa1: int, b: str,
               sb0: int, c: str, sc0: int, beta: str, cs: str, elems: tuple[str, str]) -> None:
    """All panels (a C loop over the full ones, then the last partial one) for one K range."""
    if p.cols_vary:   # the panel loop always written, then the last panel at run time
        jv = nm("jp")
        with w.block(f"for (long {jv} = 0; {jv} < {p.npanels * p.pw}; {jv} += {p.pw})"):
            _nn_calls(w, sup, p, jv, p.nv, 0, K, a, sa0, sa1, b, sb0, c, sc0, beta, cs, nm, elems)
        _last_panel(w, nm, p, str(p.npanels * p.pw), lambda j0, nv, tail, tn: _nn_calls(
            w, sup, p, j0, nv, tail, K, a, sa0, sa1, b, sb0, c, sc0, beta, cs, nm, elems, tn))
        return
    if p.npanels == 1:
        _nn_calls(w, sup, p, "0", p.nv, 0, K, a, sa0, sa1, b, sb0, c, sc0, beta, cs, nm, elems)
    elif p.npanels > 1:
        jv = nm("jp")
        with w.block(f"for (long {jv} = 0; {jv} < {p.npanels * p.pw}; {jv} += {p.pw})"):
            _nn_calls(w, sup, p, jv, p.nv, 0, K, a, sa0, sa1, b, sb0, c, sc0, beta, cs, nm, elems)
    if p.rc:
        _nn_calls(w, sup, p, str(p.npanels * p.pw), p.nv_last, p.tail, K, a, sa0, sa1, b, sb0, c, sc0, beta, cs, nm,
                  elems)


def _emit_nn_parallel(w: CWriter, nm: Namer, sup: Support, p: NNPlan, M: int, N: int, K: int, a: str, sa0: int,
                      sa1: int, b: str, sb0: int, c: str, sc0: int, beta: str, cs: str, par: str,
                      elems: tuple[str, str]) -> None:
    """Kernel-level matmul: one task per (row group, panel), each over the whole K."""
    nrg = p.nfull + (1 if p.bits or p.mr_rem else 0)   # bits: the remainder's task may have no rows
    npn = p.panel_tasks()   # cols_vary: the last panel's task may have no columns
    tr, tp = nm("tr"), nm("tp")
    w.line(f"#pragma omp parallel for num_threads({par}) collapse(2) schedule(static)")
    with w.block(f"for (long {tr} = 0; {tr} < {nrg}; {tr}++)"):
        with w.block(f"for (long {tp} = 0; {tp} < {npn}; {tp}++)"):
            w.line(f"const long r0 = {tr} * {p.mr}, j0 = {tp} * {p.pw};")
            variants = []
            for rows_full in (True, False):
                if (rows_full and not p.nfull) or (not rows_full and not (p.bits or p.mr_rem)):
                    continue
                for pan_full in (True, False):
                    if (pan_full and not p.npanels) or (not pan_full and not (p.cols_vary or p.rc)):
                        continue
                    cond = " && ".join([f"{tr} {'<' if rows_full else '=='} {p.nfull}",
                                        f"{tp} {'<' if pan_full else '=='} {p.npanels}"])
                    variants.append((cond, rows_full, pan_full))
            for k, (cond, rows_full, pan_full) in enumerate(variants):
                def rows(j0: str, nv: int, tail: int | str, tn: str, rows_full: bool = rows_full) -> None:
                    def call(mr: int, r0: str) -> None:
                        _nn_call(w, sup.nn(mr, nv, tail, blocked=K > mk.ACC_CHUNK, elems=elems), K, a, sa0, sa1, b,
                                 sb0, c, sc0, beta, cs, r0, r0 if r0 == "r0" else f"({r0})",
                                 j0 if j0 == "j0" else f"({j0})", tn)
                    if p.bits and not rows_full:
                        _remainder_runs(w, nm, p, call)
                    else:
                        call(p.mr if rows_full else p.mr_rem, "r0")
                head = ("if" if k == 0 else "else if") + f" ({cond})"
                with w.block(head):
                    if pan_full:
                        rows("j0", p.nv, 0, "")
                    elif p.cols_vary:
                        _last_panel(w, nm, p, "j0", rows)
                    else:
                        rows("j0", p.nv_last, p.tail, "")


def _fold_shared_b(nest: Nest, M: int, sc0: int, sa0: int, foldable: bool) -> tuple[Nest, int, int, int]:
    """(the batch nest, M, C's and A's row strides) with the innermost batch dim folded into the rows where B is
    the same for every product along it (a Linear's weight under an input of rank 3: [B, S, K] @ W^T) and A's
    and C's rows run on at one stride across it: one product of B * S rows instead of B products that each
    stream the whole B. Measured need: llama-1b bf16 decode at batch 8 read its LM head's 131 MB once per
    sequence, 24.5 ms where the same 8 rows as one product took 4.6 (Zen 4, 2 threads)."""
    if not foldable or not nest.sizes or nest.strides[2][-1] != 0:
        return nest, M, sc0, sa0
    nb, scb, sab = nest.sizes[-1], nest.strides[0][-1], nest.strides[1][-1]
    if scb == 0:   # every product writes the same C: the rows would race
        return nest, M, sc0, sa0
    if M == 1:
        sc0, sa0 = scb, sab
    elif scb != M * sc0 or sab != M * sa0:
        return nest, M, sc0, sa0
    return Nest(nest.sizes[:-1], [s[:-1] for s in nest.strides]), M * nb, sc0, sa0


def emit_matmul(w: CWriter, nm: Namer, sup: Support, C: View, A: View, B: View, beta: str = "0",
                rowscale: View | None = None, par: str | None = None, scratch: Scratch | None = None,
                outer: tuple[str, int] | None = None, pack_nt: bool | None = None, allow_tn: bool = True) -> None:
    """C (beta) A @ B over views (C must have unit column stride). ``rowscale`` (beta 2) has C's rows.
    ``allow_tn=False``: never the tn path (a caller that runs many products against one A: tn packs A per call).
    ``pack_nt``: an nt product's packing of B decided by the caller (the two branches of a template's run-time
    choice), None: decided here.

    ``outer`` = (loop variable, trips): the product is one iteration of a loop whose products all add
    into C (a block graph's ``sum`` accumulator; ``beta`` is then the iteration's, e.g. ``(it > 0)``).
    ``scratch`` gives this thread's scratch for the group sums when K (times the trips) is long; it must
    stay the same across the loop's iterations."""
    M, N = C.shape[-2], C.shape[-1]
    K = A.shape[-1]
    if C.strides[-1] != 1 and N != 1:
        raise ValueError("matmul target must have unit column stride")
    if C.elem != "f32":
        raise ValueError(f"matmul target must be float (it accumulates), got {C.elem}")
    elems = (A.elem, B.elem)
    batch = C.shape[:-2]
    parts = [C, A, B] + ([rowscale] if rowscale is not None else [])
    bstr = [list(View(v.ptr, v.shape[:-2], v.strides[:-2]).bstrides(batch)) for v in parts]
    nest = make_nest(batch, bstr)
    sa0, sa1 = A.strides[-2], A.strides[-1]
    sb0, sb1 = B.strides[-2], B.strides[-1]
    sc0 = C.strides[-2]
    nest, M, sc0, sa0 = _fold_shared_b(nest, M, sc0, sa0, rowscale is None)
    vars_ = [nm("bi") for _ in nest.sizes]
    ptr = [f"{v.ptr} + {offset(vars_, s)}" if vars_ else v.ptr for v, s in zip(parts, nest.strides)]
    inner_par = par if not vars_ else None
    nt_ok = sa1 == 1 and (sb0 == 1 or K == 1)
    nn_ok = sb1 == 1 or N == 1
    path = "nn" if nn_ok and not (N == 1 and nt_ok) else "nt" if nt_ok else "generic"
    # an nt product with a short K and many rows (a Gram matrix, attention scores over a head dim): B's
    # [K, N] block transposed into scratch, then the nn kernel. An nt kernel ends each R x J tile with a
    # horizontal sum that a short K does not amortize: [256, 128] @ [128, 256] ran at 177 GFLOP/s as nt
    # and 210 as nn (2 threads, Zen 4); from K = 1024 on both reach ~220
    ldp = (N + 15) // 16 * 16 + 16  # the copy's row stride: not a power of two (its 16 stores per tile conflict)
    pack = (path == "nt" and scratch is not None and elems == mk.F32 and sup.isa.name == "avx512" and N > 1
            and K <= PACK_NT_MAX_K)
    if pack and pack_nt is None and varying() and (varies(M) or varies(N)) and not varies(K):
        # in a template whose rows or keys vary (the float32 prefill attention's Q @ K^T over a prompt's length) the
        # choice is taken at run time, both forms in the text: taken here it was two region boundaries (64 rows,
        # 497 keys), each a new template (gcc and its checks) when a prompt's length crossed it
        with w.block(f"if ({M} >= {PACK_NT_MIN_ROWS} && {K * ldp} <= {PACK_NT_MAX_FLOATS})"):
            emit_matmul(w, nm, sup, C, A, B, beta, rowscale, par, scratch, outer, pack_nt=True)
        with w.block("else"):
            emit_matmul(w, nm, sup, C, A, B, beta, rowscale, par, scratch, outer, pack_nt=False)
        return
    pack = pack and (pack_nt if pack_nt is not None else M >= PACK_NT_MIN_ROWS and K * ldp <= PACK_NT_MAX_FLOATS)
    b_src, sbt = None, sb1
    if pack:
        path, sb0, sb1 = "nn", ldp, 1
    # calls of kr rows of K each, their sums added in groups of grp calls (see _grouped): nn cuts K into
    # its chunks of kc rows (a kernel-level task takes the whole K; the micro-kernel groups inside);
    # nt into chunks of W * ACC_CHUNK (ACC_CHUNK products per vector lane), or, for few rows, one call
    # over the whole K that sums in levels itself; the generic loop sums in levels itself. Over an outer
    # loop every iteration adds its own calls.
    tn_ok = path == "nt" and (
        (elems[0] == "bf16" and elems[1] in ("bf16", "i8") and mk.nt_dot(sup.isa, ("bf16", "bf16"))
         and sa0 % 2 == 0 and K % 2 == 0)
        or (mk.nt_idot(sup.isa, elems) and sa0 % 4 == 0 and K % 4 == 0)
        or (set(elems) <= {"f32", "f16"} and sup.isa.name == "avx512"))
    tn = (allow_tn and tn_ok and scratch is not None and rowscale is None and (beta == "0" or outer is not None)
          and par is None and not vars_ and K >= TN_MIN_K and N >= mk.TN_RN
          and M >= tn_min_rows(elems, on_tiles(sup.isa, elems, K)))
    if tn:
        assert scratch is not None
        emit_tn(w, nm, sup, M, N, K, ptr[1], sa0, ptr[2], sb1, ptr[0], sc0, scratch, beta, elems=elems)
        return
    p = plan_nn(sup.isa, M, N, K) if path == "nn" else None
    whole_k = swap = False
    chunk_loop = False   # _grouped writes the K-chunk loop even where K fits one chunk
    if p is not None:
        whole = parallel_nn(p, M, N, K, inner_par)
        chunk_loop = varying() and not whole
        kr = K if whole else p.kc   # (plan_nn cuts kc to K outside a template)
        grp = max(1, mk.ACC_ROWS // kr)
    elif path == "nt":
        W = mk.lanes(sup.isa)
        # vector nt kernels sum any K in levels themselves: few rows (GEMV-like) take the whole K per
        # call, so each key row streams front to back (the chunked order read every key row in pieces of
        # W * ACC_CHUNK at the row stride: int8 4096 x 4096 in L3 1581 -> 633-692 us, f32 from DRAM 5123 ->
        # 2488-3116 us, 2 threads, AVX2 Zen host, docs/codegen.md); more rows keep K chunks whose key block
        # the row groups reuse from L1
        # a matrix-vector product written as W @ x (C one contiguous column, N = 1) is emitted as its
        # transpose x^T @ W^T: one row against M keys, the multi-key kernels instead of M single dot
        # products (the int8 W1 search's candidate q @ x^T ran every row through the 1x1 kernel)
        swap = N == 1 and M > 1 and sc0 == 1 and rowscale is None
        # (K first: a short K -- attention's scores over a head dim -- then decides without comparing the rows,
        # which in a template over a prompt's length was a region boundary at 4 x NT_WHOLE_K_ROWS query rows)
        whole_k = sup.isa.vector and K > W * mk.ACC_CHUNK and (1 if swap else M) <= NT_WHOLE_K_ROWS
        kr = K if whole_k else min(K, W * mk.ACC_CHUNK)
        grp = max(1, W * mk.ACC_ROWS // kr)
    else:
        kr, grp = K, max(1, mk.ACC_ROWS // K)
    it, F = outer if outer else ("0", 1)
    # a K that varies in a template (the prefill attention's P @ V over a prompt's length) sums its chunks in groups
    # at any K: more chunks than one group was a region boundary (a new template at 513 tokens after 128)
    grouped = (chunk_loop and varies(K) and scratch is not None) or -(-K // kr) * F > grp   # (chunk_loop: nn)
    pbase = ""
    # one scratch area: the packed B first, then the group sums (a template's branch: the most any packed B takes,
    # where K * ldp, growing with the keys, would reserve for key counts the branch never runs at)
    pack_n = (PACK_NT_MAX_FLOATS if pack_nt else K * ldp) if pack else 0
    if grouped:
        if scratch is None:
            raise ValueError("a matmul with a long K needs scratch for its group sums")
        if outer and vars_:  # every product's group sum lives across the loop's iterations
            pbase = scratch(pack_n + 1 + sum((n - 1) * s for n, s in zip(C.shape, C.strides)))
        else:
            pbase = scratch(pack_n + (M - 1) * sc0 + N)
        b_src = pbase
        if pack:
            pbase = f"({pbase} + {pack_n})"
    elif pack:
        assert scratch is not None
        b_src = scratch(pack_n)
    cs = "0"
    opened = 0
    if par and vars_ and math.prod(nest.sizes) * M * N * K >= PAR_MIN * 4:  # kernel level: a task per product
        w.line(f"#pragma omp parallel for num_threads({par}) schedule(static)"
               + (f" collapse({len(vars_)})" if len(vars_) > 1 else ""))
    for v, n in zip(vars_, nest.sizes):
        w.line(f"for (long {v} = 0; {v} < {n}; {v}++) {{")
        w.level += 1
        opened += 1
    cp, ap, bp = nm("C"), nm("A"), nm("B")
    w.line(f"float* {cp} = {ptr[0]};")
    w.line(f"const {ctype(A.elem)}* {ap} = {ptr[1]};")
    w.line(f"const {ctype(B.elem)}* {bp} = {ptr[2]};")
    if rowscale is not None:
        cs = nm("cs")
        w.line(f"const float* {cs} = {ptr[3]};")
    if pack:  # B's block [K, N] (read at unit K stride, row stride sbt) as a row-major copy of row stride ldp
        pk = nm("Bp")
        w.line(f"float* {pk} = {b_src};")
        _emit_transpose(w, nm, sup, bp, sbt, pk, ldp, N, K)
        bp = pk

    def product(kv: str, kn: str, c: str, bt: str) -> None:
        """The calls for K rows [kv, kv + kn) into ``c``."""
        off = (lambda ptr, stride: f"({ptr} + {kv} * {stride})" if stride != 1 else f"({ptr} + {kv})") \
            if kv != "0" else (lambda ptr, stride: ptr)
        if p is not None:
            _nn_panels(w, nm, sup, p, kn, off(ap, sa1), sa0, sa1, off(bp, sb0), sb0, c, sc0, bt, cs, elems)
        elif path == "nt" and swap:  # C [M, 1] = (x^T @ A^T)^T: x = B's one column, A's rows the keys
            emit_nt(w, nm, sup, 1, M, kn, off(bp, 1), sb1, off(ap, 1), sa0, c, 1, bt, cs, elems[::-1],
                    prefetch=mk.nt_prefetch(sup.isa, elems[::-1], whole_k, K, sa0),
                    single_keys=mk.nt_single_keys(sup.isa, elems[::-1], whole_k, K), first_prefetches=not whole_k)
        elif path == "nt":
            emit_nt(w, nm, sup, M, N, kn, off(ap, 1), sa0, off(bp, 1), sb1, c, sc0, bt, cs, elems,
                    prefetch=mk.nt_prefetch(sup.isa, elems, whole_k, K, sb1),
                    single_keys=mk.nt_single_keys(sup.isa, elems, whole_k, K), first_prefetches=not whole_k)
        else:
            _generic(w, nm, M, N, K, ap, sa0, sa1, bp, sb0, sb1, c, sc0, bt, cs, elems)

    if path == "nn" and not grouped:
        emit_nn(w, nm, sup, M, N, K, ap, sa0, sa1, bp, sb0, cp, sc0, beta, cs, inner_par, elems)
    else:
        pp = None
        if grouped:
            pp = nm("P")
            w.line(f"float* {pp} = {pbase}" + (f" + {offset(vars_, nest.strides[0])};" if outer and vars_ else ";"))
        _grouped(w, nm, product, M, N, K, kr, grp, cp, sc0, pp, beta, it, F, chunk_loop)
    for _ in range(opened):
        w.level -= 1
        w.line("}")


# dst[k * ds + n] = src[n * ss + k] for n, k < 16: 16 loads, four rounds of shuffles, 16 stores. Measured on
# Zen 4 (one thread, [256, 128] -> [128, 256]): 3.5 µs with a padded destination stride, 7.5 with stride 256,
# 39 for the plain loop gcc vectorizes
TR16_AVX512 = """PR_INLINE void pr_tr16(const float* restrict src, long ss, float* restrict dst, long ds) {
  __m512 r[16], t[16];
  #pragma GCC unroll 16
  for (int i = 0; i < 16; i++) r[i] = _mm512_loadu_ps(src + i * ss);
  #pragma GCC unroll 8
  for (int i = 0; i < 8; i++) {
    t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
  }
  #pragma GCC unroll 4
  for (int i = 0; i < 4; i++) {
    r[4 * i] = _mm512_shuffle_ps(t[4 * i], t[4 * i + 2], 0x44);
    r[4 * i + 1] = _mm512_shuffle_ps(t[4 * i], t[4 * i + 2], 0xEE);
    r[4 * i + 2] = _mm512_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0x44);
    r[4 * i + 3] = _mm512_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0xEE);
  }
  #pragma GCC unroll 4
  for (int i = 0; i < 4; i++) {
    t[i] = _mm512_shuffle_f32x4(r[i], r[4 + i], 0x88);
    t[4 + i] = _mm512_shuffle_f32x4(r[i], r[4 + i], 0xDD);
    t[8 + i] = _mm512_shuffle_f32x4(r[8 + i], r[12 + i], 0x88);
    t[12 + i] = _mm512_shuffle_f32x4(r[8 + i], r[12 + i], 0xDD);
  }
  #pragma GCC unroll 4
  for (int i = 0; i < 4; i++) {
    r[i] = _mm512_shuffle_f32x4(t[i], t[8 + i], 0x88);
    r[8 + i] = _mm512_shuffle_f32x4(t[i], t[8 + i], 0xDD);
    r[4 + i] = _mm512_shuffle_f32x4(t[4 + i], t[12 + i], 0x88);
    r[12 + i] = _mm512_shuffle_f32x4(t[4 + i], t[12 + i], 0xDD);
  }
  #pragma GCC unroll 16
  for (int i = 0; i < 16; i++) _mm512_storeu_ps(dst + i * ds, r[i]);
}
"""


# pr_tr16 adding into its destination (dst[k * ds + n] += src[n * ss + k])
_TR16_STORE = "_mm512_storeu_ps(dst + i * ds, r[i]);"
assert _TR16_STORE in TR16_AVX512
TR16_ADD_AVX512 = TR16_AVX512.replace("pr_tr16(", "pr_tr16_add(").replace(
    _TR16_STORE, "_mm512_storeu_ps(dst + i * ds, _mm512_add_ps(_mm512_loadu_ps(dst + i * ds), r[i]));")


# pr_tr16 reading float16 (converted to float32 as it loads): a float16 operand of the tn path (emit_tn)
_TR16_LOAD = "r[i] = _mm512_loadu_ps(src + i * ss);"
assert _TR16_LOAD in TR16_AVX512
TR16_F16_AVX512 = TR16_AVX512.replace("pr_tr16(const float*", "pr_tr16_f16(const uint16_t*").replace(
    _TR16_LOAD, "r[i] = pr_v16_f16(src + i * ss);")


def _emit_transpose(w: CWriter, nm: Namer, sup: Support, src: str, ss: int, dst: str, ds: int, N: int, K: int,
                    add: bool = False, elem: str = "f32") -> None:
    """dst[k * ds + n] = src[n * ss + k] (``add``: +=) for n < N, k < K (32-bit elements, or float16 ``src``
    converted to float32): 16 x 16 tiles in registers, the edges by loops. The loops' bounds are only printed,
    never tested here: in a template (codegen/template.py) the edge loops of every count are in the text (a
    zero-trip loop where the count has no edge), so no residue of N or K modulo 16 is a guard of its own."""
    assert elem == "f32" or not add
    fn = (sup.need("pr_tr16_add", TR16_ADD_AVX512) if add else sup.need("pr_tr16", TR16_AVX512) if elem == "f32"
          else sup.need("pr_tr16_f16", TR16_F16_AVX512))
    op = "+=" if add else "="
    n16, k16 = N // 16 * 16, K // 16 * 16
    n_, k_ = nm("n"), nm("k")
    with w.block(f"for (long {n_} = 0; {n_} < {n16}; {n_} += 16)"):
        with w.block(f"for (long {k_} = 0; {k_} < {k16}; {k_} += 16)"):
            w.line(f"{fn}({src} + {n_} * {ss} + {k_}, {ss}, {dst} + {k_} * {ds} + {n_}, {ds});")
        with w.block(f"for (long {k_} = {k16}; {k_} < {K}; {k_}++)"):
            with w.block("for (long i_ = 0; i_ < 16; i_++)"):
                w.line(f"{dst}[{k_} * {ds} + {n_} + i_] {op} {ld(elem, f'{src}[({n_} + i_) * {ss} + {k_}]')};")
    with w.block(f"for (long {n_} = {n16}; {n_} < {N}; {n_}++)"):
        with w.block(f"for (long {k_} = 0; {k_} < {K}; {k_}++)"):
            w.line(f"{dst}[{k_} * {ds} + {n_}] {op} {ld(elem, f'{src}[{n_} * {ss} + {k_}]')};")


@dataclass(frozen=True)
class GroupScales:
    """A grouped product's one factor for emit_tn: key j's scale of group c at ``ptr[j * per_key + c * per_group]``
    (float32, bfloat16 or float16 ``elem``), one per ``size`` values of K."""

    ptr: str
    per_key: int
    per_group: int
    size: int
    elem: str


def emit_tn(w: CWriter, nm: Namer, sup: Support, M: int, N: int, K: int, a: str, sa0: int, bt: str, sbt: int,
            c: str, sc0: int, scratch: Scratch, beta: str = "0", elems: tuple[str, str] = ("bf16", "bf16"),
            groups: GroupScales | None = None) -> None:
    """C[M x N] = A @ Bt^T for A and Bt (keys contiguous in K) of storage ``elems``, as the transposed product
    C^T = Bt @ A^T: per group of ``mk.ACC_ROWS`` of K, A's rows are packed (a 16 x 16 register transpose,
    ``pr_tr16``) into the thread's scratch ``Xp``; every block of RN keys broadcasts its elements
    against MV vectors of 16 packed rows (``mk.tn_shape``), each lane one output, into ``Ct [N][ldm]``; at the end Ct is
    transposed into C. bfloat16 (``vdpbf16ps``, :func:`mk.tn_kernel`): A packed in k pairs, ``Xp [K / 2][ldm]``,
    the keys' pairs broadcast as they are; int8 keys (int8 weight-only on a bfloat16 model) are first converted
    into a bfloat16 panel of the scratch (exact: every int8 is a bfloat16; [128, 2048] x int8 [5632, 2048]^T, 2
    threads, Zen 4: 16.6 ms in the nt kernels, 7.5 ms so, as the bfloat16 weight's). float32 and float16, in any
    pairing (FMA, :func:`mk.tn_kernel_f32`): ``Xp [K][ldm]`` in float32 (float16 rows converted as they are
    transposed); a float16 weight's block of keys is converted into a float32 panel of the scratch before its
    broadcasts (float32 rows with int8 keys stay nt: the same product there with a float32 panel, 14.9 ms against
    13.8-14.4 in nt, both at the FMA peak). The nt kernels end every tile with a
    transpose-and-add of 16 accumulators and call per K chunk; this form has no reduction in the loop, and float16's
    nt kernel converted both operands at every use. The packing (one 16 x 16 transpose per 16 rows x 16 k) and the final
    transposition are estimated at ~2 % of a Linear's prefill product (not measured apart). ldm rounds M up to the
    kernel's 16 * MV rows: the packed rows past M are stale, and so are the Ct columns they give, which are
    never read (each lane is its own output). The summation order is the nt kernels': ACC_CHUNK products per lane
    from zero, ACC_GROUP chunks into a group sum, groups into C (here Ct). ``beta`` (0, or the iteration's of a
    block's for-loop that accumulates the product, with each iteration's part of K): C = Ct^T, or C += Ct^T where
    it is non-zero. ``groups``: a grouped product's scales (bfloat16 rows, int8 keys; emit_grouped), each group of
    ``groups.size`` products per lane summed from zero and multiplied by its key's scale (mk.tn_kernel_grouped).
    Measured: docs/codegen.md, "tn"."""
    RN, MV = mk.tn_shape(elems[1], elems[0]) if groups is None else mk.TN_GROUPED_SHAPE
    # bfloat16 rows against bfloat16 keys, or int8 keys converted into a bfloat16 panel: on the AMX tiles where the
    # machine has them and every group of K is whole tile steps (mk.tn_kernel_amx: one call per block of keys and
    # chunk of rows, the keys and rows past a whole block at run time)
    amx = (elems[0] == "bf16" and on_tiles(sup.isa, elems, K)
           and (groups is None or (elems[1] == "i8" and groups.size % mk.TN_AMX_K == 0)))
    # int8 rows against int8 keys (W8A8): on the AMX tiles where the machine has them and K is whole int8 tile steps
    # (mk.tn_kernel_amx_i8: tdpbssd, the rows packed as they are, no sign flip)
    amx_i8 = elems == ("i8", "i8") and groups is None and on_tiles(sup.isa, elems, K)
    if amx or amx_i8:
        RN, MV = mk.TN_AMX_RN, 2
    # float32 rows and scales of at most 16 significant bits (float16, bfloat16): q * s is exact in float32, so the
    # panel holds the dequantized keys and the plain float32 kernel runs over them (no per-group sums: 1 FMA and a
    # setzero per accumulator and group fewer). The grouped sum reassociated, as every float32 product is.
    scaled = (not amx and groups is not None and elems[0] == "f32" and groups.elem in ("f16", "bf16")
              and groups.size % 16 == 0
              and os.environ.get("PRISM_TN_SCALED_PANEL", "").strip() != "0")
    if groups is not None:
        assert elems in (("bf16", "i8"), ("f32", "i8")) and mk.ACC_ROWS % groups.size == 0
        assert elems[0] == "f32" or groups.size % 2 == 0
        assert not isinstance(K, int) or K % groups.size == 0
    mt = 16 * MV
    ldm = (M + mt - 1) // mt * mt
    rows16 = (M + 15) // 16 * 16   # (amx: the rows a call runs, in vectors of 16)
    mc_rows = mk.tn_amx_rows() if amx or amx_i8 else mk.TN_MC
    G = mk.TN_AMX_I8_KMAX if amx_i8 else mk.ACC_ROWS
    pairs = elems[0] == "bf16"
    quads = elems == ("i8", "i8")   # int8 x int8: A packed in k quads, vpdpbusd (mk.tn_kernel_i8)
    xp_n = (min(K, G) // 2 if pairs else min(K, G) // 4 if quads else min(K, G)) * ldm
    # the panel of a block's keys converted (float32 floats; bfloat16 pairs: half as many floats)
    panel = (RN * min(K, G) // (2 if pairs else 1)) if elems[1] in ("f16", "i8") and not quads and not amx else 0
    base = scratch(xp_n + N * ldm + panel)
    xp, ct = nm("Xp"), nm("Ct")
    w.line(f"float* {xp} = {base};")
    w.line(f"float* {ct} = {base} + {xp_n};")
    bf = ""
    if panel:
        bf = nm("Bf")
        w.line(f"{'uint16_t' if pairs else 'float'}* {bf} = ({'uint16_t' if pairs else 'float'}*)({base} + "
               f"{xp_n + N * ldm});")
    n_full = N // RN * RN
    rn_tail = N - n_full
    esz = mk.ITEMSIZE[elems[1]]
    form = ("bf16_dp" if esz == 2 else f"bf16_dp_pf{esz}") if pairs else "i8_dp" if quads else f"f32_pf{esz}"

    def kernel(rn: int, mv: int = MV) -> str:
        if groups is not None and not scaled:
            return sup.need(mk.tn_grouped_name(rn, mv, groups.size, groups.elem, elems[0]),
                            mk.tn_kernel_grouped(sup.isa, rn, mv, groups.size, groups.elem, elems[0]))
        return sup.need(mk.tn_name(rn, mv, form), mk.tn_kernel(rn, mv, esz) if pairs else
                        mk.tn_kernel_i8(rn, mv) if quads else mk.tn_kernel_f32(rn, mv, esz))

    if amx_i8:
        sup.need("pr_tn_amx_head", mk.TN_AMX_HEAD)
        kern = tail = sup.need(mk.tn_amx_i8_name(G), mk.tn_kernel_amx_i8(G))
    elif amx:
        sup.need("pr_tn_amx_head", mk.TN_AMX_HEAD)
        # bfloat16 scales: q * s split exactly into two bfloat16 panels (mk.tn_kernel_amx_split, its own staging), no
        # per-group scaling of the tiles
        split = (groups is not None and groups.elem == "bf16"
                 and os.environ.get("PRISM_AMX_SPLIT", "").strip() != "0")
        if not split:
            sup.need(mk.tn_amx_stage_name(esz), mk.tn_amx_stage(esz))
        kern = tail = (sup.need(mk.tn_amx_name(esz), mk.tn_kernel_amx(esz)) if groups is None else
                       sup.need(mk.tn_amx_split_name(groups.size), mk.tn_kernel_amx_split(groups.size)) if split else
                       sup.need(mk.tn_amx_grouped_name(groups.size, groups.elem),
                                mk.tn_kernel_amx_grouped(sup.isa, groups.size, groups.elem)))
    else:
        kern = kernel(RN)
        tail = kernel(rn_tail) if rn_tail else ""
    # a last block of rows that fills v < MV of its vectors of 16 takes the kernel of v vectors (chosen at run time
    # where the rows vary: a template over a prompt's length, every v in its text). Measured on the Zen 4 VM, one
    # thread, int8 [m, 2048] @ [2048, 2048]^T, two alternations, with the kernel of MV / 2 vectors for a block at most
    # half full (int8 x int8 only, before 2026-11-30): m = 80 2.89-2.97 -> 2.28-2.45 ms, 96 2.82-2.97 -> 2.28-2.30;
    # at whole blocks (64, 128 rows) the text with the branch was 3-8 % slower in both alternations (not understood:
    # the path run is the same), so a fixed row count emits only the kernel it takes. Every form since: docs/codegen.md
    # ("tn"), "A last block of rows by its vectors"
    last_rows = None if varies(M) else M % mt   # the last block's rows where M is fixed
    lasts: list[int] = []   # the vectors of the last block's kernels below MV: every count where M varies
    if MV > 1 and not (amx or amx_i8) and os.environ.get("PRISM_TN_LAST", "").strip() != "0":
        if last_rows is None:
            lasts = list(range(1, MV))
        elif 0 < -(-last_rows // 16) < MV:
            lasts = [-(-last_rows // 16)]
    kern_l = {v: kernel(RN, v) for v in lasts}
    tail_l = {v: kernel(rn_tail, v) for v in lasts} if rn_tail else {}
    m_full = M // mt * mt   # rows in whole blocks
    if panel:
        cvt = (sup.need("pr_i8_bf16_panel", I8_BF16_PANEL) if pairs else
               sup.need(i8_f32_scaled_panel_name(groups.size, groups.elem),
                        i8_f32_scaled_panel(sup.isa, groups.size, groups.elem)) if scaled and groups else
               sup.need("pr_i8_f32_panel", I8_F32_PANEL) if elems[1] == "i8" else sup.need("pr_f16_panel", F16_PANEL))

    def keys(fn: str, rn: int, n0: str, nxt: str, g0: str, gn: int, m0: str, mc: str, beta: str,
             fn_l: dict[int, str]) -> None:
        """The calls of the rn keys from ``n0`` for the packed rows [mc, mc + TN_MC), prefetching rn keys from
        ``nxt`` (every one of them a key of B); ``fn_l``: the kernel of v vectors of rows by v, for a last block of
        rows that fills v of ``fn``'s vectors."""
        src = f"{bt} + {n0} * {sbt} + {g0}"
        pf = f"(const char*)({bt} + {nxt} * {sbt} + {g0})"
        key_scales = "" if groups is None else (
            f", {groups.ptr} + {n0} * {groups.per_key} + ({g0}) / {groups.size} * {groups.per_group}, "
            f"{groups.per_key}, {groups.per_group}")
        # the scales go into the panel (scaled: dequantized keys) or to the grouped kernel
        panel_scales, scales = (key_scales, "") if scaled else ("", key_scales)
        if panel:   # the block's keys as float32 or bfloat16 (rn rows of gn, row stride gn)
            w.line(f"{cvt}({src}, {sbt}, {bf}, {rn}, {gn}{panel_scales});")
            src, sb = bf, gn
        else:
            sb = sbt

        def call(f: str, at: str) -> None:
            w.line(f"{f}({gn}, {src}, {sb}, {pf}, {sbt * esz}, {xp} + {at}, {ldm}, {ct} + {n0} * {ldm} + {at}, "
                   f"{ldm}, {beta}{scales});")
        if amx or amx_i8:   # every row of the chunk in one call (rows a multiple of 16: the last block's past M)
            w.line(f"{fn}({gn}, {src}, {sb}, {pf}, {sbt * esz}, {xp} + {mc}, {ldm}, {ct} + {n0} * {ldm} + {mc}, "
                   f"{ldm}, {beta}, {rn}, pr_minl({rows16}, {mc} + {mc_rows}) - {mc}{scales});")
            return
        if not fn_l:
            with w.block(f"for (long {m0} = {mc}; {m0} < pr_minl({ldm}, {mc} + {mk.TN_MC}); {m0} += {mt})"):
                call(fn, m0)
            return
        with w.block(f"for (long {m0} = {mc}; {m0} < pr_minl({m_full}, {mc} + {mk.TN_MC}); {m0} += {mt})"):
            call(fn, m0)
        with w.block(f"if ({m_full} < {ldm} && {m_full} >= {mc} && {m_full} < {mc} + {mk.TN_MC})"):
            if last_rows is not None:   # a fixed row count: the one kernel its last block takes
                (v,) = fn_l
                call(fn_l[v], str(m_full))
                return
            # the rows of the last block: more than 16 (MV - 1) take fn, more than 16 (v - 1) the kernel of v vectors
            for i, v in enumerate(sorted(fn_l, reverse=True)):
                with w.block(("if" if i == 0 else "else if") + f" ({M} - {m_full} > {16 * v})"):
                    call(fn if i == 0 else fn_l[v + 1], str(m_full))
            with w.block("else"):
                call(fn_l[1], str(m_full))

    def group(g0: str, gn: int, beta: str) -> None:
        if pairs:
            _emit_transpose(w, nm, sup, f"((const float*)({a} + {g0}))", sa0 // 2, xp, ldm, M, gn // 2)
        elif quads:   # 4 int8 of a row as one 32-bit element, then (vpdpbusd) every byte's sign bit flipped (a + 128)
            _emit_transpose(w, nm, sup, f"((const float*)({a} + {g0}))", sa0 // 4, xp, ldm, M, gn // 4)
            if not amx_i8:   # (tdpbssd: signed bytes on both sides)
                q = nm("q")
                with w.block(f"for (long {q} = 0; {q} < {gn // 4 * ldm}; {q}++)"):
                    w.line(f"((uint32_t*){xp})[{q}] ^= 0x80808080u;")
        else:
            _emit_transpose(w, nm, sup, f"({a} + {g0})", sa0, xp, ldm, M, gn, elem=elems[0])
        # packed rows in chunks of TN_MC, every block of keys against a chunk's row vectors: a key block is read
        # from memory once per chunk (the chunk's packed rows stay in L2), prefetched one block ahead
        n0, m0, mc = nm("n"), nm("m"), nm("mc")
        with w.block(f"for (long {mc} = 0; {mc} < {ldm}; {mc} += {mc_rows})"):
            with w.block(f"for (long {n0} = 0; {n0} < {n_full}; {n0} += {RN})"):
                # the next block's keys, the last RN keys of B at most: a full block ahead of the tail keys (or of
                # nothing) would prefetch past B's last key
                keys(kern, RN, n0, f"pr_minl({n0} + {RN}, {N - RN})", g0, gn, m0, mc, beta, kern_l)
            if rn_tail:
                keys(tail, rn_tail, str(n_full), str(n_full), g0, gn, m0, mc, beta, tail_l)

    full, rem = K // G, K % G
    if full:
        g0 = nm("g")
        with w.block(f"for (long {g0} = 0; {g0} < {full * G}; {g0} += {G})"):
            group(g0, G, f"({g0} > 0)")
    if rem:
        group(str(full * G), rem, "1" if full else "0")
    if beta == "0":
        _emit_transpose(w, nm, sup, ct, ldm, c, sc0, N, M)
        return
    with w.block(f"if ({beta})"):
        _emit_transpose(w, nm, sup, ct, ldm, c, sc0, N, M, add=True)
    with w.block("else"):
        _emit_transpose(w, nm, sup, ct, ldm, c, sc0, N, M)


# dst[r * n + k] = src[r * ss + k] for r < rows, k < n: a block of float16 keys as a float32 panel (emit_tn)
F16_PANEL = """PR_INLINE void pr_f16_panel(const uint16_t* restrict src, long ss, float* restrict dst, long rows,
                                long n) {
  for (long r = 0; r < rows; r++) {
    long k = 0;
    for (; k + 16 <= n; k += 16) _mm512_storeu_ps(dst + r * n + k, pr_v16_f16(src + r * ss + k));
    for (; k < n; k++) dst[r * n + k] = pr_ld_f16(src[r * ss + k]);
  }
}
"""

# a block of int8 keys as a float32 panel (a grouped product's float32 rows: emit_grouped)
I8_F32_PANEL = """PR_INLINE void pr_i8_f32_panel(const int8_t* restrict src, long ss, float* restrict dst, long rows,
                                   long n) {
  for (long r = 0; r < rows; r++) {
    long k = 0;
    for (; k + 16 <= n; k += 16)
      _mm512_storeu_ps(dst + r * n + k, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(
          _mm_loadu_si128((const __m128i*)(src + r * ss + k)))));
    for (; k < n; k++) dst[r * n + k] = (float)src[r * ss + k];
  }
}
"""

def i8_f32_scaled_panel_name(G: int, fel: str) -> str:
    return f"pr_i8_f32_panel_g{G}_s{fel}"


def i8_f32_scaled_panel(isa: ISA, G: int, fel: str) -> str:
    """dst[r * n + k] = src[r * ss + k] * S[r * ssr + k / G * ssg] for r < rows, k < n (a multiple of G): a block of
    int8 keys dequantized into a float32 panel (emit_tn, float32 rows; G a multiple of 16). Exact: an int8 times a
    scale of at most 16 significant bits (``fel`` float16 or bfloat16)."""
    f = mk._gdot_factor(isa, (fel,), "r * ssr + c * ssg", "S")
    return f"""PR_INLINE void {i8_f32_scaled_panel_name(G, fel)}(const int8_t* restrict src, long ss,
    float* restrict dst, long rows, long n, const {ctype(fel)}* restrict S, long ssr, long ssg) {{
  for (long r = 0; r < rows; r++)
    for (long c = 0; c < n / {G}; c++) {{
      const __m512 sc = _mm512_set1_ps({f});
      for (long k = c * {G}; k < c * {G} + {G}; k += 16)
        _mm512_storeu_ps(dst + r * n + k, _mm512_mul_ps(sc, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(
            _mm_loadu_si128((const __m128i*)(src + r * ss + k))))));
    }}
}}
"""


# a block of int8 keys (int8 weight-only on a bfloat16 model) as a bfloat16 panel for the vdpbf16ps kernels:
# exact (an int8 has at most 8 significant bits, bfloat16's precision), so the rounding conversion changes nothing
I8_BF16_PANEL = """PR_INLINE void pr_i8_bf16_panel(const int8_t* restrict src, long ss, uint16_t* restrict dst,
                                    long rows, long n) {
  for (long r = 0; r < rows; r++) {
    const int8_t* s = src + r * ss;
    uint16_t* d = dst + r * n;
    long k = 0;
    for (; k + 32 <= n; k += 32) {
      const __m512 lo = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i*)(s + k))));
      const __m512 hi = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i*)(s + k + 16))));
      _mm512_storeu_si512((void*)(d + k), (__m512i)_mm512_cvtne2ps_pbh(hi, lo));
    }
    for (; k < n; k++) { const float f = (float)s[k]; uint32_t u; memcpy(&u, &f, 4); d[k] = (uint16_t)(u >> 16); }
  }
}
"""


# In a template, from this many rows every row-group shape has its loop (nt_row_runs). 8 before 2026-11-29: a short
# prompt's Linear pieces (2-7 rows) were a kernel per length (llama-1b's dumped pieces: 7-8 each over 2-8 rows; now
# one template); decode attention's 4 query rows per KV head now write all three shapes (KV lengths 1000-2047 of
# the W6 shape: 99-101 µs against 100-102, docs/codegen.md)
NT_ALL_RUNS = 2


def _all_runs(M: int) -> bool:
    """Every row-group shape has its loop (a template's nt product of at least NT_ALL_RUNS rows)."""
    return varying() and M >= NT_ALL_RUNS


def nt_row_runs(isa: ISA, M: int, single_keys: int | None = None) -> dict[int, list[tuple[int, int, int]]]:
    """Per key-block width J, the runs of row groups as (first row, rows R, count): the widest R x J kernel
    first, as many of each as fit. Counted by division, not a loop over the groups, so that a traced M
    (codegen/template.py) keeps the counts as expressions (a loop per group would pin M). In a template
    (``rows_vary``) from NT_ALL_RUNS rows on, every shape has its run, of count 0 where M leaves it no rows: the
    text is one loop per shape for every such M -- one template for every prompt length, where choosing the
    runs by count made one per residue of M modulo the widest group (4 on AVX-512: a new prompt length of
    llama-small compiled and checked a template of each of 8 products per new residue, 2-4 s). Elsewhere (a
    tuned kernel, a single row) only the shapes that have rows: a zero-trip loop still costs its micro-kernel's
    compile, at every tuning candidate."""
    out: dict[int, list[tuple[int, int, int]]] = {}
    every = _all_runs(M)
    r0 = 0
    for R, J in mk.NT_SHAPES[isa.name]:
        if R == 1 and single_keys:   # the single-row kernel's key block (microkernels.nt_single_keys)
            J = single_keys
        count = (M - r0) // R
        if every or count > 0:
            out.setdefault(J, []).append((r0, R, count))
            r0 = r0 + count * R
    return out


def emit_nt(w: CWriter, nm: Namer, sup: Support, M: int, N: int, K: int | str, a: str, sa0: int, bt: str, sbt: int,
            c: str, sc0: int, beta: str, cs: str, elems: tuple[str, str] = mk.F32, prefetch: bool = True,
            single_keys: int | None = None, first_prefetches: bool = False) -> None:
    """C[M x N] (beta) A @ Bt^T, Bt rows (the keys) contiguous: for each block of J keys, every row group
    (the key block stays in L1 while the row groups use it); left-over keys one dot product at a time.
    ``prefetch``: the kernels prefetch the keys ahead (see microkernels.nt_kernel); ``first_prefetches``: only the
    first row group of each run does (calls over K chunks: below)."""
    def call(fn: str, jv: str, row: str, a_off: str, c_off: str) -> None:
        """One micro-kernel call for the rows starting at ``row`` (offsets precomputed where constant)."""
        csr = "0" if cs == "0" else f"{cs} + {row}"
        w.line(f"{fn}({K}, {a} + {a_off}, {sa0}, {bt} + {jv} * {sbt}, {sbt}, {c} + {c_off} + {jv}, {sc0}, {beta}, "
               f"{csr});")

    every = _all_runs(M)
    for J, runs in nt_row_runs(sup.isa, M, single_keys).items():
        nfull = N // J * J
        if varying() or nfull:   # a template writes the loop always (zero trips below J keys: loops.rows_vary)
            jv = nm("j")
            with w.block(f"for (long {jv} = 0; {jv} < {nfull}; {jv} += {J})"):
                for r0, R, count in runs:
                    fn = sup.nt(R, J, elems, prefetch)
                    if not every and count == 1:
                        call(fn, jv, str(r0), str(r0 * sa0), str(r0 * sc0))
                        continue
                    first = r0
                    if prefetch and first_prefetches and R * J > 1:
                        # over K chunks only a run's first row group prefetches the next keys: the later
                        # groups find this block's keys in L1, and their prefetches (one per key per line) only
                        # took load slots. bf16 [1024, 2048] x [5632, 2048]^T in 128 x 704 blocks, 2 threads,
                        # Zen 5: 687 -> 857 GFLOP/s (no prefetch at all: 861); keys from DRAM at 8-32 rows:
                        # 1.03-1.11x faster than every group prefetching, 1.2-1.5x than none. Calls over the
                        # whole K (at most NT_WHOLE_K_ROWS rows) keep every group's: llama-1b bf16 batch-8
                        # decode kernels took 24.5 ms per step against 22.2 with it (docs/codegen.md)
                        if every:
                            with w.block(f"if ({count} > 0)"):
                                call(fn, jv, str(r0), str(r0 * sa0), str(r0 * sc0))
                        else:
                            call(fn, jv, str(r0), str(r0 * sa0), str(r0 * sc0))
                        fn = sup.nt(R, J, elems, False)
                        first = r0 + R
                        if not every and count == 2:
                            call(fn, jv, str(first), str(first * sa0), str(first * sc0))
                            continue
                    # a loop, not one call per row group: 128 inlined calls of the always-inline kernel
                    # took gcc 5 s (W6 with 512-key tiles), the loop 0.4 s
                    rv = nm("r")
                    with w.block(f"for (long {rv} = {first}; {rv} < {r0 + count * R}; {rv} += {R})"):
                        call(fn, jv, rv, f"{rv} * {sa0}", f"{rv} * {sc0}")
        if varying() or nfull < N:   # a template writes the loop always (codegen/loops.py: rows_vary)
            fn = sup.nt(1, 1, elems, False)   # a few left-over keys: nothing to stream ahead of
            jv, rv = nm("j"), nm("r")
            r_lo = runs[0][0]
            r_hi = runs[-1][0] + runs[-1][1] * runs[-1][2]
            with w.block(f"for (long {jv} = {nfull}; {jv} < {N}; {jv}++)"):
                with w.block(f"for (long {rv} = {r_lo}; {rv} < {r_hi}; {rv}++)"):
                    call(fn, jv, rv, f"{rv} * {sa0}", f"{rv} * {sc0}")


def _generic(w: CWriter, nm: Namer, M: int, N: int, K: int, a: str, sa0: int, sa1: int, b: str, sb0: int, sb1: int,
             c: str, sc0: int, beta: str, cs: str, elems: tuple[str, str] = mk.F32) -> None:
    r, j, s = nm("r"), nm("j"), nm("s")
    ea, eb = elems
    with w.block(f"for (long {r} = 0; {r} < {M}; {r}++)"):
        with w.block(f"for (long {j} = 0; {j} < {N}; {j}++)"):
            term = f"{ld(ea, f'{a}[{r} * {sa0} + k * {sa1}]')} * {ld(eb, f'{b}[k * {sb0} + {j} * {sb1}]')}"
            for line in mk.blocked_sum(s, term, str(K)):
                w.line(line)
            cell = f"{c}[{r} * {sc0} + {j}]"
            csr = "1.0f" if cs == "0" else f"{cs}[{r}]"
            w.line(f"{cell} = ({beta}) == 0 ? {s} : ({beta}) == 1 ? {cell} + {s} : {cell} * {csr} + {s};")


# --- grouped products (int8 weights with a scale per group of K) ---------------------------------------------------
# At most this many rows take the grouped dot product per row and key (mk.gdot_kernel); more rows dequantize a
# block of keys into scratch and run the plain product against it (each weight converted once for all the rows).
GROUPED_DOT_ROWS = NT_WHOLE_K_ROWS
# Bytes of float32 keys one dequantized block holds (in L2 while the rows run against it)
GROUPED_BLOCK_BYTES = 256 * 1024


def grouped_tn_sizes(rows: str, G: int, K: int) -> bool:
    """Whether a grouped product of row storage ``rows``, groups of ``G`` and ``K`` values per key has the sizes
    the tn form's scaled groups take (``emit_grouped``; the cost model's rate, tune.cost._grouped_paired): whole
    groups in each ACC_ROWS call, k pairs for bfloat16 rows, K of at least TN_MIN_K."""
    return mk.ACC_ROWS % G == 0 and (rows != "bf16" or G % 2 == 0) and K >= TN_MIN_K


def grouped_block_keys(K: int, N: int) -> int:
    """Keys per dequantized block of a grouped product over ``N`` keys of ``K`` values (``emit_grouped``)."""
    return min(N, max(16, GROUPED_BLOCK_BYTES // (4 * K) // 16 * 16))


def grouped_form(C: View, A: View, B: View, factors: list[View]) -> bool:
    """Whether ``C = sum_g F[g] * (A[g] @ B[g])`` (A [Gn, M, G], B [Gn, G, N], each factor broadcast to
    [Gn, M, N] from [Gn, 1 or M, 1 or N]) has the layout ``emit_grouped`` takes: each row of A and each key of B
    (column of B) one contiguous run of Gn * G values (groups back to back, K contiguous), float factors, C
    [..., M, N] of unit column stride."""
    if len(A.shape) != 3 or len(B.shape) != 3 or not 1 <= len(factors) <= 2:
        return False
    Gn, M, G = A.shape
    N = B.shape[2]
    if B.shape[:2] != (Gn, G) or C.shape[-2:] != (M, N) or (C.strides[-1] != 1 and N != 1):
        return False
    if any(d != 1 for d in C.shape[:-2]):
        return False
    contiguous = A.strides[2] == 1 and B.strides[1] == 1 and (Gn == 1 or A.strides[0] == B.strides[0] == G)
    ok_factors = all(f.elem in ("f32", "f16", "bf16") and len(f.shape) == 3 and f.shape[0] == Gn
                     and f.shape[1] in (1, M) and f.shape[2] in (1, N) for f in factors)
    return contiguous and ok_factors


def emit_grouped(w: CWriter, nm: Namer, sup: Support, C: View, A: View, B: View, factors: list[View],
                 scratch: Scratch) -> None:
    """C[m, j] = sum_g (prod of the factors at g, m, j) * sum_k A[g, m, k] B[g, k, j] (``grouped_form``'s layout).

    The product of int8 weights [N, K] that have one scale per group of G values of K (``w = q * s[:, k // G]``)
    written as a sum of per-group products, which the search fuses into one block (docs/codegen.md, "Grouped
    products"). Up to GROUPED_DOT_ROWS rows: per key, each row's grouped dot product (mk.gdot_kernel; keys
    outermost, so each key's run streams once and the rows reuse it from L1). More rows, where no factor varies
    with the row: each block of keys dequantized (float32, its factors applied) into scratch and the plain product
    (emit_matmul, its nt kernels) run against it. Where the rows vary in a template, both, chosen at run time."""
    Gn, M, G = A.shape
    N = B.shape[2]
    sam, sbn = A.strides[1], B.strides[2]
    sc0 = C.strides[-2]
    fst = [f.bstrides((Gn, M, N)) for f in factors]   # per factor: (per group, per row, per key)
    row_free = all(s[1] == 0 for s in fst)

    def widened(bound: int) -> View:
        """A's rows (at most ``bound`` of them) widened to float32 once, into scratch: the grouped dot kernels then
        read float32 rows, where with bfloat16 / float16 rows they widened every row's values again for every key.
        Measured need (Intel VM, 2 threads, bfloat16 [1, 2048] x int8 g32 [5632, 2048]^T, the weight in L3): 650-735
        us against 340-465 for the same product with float32 rows (the kernels' work per key, not the weight's
        bytes, bounded the bfloat16 decode). Exact: every bfloat16 / float16 value is a float32."""
        K = concrete(Gn) * concrete(G)
        X, m, k = nm("Xf"), nm("m"), nm("k")
        w.line(f"float* {X} = {scratch(bound * K)};")
        with w.block(f"for (long {m} = 0; {m} < {M}; {m}++)"):
            w.line("#pragma omp simd")
            w.line(f"for (long {k} = 0; {k} < {K}; {k}++) {X}[{m} * {K} + {k}] = "
                   f"{ld(A.elem, f'{A.ptr}[{m} * {sam} + {k}]')};")
        return View(X, A.shape, (concrete(G), K, 1), "f32")

    def dots(A: View = A, bound: int | None = None) -> None:
        if bound is not None and A.elem in ("bf16", "f16") and not varies(G) and not varies(Gn):
            A = widened(bound)
        sam = A.strides[1]
        prefetch = sup.isa.name == "avx512"
        elems = (A.elem, B.elem)
        fel = tuple(f.elem for f in factors)
        one = sup.need(mk.gdot_name(sup.isa, G, elems, fel, prefetch), mk.gdot_kernel(sup.isa, G, elems, fel, prefetch))
        # runs of rows sharing each dequantized key (factors the same for every row), widest first
        runs = [R for R in mk.GDOT_ROWS if row_free and (varies(M) or M >= R)]
        TR, TJ = mk.GDOT_TILE
        tile = row_free and mk.gdot_lanes(sup.isa, G) > 1 and (varies(M) or M >= TR) and N >= TJ
        j, m = nm("j"), nm("m")

        def rows_of_key(jv: str) -> None:
            """The rows from ``m`` on against key ``jv``: runs of R rows, then one at a time."""
            for R in runs:
                fn = sup.need(mk.gdot_name(sup.isa, G, elems, fel, prefetch, R),
                              mk.gdot_kernel(sup.isa, G, elems, fel, prefetch, R))
                fs = ", ".join(f"{f.ptr} + {jv} * {s[2]}, {s[0]}" for f, s in zip(factors, fst))
                with w.block(f"for (; {m} + {R} <= {M}; {m} += {R})"):
                    w.line(f"{fn}({Gn}, {A.ptr} + {m} * {sam}, {sam}, {B.ptr} + {jv} * {sbn}, {fs}, "
                           f"{C.ptr} + {m} * {sc0} + {jv}, {sc0});")
            with w.block(f"for (; {m} < {M}; {m}++)"):
                fs = ", ".join(f"{f.ptr} + {m} * {s[1]} + {jv} * {s[2]}, {s[0]}" for f, s in zip(factors, fst))
                w.line(f"{C.ptr}[{m} * {sc0} + {jv}] = "
                       f"{one}({Gn}, {A.ptr} + {m} * {sam}, {B.ptr} + {jv} * {sbn}, {fs});")

        w.line(f"long {j} = 0;")
        if tile:   # TJ keys at a time: tiles of 8 rows x 2 keys (32 registers) and of TR rows, the rows left per key
            R8, J8 = mk.GDOT_TILE8
            tile8 = sup.isa.nregs >= 32 and (varies(M) or M >= R8) and TJ % J8 == 0
            fn = sup.need(mk.gdot_tile_name(sup.isa, G, elems, fel), mk.gdot_tile_kernel(sup.isa, G, elems, fel))
            fs = ", ".join(f"{f.ptr} + {j} * {s[2]}, {s[0]}, {s[2]}" for f, s in zip(factors, fst))
            with w.block(f"for (; {j} + {TJ} <= {N}; {j} += {TJ})"):
                w.line(f"long {m} = 0;")
                if tile8:
                    fn8 = sup.need(mk.gdot_tile_name(sup.isa, G, elems, fel, mk.GDOT_TILE8),
                                   mk.gdot_tile_kernel(sup.isa, G, elems, fel, mk.GDOT_TILE8))
                    with w.block(f"for (; {m} + {R8} <= {M}; {m} += {R8})"):
                        for j2 in range(0, TJ, J8):
                            fs8 = ", ".join(f"{f.ptr} + ({j} + {j2}) * {s[2]}, {s[0]}, {s[2]}"
                                            for f, s in zip(factors, fst))
                            w.line(f"{fn8}({Gn}, {A.ptr} + {m} * {sam}, {sam}, {B.ptr} + ({j} + {j2}) * {sbn}, "
                                   f"{sbn}, {fs8}, {C.ptr} + {m} * {sc0} + {j} + {j2}, {sc0});")
                with w.block(f"for (; {m} + {TR} <= {M}; {m} += {TR})"):
                    w.line(f"{fn}({Gn}, {A.ptr} + {m} * {sam}, {sam}, {B.ptr} + {j} * {sbn}, {sbn}, {fs}, "
                           f"{C.ptr} + {m} * {sc0} + {j}, {sc0});")
                m0, jj = nm("m0"), nm("jj")
                w.line(f"const long {m0} = {m};")
                with w.block(f"for (long {jj} = {j}; {jj} < {j} + {TJ}; {jj}++)"):
                    w.line(f"{m} = {m0};")
                    rows_of_key(jj)
        with w.block(f"for (; {j} < {N}; {j}++)"):
            w.line(f"long {m} = 0;")
            rows_of_key(j)

    def dequantized() -> None:
        K = concrete(Gn) * concrete(G)
        n_all = concrete(N)
        jb = grouped_block_keys(K, n_all)
        D = nm("D")
        w.line(f"float* {D} = {scratch(jb * K)};")
        rows = View(A.ptr, (M, K), (sam, 1), A.elem)

        def block(j0: str, jn: int) -> None:
            j, g, k = nm("j"), nm("g"), nm("k")
            with w.block(f"for (long {j} = 0; {j} < {jn}; {j}++)"):
                with w.block(f"for (long {g} = 0; {g} < {Gn}; {g}++)"):
                    fac = " * ".join(f.at(f"{g} * {s[0]} + ({j0} + {j}) * {s[2]}") for f, s in zip(factors, fst))
                    w.line(f"const float f = {fac};")
                    w.line("#pragma omp simd")
                    w.line(f"for (long {k} = 0; {k} < {G}; {k}++) {D}[{j} * {K} + {g} * {G} + {k}] = "
                           f"{ld(B.elem, f'{B.ptr}[({j0} + {j}) * {sbn} + {g} * {G} + {k}]')} * f;")
            # (the nt kernels: tn packs the rows again for every block of keys; [128, 2048] x [5632, 2048]^T took
            # 9.2-9.6 ms with tn, 8.0-8.5 with nt, the per-channel form 6.5-6.9, Zen 5, 2 threads)
            emit_matmul(w, nm, sup, View(f"({C.ptr} + {j0})", (M, jn), (sc0, 1)), rows,
                        View(D, (K, jn), (1, K)), scratch=scratch, allow_tn=False)
        full = n_all // jb * jb
        if full:
            j0 = nm("j0")
            with w.block(f"for (long {j0} = 0; {j0} < {full}; {j0} += {jb})"):
                block(j0, jb)
        if full < n_all:
            block(str(full), n_all - full)

    def transposed() -> None:
        (f,), (fs,) = factors, fst
        emit_tn(w, nm, sup, M, N, concrete(Gn) * concrete(G), A.ptr, sam, B.ptr, sbn, C.ptr, sc0, scratch,
                elems=(A.elem, "i8"), groups=GroupScales(f.ptr, fs[2], fs[0], concrete(G), f.elem))

    # int8 keys with one scale per key and group, against bfloat16 rows (the tn form's vdpbf16ps) or float32 rows
    # (its FMAs, the keys converted into a float32 panel): each group's sum scaled (mk.tn_kernel_grouped), instead of
    # FMAs on a dequantized block in the nt kernels
    paired = A.elem == "bf16" and mk.nt_dot(sup.isa, ("bf16", "bf16")) and sam % 2 == 0
    wide = A.elem == "f32" and sup.isa.name == "avx512"
    many = transposed if (row_free and len(factors) == 1 and B.elem == "i8" and (paired or wide)
                          and not varies(G) and not varies(N) and concrete(N) >= mk.TN_GROUPED_SHAPE[0]
                          and grouped_tn_sizes(A.elem, concrete(G), concrete(Gn) * concrete(G))) else dequantized
    if not row_free:
        dots()
    elif varies(M):
        with w.block(f"if ({M} <= {GROUPED_DOT_ROWS})"):
            dots(bound=GROUPED_DOT_ROWS)
        with w.block("else"):
            many()
    elif M <= GROUPED_DOT_ROWS:
        dots(bound=concrete(M))
    else:
        many()
