"""Every shape of every workload: the hand-written structure is proved (symbolic parameters) and passes
the full verification; explanations name sufficient rule sets."""

from __future__ import annotations

import pytest

import prism
from prism.verify import prove
from prism.workloads import WORKLOADS

pytestmark = pytest.mark.slow

CASES = [(wid, i) for wid in sorted(WORKLOADS) for i in range(len(WORKLOADS[wid].shapes))]


@pytest.mark.parametrize(("wid", "index"), CASES, ids=[f"{w}-{i}" for w, i in CASES])
def test_every_shape_is_verified(wid: str, index: int) -> None:
    w = WORKLOADS[wid]
    s = w.shapes[index]
    r = prism.verify(w.hand_written(s), w.program(s), hostile_input=w.hostile_input, n_instantiations=2)
    assert r.verified, r


@pytest.mark.parametrize("wid", ["W4", "W6"])
def test_split_kv_explanation_is_sufficient(wid: str) -> None:
    w = WORKLOADS[wid]
    s = w.shapes[0]
    r = prove(w.hand_written(s), w.program(s), explain=True)
    assert r.proved and r.chain
    assert "softmax.rescale" in r.chain  # the online-softmax rescaling is what the split-KV proof rests on
    assert prove(w.hand_written(s), w.program(s), active=r.chain).proved
    # and the chain is minimal: dropping its last rule breaks the proof
    assert not prove(w.hand_written(s), w.program(s), active=r.chain[:-1]).proved
