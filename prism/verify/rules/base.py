"""Rules as named data: rewrites (equalities the e-graph may use) and analysis facts (shape facts).

Every rule carries examples: variable kinds and shapes from which the self-check
(``tests/verify_selfcheck.py``) draws random instantiations and checks, in float64, that both sides agree.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from prism.verify.terms import fmt, parse


@dataclass(frozen=True)
class Par:
    """Example value of a parallel-dim variable: its size is the value of ``letter``."""

    letter: str


@dataclass(frozen=True)
class SizeStr:
    """Example value of a size-string variable: the value of a letter expression (``"a"``, ``"a*b"``, ``"1"``)."""

    expr: str


@dataclass(frozen=True)
class OneOf:
    """Example value drawn from a list (unary operator names, dims)."""

    values: tuple


Example = Mapping[str, object]  # var -> tensor shape tuple | int dim | Par | SizeStr | OneOf | float


@dataclass(frozen=True)
class Rule:
    """A named rewrite ``lhs -> rhs`` (valid when every ``when`` fact holds) in ``ruleset``."""

    name: str
    ruleset: str
    lhs: str
    rhs: str
    when: tuple[str, ...] = ()
    examples: tuple[Example, ...] = ()
    doc: str = ""

    def __post_init__(self) -> None:
        parse(self.lhs), parse(self.rhs)  # fail early on a malformed rule
        for w in self.when:
            parse(w)

    def egglog(self) -> str:
        when = f" :when ({' '.join(self.when)})" if self.when else ""
        lhs, rhs = fmt(parse(self.lhs)), fmt(parse(self.rhs))
        return f'(rewrite {lhs} {rhs}{when} :ruleset {self.ruleset} :name "{self.name}")'


@dataclass(frozen=True)
class Fact:
    """A named analysis rule: when ``pattern`` (bound to ``e``) is in the e-graph and ``when`` holds, add ``then``.

    ``then`` is ``(one e D)`` (dim D of e has extent 1) or ``(set (rank e) R)``.
    """

    name: str
    pattern: str
    then: str
    when: tuple[str, ...] = ()
    examples: tuple[Example, ...] = field(default_factory=tuple)

    def egglog(self, ruleset: str) -> str:
        binding = [f"(= e {fmt(parse(self.pattern))})"] if self.pattern else []
        facts = " ".join([*binding, *self.when])
        return f'(rule ({facts}) ({self.then}) :ruleset {ruleset} :name "{self.name}")'


def rewrite(name: str, ruleset: str, lhs: str, rhs: str, *when: str, ex: tuple[Example, ...] | Example = (),
            doc: str = "") -> Rule:
    exs = (ex,) if isinstance(ex, Mapping) else tuple(ex)
    return Rule(name, ruleset, lhs, rhs, tuple(when), exs, doc)


def both(name: str, ruleset: str, lhs: str, rhs: str, *when: str, ex: tuple[Example, ...] | Example = (),
         doc: str = "") -> list[Rule]:
    """A rule and its reverse (named ``name`` and ``name.rev``)."""
    return [rewrite(name, ruleset, lhs, rhs, *when, ex=ex, doc=doc),
            rewrite(name + ".rev", ruleset, rhs, lhs, *when, ex=ex, doc=doc)]
