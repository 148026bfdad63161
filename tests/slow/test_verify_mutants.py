"""Deliberately wrong variants of the hand-written W1-W7 structures: none is ever proved, and the
numeric verifier rejects each."""

from __future__ import annotations

import pytest
from verify_cases import MUTANTS, Case

from prism.verify import Limits, numeric_check, prove

pytestmark = pytest.mark.slow


def test_there_are_at_least_30_mutants() -> None:
    assert len(MUTANTS) >= 30
    assert len({c.name for c in MUTANTS}) == len(MUTANTS)


@pytest.mark.parametrize("case", MUTANTS, ids=[c.name for c in MUTANTS])
def test_mutant_is_never_proved_and_numerically_rejected(case: Case) -> None:
    cand, ref = case.build()
    r = prove(cand, ref, Limits())
    assert not r.proved, r
    assert r.stop in ("saturated", "iteration_limit", "node_limit", "timeout")
    n = numeric_check(cand, ref, hostile_input=case.hostile)
    assert not n.passed, f"numeric check accepted the mutant {case.name}: {n}"
