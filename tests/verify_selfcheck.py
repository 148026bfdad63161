"""Axiom self-check: every rule, instantiated on random tensors, must hold numerically (float64).

For a rule and one of its examples, :func:`instantiate` draws sizes for the example's letters, binds
every pattern variable (tensor variables become random tensors, or random *families* when the pattern
puts them under a parallel dim), checks the rule's side conditions, and evaluates both sides with the
NumPy interpretation of the term language (``prism.verify.interp``). A rule that fails does not belong
in the rule set.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from prism.verify.interp import FamilyValue, Interpreter, Pdim, TermShapeError, extent_is_one
from prism.verify.rules import FACTS, Fact, OneOf, Par, Rule, SizeStr, all_rules
from prism.verify.terms import CONSTRUCTORS, UNARY_OPS, Sexp, Str, Var, parse

RTOL = 1e-9
_LETTER = re.compile(r"[A-Za-z_]\w*")


class SelfCheckError(AssertionError):
    """A rule failed numerically, or its example does not fit the rule."""


def _letter_value(expr: str, letters: Mapping[str, int]) -> int:
    total = 0
    for term in expr.split("+"):
        prod = 1
        for f in term.split("*"):
            f = f.strip()
            prod *= int(f) if f.isdigit() else letters[f]
        total += prod
    return total


def _letters_of(example: Mapping[str, object]) -> set[str]:
    out: set[str] = set()
    for v in example.values():
        if isinstance(v, tuple):
            for s in v:
                if isinstance(s, str):
                    out |= set(_LETTER.findall(s))
        elif isinstance(v, SizeStr):
            out |= set(_LETTER.findall(v.expr))
        elif isinstance(v, Par):
            out.add(v.letter)
    return out


def _kinds(e: Sexp, out: dict[str, str]) -> None:
    """Variable kinds from their positions: T, i, f, s (size string), op, pname, p."""
    if not isinstance(e, tuple):
        return
    head, *args = e
    if head == "P":
        kinds: tuple[str, ...] = ("pname", "s")
    elif head == "Un":
        kinds = ("op", "T")
    elif head in CONSTRUCTORS:
        kinds = CONSTRUCTORS[head]
    elif head == "one":
        kinds = ("T", "i")
    elif head == "rank":
        kinds = ("T",)
    else:
        kinds = ("i",) * len(args)  # primitives (- d 1)
    for k, a in zip(kinds, args):
        if isinstance(a, Var):
            out.setdefault(a.name, k)
        _kinds(a, out)


def _free(e: Sexp, pname: dict[str, str]) -> set[str]:
    """Free parallel dims of a pattern (variables contribute none)."""
    if not isinstance(e, tuple) or e[0] not in CONSTRUCTORS:
        return set()
    head, *args = e
    if head in ("Partition", "Replicate"):
        return _free(args[0], pname) | {_pd_name(args[-1], pname)}
    if head in ("Combine", "Reduce", "ReduceMax"):
        return _free(args[0], pname) - {_pd_name(args[-1], pname)}
    out: set[str] = set()
    for a in args:
        out |= _free(a, pname)
    return out


def _pd_name(e: Sexp, pname: dict[str, str]) -> str:
    if isinstance(e, Var):
        return pname[e.name]
    if isinstance(e, tuple) and e[0] == "P":
        n = e[1]
        return pname[n.name] if isinstance(n, Var) else n.value  # type: ignore[union-attr]
    raise SelfCheckError(f"cannot name the parallel dim {e!r}")


def _families(e: Sexp, ctx: set[str], pname: dict[str, str], out: dict[str, set[str]]) -> None:
    if isinstance(e, Var):
        if out.setdefault(e.name, set(ctx)) != ctx:
            raise SelfCheckError(f"variable {e.name} is used at different parallel dims {out[e.name]} and {ctx}")
        return
    if not isinstance(e, tuple) or e[0] not in CONSTRUCTORS:
        return
    head, *args = e
    kinds = CONSTRUCTORS[head]
    if head in ("Partition", "Replicate"):
        inner = ctx - {_pd_name(args[-1], pname)}
    elif head in ("Combine", "Reduce", "ReduceMax"):
        inner = ctx | {_pd_name(args[-1], pname)}
    else:
        inner = ctx
    for k, a in zip(kinds, args):
        if k == "T":
            _families(a, inner, pname, out)


def _pd_terms(e: Sexp) -> list[Sexp]:
    if not isinstance(e, tuple):
        return []
    if e[0] == "P":
        return [e]
    return [t for a in e[1:] for t in _pd_terms(a)]


@dataclass
class Instance:
    """One random instantiation of a rule."""

    bindings: dict[str, object]
    letters: dict[str, int]

    def interpreter(self) -> Interpreter:
        return Interpreter({}, _size_of, self.bindings)


def _size_of(s: str) -> int:
    return int(s)


def instantiate(pattern: Sexp, conds: list[Sexp], example: Mapping[str, object], rng: np.random.Generator,
                positive: bool = False, extra_kinds: Sequence[Sexp] = ()) -> Instance:
    """Random values for every variable of ``pattern`` (and of ``extra_kinds``) following ``example``;
    raises :class:`SelfCheckError` if the side conditions ``conds`` do not hold for them."""
    kinds: dict[str, str] = {}
    _kinds(pattern, kinds)
    for c in [*conds, *extra_kinds]:
        _kinds(c, kinds)
    par_letters = {v.letter for v in example.values() if isinstance(v, Par)}
    par_letters |= {k for k, v in kinds.items() if v == "p" and not isinstance(example.get(k), Par)}
    letters = {name: int(rng.integers(1, 4 if name in par_letters else 5))
               for name in sorted(_letters_of(example) | par_letters)}
    b: dict[str, object] = {}
    pname: dict[str, str] = {}
    for name, kind in kinds.items():
        ex = example.get(name)
        if isinstance(ex, OneOf):
            ex = ex.values[int(rng.integers(len(ex.values)))]
        if kind == "p":
            par = ex if isinstance(ex, Par) else Par(name)
            letters.setdefault(par.letter, int(rng.integers(1, 4)))
            b[name] = Pdim(name, letters[par.letter])
            pname[name] = name
        elif kind == "pname":
            b[name] = pname[name] = str(ex if ex is not None else name)
        elif kind == "op":
            b[name] = ex if ex is not None else UNARY_OPS[int(rng.integers(len(UNARY_OPS)))]
        elif kind == "s":
            if isinstance(ex, SizeStr):
                b[name] = str(_letter_value(ex.expr, letters))
            elif isinstance(ex, str):
                b[name] = str(_letter_value(ex, letters))
            else:
                raise SelfCheckError(f"example gives no size for size variable {name}")
        elif kind == "i":
            if isinstance(ex, int):
                b[name] = ex  # else: bound by a side condition such as (= r (rank x))
        elif kind == "f":
            b[name] = float(ex) if isinstance(ex, (int, float)) else float(rng.uniform(0.5, 2.0) * rng.choice([-1, 1]))
    fams: dict[str, set[str]] = {}
    _families(pattern, _free(pattern, pname), pname, fams)
    sizes = {v.name: v.size for v in b.values() if isinstance(v, Pdim)}
    for pd in _pd_terms(pattern):
        v = Interpreter({}, _size_of, b).eval(pd)
        assert isinstance(v, Pdim)
        sizes[v.name] = v.size
    for name, kind in kinds.items():
        if kind != "T":
            continue
        spec = example.get(name)
        if not isinstance(spec, tuple):
            raise SelfCheckError(f"example gives no shape for tensor variable {name}")
        shape = tuple(s if isinstance(s, int) else _letter_value(s, letters) for s in spec)
        dims = tuple(sorted(fams.get(name, set())))
        data = {}
        for idx in itertools.product(*(range(sizes[d]) for d in dims)):
            a = rng.standard_normal(shape)
            # float32 values (what a program holds; op.cast-float32 holds on them only), checked in float64
            data[idx] = (np.abs(a) + 0.25 if positive else a).astype(np.float32).astype(np.float64)
        b[name] = FamilyValue(dims, {d: sizes[d] for d in dims}, data)
    inst = Instance(b, letters)
    for c in conds:
        if not _condition(c, inst):
            raise SelfCheckError(f"example {dict(example)} does not satisfy the side condition {c}")
    return inst


def _value(e: Sexp, inst: Instance) -> object:
    """The value of a side-condition expression: a variable, a literal, ``(rank x)`` or arithmetic."""
    it = inst.interpreter()
    if isinstance(e, tuple) and e[0] == "rank":
        return len(it.tensor(e[1]).shape)
    if isinstance(e, tuple) and e[0] in ("-", "+", "max", "min"):
        a, b = _value(e[1], inst), _value(e[2], inst)
        return {"-": a - b, "+": a + b, "max": max(a, b), "min": min(a, b)}[e[0]]  # type: ignore[operator]
    return it.eval(e)


def _condition(c: Sexp, inst: Instance) -> bool:
    assert isinstance(c, tuple)
    head, *args = c
    it = inst.interpreter()

    def val(e: Sexp) -> object:
        return _value(e, inst)
    if head == "one":
        x = it.tensor(args[0])
        return extent_is_one(x.shape, int(val(args[1])))  # type: ignore[arg-type]
    if head == "=" and isinstance(args[0], Var) and args[0].name not in inst.bindings:
        inst.bindings[args[0].name] = val(args[1])
        return True
    a, b = val(args[0]), val(args[1])
    ops = {"=": lambda: a == b, "!=": lambda: a != b, "<": lambda: a < b, ">": lambda: a > b,  # type: ignore
           "<=": lambda: a <= b, ">=": lambda: a >= b}  # type: ignore
    return bool(ops[head]())


def _close(x: FamilyValue, y: FamilyValue) -> str | None:
    if x.dims != y.dims or x.sizes != y.sizes:
        return f"families differ: {x.dims} {x.sizes} vs {y.dims} {y.sizes}"
    for k in x.data:
        a, b = x.data[k], y.data[k]
        if a.shape != b.shape:
            return f"shapes differ: {a.shape} vs {b.shape}"
        scale = max(1.0, float(np.max(np.abs(a), initial=0.0)))
        if not np.allclose(a, b, rtol=RTOL, atol=RTOL * scale, equal_nan=False):
            return f"values differ by up to {float(np.max(np.abs(a - b))):.3g}"
    return None


def check_rule(rule: Rule, seed: int, example: int | None = None) -> None:
    """Instantiate ``rule`` (one of its examples) with random values from ``seed``; raise if it fails."""
    if not rule.examples:
        raise SelfCheckError(f"rule {rule.name} has no example to instantiate")
    rng = np.random.default_rng(seed)
    ex = rule.examples[example if example is not None else int(rng.integers(len(rule.examples)))]
    lhs, rhs = parse(rule.lhs), parse(rule.rhs)
    conds = [parse(w) for w in rule.when]
    for positive in (False, True):
        inst = instantiate(lhs, conds, ex, np.random.default_rng(seed), positive)
        try:
            left = inst.interpreter().tensor(lhs)
        except TermShapeError as e:
            raise SelfCheckError(f"rule {rule.name}: the example does not fit the left side: {e}") from None
        if not all(np.all(np.isfinite(a)) for a in left.data.values()) and not positive:
            continue  # e.g. sqrt of a negative: redraw positive values
        try:
            right = inst.interpreter().tensor(rhs)
        except TermShapeError as e:
            raise SelfCheckError(f"rule {rule.name}: the right side is ill-shaped where the left is not: {e}") from None
        err = _close(left, right)
        if err:
            raise SelfCheckError(f"rule {rule.name} fails numerically ({err}); letters {inst.letters}")
        return


def check_fact(fact: Fact, seed: int) -> None:
    """Check an analysis rule: its conclusion must hold on a random instance of its pattern."""
    rng = np.random.default_rng(seed)
    ex = fact.examples[int(rng.integers(len(fact.examples)))] if fact.examples else {}
    pattern = parse(fact.pattern) if fact.pattern else Var("e")
    conds = [parse(w) for w in fact.when]
    kinds_pattern = pattern if fact.pattern else ("Un", Str("neg"), Var("e"))
    inst = instantiate(kinds_pattern, [], ex, rng, extra_kinds=conds)
    it = inst.interpreter()
    e = it.tensor(pattern)
    inst.bindings["e"] = e
    for c in conds:
        if not _condition(c, inst):
            raise SelfCheckError(f"fact {fact.name}: example {dict(ex)} does not satisfy {c}")
    then = parse(fact.then)
    assert isinstance(then, tuple)
    if then[0] == "one":
        d = int(_value(then[2], inst))  # type: ignore[arg-type]
        if not extent_is_one(e.shape, d):
            raise SelfCheckError(f"fact {fact.name}: dim {d} of shape {e.shape} is not 1")
    elif then[0] == "set":
        r = _value(then[2], inst)
        if len(e.shape) != r:
            raise SelfCheckError(f"fact {fact.name}: rank {len(e.shape)} != {r}")
    else:  # pragma: no cover
        raise SelfCheckError(f"fact {fact.name}: unknown conclusion {fact.then}")


def check_all(seeds: range = range(3)) -> list[str]:
    """Check every rule and fact; returns the failures (empty when all hold)."""
    failures = []
    for r in all_rules():
        for s in seeds:
            try:
                check_rule(r, s)
            except SelfCheckError as e:
                failures.append(str(e))
                break
    for f in FACTS:
        for s in seeds:
            try:
                check_fact(f, s)
            except (SelfCheckError, TermShapeError) as e:
                failures.append(f"{f.name}: {e}")
                break
    return failures


__all__ = ["SelfCheckError", "check_all", "check_fact", "check_rule", "instantiate"]
