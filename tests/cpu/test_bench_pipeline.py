"""The bench's `prism` column is Prism's pipeline (search -> verify -> tune -> compile) on the program."""

from __future__ import annotations

import numpy as np
import pytest

from prism.bench.data import case_inputs
from prism.bench.systems import BY_NAME
from prism.workloads import get

pytestmark = pytest.mark.cpu


def test_pipeline_column_searches_tunes_and_matches_the_reference() -> None:
    w = get("W1")
    shape = dict(n=4, d=256, m=256)
    inputs = case_inputs(w, shape, seed=0)
    system = BY_NAME["prism"]
    assert system.kind == "prism" and "search" in system.label
    prepared = system.prepare(w, shape, inputs, 1)
    assert "search_s" in prepared.info and "tune_and_compile_s" in prepared.info
    got = prepared.fetch(prepared.call())["Y"]
    ref = w.program(shape).evaluate({k: inputs[k] for k in w.input_shapes(shape)}, dtype=np.float64)["Y"]
    assert np.max(np.abs(got - ref)) <= 1e-4 * np.max(np.abs(ref))
    assert BY_NAME["hand"].kind == "reference"
