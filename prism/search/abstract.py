"""Abstract expressions: the lax, size-free meaning of a tensor that search prunes with (Mirage-style).

An abstract expression is a term over the program's input names and one value-free constant ``c``,
built from ``sum``, ``mul``, ``div``, ``add``, ``sub``, ``exp``, ``sqrt``, ... . It forgets sizes,
reduction dims, layouts and how a tensor is partitioned: a tile of ``X`` is ``X``, ``matmul(a, b)`` is
``sum(mul(a, b))``, an accumulator over the for-loop is one more ``sum`` (and ``sum(sum(x)) == sum(x)``
in the e-graph), ``rms_norm(x)`` is ``div(x, sqrt(sum(mul(x, x))))`` (the eps is dropped), softmax is
``div(exp(x), sum(exp(x)))`` (the max-shift is invisible), permute/reshape/save are the identity.
Scalar constants keep their *presence* (``mul_scalar(x, c) -> mul(x, c)``) but not their value: without
it a scaling would be invisible and search would try it anywhere, any number of times.

Everything is written once against an :class:`Algebra`, so the same translation builds egglog terms
for the target (:mod:`prism.search.egraph`), e-class ids during search, and printable trees.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Generic, Protocol, TypeVar

from prism.errors import UnsupportedError
from prism.ir.ops import OPS, decompose

T = TypeVar("T")

CONST = "c"

# IR operators the search can reason about (kernel level; TILE_OPS minus layout ops inside blocks). An
# element-wise operator's abstract value is OpDef.abstract, or the operator applied by name (opaque).
ELEMENTWISE = tuple(n for n, o in OPS.items() if o.elementwise)
BINARY = tuple(n for n, o in OPS.items() if o.group == "binary")
IDENTITY = ("reshape", "output", "result", "save", "iter")   # and permute, except of an input (permuted_atom)
COMPOSITE = tuple(n for n, o in OPS.items() if o.decomp is not None)
REDUCTIONS = tuple(n for n, o in OPS.items() if o.group == "reduction")
SUPPORTED = frozenset((*ELEMENTWISE, *IDENTITY, *COMPOSITE, *REDUCTIONS, "input", "matmul", "permute"))
WHY_UNSUPPORTED = {
    "concat": "concatenation places data by position, which the size-free abstract algebra cannot see",
    "split": "a split part depends on positions, which the size-free abstract algebra cannot see",
    "customized": "the program already contains a graph-defined kernel; search starts from plain operators",
}


class Algebra(Protocol[T]):
    """Builds abstract values. ``None`` means "not representable" and propagates."""

    def atom(self, name: str) -> T | None: ...

    def u(self, op: str, a: T | None) -> T | None: ...

    def b(self, op: str, a: T | None, b: T | None) -> T | None: ...

    def permuted(self, a: T | None, perm: tuple[int, ...]) -> T | None: ...


def permuted_atom(name: str, perm: Sequence[int]) -> str:
    """The atom of input ``name`` read through ``perm`` (composed with a permutation the name already has).

    A permute is the identity in the size-free abstraction, except directly on an input: there the
    transposed input is an atom of its own. Without it, a program that reads one input two ways (a Gram
    matrix ``x @ x.T``) has a single atom, every product of its tiles passes the sub-expression test, and
    the block search drowned (``sum(relu(x @ x.T), -1)`` on [64, 64]: 881k block states, the 60 s limit
    spent, against 165 states for ``x @ w.T``). The permutation is written from the right with leading
    fixed dims dropped, so a tile of another rank names the same atom."""
    base, _, had = name.partition("^")
    r = len(perm)
    p = tuple(perm)
    if had:
        prev = tuple(int(v) for v in had.strip("()").split(",") if v.strip())
        if len(prev) > r:  # a reshape to a lower rank between the two permutes: not composable
            return f"{name}^({','.join(str(v - r) for v in p)})"
        prev_abs = tuple(range(r - len(prev))) + tuple(v + r for v in prev)
        p = tuple(prev_abs[i] for i in p)   # x^prev read through perm
    rel = tuple(v - r for v in p)
    k = 0
    while k < r and rel[k] == k - r:
        k += 1
    rel = rel[k:]
    return base if not rel else f"{base}^({','.join(str(v) for v in rel)})"


def permuted_input(name: str) -> str | None:
    """The input a permuted atom (:func:`permuted_atom`) reads; None for an input's own atom."""
    base, sep, _ = name.partition("^")
    return base if sep else None


def op_expr(alg: Algebra[T], op: str, arg: tuple, srcs: Sequence[T | None]) -> T | None:
    """The abstract value of kernel/tile operator ``op`` applied to abstract values ``srcs``."""
    if op == "input":
        return alg.atom(arg[0])
    if op in IDENTITY:
        return srcs[0]
    if op == "permute":
        return alg.permuted(srcs[0], tuple(arg[0]))
    a = srcs[0] if srcs else None
    if op == "matmul":
        return alg.u("sum", alg.b("mul", a, srcs[1]))
    d = OPS.get(op)
    if d is not None and (d.elementwise or d.group == "reduction"):
        if d.abstract is not None:  # (a reduction's: its monoid applied, prism.ir.reductions)
            return d.abstract(alg, arg, srcs)
        return alg.u(op, a) if d.group == "unary" else alg.b(op, a, srcs[1])
    if op == "rms_norm":
        return alg.b("div", a, alg.u("sqrt", alg.u("sum", alg.b("mul", a, a))))
    if op == "softmax":
        e = alg.u("exp", a)
        return alg.b("div", e, alg.u("sum", e))
    if op == "rotate_half":
        # a position-dependent operator (its decomposition concatenates): an application of its own, which
        # the candidate must make to the same operand; the verifier checks it through the decomposition
        return alg.u("rotate_half", a)
    if d is not None and d.decomp is not None:  # other composites (layer_norm): their decomposition's value
        return decompose(op, lambda o, s, r: op_expr(alg, o, r, s), list(srcs[:d.arity or len(srcs)]), arg)
    raise UnsupportedError(f"operator {op!r} is not supported by search: "
                           f"{WHY_UNSUPPORTED.get(op, 'it has no abstract expression')}; "
                           f"supported: {sorted(SUPPORTED - set(IDENTITY[2:]))}")


def acc_expr(alg: Algebra[T], kind: str, srcs: Sequence[T | None]) -> T | None:
    """The abstract value of a for-loop accumulator (see prism.ir.block.ACCUMULATORS)."""
    x = srcs[0]
    if kind in ("sum", "sum_last"):
        return alg.u("sum", x)
    if kind == "rms":
        return alg.u("sqrt", alg.u("sum", alg.b("mul", x, x)))
    if kind == "max":
        return alg.u("max", x)
    if kind == "softmax_sum":
        return alg.u("sum", alg.u("exp", x))
    if kind == "softmax_matmul":
        return alg.u("sum", alg.b("mul", alg.u("exp", x), srcs[1]))
    raise UnsupportedError(f"accumulator {kind!r} has no abstract expression")


# --- a printable algebra (tests, error messages, the egglog oracle) ----------------------------

Tree = tuple  # ("atom", name) | (op, child) | (op, child, child)


class TreeAlgebra(Generic[T]):
    """Abstract values as nested tuples (applies ``sum(sum(x)) -> sum(x)`` eagerly)."""

    def atom(self, name: str) -> Tree:
        return ("atom", name)

    def u(self, op: str, a: Tree | None) -> Tree | None:
        if a is None:
            return None
        if op == "sum" and a[0] == "sum":
            return a
        return (op, a)

    def b(self, op: str, a: Tree | None, b: Tree | None) -> Tree | None:
        if a is None or b is None:
            return None
        return (op, a, b)

    def permuted(self, a: Tree | None, perm: tuple[int, ...]) -> Tree | None:
        if a is None or a[0] != "atom":
            return a
        return ("atom", permuted_atom(a[1], perm))


def format_tree(t: Tree | None) -> str:
    if t is None:
        return "<none>"
    if t[0] == "atom":
        return t[1]
    return f"{t[0]}(" + ", ".join(format_tree(c) for c in t[1:]) + ")"


def graph_exprs(graph: object, alg: Algebra[T]) -> list[T | None]:
    """Abstract values of a kernel graph's outputs; UnsupportedError names the first unsupported node."""
    vals: dict = {}
    for n in graph.nodes:  # type: ignore[attr-defined]
        if n.op not in SUPPORTED:
            raise UnsupportedError(
                f"search cannot handle node {n.describe()} (operator {n.op!r}): "
                f"{WHY_UNSUPPORTED.get(n.op, 'it has no abstract expression')}. "
                f"Supported operators: {sorted(SUPPORTED - {'output', 'result', 'save', 'iter'})}")
        vals[n] = op_expr(alg, n.op, n.arg, [vals[s] for s in n.src])
    return [vals[o] for o in graph.outputs]  # type: ignore[attr-defined]


def heads(t: Tree) -> set[str]:
    """Operator names in a tree (atoms excluded)."""
    out: set[str] = set()
    stack = [t]
    while stack:
        x = stack.pop()
        if x[0] != "atom":
            out.add(x[0])
            stack.extend(x[1:])
    return out
