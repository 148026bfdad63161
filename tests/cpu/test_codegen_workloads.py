"""Every workload's hand-written structure, compiled to C and run, against the program's float64
reference, on normal and hostile inputs (tolerance: cg_helpers.RTOL), at every shape whose inputs fit
in 100 MiB. The shapes above that (W2/W3 at d = 4096, W6 b=8 S=4096) and the full sweep of alternative
parameters, SIMD paths and programs are in tests/slow/test_codegen_full.py."""

from __future__ import annotations

import pytest
from cg_helpers import assert_close, input_mib, supported_isas, workload_case

import prism
from prism.workloads import WORKLOADS

pytestmark = pytest.mark.cpu

CASES = [(wid, si) for wid, w in WORKLOADS.items() for si in range(len(w.shapes)) if input_mib(wid, si) <= 100]


def _id(case: tuple[str, int]) -> str:
    wid, si = case
    return f"{wid}-{WORKLOADS[wid].shape_label(WORKLOADS[wid].shapes[si])}"


@pytest.mark.parametrize("case", CASES, ids=[_id(c) for c in CASES])
def test_hand_written_structure_matches_reference(case: tuple[str, int]) -> None:
    wid, si = case
    w = WORKLOADS[wid]
    s = w.shapes[si]
    kernel = prism.compile(w.hand_written(s), params=w.params(s))
    for kind in ("normal", "hostile"):
        x, ref = workload_case(wid, si, kind)
        assert_close(kernel(**x), ref, f"{_id(case)} {kind}")


@pytest.mark.parametrize("wid", list(WORKLOADS))
def test_alternative_parameters(wid: str) -> None:
    w = WORKLOADS[wid]
    s = w.shapes[0]
    for params in w.alt_params(s):
        kernel = prism.compile(w.hand_written(s), params=params)
        for kind in ("normal", "hostile"):
            x, ref = workload_case(wid, 0, kind)
            assert_close(kernel(**x), ref, f"{wid} {params} {kind}")


@pytest.mark.parametrize("isa", [i for i in supported_isas() if i != prism.codegen.detect().name])
@pytest.mark.parametrize("wid", list(WORKLOADS))
def test_other_simd_paths(wid: str, isa: str) -> None:
    """The AVX2 and portable micro-kernels run here too (this machine can execute them)."""
    w = WORKLOADS[wid]
    s = w.shapes[0]
    kernel = prism.compile(w.hand_written(s), params=w.params(s), isa=isa)
    for kind in ("normal", "hostile"):
        x, ref = workload_case(wid, 0, kind)
        assert_close(kernel(**x), ref, f"{wid} {isa} {kind}")
    assert f"prism kernel ({isa})" in kernel.source


@pytest.mark.parametrize("wid", list(WORKLOADS))
def test_program_with_predefined_kernels(wid: str) -> None:
    """The unfused program: every operator a predefined parallel kernel."""
    w = WORKLOADS[wid]
    kernel = prism.compile(w.program(w.shapes[0]))
    for kind in ("normal", "hostile"):
        x, ref = workload_case(wid, 0, kind)
        assert_close(kernel(**x), ref, f"{wid} program {kind}")
