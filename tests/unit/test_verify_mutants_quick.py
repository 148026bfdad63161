"""A quick subset of the mutants (one per workload family); the full set is in tests/slow."""

from __future__ import annotations

import pytest
from verify_cases import MUTANTS, Case

from prism.verify import numeric_check, prove

pytestmark = pytest.mark.unit

QUICK = [c for c in MUTANTS if c.name in {
    "W1.dropped-epsilon", "W2.one-division-missing", "W3.silu-on-wrong-operand", "W7.lora-in-loop",
    "W4.missing-denominator-rescale", "W6.off-by-one-split"}]


def test_quick_subset_is_complete() -> None:
    assert len(QUICK) == 6


@pytest.mark.parametrize("case", QUICK, ids=[c.name for c in QUICK])
def test_mutant_rejected(case: Case) -> None:
    cand, ref = case.build()
    assert not prove(cand, ref).proved
    assert not numeric_check(cand, ref, hostile_input=case.hostile, n_instantiations=1).passed
