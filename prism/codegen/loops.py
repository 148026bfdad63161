"""Loop nests over views: element-wise assignment, reductions along one axis, row-wise composites.

Every nest drops unit dims and merges adjacent dims that are contiguous for all participants, puts
``#pragma omp simd`` on the innermost loop (reductions use OpenMP's ``reduction`` clause, which is what
allows vectorizing a float sum without -ffast-math), and, at kernel level (``par`` = the C expression of
the thread count), parallelizes the outer loops when the nest is big enough to pay for a fork.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass

from prism.codegen.cwriter import CWriter, Namer
from prism.codegen.prelude import c_float
from prism.codegen.tiles import Expr, Operand, View, ctype, ld, leaves, render, st
from prism.ir.reductions import MONOIDS, Monoid
from prism.ir.traced import varies

PAR_MIN = 1 << 15      # elements below which a kernel-level loop runs on one thread (a fork costs ~µs)
CHUNK = 4096           # a 1-D parallel loop runs in chunks of this many elements (the last one cut short)
# A transposing copy (an operand read with a large stride along the nest's innermost dim and contiguously along
# another) runs over TILE x TILE tiles of those two dims from TILE_MIN elements: each tile reads TILE lines of the
# source and writes TILE rows of the target, instead of one source line per element of a whole target row.
# Measured need: llama-1b bf16's LM head, the program's own sGraph (W^T materialized as float32, then a matmul)
# took 324-340 ms per call for a 32000 x 2048 weight (its transpose re-read every source line from L3 32 times,
# one element each); the model predicted 10.8 ms.
# In a template (``rows_vary``) the copy is tiled by its layout alone, at any size, and every tile's bound is the
# cut-short form: the size conditions were guards that ended template regions where nothing else changed
# (llama-1b float32's fused MLP at 188 prompt tokens, its prefill attention at 182; each new region a gcc run and
# three numeric checks, 1.9-2.4 s). Tried before with the size conditions kept but TILE_MIN dropped: their own
# boundaries at 32 rows split short prompts' templates instead.
TILE = 32
TILE_MIN = 1 << 16


@dataclass
class Nest:
    sizes: list[int]
    strides: list[list[int]]  # per participant, per dim


def make_nest(shape: Sequence[int], participants: Sequence[Sequence[int]]) -> Nest:
    """Drop unit dims, then merge dim d into d+1 when stride[d] == stride[d+1] * size[d+1] for all."""
    keep = [d for d, n in enumerate(shape) if n != 1]
    sizes = [shape[d] for d in keep]
    strides = [[p[d] for d in keep] for p in participants]
    d = len(sizes) - 2
    while d >= 0:
        if all(s[d] == s[d + 1] * sizes[d + 1] for s in strides):
            sizes[d] *= sizes[d + 1]
            del sizes[d + 1]
            for s in strides:
                s[d] = s[d + 1]
                del s[d + 1]
        d -= 1
    return Nest(sizes, strides)


def offset(vars_: Sequence[str], strides: Sequence[int]) -> str:
    terms = [v if s == 1 else f"{v} * {s}" for v, s in zip(vars_, strides) if s != 0]
    return " + ".join(terms) if terms else "0"


# Templates (codegen/template.py) serve every value of a dim in a guard region with one text: under ``rows_vary()``
# (template tracing and its validation's plain generation) the code takes no decision on a size that only picks
# whether a remainder loop is written -- the remainder loop is written always (zero trips where nothing is left) --
# and nn products take their row remainder by its bits at run time (matmul.plan_nn). Measured need: llama-1b bf16's
# prefill attention had one template per residue class of the prompt length modulo 16 (its QK^T keys in blocks of
# 16, 8 and 4 with the left-over keys one at a time; the softmax rows in quarters): a new even length compiled and
# checked a new one in 3 of 4 cases (1.1-1.3 s each; `/tmp` sweep of 16 lengths after 128 under dynamic=True).
_ROWS_VARY: ContextVar[bool] = ContextVar("prism_rows_vary", default=False)


@contextmanager
def rows_vary() -> Iterator[None]:
    """Generate code whose text does not depend on its row counts or remainders where it can: for templates."""
    token = _ROWS_VARY.set(True)
    try:
        yield
    finally:
        _ROWS_VARY.reset(token)


def varying() -> bool:
    """Whether code is being generated for a template (``rows_vary``)."""
    return _ROWS_VARY.get()


@contextmanager
def loops(w: CWriter, vars_: Sequence[str], sizes: Sequence[int], simd: str | None = "",
          par: str | None = None, total: int = 0) -> Iterator[None]:
    """Open ``for`` loops; ``simd``: None = no pragma, "" = plain simd, or a clause such as
    ``reduction(+:s)``. ``par``: parallelize the loops outside the innermost."""
    n = len(vars_)
    npar = n - 1 if simd is not None else n
    opened = 0
    # in a template the PAR_MIN test is the pragma's run-time if clause: taken here it was a region boundary (a
    # piece over a prompt's rows: llama-1b int8w-bf16's to+linear+mul at 64 rows, a new template)
    run_time = varying()
    try:
        for k, (v, size) in enumerate(zip(vars_, sizes)):
            if k == 0 and par and npar >= 1 and (run_time or total >= PAR_MIN):
                w.line(f"#pragma omp parallel for num_threads({par}) schedule(static)"
                       + (f" collapse({npar})" if npar > 1 else "")
                       + (f" if(({total}) >= {PAR_MIN})" if run_time else ""))
            if k == n - 1 and simd is not None:
                w.line(f"#pragma omp simd {simd}".rstrip())
            w.line(f"for (long {v} = 0; {v} < {size}; {v}++) {{")
            w.level += 1
            opened += 1
        yield
    finally:
        for _ in range(opened):
            w.level -= 1
            w.line("}")


def _unique_leaves(x: Operand) -> list[View]:
    seen: dict[int, View] = {}
    for lf in leaves(x):
        seen.setdefault(id(lf), lf)
    return list(seen.values())


def _assign_chunks(w: CWriter, nm: Namer, target: View, lvs: list[View], src: Operand, nest: Nest, op: str,
                   par: str) -> None:
    """A long 1-D element-wise loop over chunks of CHUNK elements, parallel over the chunks; the last chunk is
    cut short. Whether the length divides CHUNK is no decision of the code: a template over a dim (codegen/
    template.py) serves every value. Measured need: with a divided length only, llama-1b's prefill attention had
    one template for even prompt lengths and one for odd ones (the output's 2048 x L elements), 0.55 s for the first
    odd length after an even one; and an odd length ran that loop on one thread."""
    n = nest.sizes[0]
    c, i, end = nm("c"), nm("i"), nm("end")
    access = {id(v): v.at(offset([i], s)) for v, s in zip(lvs, nest.strides[1:])}
    t = f"{target.ptr}[{offset([i], nest.strides[0])}]"
    e = render(src, access)
    w.line(f"#pragma omp parallel for num_threads({par}) schedule(static)"
           + (f" if(({n}) >= {PAR_MIN})" if varying() else ""))
    w.line(f"for (long {c} = 0; {c} < {(n + CHUNK - 1) // CHUNK}; {c}++) {{")
    w.level += 1
    w.line(f"const long {end} = pr_minl({n}, ({c} + 1) * {CHUNK});")
    w.line("#pragma omp simd")
    w.line(f"for (long {i} = {c} * {CHUNK}; {i} < {end}; {i}++) {{")
    w.level += 1
    w.line(store(target.elem, t, op, e))
    w.level -= 1
    w.line("}")
    w.level -= 1
    w.line("}")


def assign(w: CWriter, nm: Namer, target: View, src: Operand, op: str = "=", par: str | None = None) -> None:
    """target (op)= src element-wise; op is ``=``, ``+=`` or ``max``."""
    shape = target.shape
    lvs = _unique_leaves(src)
    nest = make_nest(shape, [list(target.strides)] + [list(v.bstrides(shape)) for v in lvs])
    if not nest.sizes:
        nest = Nest([1], [[0] for _ in nest.strides])
    if par and len(nest.sizes) == 1 and (varying() or nest.sizes[0] >= PAR_MIN):   # (a template: if clause)
        _assign_chunks(w, nm, target, lvs, src, nest, op, par)
        return
    d = _transposed_dim(nest)
    if d is not None:
        _assign_tiled(w, nm, target, src, lvs, nest, d, op, par)
        return
    vars_ = [nm("i") for _ in nest.sizes]
    access = {id(v): v.at(offset(vars_, s)) for v, s in zip(lvs, nest.strides[1:])}
    t = f"{target.ptr}[{offset(vars_, nest.strides[0])}]"
    e = render(src, access)
    with loops(w, vars_, nest.sizes, par=par, total=math.prod(shape)):
        w.line(store(target.elem, t, op, e))


def _transposed_dim(nest: Nest) -> int | None:
    """The dim ``d`` along which an operand of a transposing copy is contiguous (see TILE), or None: the
    target is contiguous along the innermost dim, some operand reads it with a stride of at least TILE
    elements and is contiguous along ``d``, both dims span at least TILE, the nest at least TILE_MIN."""
    last = len(nest.sizes) - 1
    if last < 1 or nest.strides[0][last] != 1:
        return None
    sized = not varying()   # a template tiles by layout alone (see TILE_MIN)
    if sized and (math.prod(nest.sizes) < TILE_MIN or nest.sizes[last] < TILE):
        return None
    for s in nest.strides[1:]:
        if abs(s[last]) >= TILE:
            for d in range(last - 1, -1, -1):
                if s[d] == 1 and (not sized or nest.sizes[d] >= TILE):
                    return d
    return None


def _assign_tiled(w: CWriter, nm: Namer, target: View, src: Operand, lvs: list[View], nest: Nest, d: int,
                  op: str, par: str | None) -> None:
    """The element-wise assignment over TILE x TILE tiles of dims ``d`` and the innermost (both tile loops
    outermost but for the other dims, parallel over every outer loop; the last tile of a dim is cut short)."""
    last = len(nest.sizes) - 1
    others = [k for k in range(last) if k != d]
    outer = {k: nm("i") for k in (*others, d, last)}
    inner = {k: nm("t") for k in (d, last)}
    index = [f"({outer[k]} + {inner[k]})" if k in inner else outer[k] for k in range(len(nest.sizes))]
    access = {id(v): v.at(offset(index, s)) for v, s in zip(lvs, nest.strides[1:])}
    t = f"{target.ptr}[{offset(index, nest.strides[0])}]"
    e = render(src, access)
    if par:
        w.line(f"#pragma omp parallel for num_threads({par}) schedule(static) collapse({len(others) + 2})")
    opened = 0
    for k in (*others, d, last):
        step = TILE if k in inner else 1
        w.line(f"for (long {outer[k]} = 0; {outer[k]} < {nest.sizes[k]}; {outer[k]} += {step}) {{")
        w.level += 1
        opened += 1
    for k in (d, last):
        if k == last:
            w.line("#pragma omp simd")
        n = nest.sizes[k]
        bound = (str(TILE) if not varying() and n % TILE == 0
                 else f"({n} - {outer[k]} < {TILE} ? {n} - {outer[k]} : {TILE})")
        w.line(f"for (long {inner[k]} = 0; {inner[k]} < {bound}; {inner[k]}++) {{")
        w.level += 1
        opened += 1
    w.line(store(target.elem, t, op, e))
    for _ in range(opened):
        w.level -= 1
        w.line("}")


def store(elem: str, t: str, op: str, e: str) -> str:
    """The C statement ``t (op)= e`` for an element ``t`` stored as ``elem`` (op ``=``, ``+=`` or ``max``):
    the value is computed in float and rounded once when it is stored."""
    cur = ld(elem, t)
    value = e if op == "=" else f"{cur} + {e}" if op == "+=" else f"pr_max({cur}, {e})"
    if elem == "f32" and op != "max":
        return f"{t} {op} {e};"
    return f"{t} = {st(elem, value)};"


def _combine(kind: str, acc: str, x: str) -> str:
    return MONOIDS[kind].c_combine(acc, x)


# A long row is reduced in SPLIT parts: its quarters [k*q, (k+1)*q) are read in one loop, four values per step,
# combined as a tree and then into one OpenMP reduction variable. One vectorized accumulator taking every value is a
# chain of dependent adds (3-4 cycles each), so a plain single-accumulator sum runs at a fraction of the load rate;
# with the tree, one add per four vectors is on the chain. Measured on [256, 1024] rows, one thread, AVX2 (gcc 12
# -O3): sum 28.8 -> 17.6 µs, max with its NaN flag 39.3 -> 24.5 µs (ATen's sum: 19.5 µs), first with four
# reduction variables (one per quarter). The tree then replaced those: each reduction variable costs a horizontal
# reduction per row, which gcc writes as a sequence of lane shuffles -- for a row of 1024 floats a third of the
# row's instructions. Tree vs four variables, [256, 1024], 2 threads, AVX-512 (Zen 4): sum 6.3-7.3 -> 5.2-5.4
# µs, and 5.3-7.1 -> 5.2-5.4 with AVX-512 off. A lane array (``float a[32]`` updated by a simd loop) was as fast
# in one spelling and 2x slower in another, when gcc kept the array in memory: scalar reduction variables stay
# in registers by construction.
SPLIT = 4
SPLIT_MIN = 64  # rows shorter than this are reduced in one loop (a quarter below 16 floats gains nothing)
# A row whose length varies in a template (traced.varies: a prompt's length) is split at any length: n < SPLIT_MIN was a
# region boundary. Measured need: llama-1b int8w-bf16 started at a 24-token prompt traced new templates of its
# prefill and decode attentions (their softmax rows) at a 128-token prompt, +1.16 s with empty caches.


def _quarters(j: str, n: int) -> tuple[int, list[str]]:
    """(trip count, the index expression of each part) of a row of n split in SPLIT parts."""
    q = n // SPLIT
    return q, [j] + [f"({j} + {k * q})" for k in range(1, SPLIT)]


def sum_loop(w: CWriter, nm: Namer, s: str, j: str, n: int, value: Callable[[str], str],
             sink: Callable[[str, str], str] | None = None) -> None:
    """``s += value(j)`` over ``j < n`` (``s`` is declared and set by the caller); ``sink(j, v)``, if given,
    is a statement that also stores each value ``v`` (softmax's exponentials). Vectorized; rows of at least
    SPLIT_MIN elements in SPLIT parts summed as a tree (see SPLIT)."""
    def one(jx: str) -> str:
        if sink is None:
            return value(jx)
        e = nm("e")
        w.line(f"const float {e} = {value(jx)};")
        w.line(sink(jx, e))
        return e

    if not varies(n) and n < SPLIT_MIN:   # a row whose length varies in a template: split at any length (SPLIT)
        with loops(w, [j], [n], simd=f"reduction(+:{s})"):
            e = one(j)
            w.line(f"{s} = {s} + {e};" if sink is None else f"{s} += {e};")
        return
    q, idx = _quarters(j, n)
    p = nm("p")
    w.line(f"float {p} = 0.0f;")
    with loops(w, [j], [q], simd=f"reduction(+:{p})"):
        w.line(f"{p} += {_pairwise([one(jx) for jx in idx])};")
    w.line(f"{s} += {p};")
    if varying() or n % SPLIT:  # the last n % SPLIT elements (a template: always, zero trips or more)
        with loops(w, [j], [n - SPLIT * q], simd=None):
            w.line(f"{s} += {one(f'({j} + {SPLIT * q})')};")


def _pairwise(parts: Sequence[str]) -> str:
    """The sum of the SPLIT parts, pairwise: ``(p0 + p1) + (p2 + p3)``."""
    return f"({parts[0]} + {parts[1]}) + ({parts[2]} + {parts[3]})"


def _max_step(w: CWriter, v: str, m: str, nan: str, value: str, gt: str = ">") -> None:
    """``v = value; m = max(m, v)`` (``gt`` ``<``: min), setting the NaN flag ``nan`` if ``v`` is NaN."""
    w.line(f"const float {v} = {value};")
    w.line(f"{m} = {v} {gt} {m} ? {v} : {m};")
    w.line(f"{nan} |= {v} != {v};")


def max_loop(w: CWriter, nm: Namer, m: str, j: str, n: int, value: Callable[[str], str],
             mo: Monoid = MONOIDS["max"]) -> None:
    """``m = max(m, value(j))`` over ``j < n`` (``mo``: a compare monoid, max or min; ``m`` set to its identity
    by the caller), NaN-propagating, as a vectorized reduction. ``pr_max`` in the loop is a dependent select chain (an
    unordered compare and two blends per vector); here the maximum is the plain ``v > m ? v : m`` (one compare
    and blend, which the reduction clause splits across lanes) and NaN is an OR-reduced flag beside it.
    Measured on 128 x 1024 rows, one thread: 19.4 -> 6.3 µs. Rows of at least SPLIT_MIN elements in SPLIT
    parts combined as a tree (see SPLIT)."""
    nan = nm("nan")
    gt, kind, init = mo.compare, mo.omp, mo.c_init
    w.line(f"int {nan} = {m} != {m};")
    if not varies(n) and n < SPLIT_MIN:   # as sum_loop
        v = nm("v")
        with loops(w, [j], [n], simd=f"reduction({kind}:{m}) reduction(|:{nan})"):
            _max_step(w, v, m, nan, value(j), gt)
    else:
        # the four values' maximum as a tree, then one running max; the NaN flag from two unordered compares
        # (one per pair: true when either is NaN). [256, 1024] rows, 2 threads, AVX-512 (Zen 4), best of 7 x
        # 2000 calls: 9.3-9.6 µs with four running maxima and four running sums (the sum was NaN whenever a NaN
        # was read; 11.2-12.7 -> and cheaper than a compare per vector on AVX2 then) -> 5.6-5.8 µs; without
        # any NaN flag 5.2-5.3
        q, idx = _quarters(j, n)
        vs = [nm("v") for _ in range(SPLIT)]
        a, b, c, p = nm("m"), nm("m"), nm("m"), nm("p")
        w.line(f"float {p} = {init};")
        with loops(w, [j], [q], simd=f"reduction({kind}:{p}) reduction(|:{nan})"):
            for v, jx in zip(vs, idx):
                w.line(f"const float {v} = {value(jx)};")
            w.line(f"const float {a} = {vs[1]} {gt} {vs[0]} ? {vs[1]} : {vs[0]};")
            w.line(f"const float {b} = {vs[3]} {gt} {vs[2]} ? {vs[3]} : {vs[2]};")
            w.line(f"const float {c} = {b} {gt} {a} ? {b} : {a};")
            w.line(f"{p} = {c} {gt} {p} ? {c} : {p};")
            w.line(f"{nan} |= __builtin_isunordered({vs[0]}, {vs[1]}) | __builtin_isunordered({vs[2]}, {vs[3]});")
        w.line(f"{m} = {p} {gt} {m} ? {p} : {m};")
        if varying() or n % SPLIT:
            v = nm("v")
            with loops(w, [j], [n - SPLIT * q], simd=None):
                _max_step(w, v, m, nan, value(f"({j} + {SPLIT * q})"), gt)
    w.line(f"if ({nan}) {m} = NAN;")


def reduce(w: CWriter, nm: Namer, target: View, src: Operand, axis: int, kind: str, mode: str = "set",
           post: Callable[[str], str] | None = None, par: str | None = None) -> None:
    """Reduce ``src`` along ``axis`` with monoid ``kind`` (``prism.ir.reductions.MONOIDS``: ``sum``, ``max``,
    ``min``) into ``target`` (src shape with axis = 1).

    mode ``set``: target = post(r); mode ``acc``: target = combine(target, post(r)) (for-loop
    accumulators). Along the innermost axis the reduction is vectorized (OpenMP reduction clause) and a long
    row is split in SPLIT parts (sum_loop, max_loop); along another axis it sweeps the axis in order.
    """
    shape = src.shape
    n = shape[axis]
    lvs = _unique_leaves(src)
    tstr = list(target.bstrides(shape[:axis] + (1,) + shape[axis + 1:]))
    lstr = [list(v.bstrides(shape)) for v in lvs]
    inner = math.prod(shape[axis + 1:])
    post = post or (lambda s: s)
    outer_shape = shape[:axis]
    if inner == 1:
        # vectorize the reduction itself
        oshape = outer_shape + shape[axis + 1:]
        drop = [d for d in range(len(shape)) if d != axis]
        nest = make_nest(oshape, [[tstr[d] for d in drop]] + [[s[d] for d in drop] for s in lstr])
        vars_ = [nm("i") for _ in nest.sizes]
        j = nm("j")
        s = nm("s")

        # max(-y) = -min(y) and min(-y) = -max(y), exactly: reducing y saves a negation per element (a
        # written-out amin, -max(-x); [256, 1024], 2 threads, AVX-512: 7.1 µs, as amax 5.6 µs)
        mo = MONOIDS[kind]
        flip = bool(mo.negated) and isinstance(src, Expr) and src.op == "neg"
        run = MONOIDS[mo.negated] if flip else mo
        body = src.srcs[0] if flip else src

        def value(jx: str) -> str:
            return render(body, {id(v): v.at(_join(offset(vars_, ns), jx, ls[axis]))
                                 for v, ns, ls in zip(lvs, nest.strides[1:], lstr)})
        t = f"{target.ptr}[{offset(vars_, nest.strides[0])}]"
        with loops(w, vars_, nest.sizes, simd=None, par=par, total=math.prod(shape)):
            w.line(f"float {s} = {run.c_init};")
            if run.compare:
                max_loop(w, nm, s, j, n, value, run)
                if flip:
                    w.line(f"{s} = -{s};")
            else:
                sum_loop(w, nm, s, j, n, value)
            if mode == "set":
                w.line(store(target.elem, t, "=", post(s)))
            else:
                w.line(store(target.elem, t, "=", _combine(kind, ld(target.elem, t), post(s))))
        return
    # the axis is not innermost: sweep it sequentially, vectorize over the inner dims
    onest = make_nest(outer_shape, [tstr[:axis]] + [s[:axis] for s in lstr])
    inest = make_nest(shape[axis + 1:], [tstr[axis + 1:]] + [s[axis + 1:] for s in lstr])
    ov = [nm("i") for _ in onest.sizes]
    iv = [nm("k") for _ in inest.sizes]
    j = nm("j")
    access = {id(v): v.at(_join(_join(offset(ov, os_), j, ls[axis]), offset(iv, is_), 1))
              for v, os_, is_, ls in zip(lvs, onest.strides[1:], inest.strides[1:], lstr)}
    if target.elem != "f32":   # the sweep accumulates in the target: a float target (callers materialize)
        raise ValueError(f"reduce along a non-innermost axis into a {target.elem} target")
    t = f"{target.ptr}[{_join(offset(ov, onest.strides[0]), offset(iv, inest.strides[0]), 1)}]"
    tmp = target.ptr if mode == "set" else None
    with loops(w, ov, onest.sizes, simd=None, par=par, total=math.prod(shape)):
        if mode == "set":
            with loops(w, iv, inest.sizes):
                w.line(f"{t} = {MONOIDS[kind].c_init};")
        else:  # accumulate: reduce into a private row first, then combine once (keeps post() exact)
            tmp = nm("r")
            w.line(f"float {tmp}[{math.prod(inest.sizes)}];")
            with loops(w, iv, inest.sizes):
                w.line(f"{tmp}[{offset(iv, _dense(inest.sizes))}] = {MONOIDS[kind].c_init};")
        cell = t if mode == "set" else f"{tmp}[{offset(iv, _dense(inest.sizes))}]"
        with loops(w, [j], [n], simd=None):
            with loops(w, iv, inest.sizes):
                w.line(f"{cell} = {_combine(kind, cell, render(src, access))};")
        if mode != "set" or post(cell) != cell:
            with loops(w, iv, inest.sizes):
                w.line(f"{t} = {post(cell)};" if mode == "set" else f"{t} = {_combine(kind, t, post(cell))};")


def _dense(sizes: Sequence[int]) -> list[int]:
    out = [1] * len(sizes)
    for d in range(len(sizes) - 2, -1, -1):
        out[d] = out[d + 1] * sizes[d + 1]
    return out


def _join(base: str, var: str, stride: int) -> str:
    if stride == 0 or var == "0":
        return base
    term = var if stride == 1 else f"{var} * {stride}"
    return term if base == "0" else f"{base} + {term}"


def rowwise(w: CWriter, nm: Namer, target: View, src: View, axis: int, kind: str, eps: float = 0.0,
            par: str | None = None) -> None:
    """``rms_norm`` (x / sqrt(mean(x^2) + eps)), ``layer_norm`` ((x - mean) / sqrt(mean((x - mean)^2) + eps)),
    ``softmax`` (exp(x - max) / sum) or ``rotate_half`` (concat(-x[h:], x[:h])) along ``axis``.

    Per row: the statistics in one vectorized pass, then the normalized row (softmax stores the
    exponentials first and scales them in place by the reciprocal of their sum).
    """
    shape = src.shape
    n = shape[axis]
    if target.elem != "f32":   # softmax divides in place in the target
        raise ValueError(f"rowwise {kind} into a {target.elem} target (callers give a float target)")
    drop = [d for d in range(len(shape)) if d != axis]
    oshape = tuple(shape[d] for d in drop)
    nest = make_nest(oshape, [[target.strides[d] for d in drop], [src.strides[d] for d in drop]])
    vars_ = [nm("i") for _ in nest.sizes]
    j = nm("j")
    tb = nm("t")
    sb = nm("x")
    ts, ss = target.strides[axis], src.strides[axis]
    with loops(w, vars_, nest.sizes, simd=None, par=par, total=math.prod(shape)):
        w.line(f"float* {tb} = {target.ptr} + {offset(vars_, nest.strides[0])};")
        w.line(f"const {ctype(src.elem)}* {sb} = {src.ptr} + {offset(vars_, nest.strides[1])};")
        def x(jx: str) -> str:
            return ld(src.elem, f"{sb}[{_join('0', jx, ss)}]")

        def t(jx: str) -> str:
            return f"{tb}[{_join('0', jx, ts)}]"
        xj, tj = x(j), t(j)
        if kind == "rms_norm":
            q = nm("q")
            w.line(f"float {q} = 0.0f;")
            sum_loop(w, nm, q, j, n, lambda jx: f"{x(jx)} * {x(jx)}")
            w.line(f"{q} = sqrtf({q} / {c_float(n)} + {c_float(eps)});")
            with loops(w, [j], [n]):
                w.line(f"{tj} = {xj} / {q};")
        elif kind == "layer_norm":
            # three passes over the row (it is in L1 after the first): the mean, the centred variance (not
            # E[x^2] - mean^2, which cancels catastrophically when |mean| >> std), the normalized row
            mu, v, r = nm("mu"), nm("v"), nm("r")
            w.line(f"float {mu} = 0.0f, {v} = 0.0f;")
            sum_loop(w, nm, mu, j, n, x)
            w.line(f"{mu} = {mu} / {c_float(n)};")
            sum_loop(w, nm, v, j, n, lambda jx: f"({x(jx)} - {mu}) * ({x(jx)} - {mu})")
            w.line(f"const float {r} = 1.0f / sqrtf({v} / {c_float(n)} + {c_float(eps)});")
            with loops(w, [j], [n]):
                w.line(f"{tj} = ({xj} - {mu}) * {r};")
        elif kind == "softmax":
            m, s = nm("m"), nm("s")
            w.line(f"float {m} = -INFINITY, {s} = 0.0f;")
            max_loop(w, nm, m, j, n, x)
            sum_loop(w, nm, s, j, n, lambda jx: f"pr_exp_le0({x(jx)} - {m})", sink=lambda jx, e: f"{t(jx)} = {e};")
            # times the reciprocal (within 1.5 ulp of the quotient): a vector division is ~10x a multiply's
            # throughput cost; [256, 512], one thread, AVX2: 134 -> 125 µs
            r = nm("r")
            w.line(f"const float {r} = 1.0f / {s};")
            with loops(w, [j], [n]):
                w.line(f"{tj} = {tj} * {r};")
        elif kind == "rotate_half":  # t = concat(-x[h:], x[:h]): two copy loops over the halves
            h = n // 2
            with loops(w, [j], [h]):
                w.line(f"{tj} = -{x(f'({j} + {h})')};")
            with loops(w, [j], [h]):
                w.line(f"{t(f'({j} + {h})')} = {xj};")
        else:  # pragma: no cover
            raise ValueError(kind)
