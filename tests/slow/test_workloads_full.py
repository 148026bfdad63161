"""Every workload x every shape of WORKLOADS.md: hand-written structure vs program, float64, normal and
hostile inputs, at the default and two alternative instantiations of its symbols."""

from __future__ import annotations

import pytest

from prism.workloads import WORKLOADS
from prism.workloads.check import check_case

pytestmark = pytest.mark.slow

CASES = [(w.id, i) for w in WORKLOADS.values() for i in range(len(w.shapes))]


@pytest.mark.parametrize(("wid", "i"), CASES, ids=[f"{w}-{i}" for w, i in CASES])
def test_every_shape(wid: str, i: int) -> None:
    w = WORKLOADS[wid]
    for kind in ("normal", "hostile"):
        results = list(check_case(w, w.shapes[i], kind))
        assert len(results) >= 2
        for r in results:
            assert r.ok, r
