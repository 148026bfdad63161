"""The search's gate proves a candidate once: the proof it makes before the numeric check (to skip the check of a
candidate that cannot pass) is the verifier's, not made again; the verdict is the same as the verifier's own."""

from __future__ import annotations

import pytest
from verify_cases import EPS, MUTANTS, _w1

import prism.verify as V
from prism.errors import InputError
from prism.search import gate
from prism.verify import egraph

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("correct", [True, False])
def test_one_proof_per_verification(monkeypatch: pytest.MonkeyPatch, correct: bool) -> None:
    if correct:
        cand, prog = _w1(lambda bb, x, acc: bb.div(acc, bb.accumulate("rms", x, eps=EPS)))()
    else:
        cand, prog = next(c for c in MUTANTS if c.name == "W1.wrong-epsilon").build()
    if gate.formal_verifier() is None:
        pytest.skip("no formal verifier in this build")
    calls: list[int] = []
    prove = egraph.prove

    def counted(*a: object, **k: object) -> object:
        calls.append(1)
        return prove(*a, **k)   # type: ignore[arg-type]
    monkeypatch.setattr(egraph, "prove", counted)
    monkeypatch.setattr(V.api, "prove", counted)
    v = gate.verify(cand, prog)
    assert v.ok is correct and len(calls) <= 1, (v, len(calls))
    assert V.verify(cand, prog, generalize=True).verified is correct


def test_a_given_proof_excludes_limits_and_explain() -> None:
    cand, prog = _w1(lambda bb, x, acc: bb.div(acc, bb.accumulate("rms", x, eps=EPS)))()
    proof = egraph.prove(cand, prog)
    with pytest.raises(InputError, match="formal="):
        V.verify(cand, prog, formal=proof, explain=True)
