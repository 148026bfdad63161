"""Table-driven tensor identities: every true one is proved (and passes the numeric check), no false one
is proved within the bound (and the numeric check rejects each, so the table itself is right)."""

from __future__ import annotations

import pytest
from verify_cases import FALSE_IDENTITIES, TRUE_IDENTITIES, Case

from prism.verify import Limits, numeric_check, prove

pytestmark = pytest.mark.unit

BOUND = Limits(iterations=40, nodes=40_000, seconds=10.0)


def test_tables_are_large_enough() -> None:
    assert len(TRUE_IDENTITIES) >= 40 and len(FALSE_IDENTITIES) >= 40
    names = [c.name for c in TRUE_IDENTITIES + FALSE_IDENTITIES]
    assert len(names) == len(set(names))


@pytest.mark.parametrize("case", TRUE_IDENTITIES, ids=[c.name for c in TRUE_IDENTITIES])
def test_true_identity_is_proved(case: Case) -> None:
    lhs, rhs = case.build()
    r = prove(lhs, rhs, BOUND)
    assert r.proved, r
    n = numeric_check(lhs, rhs, hostile_input=case.hostile, n_instantiations=2)
    assert n.passed, n


@pytest.mark.parametrize("case", FALSE_IDENTITIES, ids=[c.name for c in FALSE_IDENTITIES])
def test_false_identity_is_not_proved(case: Case) -> None:
    lhs, rhs = case.build()
    r = prove(lhs, rhs, BOUND)
    assert not r.proved, r
    assert r.stop in ("saturated", "iteration_limit", "node_limit", "timeout")
    n = numeric_check(lhs, rhs, hostile_input=case.hostile, n_instantiations=2)
    assert not n.passed, f"{case.name} is not numerically false: {n}"
