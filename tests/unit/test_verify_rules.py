"""Axiom self-check: every named rule and analysis fact of the formal verifier holds numerically on
random tensors (hypothesis draws the sizes and values), and deliberately wrong rules are caught."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from verify_selfcheck import SelfCheckError, check_all, check_fact, check_rule

from prism.verify.egraph import _rules_text
from prism.verify.rules import FACTS, RULESETS, Rule, all_rules

pytestmark = pytest.mark.unit

RULES = all_rules()


@pytest.mark.parametrize("rule", RULES, ids=[r.name for r in RULES])
@settings(max_examples=8)
@given(seed=st.integers(0, 2**32 - 1))
def test_rule_holds_on_random_tensors(rule: Rule, seed: int) -> None:
    check_rule(rule, seed)


@pytest.mark.parametrize("rule", RULES, ids=[r.name for r in RULES])
def test_every_example_of_a_rule_fits_it(rule: Rule) -> None:
    assert rule.examples, f"rule {rule.name} has no example for the self-check"
    for i in range(len(rule.examples)):
        check_rule(rule, seed=i, example=i)


@pytest.mark.parametrize("fact", FACTS, ids=[f.name for f in FACTS])
@settings(max_examples=5)
@given(seed=st.integers(0, 2**32 - 1))
def test_analysis_fact_holds(fact, seed: int) -> None:
    check_fact(fact, seed)


def test_check_all_reports_no_failure() -> None:
    assert check_all(range(2)) == []


def test_rules_are_named_uniquely_and_grouped() -> None:
    names = [r.name for r in RULES]
    assert len(names) == len(set(names))
    assert set(RULESETS) == {"parallel", "cancel", "combine", "split", "softmax", "layout", "algebra"}
    for ruleset, rules in RULESETS.items():
        assert rules and all(r.ruleset == ruleset for r in rules)


def test_rules_parse_as_egglog() -> None:
    from egglog.bindings import EGraph

    from prism.verify.terms import declarations
    eg = EGraph()
    eg.run_program(*eg.parse_program(declarations() + _rules_text(None)))


WRONG_RULES = [
    Rule("bad.matmul-commutes", "x", "(Matmul a b)", "(Matmul b a)", examples=({"a": ("n", "n"), "b": ("n", "n")},)),
    Rule("bad.exp-of-sum", "x", '(Un "exp" (Add a b))', '(Add (Un "exp" a) (Un "exp" b))',
         examples=({"a": ("m", "n"), "b": ("m", "n")},)),
    Rule("bad.rescale", "x", '(Mul (Un "exp" (Sub a b)) (Un "exp" (Sub c b)))', '(Un "exp" (Sub a c))',
         examples=({"a": ("m", "n"), "b": ("m", 1), "c": ("m", 1)},)),
    Rule("bad.reduce-replicate", "x", "(Reduce (Replicate x p) p)", "x", examples=({"x": ("m", "n")},),
         doc="a replicated value summed over p is |p| times the value"),
    Rule("bad.swap-same-dim", "x", "(Partition (Partition x d q) d p)", "(Partition (Partition x d p) d q)",
         examples=({"x": ("m", "n*p*q"), "d": -1},), doc="nested splits of one dim do not commute (chunk order)"),
    Rule("bad.combine-order", "x", "(Combine (Combine x d q) d p)", "(Combine (Combine x d p) d q)",
         examples=({"x": ("m", "n"), "d": -1},)),
    Rule("bad.combine-wrong-dim", "x", "(Combine (Partition t d p) e p)", "t",
         examples=({"t": ("m*p", "n*p"), "d": -1, "e": -2},)),
    Rule("bad.lift-sum-over-split-dim", "x", "(Sum (Partition x d p) d)", "(Partition (Sum x d) d p)",
         examples=({"x": ("m", "n*p"), "d": -1},)),
    Rule("bad.partial-matmul-rows", "x", "(Reduce (Matmul (Partition a -2 p) (Replicate b p)) p)", "(Matmul a b)",
         examples=({"a": ("m*p", "k"), "b": ("k", "n")},)),
    Rule("bad.row-scale-full", "x", "(Mul (Matmul a b) r)", "(Matmul (Mul a r) b)",
         examples=({"a": ("n", "n"), "b": ("n", "n"), "r": ("n", "n")},)),
    Rule("bad.max-of-partial-sums", "x", "(ReduceMax (Sum (Partition x d p) d) p)", "(Sum x d)",
         examples=({"x": ("m", "n*p"), "d": -1},)),
    Rule("bad.lift-add-broadcast", "x", "(Add (Partition a d p) (Replicate b p))", "(Partition (Add a b) d p)",
         examples=({"a": ("m", "n*p"), "b": ("m", "n*p"), "d": -1},), doc="b is not constant along d"),
]


@pytest.mark.parametrize("rule", WRONG_RULES, ids=[r.name for r in WRONG_RULES])
def test_a_wrong_rule_fails_the_self_check(rule: Rule) -> None:
    failures = 0
    for seed in range(20):
        try:
            check_rule(rule, seed)
        except SelfCheckError:
            failures += 1
    assert failures > 0, f"the self-check did not catch the wrong rule {rule.name}"


def test_an_example_that_violates_the_side_condition_is_reported() -> None:
    r = next(r for r in RULES if r.name == "lift.Add.part-rep")
    bad = Rule(r.name, r.ruleset, r.lhs, r.rhs, r.when, ({"a": ("m", "n*p"), "b": ("m", "n*p"), "d": -1},))
    with pytest.raises(SelfCheckError, match="side condition"):
        check_rule(bad, 0)


def test_a_wrong_analysis_fact_fails_the_self_check() -> None:
    from prism.verify.rules import Fact
    bad = Fact("bad.one-add", "(Add a b)", "(one e k)", ("(one a k)",),
               ({"a": ("m", 1), "b": ("m", "n+1"), "k": -1},))
    with pytest.raises(SelfCheckError, match="is not 1"):
        check_fact(bad, 0)
    bad_rank = Fact("bad.rank-unsqueeze", "(Unsqueeze x k)", "(set (rank e) r)", ("(= r (rank x))",),
                    ({"x": ("a", "b"), "k": -2},))
    with pytest.raises(SelfCheckError, match="rank"):
        check_fact(bad_rank, 0)


def test_egglog_text_is_cut_between_commands_only() -> None:
    """The verifier feeds egglog its rule set in pieces (egraph._execute: memory grows with each parsed
    program's size times its commands): pieces join back to the text, each ends after a complete command,
    and parentheses inside strings and comments do not count."""
    from prism.verify.egraph import _chunks, _rules_text, declarations

    text = declarations() + "\n" + _rules_text(None)
    pieces = _chunks(text, 1000)
    assert "".join(pieces) == text and len(pieces) > 10
    egraph = pytest.importorskip("egglog.bindings").EGraph()
    for p in pieces:
        assert p.strip().endswith(")")
        egraph.parse_program(p)  # each piece is a program of its own (raises on a cut command)
    assert _chunks('(a "x(" b) ; c ( d\n(e "))")', 1) == ['(a "x(" b)', ' ; c ( d\n(e "))")']
