"""The hand-written structures of W1-W7 match their programs (first shape of each, quick tier).

The full sweep over every shape is in tests/slow/test_workloads_full.py.
"""

from __future__ import annotations

import numpy as np
import pytest

from prism.ir.dims import Dim, structurally_equal
from prism.verify.numeric import reduction_length, tolerance
from prism.workloads import WORKLOADS, get
from prism.workloads.check import RTOL, check_case, rel_error

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("wid", sorted(WORKLOADS))
@pytest.mark.parametrize("kind", ["normal", "hostile"])
def test_hand_written_matches_program_first_shape(wid: str, kind: str) -> None:
    w = WORKLOADS[wid]
    results = list(check_case(w, w.shapes[0], kind))
    assert len(results) >= 2  # at least two instantiations of the block-graph symbols
    assert len({tuple(sorted(r.params.items())) for r in results}) == len(results)
    for r in results:
        assert r.finite, r
        assert r.error <= RTOL, r


@pytest.mark.parametrize("wid", sorted(WORKLOADS))
def test_hand_written_graphs_are_symbolic(wid: str) -> None:
    """Grid sizes and loop ranges are symbols in the hand-written graphs; params make them concrete."""
    w = WORKLOADS[wid]
    s = w.shapes[0]
    hand = w.hand_written(s)
    free = set().union(*(bg.symbols() for bg in hand.customized_ops()))
    assert set(w.params(s)) <= free
    concrete = hand.instantiate({**w.params(s), **w.env(s)})
    assert all(bg.is_concrete() for bg in concrete.customized_ops())


@pytest.mark.parametrize("wid", sorted(WORKLOADS))
def test_program_output_shape_is_symbolic_in_batch(wid: str) -> None:
    w = WORKLOADS[wid]
    s = w.shapes[0]
    (shape,) = w.program(s).output_shapes.values()
    (hshape,) = w.hand_written(s).output_shapes.values()
    batch = w.symbolic[0]
    assert isinstance(shape[0], Dim) and str(shape[0]) == batch
    assert all(structurally_equal(a, b) for a, b in zip(shape, hshape))
    concrete = [int(s[batch]) if isinstance(d, Dim) else d for d in shape]
    out = next(iter(w.program(s).evaluate(w.inputs(s)).values()))
    assert list(out.shape) == concrete


def test_hostile_inputs_overflow_a_naive_softmax_but_not_the_stable_one() -> None:
    """The hostile inputs really are hostile: exp without max-subtraction overflows in float32."""
    w = get("W4")
    s = w.shapes[0]
    x = w.inputs(s, "hostile")
    scores = np.matmul(x["Q"], np.swapaxes(x["K"], -1, -2)) / np.sqrt(s["D"])
    with np.errstate(over="ignore"):
        assert not np.all(np.isfinite(np.exp(scores.astype(np.float32))))
    for s in w.shapes:  # the float32 reference (stable softmax) is within the verifier's tolerance
        x = w.inputs(s, "hostile")
        out = w.program(s).evaluate(x)["O"]
        assert np.all(np.isfinite(out))
        ref = w.program(s).evaluate(x, dtype=np.float64)["O"]
        tol = tolerance(reduction_length(w.program(s), s))
        err = float(np.max(np.abs(out - ref) / (np.abs(ref) + np.sqrt(np.mean(ref ** 2)))))
        assert err <= tol / 4, (s, err, tol)  # measured 1.0e-5 .. 5.5e-5 against 4e-4


def test_a_wrong_instantiation_is_caught() -> None:
    """The check can fail: dropping the rms accumulator's epsilon changes W1's result measurably."""
    w = get("W1")
    s = dict(n=2, d=64, m=64)
    x = w.inputs(s)
    x["X"] *= 1e-3  # small rows make eps matter
    ref = w.program(s).evaluate(x, dtype=np.float64)["Y"]
    import prism.workloads.library as lib
    old = lib.EPS
    try:
        lib.EPS = 1e-2
        bad = w.hand_written(s).evaluate(x, dtype=np.float64, params={"G": 2, "F": 2})["Y"]
    finally:
        lib.EPS = old
    assert rel_error(bad, ref) > RTOL
