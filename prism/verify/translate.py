"""Translation of kernel graphs (with customized operators) into terms of the verifier's term language.

A block graph becomes, per output, ``combine``/``reduce`` over its grid dims of a per-block term. In the
per-block term an input iterator is the input's term wrapped, for grid dim 0, 1, 2 in turn, in
``Partition`` (imap = data dim) or ``Replicate`` (imap = None), then in ``Partition`` over the for-loop
when it has an fmap; so chunk order is exactly the block-graph semantics (lower grid dim outermost,
for-loop innermost). Loop values are families over the for-loop; a loop-invariant value used inside
the loop is ``Replicate``-d over it. Accumulators are written as folds over the loop::

    sum(t)            = Reduce(t, loop)
    sum_last(t)       = Sum(u, -1)                                  u = Combine(t, -1, loop)
    max(t)            = Max(u, -1)
    rms(t)            = sqrt(Mean(square(u), -1) + eps)
    softmax_sum(t)    = Sum(exp(u - Max(u, -1)), -1)
    softmax_matmul(t, v) = exp(u - Max(u, -1)) @ Combine(v, -2, loop)

which is what the online recurrences compute (``u`` concatenates the iterations' tiles along the last
dim; the global row max of ``u`` is the final running max). Parallel dims are named per customized
operator and never take values, so a proof covers every grid size, loop range and batch size.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from prism.errors import UnsupportedError
from prism.ir import dims as D
from prism.ir.block import BlockGraph
from prism.ir.dims import DimLike
from prism.ir.dtypes import float32
from prism.ir.elementwise import is_exact_cast
from prism.ir.graph import Graph
from prism.ir.node import Node
from prism.ir.ops import OPS, decompose, infer
from prism.verify.terms import Sexp, Str, Var, fmt

Term = Var  # a reference to a let-bound term ($tN)


def size_str(d: DimLike) -> str:
    return D.format_dim(d)


@dataclass
class TermDag:
    """Hash-consed terms: ``lets[i] = (name, sexp)`` with children referring to earlier names."""

    lets: list[tuple[str, Sexp]] = field(default_factory=list)
    facts: list[str] = field(default_factory=list)           # analysis facts known from static shapes
    sizes: dict[str, DimLike] = field(default_factory=dict)  # size strings used in terms -> dims
    _index: dict[Sexp, Var] = field(default_factory=dict)
    _shaped: set[str] = field(default_factory=set)

    def add(self, sexp: Sexp, shape: Sequence[DimLike] | None = None) -> Var:
        ref = self._index.get(sexp)
        if ref is None:
            ref = Var(f"$t{len(self.lets)}")
            self.lets.append((ref.name, sexp))
            self._index[sexp] = ref
        if shape is not None:
            self.shaped(ref, shape)
        return ref

    def shaped(self, ref: Var, shape: Sequence[DimLike]) -> Var:
        """Record the static shape facts of ``ref`` (rank; dims of extent 1)."""
        if ref.name not in self._shaped:
            self._shaped.add(ref.name)
            self.facts.append(f"(set (rank {ref.name}) {len(shape)})")
            self.facts += [f"(one {ref.name} {i - len(shape)})" for i, s in enumerate(shape)
                           if isinstance(s, int) and s == 1]
        return ref

    def size(self, d: DimLike) -> Str:
        s = size_str(d)
        self.sizes[s] = d
        return Str(s)

    def egglog(self) -> str:
        return "\n".join([f"(let {name} {fmt(sexp)})" for name, sexp in self.lets] + self.facts)

    def expand(self, ref: Var) -> Sexp:
        """The full tree of a let-bound term (for printing small terms)."""
        table = dict(self.lets)

        def go(e: Sexp) -> Sexp:
            if isinstance(e, Var) and e.name in table:
                return go(table[e.name])
            if isinstance(e, tuple):
                return tuple(go(x) for x in e)
            return e
        return go(ref)


def _neg(d: int, rank: int) -> int:
    return d - rank if d >= 0 else d


class Translator:
    """Translates graphs into one :class:`TermDag` (both sides of a proof share it)."""

    def __init__(self, dag: TermDag | None = None) -> None:
        self.dag = dag or TermDag()

    # --- kernel graphs ------------------------------------------------------------------------
    def graph(self, g: Graph, side: str) -> dict[str, Var]:
        """Terms of the outputs of ``g``; ``side`` prefixes the parallel-dim names of its kernels."""
        vals: dict[Node, Var] = {}
        results: dict[Node, list[Var]] = {}
        kernels = 0
        for n in g.nodes:
            if n.op == "input":
                vals[n] = self.dag.add(("In", Str(n.arg[0])), n.shape)
            elif n.op == "output":
                vals[n] = vals[n.src[0]]
            elif n.op == "customized":
                results[n] = self.block_graph(n.arg[0], [vals[s] for s in n.src], f"{side}{kernels}")
                kernels += 1
            elif n.op == "result":
                vals[n] = self.dag.shaped(results[n.src[0]][n.arg[0]], n.shape)
            elif is_exact_cast(n):
                # holds every value of its operand (int8 -> bfloat16): the identity on values, what the
                # search drops it as (prism.search.program.identity_cast); casts to float32 are that already
                # by the rule op.cast-float32 (on any operand)
                vals[n] = vals[n.src[0]]
            else:
                vals[n] = self.op(n.op, n.arg, [vals[s] for s in n.src], [s.shape for s in n.src], n.shape)
        return {n.arg[0]: vals[n] for n in g.outputs}

    def op(self, op: str, arg: tuple, srcs: list[Var], shapes: list[tuple[DimLike, ...]],
           out: tuple[DimLike, ...]) -> Var:
        """The term of one (kernel or tile) operator applied to terms."""
        add = self.dag.add
        r = len(shapes[0]) if shapes else 0
        x = srcs[0] if srcs else None
        if op == "matmul":
            return add(("Matmul", srcs[0], srcs[1]), out)
        if op == "mul_scalar":
            return add(("Scale", x, float(arg[0])), out)
        if op == "add_scalar":
            return add(("Shift", x, float(arg[0])), out)
        d = OPS.get(op)
        if d is not None and d.group == "unary":
            return add(("Un", Str(d.term_name(arg)), x), out)
        if d is not None and d.group == "binary":
            return add((d.term_head, srcs[0], srcs[1]), out)
        if d is not None and d.group == "reduction":
            term = add((d.term_head, x, _neg(arg[0], r)), out)
            n = shapes[0][arg[0]]
            if d.mean and isinstance(n, int):
                # over a dim of a known size n, mean(x) = sum(x) * (1/n): the terms carry no extents, so
                # the translator, which knows the size, states the equation (the frontend writes a mean
                # over several dims as sums scaled once)
                fold = next(o for o in OPS.values() if o.group == "reduction" and o.monoid == d.monoid and not o.mean)
                scaled = add(("Scale", add((fold.term_head, x, _neg(arg[0], r)), out), 1.0 / n), out)
                self.dag.facts.append(f"(union {term.name} {scaled.name})")
            return term
        if d is not None and d.decomp is not None:  # a composite: the terms of its decomposition
            return self._decomposed(op, arg, srcs[0], shapes[0], out)
        if op == "permute":
            return self._permute(x, tuple(arg[0]), shapes[0], out)  # type: ignore[arg-type]
        if op == "reshape":
            return self._reshape(x, shapes[0], out)  # type: ignore[arg-type]
        if op == "concat":
            return self._concat(srcs, shapes, _neg(arg[0], r), out)
        if op == "split":
            dim, sizes, index = arg
            start: DimLike = 0
            for s in sizes[:index]:
                start = start + s
            return add(("Slice", x, _neg(dim, r), self.dag.size(start), self.dag.size(sizes[index])), out)
        raise UnsupportedError(f"the formal verifier has no term for operator {op!r}")

    def _decomposed(self, op: str, arg: tuple, x: Var, shape: tuple[DimLike, ...], out: tuple[DimLike, ...]) -> Var:
        def apply(o: str, srcs: list[tuple[Var, tuple]], a: tuple) -> tuple[Var, tuple]:
            shp = infer(OPS[o], tuple(s[1] for s in srcs), (float32,) * len(srcs), a)[0]
            return self.op(o, a, [s[0] for s in srcs], [s[1] for s in srcs], shp), shp
        ref, _ = decompose(op, apply, [(x, shape)], tuple(arg))
        return self.dag.shaped(ref, out)

    def _permute(self, x: Var, perm: tuple[int, ...], shape: tuple[DimLike, ...], out: tuple[DimLike, ...]) -> Var:
        r = len(perm)
        cur = list(range(r))
        t = x
        for i in range(r):
            if cur[i] != perm[i]:
                j = cur.index(perm[i])
                cur[i], cur[j] = cur[j], cur[i]
                a, b = sorted((i, j))
                t = self.dag.add(("Transpose", t, a - r, b - r))
        return self.dag.shaped(t, out)

    def _reshape(self, x: Var, src: tuple[DimLike, ...], out: tuple[DimLike, ...]) -> Var:
        add, size = self.dag.add, self.dag.size
        eq = D.structurally_equal
        rs, ro = len(src), len(out)
        if rs == ro and all(eq(a, b) for a, b in zip(src, out)):
            return x
        if ro == rs + 1:
            for d in range(rs):  # split dim d into (out[d], out[d+1]); prefer a non-trivial outer factor
                if (all(eq(a, b) for a, b in zip(src[:d], out[:d]))
                        and all(eq(a, b) for a, b in zip(src[d + 1:], out[d + 2:]))
                        and eq(D.product([out[d], out[d + 1]]), src[d])
                        and not (isinstance(out[d], int) and out[d] == 1)):
                    return add(("SplitAxis", x, d - rs, size(out[d]), size(out[d + 1])), out)
            for k in range(ro):  # insert an extent-1 axis at k
                if isinstance(out[k], int) and out[k] == 1 and all(
                        eq(a, b) for a, b in zip(src, out[:k] + out[k + 1:])):
                    return add(("Unsqueeze", x, k - ro), out)
        if ro == rs - 1:
            for k in range(rs):  # remove the extent-1 dim k
                if isinstance(src[k], int) and src[k] == 1 and all(
                        eq(a, b) for a, b in zip(src[:k] + src[k + 1:], out)):
                    return add(("Squeeze", x, k - rs), out)
        return add(("Reshape", x, Str(",".join(size(d).value for d in out))), out)

    def _concat(self, srcs: list[Var], shapes: list[tuple[DimLike, ...]], d: int, out: tuple[DimLike, ...]) -> Var:
        t, ext = srcs[-1], shapes[-1][d]
        for s, shp in zip(reversed(srcs[:-1]), reversed(shapes[:-1])):
            t = self.dag.add(("Concat", s, t, d, self.dag.size(shp[d]), self.dag.size(ext)))
            ext = shp[d] + ext
        return self.dag.shaped(t, out)

    # --- block graphs -------------------------------------------------------------------------
    def block_graph(self, bg: BlockGraph, inputs: list[Var], name: str) -> list[Var]:
        """Terms of the outputs of ``bg`` applied to ``inputs``; ``name`` names its parallel dims."""
        if bg.map_symbols():
            raise UnsupportedError(
                f"the formal verifier does not support symbolic maps yet (map symbols {sorted(bg.map_symbols())}); "
                "instantiate the map symbols (block_graph.instantiate({...})) and verify each choice")
        add, size = self.dag.add, self.dag.size
        grid = [("P", Str(f"{name}.g{p}"), size(g)) for p, g in enumerate(bg.grid)]
        loop = ("P", Str(f"{name}.L"), size(bg.forloop))
        # a grid dim of size 1 (a block graph with no grid: search.maps.MapCSP.gridless_column) is one block: its
        # partition and combine are the whole tensor, its replicate and reduce the value itself. Written as
        # terms they would prove only with a rule for size-1 parallel dims (Reduce (Replicate x p) p = x |p|)
        one = [isinstance(g, int) and g == 1 for g in bg.grid]
        vals: dict[Node, Var] = {}
        inloop: dict[Node, bool] = {}

        def looped(n: Node) -> Var:
            """The term of n as a family over the loop."""
            return vals[n] if inloop[n] else add(("Replicate", vals[n], loop), n.shape)

        outs: list[Var] = []
        for n in bg.nodes:
            if n.op == "iter":
                idx, imap, fmap = n.arg
                spec = bg.inputs[idx]
                r = len(spec.shape)
                t = inputs[idx]
                for p, e in enumerate(imap):
                    if not one[p]:
                        t = add(("Partition", t, e - r, grid[p]) if e is not None else ("Replicate", t, grid[p]))
                if fmap is not None:
                    t = add(("Partition", t, fmap - r, loop))
                vals[n], inloop[n] = self.dag.shaped(t, n.shape), fmap is not None
            elif n.op == "acc":
                vals[n], inloop[n] = self._acc(n, [looped(s) for s in n.src], loop), False
            elif n.op == "save":
                _, omap, fmap = n.arg
                r = len(n.shape)
                t = vals[n.src[0]]
                if fmap is not None:
                    t = add(("Combine", t, fmap - r, loop))
                for p in reversed(range(len(bg.grid))):
                    e = omap[p]
                    if one[p]:
                        continue
                    t = add(("Combine", t, e - r, grid[p]) if e is not None else ("Reduce", t, grid[p]))
                outs.append(t)
            else:
                any_loop = any(inloop[s] for s in n.src)
                srcs = [looped(s) if any_loop else vals[s] for s in n.src]
                vals[n] = self.op(n.op, n.arg, srcs, [s.shape for s in n.src], n.shape)
                inloop[n] = any_loop
        return [outs[s.arg[0]] for s in bg.outputs]

    def _acc(self, n: Node, srcs: list[Var], loop: Sexp) -> Var:
        kind, params = n.arg
        add = self.dag.add
        x = srcs[0]
        if kind == "sum":
            return add(("Reduce", x, loop), n.shape)
        u = add(("Combine", x, -1, loop))
        if kind == "sum_last":
            return add(("Sum", u, -1), n.shape)
        if kind == "max":
            return add(("Max", u, -1), n.shape)
        if kind == "rms":
            ms = add(("Mean", add(("Un", Str("square"), u)), -1))
            return add(("Un", Str("sqrt"), add(("Shift", ms, float(params[0])))), n.shape)
        e = add(("Un", Str("exp"), add(("Sub", u, add(("Max", u, -1))))))
        if kind == "softmax_sum":
            return add(("Sum", e, -1), n.shape)
        if kind == "softmax_matmul":
            return add(("Matmul", e, add(("Combine", srcs[1], -2, loop))), n.shape)
        raise UnsupportedError(f"the formal verifier has no term for accumulator {kind!r}")  # pragma: no cover


def translate(graphs: dict[str, Graph]) -> tuple[TermDag, dict[str, dict[str, Var]]]:
    """Translate several graphs (by side name) into one term DAG; returns the DAG and the output terms."""
    tr = Translator()
    return tr.dag, {side: tr.graph(g, side) for side, g in graphs.items()}


def evaluate_dag(dag: TermDag, inputs: dict[str, object], env: dict[str, int]) -> dict[str, object]:
    """Evaluate every let-bound term numerically (float64) at concrete symbol values ``env``."""
    from prism.verify.interp import Interpreter

    def size_of(s: str) -> int:
        if s.lstrip("-").isdigit():
            return int(s)
        return D.evaluate(dag.sizes[s], env)
    it = Interpreter(inputs, size_of)  # type: ignore[arg-type]
    for name, sexp in dag.lets:
        it.bindings[name] = it.eval(sexp)
    return it.bindings
