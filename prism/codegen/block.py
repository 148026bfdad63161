"""Lowering of one concrete block graph (a customized operator) to a C function.

Shape of the generated function::

    #pragma omp parallel            one thread team; each thread owns a scratch area
      #pragma omp for               the flattened grid: one iteration = one block
        <pre>                       loop-invariant tiles, accumulator initialization
        for (it = 0; it < F; it++)  the for-loop: loop tiles, accumulator updates, in-loop saves
        <post>                      after the loop: accumulator finalization, epilogue, saves
    <partial sums>                  outputs whose omap has a None grid dim: add the per-block slots

Tiles read from inputs are strided views (no copies; permutes and splits of them are free). Element-
wise chains are fused into the loop of their single consumer (an element-wise op of the same shape, a
reduction, an accumulator or a save), so ``save(div(acc, rms))`` writes the output directly. A matmul
whose only consumer is a ``sum`` accumulator accumulates in place (micro-kernel beta = 1; over a long
loop the iterations' products are added in groups, see matmul.py). Online
softmax: the accumulators over the same scores share one running max; each iteration computes the new
row max, the rescale factor alpha = exp(m_old - m_new), p = exp(x - m_new) once, then l = l*alpha +
rowsum(p) and o = o*alpha + p @ v (the rescale is fused into the micro-kernel, beta = 2).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from prism.codegen import loops as LP
from prism.codegen import microkernels as mk
from prism.codegen.cwriter import CWriter, Namer
from prism.codegen.matmul import Support, emit_grouped, emit_matmul, grouped_form
from prism.codegen.prelude import c_float
from prism.codegen.tiles import ELEMENTWISE, EXP_LE0, Expr, Operand, View, contiguous_strides, ctype, elem_of
from prism.errors import UnsupportedError
from prism.ir.block import BlockGraph
from prism.ir.node import Node
from prism.ir.ops import OPS, attrs_dict
from prism.ir.traced import as_int

ALIGN = 16  # floats: scratch tiles start on 64-byte boundaries
# A value read by several consumers is computed again in each when its fused expression costs at most this
# many flops per element (OpDef.flops; a subtraction 1, exp ~ 12): cheaper than storing it and reading it back.
RECOMPUTE_FLOPS = 2
# Threads of a block graph's grid loop: one per PAR_WORK units of work (elements the kernel reads and
# writes, plus a matmul's multiply-adds / 8), at most one per block. An OpenMP fork/join costs 1-3 µs on
# this machine, and when another process holds a core a second thread made a 128-element kernel wait
# hundreds of µs (measured: 550 µs per call under load, 3.4 µs with one thread idle); a thread's share
# should be several µs of work.
PAR_WORK = 16384

_EXPR_ACCS = ("sum", "sum_last", "rms", "max")
_SOFTMAX = ("softmax_sum", "softmax_matmul")


@dataclass
class BlockFunction:
    name: str
    text: str
    scratch_floats: int                     # per thread
    partial_ws: list[tuple[int, int]] = field(default_factory=list)  # (output index, floats) slots


def _ints(shape: tuple) -> tuple[int, ...]:
    """A concrete shape's dims as ints (traced ones stay traced: prism/ir/traced.py)."""
    try:
        return tuple(as_int(d) for d in shape)
    except TypeError:
        raise UnsupportedError(f"cannot generate code for symbolic shape {shape}; bind the symbols first") from None


_ROWWISE = frozenset(n for n, o in OPS.items() if o.group == "composite")   # loops.rowwise: one C loop each
_REDUCTIONS = frozenset(n for n, o in OPS.items() if o.group == "reduction")   # prism.ir.reductions
_DIRECT = frozenset({*_REDUCTIONS, *_ROWWISE})  # BlockLowering.direct_target


def consumers(nodes: list[Node]) -> dict[Node, list[Node]]:
    out: dict[Node, list[Node]] = {n: [] for n in nodes}
    for n in nodes:
        for s in n.src:
            out[s].append(n)
    return out


# The program dtypes whose values a block stores in their own type as matmul operands, where the machine has the
# product's dot instruction (mk.nt_dot: vdpbf16ps; mk.nt_idot: vpdpbusd): (dtype, storage, predicate)
_DOT_OPERANDS = (("bfloat16", "bf16", mk.nt_dot), ("int8", "i8", mk.nt_idot))


class BlockLowering:
    def __init__(self, bg: BlockGraph, name: str, sup: Support, nm: Namer, in_elems: list[str] | None = None,
                 out_elems: list[str] | None = None) -> None:
        """``in_elems`` / ``out_elems``: the storage of the buffers the caller passes (default: the inputs'
        dtypes, float outputs); tiles are float32 whatever they are."""
        if not bg.is_concrete():
            raise UnsupportedError(f"cannot generate code for a block graph with free symbols {sorted(bg.symbols())}; "
                                   "instantiate it (pass params=...)")
        self.in_elems = in_elems if in_elems is not None else [elem_of(spec.dtype) for spec in bg.inputs]
        self.out_elems = out_elems if out_elems is not None else ["f32"] * len(bg.outputs)
        self.bg, self.name, self.sup, self.nm = bg, name, sup, nm
        self.grid = _ints(bg.grid)
        self.F = int(bg.forloop)
        self.nodes = bg.nodes
        self.cons = consumers(self.nodes)
        self.phase = bg.phase
        self.w = {"inv": CWriter(3), "loop": CWriter(4), "post": CWriter(3)}
        self.scratch = 0
        self.vals: dict[Node, Operand] = {}
        self.groups: dict[Node, dict] = {}      # softmax groups by score node
        self.partial: list[tuple[int, int]] = []
        self.final: list[str] = []              # code after the parallel region (partial sums)
        self.saved: set[Node] = set()           # saves whose source wrote the output tile itself

    # --- helpers -----------------------------------------------------------------------------
    def alloc(self, shape: tuple[int, ...], elem: str = "f32") -> View:
        off = self.scratch
        floats = -(-max(1, math.prod(shape)) * mk.ITEMSIZE[elem] // 4)
        self.scratch += -(-floats // ALIGN) * ALIGN
        return View.dense(f"(S + {off})" if elem == "f32" else f"(({ctype(elem)}*)(S + {off}))", shape, elem)

    def view(self, val: Operand, phase: str, elem: str = "f32") -> View:
        """A view of ``val``, materializing a fused expression into scratch (stored as ``elem``) if needed."""
        if isinstance(val, View):
            return val
        t = self.alloc(val.shape, elem)
        LP.assign(self.w[phase], self.nm, t, val)
        return t

    def operand_elem(self, n: Node) -> str:
        """How a value materialized for several consumers is stored: bfloat16 when every consumer is a
        matmul that reads it as a bfloat16 operand (``operands``), else float32."""
        cs = self.cons[n]
        for name, elem, fast in _DOT_OPERANDS:
            if (cs and n.dtype.name == name and fast(self.sup.isa, (elem, elem))
                    and all(c.op == "matmul" and all(s.dtype.name == name for s in c.src) for c in cs)):
                return elem
        return "f32"

    def operands(self, n: Node, phase: str) -> tuple[View, View]:
        """The two operands of matmul ``n`` as views. Where both are bfloat16 values of the program and the
        machine sums bfloat16 pairs in one instruction (``mk.nt_dot``), an operand computed here is stored
        as bfloat16 (rounded once, as the program's dtype says; PyTorch stores it so too): a float32 operand
        would leave the product on the widening path at half the rate (the 128-token prefill of a bfloat16
        Llama's MLP: rms_norm(x) * w is the gate and up projections' operand). The numeric check's allowance
        for a low-precision program counts this rounding (``verify.numeric.rounding_allowance``)."""
        vals = [self.vals[s] for s in n.src]
        elem = "f32"
        # (int8: a quantizer's values -- cast(round(x / s), int8), integral -- against int8 weights, stored as int8
        # for vpdpbusd: mk.nt_idot; the store truncates an integral value exactly)
        for name, e, fast in _DOT_OPERANDS:
            if all(s.dtype.name == name and (not isinstance(v, View) or v.elem == e) for s, v in zip(n.src, vals)) \
                    and fast(self.sup.isa, (e, e)):
                elem = e
        a, b = (self.view(v, phase, elem) for v in vals)
        return a, b

    def inline(self, n: Node) -> bool:
        if n.op not in ELEMENTWISE:
            return False
        cs = self.cons[n]
        if len(cs) != 1:
            return self.recompute(n)
        return self.inline_into(n, cs[0])

    def recompute(self, n: Node) -> bool:
        """Whether a value of several consumers is computed again in each instead of stored once: where it
        is cheap (at most RECOMPUTE_FLOPS per element over its fused expression) and every consumer would
        take it inline. A stored tile costs a write and a read back per consumer; recomputing it reads its
        leaves again instead (log_softmax's ``x - max``: a 64 KB tile per block written and read twice)."""
        cs = self.cons[n]
        flops = OPS[n.op].flops + sum(_flops(self.vals[x]) for x in n.src)
        if not cs or flops > RECOMPUTE_FLOPS:
            return False
        return all(self.phase[c] == self.phase[n] and self.inline_into(n, c) for c in cs)

    def inline_into(self, n: Node, c: Node) -> bool:
        if c.op in ELEMENTWISE or c.op in _REDUCTIONS:
            return self.phase[c] == self.phase[n] and (c.op not in ELEMENTWISE or _ints(c.shape) == _ints(n.shape))
        if c.op == "save":
            return True
        if c.op == "acc":
            return c.arg[0] in _EXPR_ACCS and self.phase[n] == "loop" and c.src[0] not in self.groups_src()
        return False

    def groups_src(self) -> set[Node]:
        return {n.src[0] for n in self.nodes if n.op == "acc" and n.arg[0] in _SOFTMAX}

    def fused_matmul(self, n: Node) -> bool:
        cs = self.cons[n]
        return (n.op == "matmul" and self.phase[n] == "loop" and len(cs) == 1 and cs[0].op == "acc"
                and cs[0].arg[0] == "sum")

    def region(self, shape: tuple[int, ...], tile: tuple[int, ...], pmap: tuple, fmap: object
               ) -> tuple[str, int]:
        """(block offset expr, per-iteration step) of the tile of a dense tensor of ``shape``."""
        strides = contiguous_strides(shape)
        terms = []
        step = 0
        for d in range(len(shape)):
            idx = ""
            for p, e in enumerate(pmap):
                if e == d and self.grid[p] > 1:
                    idx = f"({idx} * {self.grid[p]} + b{p})" if idx else f"b{p}"
            unit = tile[d] * strides[d]
            if fmap == d:
                step = unit
                if idx:
                    terms.append(f"{idx} * {unit * self.F}")
            elif idx:
                terms.append(f"{idx} * {unit}")
        return (" + ".join(terms) if terms else "0"), step

    # --- lowering ----------------------------------------------------------------------------
    def grouped_products(self) -> Grouped:
        return grouped_products(self.nodes, self.cons, self.phase, one_iteration=self.F == 1)

    def lower_grouped(self, n: Node, pattern: tuple[Node, list[Node], list[Node]], out_ptrs: list[str]) -> bool:
        """Lower grouped product ``n`` (``grouped_products``) in one pass if its operands' layout fits
        (``matmul.grouped_form``); False: lower its nodes one by one."""
        mm, _, factors = pattern
        ph = self.phase[mm]   # (a loop of one iteration: the product is written in its body, where its tiles are)
        a, b = (self.vals.get(s) for s in mm.src)
        if not isinstance(a, View) or not isinstance(b, View):
            return False
        vals = [self.vals.get(f) for f in factors]
        if any(v is None for v in vals):
            return False
        # a computed factor goes into scratch once per block (dense: the layout check takes it as such); float16 and
        # bfloat16 ones stored so are read as they are, one conversion per group
        shaped = [v if isinstance(v, View) else View.dense("", v.shape) for v in vals]
        out_shape = _ints(n.shape)
        if not grouped_form(View.dense("", out_shape), a, b, shaped):
            return False
        fviews = [v if isinstance(v, View) else self.view(v, ph) for v in vals]
        direct = self.direct_target(n, out_ptrs)
        target = direct if direct is not None else self.alloc(out_shape)
        emit_grouped(self.w[ph], self.nm, self.sup, target, a, b, fviews, self.scratch_ptr)
        self.vals[n] = target
        return True

    def lower(self, in_ptrs: list[str], out_ptrs: list[str]) -> BlockFunction:
        smax_src = self.groups_src()
        grouped = self.grouped_products()
        pending = {x: s for s, (mm, chain, _) in grouped.items() for x in (mm, *chain)}
        for n in self.nodes:
            if n in pending and pending[n] in grouped:
                continue   # part of a grouped product: lowered with its sum (or one by one, below)
            if n in grouped:
                pattern = grouped.pop(n)
                if not self.lower_grouped(n, pattern, out_ptrs):
                    for x in self.nodes:   # its nodes one by one, in order
                        if x in pending and pending[x] is n:
                            self.lower_node(x, in_ptrs, out_ptrs, smax_src)
                    self.lower_node(n, in_ptrs, out_ptrs, smax_src)
                continue
            self.lower_node(n, in_ptrs, out_ptrs, smax_src)
        return self.assemble(in_ptrs, out_ptrs)

    def lower_node(self, n: Node, in_ptrs: list[str], out_ptrs: list[str], smax_src: set[Node]) -> None:
        if n.op == "save":
            self.lower_save(n, out_ptrs)
        elif n.op == "iter":
            self.lower_iter(n, in_ptrs)
        elif n.op == "acc":
            self.lower_acc(n, smax_src)
        elif n.op in ELEMENTWISE:
            op = EXP_LE0 if n.op == "exp" and _minus_own_max(n.src[0]) else n.op
            e = Expr(op, n.arg, tuple(self.vals[s] for s in n.src), _ints(n.shape))
            self.vals[n] = e if self.inline(n) else self.view(e, self.phase[n], self.operand_elem(n))
        elif n.op == "matmul":
            if not self.fused_matmul(n):
                w = self.w[self.phase[n]]
                a, b = self.operands(n, self.phase[n])
                c = self.alloc(_ints(n.shape))
                emit_matmul(w, self.nm, self.sup, c, a, b, scratch=self.scratch_ptr)
                self.vals[n] = c
        else:
            direct = self.direct_target(n, out_ptrs)
            alloc = self.alloc if direct is None else (lambda shape, t=direct: t)
            self.vals[n] = lower_layout_or_reduce(n, self.vals, self.w[self.phase[n]], self.nm, alloc,
                                                  lambda v, n=n: self.view(v, self.phase[n]))

    def direct_target(self, n: Node, out_ptrs: list[str]) -> View | None:
        """The output tile itself as the target of a reduction or row-wise operator whose one consumer is a
        float32 save of the same tile (no partial-sum slots; a per-iteration save of a value of the loop, or a
        post-loop save of a value computed before or after the loop): the result is written where it is
        saved, and the save's copy from scratch is not made (a softmax piece of [256, 512] copied 512 KB more
        per call). The save is then skipped (``self.saved``)."""
        cs = self.cons[n]
        if n.op not in _DIRECT or len(cs) != 1 or cs[0].op != "save":
            return None
        save = cs[0]
        k, om, fm = save.arg
        if (self.out_elems[k] != "f32" or self.partial_dims(om)
                or self.phase[n] not in (("loop",) if fm is not None else ("inv", "post"))
                or _ints(save.shape) != _ints(n.shape)):
            return None
        shape, tile, off = self.save_region(save)
        self.saved.add(save)
        return View(f"({out_ptrs[k]} + {off})", tile, contiguous_strides(shape), "f32")

    def partial_dims(self, om: tuple) -> list[int]:
        """The grid dims a save with output map ``om`` sums over (each block writes a partial-sum slot)."""
        return [p for p, e in enumerate(om) if e is None and self.grid[p] > 1]

    def save_region(self, n: Node) -> tuple[tuple[int, ...], tuple[int, ...], str]:
        """(output shape, tile, offset expression of this block's (and iteration's) tile) of save ``n``."""
        k, om, fm = n.arg
        shape, tile = _ints(self.bg.output_shapes[k]), _ints(n.shape)
        off, step = self.region(shape, tile, om, fm)
        return shape, tile, (f"{off} + it * {step}" if fm is not None else off)

    def lower_iter(self, n: Node, in_ptrs: list[str]) -> None:
        idx, im, fm = n.arg
        spec = self.bg.inputs[idx]
        shape, tile = _ints(spec.shape), _ints(n.shape)
        off, step = self.region(shape, tile, im, fm)
        v = self.nm("v")
        el = self.in_elems[idx]
        self.w["inv"].line(f"const {ctype(el)}* {v} = {in_ptrs[idx]}" + (f" + {off};" if off != "0" else ";"))
        strides = contiguous_strides(shape)
        if fm is not None:
            vi = v + "i"
            self.w["loop"].line(f"const {ctype(el)}* {vi} = {v} + it * {step};")
            v = vi
        self.vals[n] = View(v, tile, strides, el)

    def lower_save(self, n: Node, out_ptrs: list[str]) -> None:
        if n in self.saved:  # written in place by its source (direct_target)
            return
        k, om, fm = n.arg
        shape, tile, off = self.save_region(n)
        base = out_ptrs[k]
        red = self.partial_dims(om)
        if red:  # partial sums: each block writes its own slot, added after the grid
            slots = math.prod(self.grid[p] for p in red)
            numel = math.prod(shape)
            slot = ""
            for p in red:
                slot = f"({slot} * {self.grid[p]} + b{p})" if slot else f"b{p}"
            pw = f"pw{k}"
            base = f"({pw} + ({slot}) * {numel})"
            self.partial.append((k, slots * numel))
            self.final.append(self._partial_sum(k, pw, shape, slots, out_ptrs[k]))
        phase = "loop" if fm is not None else "post"
        target = View(f"({base} + {off})", tile, contiguous_strides(shape), "f32" if red else self.out_elems[k])
        LP.assign(self.w[phase], self.nm, target, self.vals[n.src[0]])

    def _partial_sum(self, k: int, pw: str, shape: tuple[int, ...], slots: int, out: str) -> str:
        """out = the sum of the slots, in float: a low-precision output is rounded once, at the end."""
        w = CWriter(1)
        numel = math.prod(shape)
        el = self.out_elems[k]
        acc = View.dense(out if el == "f32" else pw, (numel,))
        if el == "f32":
            LP.assign(w, self.nm, acc, View.dense(pw, (numel,)), par="nth")
        for s in range(1, slots):
            LP.assign(w, self.nm, acc, View.dense(f"({pw} + {s * numel})", (numel,)), "+=", par="nth")
        if el != "f32":
            LP.assign(w, self.nm, View.dense(out, (numel,), el), acc, par="nth")
        return w.text()

    def lower_acc(self, n: Node, smax_src: set[Node]) -> None:
        kind, params = n.arg
        x = n.src[0]
        body, pre, post = self.w["loop"], self.w["inv"], self.w["post"]
        nm = self.nm
        if kind in _SOFTMAX or (kind == "max" and x in smax_src):
            g = self.softmax_group(x)
            if kind == "max":
                self.vals[n] = g["m"]
            elif kind == "softmax_sum":
                l_ = self.alloc(_ints(n.shape))
                LP.assign(pre, nm, l_, _const(l_.shape, 0.0))
                LP.assign(body, nm, l_, Expr("mul", (), (l_, g["alpha"]), l_.shape))
                LP.reduce(body, nm, l_, g["p"], len(l_.shape) - 1, "sum", mode="acc")
                self.vals[n] = l_
            else:
                o = self.alloc(_ints(n.shape))
                v = self.view(self.vals[n.src[1]], "loop")
                emit_matmul(body, nm, self.sup, o, g["p"], v, beta="(it > 0 ? 2 : 0)", rowscale=g["alpha"],
                            scratch=self.scratch_ptr)
                self.vals[n] = o
            return
        st = self.alloc(_ints(n.shape))
        if kind == "sum":
            if self.fused_matmul(x):
                a, b = self.operands(x, "loop")
                emit_matmul(body, nm, self.sup, st, a, b, beta="(it > 0)", scratch=self.scratch_ptr,
                            outer=("it", self.F))
            else:
                LP.assign(pre, nm, st, _const(st.shape, 0.0))
                self.sum_over_loop(st, self.vals[x])
        elif kind in ("sum_last", "rms", "max"):
            init = -math.inf if kind == "max" else 0.0
            LP.assign(pre, nm, st, _const(st.shape, init))
            src = self.vals[x]
            if kind == "rms":
                src = Expr("square", (), (src,), _ints(x.shape))
            LP.reduce(body, nm, st, src, len(st.shape) - 1, "max" if kind == "max" else "sum", mode="acc")
            if kind == "rms":
                count = as_int(x.shape[-1]) * self.F
                (eps,) = params
                r = nm("r")
                post.line(f"for (long {r} = 0; {r} < {st.numel}; {r}++) "
                          f"{st.ptr}[{r}] = sqrtf({st.ptr}[{r}] / {c_float(count)} + {c_float(eps)});")
        else:  # pragma: no cover - the builder rejects unknown kinds
            raise UnsupportedError(f"no lowering for accumulator {kind!r}")
        self.vals[n] = st

    def scratch_ptr(self, nfloats: int) -> str:
        return self.alloc((nfloats,)).ptr

    def sum_over_loop(self, st: View, x: Operand) -> None:
        """st += x every iteration, in groups of ``ACC_GROUP`` iterations when the loop is longer: a group
        sums in its own tile and adds into st once (as matmul.py does for K; not one running sum)."""
        body, nm, G = self.w["loop"], self.nm, mk.ACC_GROUP
        if self.F <= G:
            LP.assign(body, nm, st, x, "+=")
            return
        pv = self.alloc(st.shape)
        tp = nm("T")
        body.line(f"float* {tp} = it < {G} ? {st.ptr} : {pv.ptr};")
        with body.block(f"if (it >= {G} && it % {G} == 0)"):
            LP.assign(body, nm, pv, x)
        with body.block("else"):
            LP.assign(body, nm, View(tp, st.shape, st.strides), x, "+=")
        with body.block(f"if (it >= {G} && (it % {G} == {G - 1} || it == {self.F - 1}))"):
            LP.assign(body, nm, st, pv, "+=")

    def softmax_group(self, x: Node) -> dict:
        """Running max m, rescale alpha and p = exp(x - m) for the accumulators over scores ``x``."""
        g = self.groups.get(x)
        if g is not None:
            return g
        nm, body, pre = self.nm, self.w["loop"], self.w["inv"]
        xv = self.view(self.vals[x], "loop")
        rows = _ints(x.shape)[:-1] + (1,)
        m = self.alloc(rows)
        alpha = self.alloc(rows)
        mx = self.alloc(rows)
        p = self.alloc(_ints(x.shape))
        LP.assign(pre, nm, m, _const(rows, -math.inf))
        LP.reduce(body, nm, mx, xv, len(rows) - 1, "max")
        r = nm("r")
        with body.block(f"for (long {r} = 0; {r} < {m.numel}; {r}++)"):
            body.line(f"const float mn = pr_max({m.ptr}[{r}], {mx.ptr}[{r}]);")
            body.line(f"{alpha.ptr}[{r}] = it == 0 ? 0.0f : pr_exp_le0({m.ptr}[{r}] - mn);")
            body.line(f"{m.ptr}[{r}] = mn;")
        LP.assign(body, nm, p, Expr(EXP_LE0, (), (Expr("sub", (), (xv, m), xv.shape),), xv.shape))
        g = {"m": m, "alpha": alpha, "p": p}
        self.groups[x] = g
        return g

    # --- assembly ------------------------------------------------------------------------------
    def assemble(self, in_ptrs: list[str], out_ptrs: list[str]) -> BlockFunction:
        nblk = math.prod(self.grid)
        g = self.grid + (1,) * (3 - len(self.grid))
        work = sum(math.prod(_ints(s.shape)) for s in self.bg.inputs)
        work += sum(math.prod(_ints(s)) for s in self.bg.output_shapes)
        for n in self.bg.nodes:
            if n.op == "matmul":
                work += nblk * self.F * math.prod(_ints(n.shape)) * as_int(n.src[0].shape[-1]) // 8
        w = CWriter()
        params = ([f"const {ctype(e)}* restrict {p}" for p, e in zip(in_ptrs, self.in_elems)]
                  + [f"{ctype(e)}* restrict {p}" for p, e in zip(out_ptrs, self.out_elems)])
        params += [f"float* restrict pw{k}" for k, _ in self.partial]
        params += ["float* restrict scr", "long scr_stride", "int nth"]
        # str() of each size: a traced one prints as its hole (a tuple's repr would print its value)
        grid = ", ".join(str(g) for g in self.grid) + ("," if len(self.grid) == 1 else "")
        w.line(f"/* block graph: grid=({grid}) forloop={self.F} */")
        with w.block(f"PR_NOINLINE void {self.name}({', '.join(params)})"):
            if LP.varying():
                # in a template the thread count is computed at run time: taken here it was a region boundary
                # (an element-wise piece over a prompt's rows: new templates where the work crosses PAR_WORK,
                # llama-1b's RoPE at 64 rows)
                w.line(f"const long nw = ({work}) / {PAR_WORK};")
                w.line(f"const int nt = (int)pr_minl(nth, nw < 1 ? 1 : pr_minl({nblk}, nw));")
            else:
                par = max(1, min(nblk, work // PAR_WORK))
                w.line(f"const int nt = nth < {par} ? nth : {par};")
            w.line("#pragma omp parallel num_threads(nt)")
            with w.block(""):
                w.line("float* restrict S = scr + (long)omp_get_thread_num() * scr_stride;")
                w.line("(void)S;")
                w.line("#pragma omp for schedule(static)")
                with w.block(f"for (long blk = 0; blk < {nblk}; blk++)"):
                    coords = []
                    if g[0] > 1:
                        coords.append(f"b0 = blk / {g[1] * g[2]}" if g[1] * g[2] > 1 else "b0 = blk")
                    if g[1] > 1:
                        coords.append(f"b1 = (blk / {g[2]}) % {g[1]}" if g[2] > 1 else f"b1 = blk % {g[1]}")
                    if g[2] > 1:
                        coords.append(f"b2 = blk % {g[2]}")
                    if coords:
                        w.line(f"const long {', '.join(coords)};")
                    w.extend(_dedent(self.w["inv"]))
                    with w.block(f"for (long it = 0; it < {self.F}; it++)"):
                        w.extend(_dedent(self.w["loop"]))
                    w.extend(_dedent(self.w["post"]))
            for text in self.final:
                w.raw(text)
        return BlockFunction(self.name, w.text(), self.scratch, list(self.partial))


Grouped = dict[Node, tuple[Node, list[Node], list[Node]]]   # grouped_products: sum -> (matmul, chain, factors)


def grouped_products(nodes: list[Node], cons: Mapping[Node, Sequence[Node]], phase: Mapping[Node, str],
                     dims: Callable[[tuple], tuple[int, ...]] = _ints, one_iteration: bool = False) -> Grouped:
    """``sum(mul(...mul(matmul(a, b), f0)..., fk), dim=0)`` over a batched product's group dim: the sum node ->
    (the matmul, the muls and accumulators between, the factors), where every node of it has one consumer and
    each factor is broadcast over the rows or the keys ([Gn, 1 or M, 1 or N]) and computed before the loop or in
    the matmul's phase: a product of int8 weights with a scale per group of K (``matmul.emit_grouped``; the cost
    model prices it by the same rule). ``one_iteration`` (a for-loop of one iteration): ``sum`` accumulators in
    the chain are identities and taken too (the search returns such forms beside the plain one, and at some sizes
    only them); otherwise the chain is of one phase. Whether the operands' layout fits is decided when they are
    lowered (``BlockLowering.lower_grouped``). ``dims``: a shape's values."""
    out: Grouped = {}
    for n in nodes:
        if n.op != "sum" or len(n.src[0].shape) != 3 or n.arg[0] % 3 != 0:   # (dim 0, or -3)
            continue
        chain: list[Node] = []
        factors: list[Node] = []
        x = n.src[0]
        while len(cons[x]) == 1:
            if x.op == "acc" and x.arg[0] == "sum" and one_iteration:
                chain.append(x)
                x = x.src[0]
            elif x.op == "mul" and len(factors) < 2:
                chain.append(x)
                a, b = x.src
                if a.op in ("matmul", "mul", "acc"):
                    a, b = b, a
                factors.append(a)
                x = b
            else:
                break
        ph = phase.get(x)
        if (x.op != "matmul" or not factors or len(cons[x]) != 1 or len(x.shape) != 3
                or (not one_iteration and any(phase.get(c) != ph for c in chain))
                or any(phase.get(f) not in ("inv", ph) for f in factors)):
            continue
        gm = dims(x.shape)
        if all(dims(c.shape) == gm for c in chain) and all(
                len(f.shape) == 3 and dims(f.shape)[0] == gm[0] and dims(f.shape)[1] in (1, gm[1])
                and dims(f.shape)[2] in (1, gm[2]) and f not in chain for f in factors):
            out[n] = (x, chain, factors)
    return out


def _dedent(w: CWriter) -> CWriter:
    out = CWriter()
    out.lines = [ln.strip("\n") for ln in w.lines]
    base = min((len(ln) - len(ln.lstrip(" ")) for ln in out.lines if ln.strip()), default=0)
    out.lines = [ln[base:] for ln in out.lines]
    return out


def _minus_own_max(n: Node) -> bool:
    """``n`` is ``x - max(x)`` along some dim (at most 0, or NaN): its exponential needs no overflow handling
    (``pr_exp_le0``; log_softmax, logsumexp and softmax written out)."""
    return n.op == "sub" and n.src[1].op == "max" and n.src[1].src[0] is n.src[0]


def _const(shape: tuple[int, ...], value: float) -> Expr:
    """A constant expression (0 * x + c has NaN traps; use a literal leaf instead)."""
    return Expr("const", (value,), (), shape)


def lower_layout_or_reduce(n: Node, vals: dict[Node, Operand], w: CWriter, nm: Namer, alloc: Callable,
                           as_view: Callable, par: str | None = None) -> Operand:
    """Tile/kernel operators that are neither element-wise nor matmul: reductions, composites, layout."""
    op = n.op
    shape = _ints(n.shape)
    if op in _REDUCTIONS:
        (dim,) = n.arg
        src = vals[n.src[0]]
        t = alloc(shape)
        cnt = as_int(n.src[0].shape[dim])
        post = (lambda s: f"{s} / {c_float(cnt)}") if OPS[op].mean else None
        LP.reduce(w, nm, t, src, dim, OPS[op].monoid, post=post, par=par)
        return t
    if op in _ROWWISE:
        src = as_view(vals[n.src[0]])
        t = alloc(shape)
        LP.rowwise(w, nm, t, src, n.arg[0], op, eps=attrs_dict(OPS[op], n.arg).get("eps", 0.0), par=par)
        return t
    if op == "permute":
        return as_view(vals[n.src[0]]).permute(n.arg[0])
    if op == "reshape":
        src = as_view(vals[n.src[0]])
        v = src.reshape(shape)
        if v is None:
            t = alloc(src.shape)
            LP.assign(w, nm, t, src, par=par)
            v = t.reshape(shape)
        return v
    if op == "split":
        dim, sizes, index = n.arg
        start = sum(as_int(s) for s in sizes[:index])
        return as_view(vals[n.src[0]]).slice(dim, start, as_int(sizes[index]))
    if op == "concat":
        (dim,) = n.arg
        t = alloc(shape)
        start = 0
        for s in n.src:
            size = as_int(s.shape[dim])
            LP.assign(w, nm, t.slice(dim, start, size), vals[s], par=par)
            start += size
        return t
    raise UnsupportedError(f"no C lowering for operator {op!r}")


def _flops(v: Operand) -> int:
    """Flops per element of a fused expression (0 for a stored tile)."""
    if isinstance(v, View):
        return 0
    return OPS["exp" if v.op == EXP_LE0 else v.op].flops + sum(_flops(x) for x in v.srcs)
