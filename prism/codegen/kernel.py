"""Lowering of a concrete kernel graph to one C source with one entry point.

``int prism_entry(void** io, float* ws, int nth)``: ``io`` holds the input pointers (in
``Graph.inputs`` order) then the output pointers (in ``Graph.outputs`` order); ``ws`` is a workspace of
``ws_floats + nth * scratch_floats`` floats owned by the runtime (kernel-level intermediates, partial-
sum slots, then one scratch area per thread for the block tiles); ``nth`` is the thread count.

Storage: every tensor is dense row-major. A reshape aliases its source; the value an output is (up to
reshapes) is computed straight into the caller's output buffer; everything else gets a workspace
region. Predefined operators become parallel loop nests (element-wise chains fused into their
single consumer); each customized operator becomes one function (``prism.codegen.block``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from prism.codegen import isa as ISA_
from prism.codegen import loops as LP
from prism.codegen.block import _REDUCTIONS as REDUCTIONS
from prism.codegen.block import ALIGN, BlockLowering, _ints, lower_layout_or_reduce
from prism.codegen.cwriter import CWriter, Namer
from prism.codegen.matmul import Support, emit_matmul
from prism.codegen.prelude import prelude
from prism.codegen.tiles import ELEMENTWISE, Expr, Operand, View, ctype, elem_of
from prism.errors import UnsupportedError
from prism.ir.graph import Graph
from prism.ir.node import Node

CODEGEN_VERSION = "1"  # bump when generated code changes meaning (part of the cache key via the source)


@dataclass(frozen=True)
class Generated:
    """A generated source and what the runtime needs to call it."""

    source: str                      # the full C text
    body: str                        # the same without the prelude (golden tests)
    isa: str
    input_names: tuple[str, ...]
    output_names: tuple[str, ...]
    output_shapes: tuple[tuple[int, ...], ...]
    ws_floats: int                   # kernel-level workspace
    scratch_floats: int              # per thread


def generate(g: Graph, isa: str | ISA_.ISA | None = None) -> Generated:
    """C source for a concrete kernel graph (every dim and block-graph parameter an int)."""
    return _KernelLowering(g, ISA_.get(isa)).run()


class _KernelLowering:
    def __init__(self, g: Graph, isa: ISA_.ISA) -> None:
        if not g.outputs:
            raise UnsupportedError("the graph has no outputs; mark results with g.output(tensor)")
        if g.symbols():
            raise UnsupportedError(f"cannot generate code for a graph with symbolic dims {sorted(g.symbols())}; "
                                   "bind them (prism.compile does this from the input shapes)")
        self.g, self.isa = g, isa
        self.nm = Namer()
        self.sup = Support(isa)
        self.nodes = g.nodes
        self.cons: dict[Node, list[Node]] = {n: [] for n in self.nodes}
        for n in self.nodes:
            for s in n.src:
                self.cons[s].append(n)
        self.ws = 0
        self.scratch = 0
        self.vals: dict[Node, Operand] = {}
        self.body = CWriter(1)
        self.funcs: list[str] = []
        self.inputs = list(g.inputs)
        self.outputs = g.outputs
        self.nin = len(self.inputs)
        for n in self.nodes:
            if n.dtype is not None and n.dtype.name == "float64":
                raise UnsupportedError(f"code generation has no float64 path; {n.describe()} is float64 (float64 is "
                                       "for reference graphs)")
        self.in_elems = [elem_of(g.inputs[k].dtype) for k in self.inputs]
        self.out_elems = [elem_of(o.dtype) for o in self.outputs]

    def alloc_ws(self, nfloats: int) -> str:
        off = self.ws
        self.ws += -(-max(1, nfloats) // ALIGN) * ALIGN
        return f"(ws + {off})"

    def thread_scratch(self, nfloats: int) -> str:
        """The calling thread's scratch area (kernel-level code runs between the block functions, which are
        the only other users of it)."""
        self.scratch = max(self.scratch, nfloats)
        return "(scr + (long)omp_get_thread_num() * scr_stride)"

    # --- storage plan: which nodes compute straight into an output buffer ---------------------
    def claim_outputs(self) -> dict[Node, int]:
        """Which nodes compute straight into an output buffer. A low-precision output is claimed only by code
        that stores each element once (an element-wise loop, a block graph's saves) and only when nothing else
        reads the value (it would read it rounded); anything else (a matmul, a reduction, a row-wise
        composite) computes in float32 workspace, then one loop stores it rounded."""
        claims: dict[Node, int] = {}
        for k, o in enumerate(self.outputs):
            root = o.src[0]
            while root.op == "reshape":
                root = root.src[0]
            if self.out_elems[k] != "f32" and ((root.op not in ELEMENTWISE and root.op != "result")
                                               or any(c.op != "output" for c in self.cons[root])):
                continue  # (other consumers read the value unrounded, from workspace)
            if root.op != "input" and root not in claims:
                claims[root] = k
        return claims

    def inline(self, n: Node) -> bool:
        if n.op not in ELEMENTWISE or n in self.claims:
            return False
        cs = self.cons[n]
        if len(cs) != 1:
            return False
        c = cs[0]
        if c.op in REDUCTIONS:
            return True
        return c.op in ELEMENTWISE and _ints(c.shape) == _ints(n.shape)

    def target(self, n: Node, shape: tuple[int, ...]) -> View:
        k = self.claims.get(n)
        if k is not None:
            return View.dense(f"out{k}", shape, self.out_elems[k])
        return View.dense(self.alloc_ws(math.prod(shape)), shape)

    def as_view(self, val: Operand) -> View:
        if isinstance(val, View):
            return val
        t = View.dense(self.alloc_ws(math.prod(val.shape)), val.shape)
        LP.assign(self.body, self.nm, t, val, par="nth")
        return t

    # --- lowering --------------------------------------------------------------------------------
    def run(self) -> Generated:
        self.claims = self.claim_outputs()
        results: dict[Node, dict[int, View]] = {}
        for n in self.nodes:
            op = n.op
            if op == "input":
                i = self.inputs.index(n.arg[0])
                self.vals[n] = View.dense(f"in{i}", _ints(n.shape), self.in_elems[i])
            elif op == "output":
                continue
            elif op == "customized":
                self.lower_customized(n, results)
            elif op == "result":
                self.vals[n] = results[n.src[0]][n.arg[0]]
            elif op in ELEMENTWISE:
                e = Expr(op, n.arg, tuple(self.vals[s] for s in n.src), _ints(n.shape))
                if self.inline(n):
                    self.vals[n] = e
                else:
                    t = self.target(n, e.shape)
                    LP.assign(self.body, self.nm, t, e, par="nth")
                    self.vals[n] = t
            elif op == "matmul":
                a, b = (self.as_view(self.vals[s]) for s in n.src)
                c = self.target(n, _ints(n.shape))
                emit_matmul(self.body, self.nm, self.sup, c, a, b, par="nth", scratch=self.thread_scratch)
                self.vals[n] = c
            elif op == "reshape":
                self.vals[n] = self.as_view(self.vals[n.src[0]]).reshape(_ints(n.shape))  # dense: free
            else:
                self.vals[n] = lower_layout_or_reduce(
                    n, self.vals, self.body, self.nm, lambda shape, n=n: self.target(n, shape), self.as_view,
                    par="nth")
                if op in ("permute", "split"):  # views at tile level; kernel tensors stay dense
                    t = self.target(n, _ints(n.shape))
                    LP.assign(self.body, self.nm, t, self.vals[n], par="nth")
                    self.vals[n] = t
        for k, o in enumerate(self.outputs):
            root = o.src[0]
            while root.op == "reshape":
                root = root.src[0]
            if self.claims.get(root) != k:
                LP.assign(self.body, self.nm, View.dense(f"out{k}", _ints(o.shape), self.out_elems[k]),
                          self.vals[o.src[0]], par="nth")
        return self.assemble()

    def lower_customized(self, n: Node, results: dict[Node, dict[int, View]]) -> None:
        bg = n.arg[0]
        outs: dict[int, View] = {}
        for r in self.cons[n]:
            if r.op == "result":
                outs[r.arg[0]] = self.target(r, _ints(r.shape))
        for k, shape in enumerate(bg.output_shapes):
            if k not in outs:
                outs[k] = View.dense(self.alloc_ws(math.prod(_ints(shape))), _ints(shape))
        results[n] = outs
        fname = f"blk{len(self.funcs)}"
        ins = [f"a{i}" for i in range(len(n.src))]
        outp = [f"o{k}" for k in range(len(bg.outputs))]
        in_views = [self.as_view(self.vals[s]) for s in n.src]
        fn = BlockLowering(bg, fname, self.sup, self.nm, [v.elem for v in in_views],
                           [outs[k].elem for k in range(len(bg.outputs))]).lower(ins, outp)
        self.scratch = max(self.scratch, fn.scratch_floats)
        self.funcs.append(fn.text)
        args = [v.ptr for v in in_views] + [outs[k].ptr for k in range(len(bg.outputs))]
        args += [self.alloc_ws(nf) for _, nf in fn.partial_ws]
        args += ["scr", "scr_stride", "nth"]
        self.body.line(f"{fname}({', '.join(args)});")

    def assemble(self) -> Generated:
        w = CWriter()
        w.line(f"/* prism kernel ({self.isa.name}); codegen v{CODEGEN_VERSION} */")
        w.line(f"#define PRISM_WS_FLOATS ((long){self.ws})")
        w.line(f"#define PRISM_SCRATCH_FLOATS ((long){self.scratch})")
        w.line("")
        sup = self.sup.text()
        if sup:
            w.raw(sup)
        for f in self.funcs:
            w.raw(f)
            w.line("")
        with w.block("int prism_entry(void** io, float* ws, int nth)"):
            for i in range(self.nin):
                t = ctype(self.in_elems[i])
                w.line(f"const {t}* restrict in{i} = (const {t}*)io[{i}];")
            for k in range(len(self.outputs)):
                t = ctype(self.out_elems[k])
                w.line(f"{t}* restrict out{k} = ({t}*)io[{self.nin + k}];")
            w.line("float* restrict scr = ws + PRISM_WS_FLOATS;")
            w.line("const long scr_stride = PRISM_SCRATCH_FLOATS;")
            w.line("(void)scr; (void)scr_stride;")
            w.extend(_strip(self.body))
            w.line("return 0;")
        body = w.text()
        return Generated(prelude() + "\n" + body, body, self.isa.name, tuple(self.inputs),
                         tuple(o.arg[0] for o in self.outputs), tuple(_ints(o.shape) for o in self.outputs),
                         self.ws, self.scratch)


def _strip(w: CWriter) -> CWriter:
    out = CWriter()
    base = min((len(ln) - len(ln.lstrip(" ")) for ln in w.lines if ln.strip()), default=0)
    out.lines = [ln[base:] for ln in w.lines]
    return out
