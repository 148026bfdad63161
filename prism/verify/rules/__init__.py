"""The rule sets of the formal verifier, as named data (one module per set)."""

from __future__ import annotations

from prism.verify.rules import algebra, analysis, cancel, layout, operators, parallel, softmax, split
from prism.verify.rules.base import Fact, OneOf, Par, Rule, SizeStr

RULESETS: dict[str, tuple[Rule, ...]] = {
    parallel.RULESET: parallel.RULES,
    cancel.RULESET: cancel.RULES,
    parallel.COMBINE: parallel.COMBINE_RULES,
    split.RULESET: split.RULES,
    softmax.RULESET: softmax.RULES,
    layout.RULESET: layout.RULES,
    algebra.RULESET: algebra.RULES + operators.RULES,
}
FACTS: tuple[Fact, ...] = analysis.FACTS
ANALYSIS = analysis.RULESET


def all_rules() -> list[Rule]:
    return [r for rules in RULESETS.values() for r in rules]


def _check_unique() -> None:
    names = [r.name for r in all_rules()] + [f.name for f in FACTS]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise ValueError(f"rule names must be unique; duplicated: {dup}")


_check_unique()

__all__ = ["ANALYSIS", "FACTS", "RULESETS", "Fact", "OneOf", "Par", "Rule", "SizeStr", "all_rules"]
