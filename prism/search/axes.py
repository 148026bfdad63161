"""Kept axes: the program axes that every output keeps and nothing reduces, which search never reduces.

The abstract expressions search prunes with (:mod:`prism.search.abstract`) forget which dim a reduction
runs over, and ``sum(sum(x)) == sum(x)`` in their e-graph: a tile of ``x @ q.T`` summed once more over its
output columns is "the product" to them. So every over-reduction of a product passes the sub-expression
test, and a block that saves one is a kernel tensor the last operator then tries to build the output from.
Measured need: a grouped int8 Linear at 8 rows (``[8, 2048] x [2048, 2048]``, groups of 32) with two
kernel operators made 61k block structures in one non-final block search (14.8 s), 7156 distinct kernel
tensors, and final block searches over them that found nothing in 20 s each: the search's whole 60 s,
for the same five candidates its one-operator level found in 4 s.

This module names the dims that cannot be reduced. Each dim of each tensor of the searched program (the
core) belongs to an *axis*: the dims that operators line up (an element-wise operator's operands and
result, a product's rows with its result's rows, its contracted dims with each other, a permute's moved
dims) are one axis (union-find). An axis is *kept* when a program output has it (size above 1) and no
operator of the program reduces it -- no reduction or contraction over it, no row-wise operator along it
(softmax, a norm), no layout change that moves data across it (a reshape that splits or merges it, a
concatenation, ``rotate_half``: those make it *unknown*). Along a kept axis the program is a batch of
independent computations: each output slice depends on the input slices at the same position only. A
tensor that sums over a kept axis mixes those slices, and no program output is built from such a value
(the program never forms one), so search may drop it like any other value outside the program's
sub-expressions -- at the price of the same laxness the abstract test has (a correct implementation that
reduced a kept axis and cancelled it again is not searched; results are verified either way).

``kept_axes(core)`` gives, per core input, per dim: ``True`` (a kept axis), ``False`` (an axis the
program reduces or does not output) or ``None`` (unknown, or a dim of size 1). The search carries these
flags on its kernel tensors (through predefined operators and the origins of block outputs) and block
contexts, and prunes (rule ``axes``) a reduction, row-wise operator or contraction over a kept dim, and an
element-wise operator or product batch that lines a kept dim up with a dim of a known other axis.
"""

from __future__ import annotations

from collections.abc import Sequence

from prism.ir.graph import Graph
from prism.ir.node import Node

Flags = tuple[bool | None, ...]


def _one(d: object) -> bool:
    return isinstance(d, int) and d == 1


class _Axes:
    """Union-find over (node, dim), with each class's marks (output / reduced / unknown)."""

    def __init__(self) -> None:
        self.parent: dict[tuple[Node, int], tuple[Node, int]] = {}
        self.marks: dict[tuple[Node, int], set[str]] = {}

    def find(self, k: tuple[Node, int]) -> tuple[Node, int]:
        p = self.parent.setdefault(k, k)
        if p != k:
            p = self.find(p)
            self.parent[k] = p
        return p

    def union(self, a: tuple[Node, int], b: tuple[Node, int]) -> None:
        ra, rb = self.find(a), self.find(b)
        if ra != rb:
            self.parent[rb] = ra
            self.marks.setdefault(ra, set()).update(self.marks.pop(rb, set()))

    def mark(self, k: tuple[Node, int], what: str) -> None:
        self.marks.setdefault(self.find(k), set()).add(what)

    def flag(self, k: tuple[Node, int]) -> bool | None:
        m = self.marks.get(self.find(k), set())
        if "unknown" in m:
            return None
        return "output" in m and "reduced" not in m

    def align(self, out: Node, srcs: Sequence[Node], skip: int = 0) -> None:
        """Right-aligned broadcast: each operand dim of size above 1 is the result's dim at its place (``skip``:
        the last dims of every tensor left out -- a product's rows and columns, when aligning its batch dims)."""
        r = len(out.shape) - skip
        for s in srcs:
            rs = len(s.shape) - skip
            for j in range(1, min(r, rs) + 1):
                if not _one(s.shape[rs - j]) and not _one(out.shape[r - j]):
                    self.union((out, r - j), (s, rs - j))


def kept_axes(core: Graph) -> dict[str, Flags]:
    """Per input of ``core`` (by name), per dim: whether it is a kept axis (module docstring)."""
    ax = _Axes()
    for n in core.nodes:
        op, src = n.op, n.src
        if op == "input":
            continue
        rank = len(n.shape)
        if op in ("output", "cast") or (op not in ("permute", "reshape") and len(src) == 1 and _elementwise(op)):
            for d in range(rank):
                ax.union((n, d), (src[0], d))
        elif len(src) == 2 and _elementwise(op):
            ax.align(n, src)
        elif op == "matmul":
            a, b = src
            ax.union((n, rank - 2), (a, len(a.shape) - 2))
            ax.union((n, rank - 1), (b, len(b.shape) - 1))
            ax.union((a, len(a.shape) - 1), (b, len(b.shape) - 2))
            ax.mark((a, len(a.shape) - 1), "reduced")
            ax.align(n, src, skip=2)   # the batch dims
        elif op in ("sum", "max", "min", "mean"):
            (x,), d = src, n.arg[0]
            for j in range(rank):
                if j != d:
                    ax.union((n, j), (x, j))
            ax.mark((x, d), "reduced")
        elif op in ("softmax", "rms_norm", "layer_norm", "rotate_half"):
            (x,), d = src, n.arg[0]
            for j in range(rank):
                ax.union((n, j), (x, j))
            ax.mark((x, d), "unknown" if op == "rotate_half" else "reduced")
        elif op == "permute":
            (x,), perm = src, n.arg[0]
            for j, p in enumerate(perm):
                ax.union((n, j), (x, p))
        elif op == "reshape":
            _reshape(ax, n, src[0])
        else:  # concat, split, anything new: every dim involved unknown
            for s in (n, *src):
                for j in range(len(s.shape)):
                    ax.mark((s, j), "unknown")
    for o in core.outputs:
        for j, d in enumerate(o.shape):
            if not _one(d):
                ax.mark((o, j), "output")
    return {name: tuple(None if _one(d) else ax.flag((n, j)) for j, d in enumerate(n.shape))
            for name, n in core.inputs.items()}


def _elementwise(op: str) -> bool:
    from prism.ir.ops import OPS
    o = OPS.get(op)
    return o is not None and (o.elementwise or o.group in ("unary", "binary"))


def _reshape(ax: _Axes, n: Node, x: Node) -> None:
    """Dims a reshape carries over unchanged (the same size at the same place among the dims above 1, from
    the left until the first difference) keep their axis; every other dim on either side is unknown."""
    ins = [j for j, d in enumerate(x.shape) if not _one(d)]
    outs = [j for j, d in enumerate(n.shape) if not _one(d)]
    k = 0
    while k < min(len(ins), len(outs)) and _same(x.shape[ins[k]], n.shape[outs[k]]):
        ax.union((n, outs[k]), (x, ins[k]))
        k += 1
    if len(ins) == len(outs) == k:
        return
    for j in ins[k:]:
        ax.mark((x, j), "unknown")
    for j in outs[k:]:
        ax.mark((n, j), "unknown")


def _same(a: object, b: object) -> bool:
    if isinstance(a, int) and isinstance(b, int):
        return a == b
    return a is b


def after(kind: str, arg: tuple, axes: Sequence[Flags | None], shapes: Sequence[tuple], rank: int
          ) -> tuple[bool, Flags | None]:
    """An operator (template ``kind``, absolute ``arg``) on operands of full ``shapes`` with flags ``axes``, its
    result of ``rank`` dims: (the operator is allowed, its result's flags). Not allowed: a reduction, row-wise
    operator or contraction over a kept dim, a pairing of a kept dim with a known other axis: a predefined
    operator on whole tensors (kernel.py; block.py's ``_check_axes`` applies the same rule to tiles)."""
    def get(i: int, d: int) -> bool | None:
        a = axes[i]
        return None if a is None or d < 0 or _one(shapes[i][d]) else a[d]

    def lined_up(lead: int) -> list[bool | None] | None:
        """The flags of the first ``lead`` result dims, right-aligned with the operands' (None: a kept dim
        paired with a known other axis)."""
        out: list[bool | None] = []
        for j in range(lead):   # (a product's batch dims align as the whole tensors do: rows and columns last)
            fa = get(0, j - (rank - len(shapes[0])))
            fb = get(1, j - (rank - len(shapes[1])))
            if fa is not None and fb is not None and fa != fb:
                return None
            out.append(fa if fa is not None else fb)
        return out

    if kind == "unary":
        return True, axes[0]
    if kind == "permute":
        a = axes[0]
        return True, None if a is None else tuple(a[p] for p in arg[0])
    if kind in ("reduce", "rowwise"):
        d = arg[0]
        if get(0, d):
            return False, None
        a = axes[0]
        return True, None if a is None else (a[:d] + (None,) + a[d + 1:] if kind == "reduce" else a)
    if kind not in ("binary", "matmul"):
        return True, None   # reshape and the rest: nothing known of the result
    if kind == "matmul" and (get(0, len(shapes[0]) - 1) or get(1, len(shapes[1]) - 2)):
        return False, None
    out = lined_up(rank if kind == "binary" else rank - 2)
    if out is None:
        return False, None
    if kind == "matmul":
        out += [get(0, len(shapes[0]) - 2), get(1, len(shapes[1]) - 1)]
    return True, tuple(out) if any(f is not None for f in out) else None


def out_axes(structs: Sequence, k: int) -> Flags | None:
    """The flags of output ``k`` of a customized operator, from the origins of its saved tile's dims (the block
    inputs' flags), where every structure of the group agrees; None where nothing is known."""
    got: list[bool | None] | None = None
    for s in structs:
        t = s.tensors[s.outputs[k]]
        f = [s.ctx.kept(d) for d in t.shape]
        if got is None:
            got = f
        else:
            got = [a if a == b else None for a, b in zip(got, f)]
    if not got or all(f is None for f in got):
        return None
    return tuple(got)
