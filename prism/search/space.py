"""The search space: limits and the operator set derived from the program.

The operator set is *the program's own operators* (with their attributes: ``mul_scalar``'s constant,
``permute``'s permutation, ``rms_norm``'s eps and dim, ``reshape``'s target shape), *the operators their
definitions are made of* (``rms_norm`` -> mul, mean/sum, sqrt, div; ``softmax`` -> max, sub, exp, sum,
div; ``layer_norm`` is searched as itself: it has no for-loop accumulator, and its parts would only add
the two-kernel forms that its one pass per row beats), *matmul's* building blocks, and every for-loop
accumulator of ``prism.ir.block.ACCUMULATORS`` (``rms`` with the program's eps). Operators whose
abstract expression uses a head that does not occur in the target's saturated e-graph are dropped up
front (they could never pass the sub-expression test).
Nothing here looks at which workload the program is.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from prism.errors import PrismError
from prism.ir.block import ACCUMULATORS
from prism.ir.ops import OPS
from prism.search.abstract import BINARY, TreeAlgebra, acc_expr, heads, op_expr
from prism.search.program import identity_cast

REDUCE = tuple(n for n, o in OPS.items() if o.group == "reduction")
ROWWISE = tuple(n for n, o in OPS.items() if o.group == "composite")  # rms_norm, layer_norm, softmax
COMMUTATIVE = frozenset(("add", "mul", "maximum"))
BLOCK_EXCLUDED = frozenset(("reshape", "concat", "split"))  # layout changes a tile cannot express
FREE_OPS = ("reshape",)  # a contiguous reshape is a view: no kernel launch, no traffic


@dataclass(frozen=True)
class Limits:
    """Bounds on the generated space (and the time/state budget). All part of the result-cache key."""

    max_kernel_ops: int = 2         # operators of the kernel graph (predefined + customized)
    max_customized: int = 2         # customized (graph-defined) operators
    max_block_ops: int = 8          # tile operators + accumulators per block graph (iterators/savers excluded)
    max_block_inputs: int = 4
    max_block_outputs: int = 3
    max_accumulators: int = 3       # per block graph
    time_limit: float = 60.0        # seconds of generation
    state_limit: int = 5_000_000    # generated states (kernel + block level)
    max_results: int = 5            # verified sGraphs returned (verification walks the ranking)
    split_reductions: bool = True   # add the split-reduction variant of each result (prism.search.splitk)

    def __post_init__(self) -> None:
        for k, v in asdict(self).items():
            if k == "split_reductions":
                if not isinstance(v, bool):
                    raise PrismError(f"search limit split_reductions must be True or False, got {v!r}")
            elif k == "time_limit":
                if not (isinstance(v, (int, float)) and v > 0):
                    raise PrismError(f"search limit time_limit must be a positive number of seconds, got {v!r}")
            elif not isinstance(v, int) or v < (0 if k == "max_customized" else 1):
                raise PrismError(f"search limit {k} must be an integer >= 1 (max_customized >= 0), got {v!r}")

    def key(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Template:
    """One operator of the search space. ``arg`` holds reduction/row-wise dims relative to the rank
    (negative), so a template applies to tiles and whole tensors alike."""

    op: str          # IR operator name, or "acc"
    arg: tuple       # IR attributes (relative dims); for "acc": (kind, params)
    kind: str        # unary | binary | matmul | reduce | rowwise | permute | reshape | acc1 | acc2
    kernel: bool     # usable as a predefined kernel operator
    block: bool      # usable inside a block graph

    def __str__(self) -> str:
        if self.op == "acc":
            k, params = self.arg
            return f"acc.{k}" + (f"({', '.join(f'{p:g}' for p in params)})" if params else "")
        return self.op + (f"{self.arg}" if self.arg else "")

    def absolute_arg(self, rank: int) -> tuple:
        if self.kind in ("reduce",):
            return (rank + self.arg[0],)
        if self.kind == "rowwise":
            return (rank + self.arg[0], *self.arg[1:])
        return self.arg


def _kind(op: str) -> str:
    if op == "matmul":
        return "matmul"
    if op in BINARY:
        return "binary"
    if op in REDUCE:
        return "reduce"
    if op in ROWWISE:
        return "rowwise"
    if op in ("permute", "reshape"):
        return op
    return "unary"


def _rel(op: str, arg: tuple, rank: int) -> tuple:
    if op in REDUCE:
        return (arg[0] - rank,)
    if op in ROWWISE:
        return (arg[0] - rank, *arg[1:])
    return arg


def derive_opset(graph: Any, table_ops: set[str]) -> list[Template]:
    """The operator templates for ``graph`` (see the module docstring), filtered by ``table_ops``:
    the operator heads present in the target's saturated e-graph."""
    seen: dict[tuple, Template] = {}

    def add(op: str, arg: tuple, kernel: bool = True, block: bool = True) -> None:
        kind = _kind(op) if op != "acc" else ("acc2" if arg[0] == "softmax_matmul" else "acc1")
        t = Template(op, arg, kind, kernel and op != "acc", block and op not in BLOCK_EXCLUDED)
        if (op, arg) in seen:
            old = seen[(op, arg)]
            t = Template(op, arg, kind, old.kernel or t.kernel, old.block or t.block)
        seen[(op, arg)] = t

    eps_values: list[float] = []
    for n in graph.nodes:
        if n.op in ("input", "output"):
            continue
        rank = len(n.src[0].shape) if n.src else len(n.shape)
        if identity_cast(n):
            # the identity on values (prism.search.abstract): never worth placing (as an operator search may
            # apply anywhere it multiplied the states: a Linear of an int8 weight, 500k states, time limit);
            # operators promote the dtypes it would have changed, build_graph casts the outputs
            continue
        add(n.op, _rel(n.op, n.arg, rank))
        if n.op == "rms_norm":
            d = n.arg[0] - rank
            for op, arg in (("mul", ()), ("square", ()), ("sum", (d,)), ("mean", (d,)), ("sqrt", ()),
                            ("rsqrt", ()), ("div", ()), ("add_scalar", (n.arg[1],))):
                add(op, arg)
            eps_values.append(n.arg[1])
        elif n.op == "softmax":
            d = n.arg[0] - rank
            for op, arg in (("max", (d,)), ("sub", ()), ("exp", ()), ("sum", (d,)), ("div", ())):
                add(op, arg)
        elif n.op == "matmul":
            add("mul", ())
            add("sum", (-1,))
        elif n.op == "mean":
            add("sum", (n.arg[0] - rank,))
    for kind, a in ACCUMULATORS.items():
        if a.params == ("eps",):
            for e in dict.fromkeys(eps_values):
                add("acc", (kind, (float(e),)))
        else:
            add("acc", (kind, ()))
    alg = TreeAlgebra()
    out = []
    for t in seen.values():
        srcs = [alg.atom("x"), alg.atom("y")]
        tree = acc_expr(alg, t.arg[0], srcs) if t.op == "acc" else op_expr(alg, t.op, t.absolute_arg(4), srcs)
        if tree is not None and heads(tree) <= table_ops:
            out.append(t)
    return out


class CompiledTemplate:
    """A template with its abstract semantics tabulated over the frozen e-graph: ``umap[c]`` (one operand)
    or ``left[c1][c2]`` / ``right[c2][c1]`` (two operands) is the result class. Search then finds every
    operand that passes the sub-expression test with one dict lookup instead of trying all of them."""

    __slots__ = ("arity", "left", "right", "t", "umap")

    def __init__(self, t: Template, table: Any) -> None:
        from prism.search.abstract import TreeAlgebra, acc_expr, op_expr

        self.t = t
        self.umap: dict[int, int] = {}
        self.left: dict[int, dict[int, int]] = {}
        self.right: dict[int, dict[int, int]] = {}
        two = t.kind in ("binary", "matmul", "acc2")
        self.arity = 2 if two else 1

        def sem(alg: Any, srcs: list) -> Any:
            if t.op == "acc":
                return acc_expr(alg, t.arg[0], srcs)
            return op_expr(alg, t.op, t.absolute_arg(4), srcs)

        classes = _all_classes(table)
        if not two:
            for c in classes:
                r = sem(table, [c])
                if r is not None:
                    self.umap[c] = r
            return
        pattern = sem(TreeAlgebra(), [("atom", "$x"), ("atom", "$y")])
        for c1, c2, r in _match_binary(table, pattern):
            self.left.setdefault(c1, {})[c2] = r
            self.right.setdefault(c2, {})[c1] = r


def _all_classes(table: Any) -> list[int]:
    out = set(table.atoms.values()) | set(table.un.values()) | set(table.bin.values())
    out |= {k[1] for k in table.un} | {k[1] for k in table.bin} | {k[2] for k in table.bin}
    return sorted(out)


def _match_binary(table: Any, pattern: tuple) -> list[tuple[int, int, int]]:
    """All (x class, y class, result class) for a pattern with one binary node over unary chains of
    ``$x`` and ``$y`` (the shape of every binary template's abstract expression)."""
    outer: list[str] = []
    p = pattern
    while len(p) == 2:
        outer.append(p[0])
        p = p[1]
    if len(p) != 3:
        raise AssertionError(f"unexpected binary pattern {pattern}")
    op, pa, pb = p

    def chain(q: tuple) -> tuple[list[str], str]:
        ops = []
        while q[0] != "atom":
            if len(q) != 2:
                raise AssertionError(f"unexpected operand pattern {q}")
            ops.append(q[0])
            q = q[1]
        return ops, q[1]

    inv: dict[tuple[str, int], list[int]] = {}
    for (uop, x), r in table.un.items():
        inv.setdefault((uop, r), []).append(x)

    def pre(ops: list[str], c: int) -> list[int]:
        cur = [c]
        for o in ops:  # outermost first: invert step by step
            cur = [x for y in cur for x in inv.get((o, y), ())]
        return cur

    ca_ops, va = chain(pa)
    cb_ops, vb = chain(pb)
    if va == vb:
        raise AssertionError(f"binary pattern uses one operand twice: {pattern}")
    out = []
    for (bop, a, b), r in table.bin.items():
        if bop != op:
            continue
        for o in reversed(outer):
            r = table.un.get((o, r))
            if r is None:
                break
        if r is None:
            continue
        for x in pre(ca_ops, a):
            for y in pre(cb_ops, b):
                out.append((x, y, r) if va == "$x" else (y, x, r))
    return out
