"""The full code-generation sweep: every workload x shape x {hand-written at its params, each
alternative instantiation, each SIMD path this machine runs, the unfused program} against the
float64 reference on normal and hostile inputs (the CPU tier runs the shapes up to 100 MiB)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "cpu"))
from cg_helpers import assert_close, supported_isas, workload_case

import prism
from prism.workloads import WORKLOADS

pytestmark = pytest.mark.slow

CASES = [(wid, si) for wid, w in WORKLOADS.items() for si in range(len(w.shapes))]
IDS = [f"{wid}-{WORKLOADS[wid].shape_label(WORKLOADS[wid].shapes[si])}" for wid, si in CASES]


@pytest.fixture(scope="module", autouse=True)
def _poison(tmp_path_factory: pytest.TempPathFactory):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PRISM_POISON_WS", "1")
        if not os.environ.get("PRISM_TEST_CACHE_DIR"):
            mp.setenv("PRISM_CACHE_DIR", str(tmp_path_factory.mktemp("prism-cache")))
        yield


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_every_instantiation_and_path(case: tuple[str, int]) -> None:
    wid, si = case
    w = WORKLOADS[wid]
    s = w.shapes[si]
    kernels = [(f"params {w.params(s)}", prism.compile(w.hand_written(s), params=w.params(s)))]
    kernels += [(f"alt {p}", prism.compile(w.hand_written(s), params=p)) for p in w.alt_params(s)]
    kernels += [(f"isa {i}", prism.compile(w.hand_written(s), params=w.params(s), isa=i)) for i in supported_isas()]
    kernels += [("program", prism.compile(w.program(s)))]
    for kind in ("normal", "hostile"):
        x, ref = workload_case(wid, si, kind)
        for what, k in kernels:
            assert_close(k(**x), ref, f"{IDS[CASES.index(case)]} {what} {kind}")
