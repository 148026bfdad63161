"""The sub-expression oracle: the target's abstract expression in an e-graph saturated ONCE with lax axioms.

A candidate tensor survives only if its abstract expression is a sub-expression of some form of the
target that the lax axioms can reach (Mirage's pruning rule). We build the target's e-graph in egglog,
saturate it with the named axioms of :data:`AXIOMS` under an iteration and node limit, and then
*freeze* it into a Python hash-cons table: ``(op, child classes) -> class``. Testing a candidate is
then a bottom-up lookup that search does incrementally (a new tile's class is one dict lookup from
its operands' classes), so every test is memoized by construction.

Why freeze instead of asking egglog each time: measured on the W1 target, ``EGraph.check_bool`` of one
term costs ~0.3 ms, a frozen lookup ~0.3 us (see docs/search.md for the numbers); search asks tens of
thousands of times. :meth:`LaxEGraph.contains_egglog` keeps the egglog query for cross-checks.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from egglog import EGraph, Expr, StringLike, birewrite, eq, function, rewrite, rule, ruleset, union, vars_

from prism.search.abstract import Tree, permuted_atom


class AE(Expr):
    """An abstract value: an atom (input name or the constant ``c``) or an operator application."""

    def __init__(self, name: StringLike) -> None: ...


@function
def U(op: StringLike, a: AE) -> AE: ...


@function
def B(op: StringLike, a: AE, b: AE) -> AE: ...


@dataclass(frozen=True)
class Axiom:
    name: str
    doc: str


# Lax axioms: sound for the size-free abstraction (not for tensors: `sum(div(a, b)) = div(sum(a), b)`
# needs b constant along the summed dim). They only decide what search may *try*; the verifier decides
# what is correct.
AXIOMS: tuple[Axiom, ...] = (
    Axiom("add-comm", "a + b = b + a"),
    Axiom("mul-comm", "a * b = b * a"),
    Axiom("maximum-comm", "maximum(a, b) = maximum(b, a)"),
    Axiom("add-assoc", "(a + b) + c = a + (b + c)"),
    Axiom("mul-assoc", "(a * b) * c = a * (b * c)"),
    Axiom("mul-div", "(a / b) * c = (a * c) / b"),
    Axiom("div-div", "(a / b) / c = a / (b * c)"),
    Axiom("mul-rsqrt", "a * rsqrt(b) = a / sqrt(b)"),
    Axiom("sum-sum", "sum(sum(a)) = sum(a)  (also: every sum class contains sum of itself)"),
    Axiom("sum-div", "sum(a / b) = sum(a) / b"),
    Axiom("sum-mul", "sum(a * b) = a * sum(b)"),
    Axiom("sum-add", "sum(a + b) = sum(a) + sum(b)"),
    Axiom("mul-add", "a * (b + c) = a*b + a*c"),
    Axiom("div-add", "(a + b) / c = a/c + b/c"),
)


# Every named axiom but the laxest: `sum(a*b) = a*sum(b)` also equates `x*sum(x)` with `sum(x*x)`
# (measured on W1: 5x the states and 5x the false candidates) and no W1-W7 target needs it. Pass
# axioms=[...] to LaxEGraph / prism.search to change the set.
DEFAULT_AXIOMS: tuple[str, ...] = tuple(a.name for a in AXIOMS if a.name != "sum-mul")


def _rules() -> dict[str, list]:
    a, b, c = vars_("a b c", AE)

    def m(x: AE, y: AE) -> AE:
        return B("mul", x, y)

    def d(x: AE, y: AE) -> AE:
        return B("div", x, y)

    def ad(x: AE, y: AE) -> AE:
        return B("add", x, y)

    def s(x: AE) -> AE:
        return U("sum", x)

    return {
        "add-comm": [rewrite(ad(a, b)).to(ad(b, a))],
        "mul-comm": [rewrite(m(a, b)).to(m(b, a))],
        "maximum-comm": [rewrite(B("maximum", a, b)).to(B("maximum", b, a))],
        "add-assoc": [birewrite(ad(ad(a, b), c)).to(ad(a, ad(b, c)))],
        "mul-assoc": [birewrite(m(m(a, b), c)).to(m(a, m(b, c)))],
        "mul-div": [birewrite(m(d(a, b), c)).to(d(m(a, c), b))],
        "div-div": [birewrite(d(d(a, b), c)).to(d(a, m(b, c)))],
        "mul-rsqrt": [birewrite(m(a, U("rsqrt", b))).to(d(a, U("sqrt", b)))],
        "sum-sum": [rewrite(s(s(a))).to(s(a)), rule(eq(c).to(s(a))).then(union(s(c)).with_(c))],
        "sum-div": [birewrite(s(d(a, b))).to(d(s(a), b))],
        "sum-mul": [birewrite(s(m(a, b))).to(m(a, s(b)))],
        "sum-add": [birewrite(s(ad(a, b))).to(ad(s(a), s(b)))],
        "mul-add": [birewrite(m(a, ad(b, c))).to(ad(m(a, b), m(a, c)))],
        "div-add": [birewrite(d(ad(a, b), c)).to(ad(d(a, c), d(b, c)))],
    }


def tree_to_egglog(t: Tree) -> AE:
    if t[0] == "atom":
        return AE(t[1])
    if len(t) == 2:
        return U(t[0], tree_to_egglog(t[1]))
    return B(t[0], tree_to_egglog(t[1]), tree_to_egglog(t[2]))


@dataclass
class ClassTable:
    """The frozen e-graph: a picklable hash-cons table. Implements the abstract Algebra over class ids."""

    atoms: dict[str, int] = field(default_factory=dict)
    un: dict[tuple[str, int], int] = field(default_factory=dict)
    bin: dict[tuple[str, int, int], int] = field(default_factory=dict)
    roots: list[int] = field(default_factory=list)

    def atom(self, name: str) -> int | None:
        return self.atoms.get(name)

    def u(self, op: str, a: int | None) -> int | None:
        return None if a is None else self.un.get((op, a))

    def b(self, op: str, a: int | None, b: int | None) -> int | None:
        return None if a is None or b is None else self.bin.get((op, a, b))

    def ensure_atom(self, name: str) -> int:
        """The class of input ``name``, a new one if the target does not contain it (an input read only
        permuted: the target holds its permuted atom, the search still starts from the input)."""
        if name not in self.atoms:
            ids = [*self.atoms.values(), *self.un.values(), *self.bin.values(), *(k[1] for k in self.un),
                   *(c for k in self.bin for c in k[1:])]
            self.atoms[name] = max(ids, default=-1) + 1
        return self.atoms[name]

    def permuted(self, a: int | None, perm: tuple[int, ...]) -> int | None:
        """A permute of an input's class is the class of its permuted atom (``abstract.permuted_atom``);
        of any other class, the identity."""
        if a is None:
            return None
        names = [n for n, c in self.atoms.items() if c == a]
        if not names:
            return a
        return self.atoms.get(permuted_atom(names[0], perm))

    def ops(self) -> set[str]:
        return {k[0] for k in self.un} | {k[0] for k in self.bin}

    @property
    def size(self) -> int:
        return len(self.atoms) + len(self.un) + len(self.bin)

    def lookup(self, t: Tree | None) -> int | None:
        """The class of a whole tree (None if it is not a sub-expression)."""
        if t is None:
            return None
        if t[0] == "atom":
            return self.atom(t[1])
        if len(t) == 2:
            return self.u(t[0], self.lookup(t[1]))
        return self.b(t[0], self.lookup(t[1]), self.lookup(t[2]))


@dataclass
class SaturationReport:
    iterations: int
    saturated: bool
    nodes: int
    seconds: float
    axioms: tuple[str, ...]


class LaxEGraph:
    """Saturates the target's abstract expressions once; exposes the frozen :class:`ClassTable`."""

    def __init__(self, targets: Sequence[Tree], iterations: int = 12, node_limit: int = 200_000,
                 axioms: Sequence[str] | None = None) -> None:
        t0 = time.perf_counter()
        rules = _rules()
        names = tuple(axioms) if axioms is not None else DEFAULT_AXIOMS
        unknown = sorted(set(names) - set(rules))
        if unknown:
            raise ValueError(f"unknown axioms {unknown}; known: {sorted(rules)}")
        self.ruleset = ruleset(*[r for n in names for r in rules[n]])
        self.egraph = EGraph()
        for i, t in enumerate(targets):
            self.egraph.let(f"root{i}", tree_to_egglog(t))
        saturated, it, nodes = False, 0, 0
        for it in range(1, iterations + 1):  # noqa: B007
            report = self.egraph.run(self.ruleset * 1)
            nodes = self._count()
            if not report.updated:
                saturated = True
                break
            if nodes > node_limit:
                break
        self.table = self._freeze(targets)
        self.report = SaturationReport(it, saturated, self.table.size, time.perf_counter() - t0, names)

    def _count(self) -> int:
        return sum(len(f.rows) for f in self.egraph._egraph.freeze().functions.values())

    def _freeze(self, targets: Sequence[Tree]) -> ClassTable:
        fz = self.egraph._egraph.freeze()
        raw = self.egraph._egraph
        strings: dict = {}

        def string(v: object) -> str:
            s = strings.get(v)
            if s is None:
                s = strings[v] = raw.value_to_string(v)
            return s

        ids: dict = {}

        def cid(v: object) -> int:
            return ids.setdefault(v, len(ids))

        tab = ClassTable()
        for name, fn in fz.functions.items():
            kind = name.rsplit("_", 1)[-1]
            for row in fn.rows:
                if name.endswith("AE___init__"):
                    tab.atoms[string(row.inputs[0])] = cid(row.output)
                elif kind == "U" and len(row.inputs) == 2:
                    tab.un[(string(row.inputs[0]), cid(row.inputs[1]))] = cid(row.output)
                elif kind == "B" and len(row.inputs) == 3:
                    tab.bin[(string(row.inputs[0]), cid(row.inputs[1]), cid(row.inputs[2]))] = cid(row.output)
        tab.roots = [tab.lookup(t) for t in targets]  # type: ignore[misc]
        if any(r is None for r in tab.roots):  # pragma: no cover - a bug in freezing, never in the input
            raise AssertionError("a target is missing from its own frozen e-graph")
        return tab

    def contains_egglog(self, t: Tree) -> bool:
        """The same test asked of egglog directly (slow; for cross-checks and measurements)."""
        return self.egraph.check_bool(tree_to_egglog(t))
