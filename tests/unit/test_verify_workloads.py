"""The formal verifier proves every hand-written W1-W7 structure (all its grid sizes, loop ranges and
batch dims symbolic) equal to its program; the translation into terms means what the block-graph
simulator computes; the numeric verifier accepts the hand-written structures."""

from __future__ import annotations

import numpy as np
import pytest

from prism.errors import UnsupportedError
from prism.ir.block import BlockBuilder, MapVar
from prism.ir.graph import Graph
from prism.verify import Limits, numeric_check, prove
from prism.verify.translate import evaluate_dag, translate
from prism.workloads import WORKLOADS

pytestmark = pytest.mark.unit

IDS = sorted(WORKLOADS)


@pytest.mark.parametrize("wid", IDS)
def test_hand_written_structure_is_proved(wid: str) -> None:
    w = WORKLOADS[wid]
    s = w.shapes[0]
    hand = w.hand_written(s)
    symbols = set().union(*(bg.symbols() for bg in hand.customized_ops()))
    assert symbols & {"G", "F", "P", "T"}, "the proof must be about a symbolic structure"
    r = prove(hand, w.program(s))
    assert r.proved, r
    assert r.stop == "proved" and r.outputs == {n: True for n in w.program(s).output_names}
    assert r.stats.iterations > 0 and r.stats.enodes > 0


@pytest.mark.parametrize("wid", IDS)
def test_translation_means_what_the_simulator_computes(wid: str) -> None:
    """Evaluate both sides' terms (family semantics in NumPy) at a concrete instantiation."""
    w = WORKLOADS[wid]
    s = w.shapes[0]
    hand, prog = w.hand_written(s), w.program(s)
    dag, outs = translate({"a": hand, "b": prog})
    x = w.inputs(s, "normal", 1, np.float64)
    env = {**w.env(s), **w.alt_params(s)[-1]}
    vals = evaluate_dag(dag, x, env)
    ref = hand.evaluate(x, dtype=np.float64, params=w.alt_params(s)[-1])
    for name, r in ref.items():
        for side in ("a", "b"):
            v = vals[outs[side][name].name]
            assert v.dims == ()  # every parallel dim is folded at the outputs
            np.testing.assert_allclose(v.data[()], r, rtol=1e-9, atol=1e-9 * np.max(np.abs(r)))


@pytest.mark.parametrize("wid", IDS)
def test_numeric_check_accepts_hand_written(wid: str) -> None:
    w = WORKLOADS[wid]
    s = w.shapes[0]
    r = numeric_check(w.hand_written(s), w.program(s), hostile_input=w.hostile_input, n_instantiations=2)
    assert r.passed, r
    assert {c.kind for c in r.checks} == {"normal", "hostile", "tiny"}
    assert len(r.instantiations) == 2


def test_symbolic_maps_are_rejected_clearly() -> None:
    g = Graph("mapvar")
    X = g.input("X", ("n", 64))
    bb = BlockBuilder(grid=("G",), forloop=1, inputs=[X])
    bb.save(bb.exp(bb.iter(0, imap=(MapVar("m0"),))), omap=(MapVar("m1"),))
    (y,) = g.customized(bb.build(), [X])
    g.output(y, "Y")
    ref = Graph("ref")
    ref.output(ref.exp(ref.input("X", ("n", 64))), "Y")
    with pytest.raises(UnsupportedError, match="symbolic maps"):
        prove(g, ref)


def test_stop_reasons_are_typed() -> None:
    w = WORKLOADS["W4"]
    s = w.shapes[0]
    hand, prog = w.hand_written(s), w.program(s)
    assert prove(hand, prog, Limits(iterations=2)).stop == "iteration_limit"
    assert prove(hand, prog, Limits(nodes=10)).stop == "node_limit"
    assert prove(hand, prog, Limits(seconds=0.0)).stop == "timeout"
    r = prove(hand, prog, Limits(iterations=2))
    assert not r.proved and r.stats.iterations == 2


def test_outputs_must_match() -> None:
    w = WORKLOADS["W1"]
    s = w.shapes[0]
    g = Graph("other")
    g.output(g.exp(g.input("X", ("n", s["d"]))), "Z")
    with pytest.raises(Exception, match="outputs differ"):
        prove(g, w.program(s))
