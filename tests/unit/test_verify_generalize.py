"""The numeric check at generalized sizes: a program's big fixed sizes made symbols (``Graph.generalize``,
``prism.verify.numeric.generalized``) so the search's gate checks candidates at small values of them
instead of drawing and evaluating whole weights; the proof and the compiled kernel's final check stay at
the real sizes."""

from __future__ import annotations

import pytest
from verify_cases import MUTANTS

import prism
from prism.errors import PrismError
from prism.ir import dims as D
from prism.search import Limits
from prism.search.gate import UnsplitCheck, generalized_pair
from prism.verify.numeric import choose_instantiations, generalized, numeric_check
from prism.workloads import WORKLOADS

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("name", sorted(WORKLOADS))
def test_generalized_graphs_are_the_given_ones_at_the_real_sizes(name: str) -> None:
    w = WORKLOADS[name]
    s = w.shapes[0]
    cand, ref = w.hand_written(s), w.program(s)
    gen = generalized(cand, ref)
    assert gen is not None
    c, r, sizes = gen
    assert sizes and all(v > 64 for v in sizes.values())
    assert set(sizes) <= r.symbols() and not (set(sizes) & ref.symbols())
    assert c.instantiate(sizes).key == cand.key and r.instantiate(sizes).key == ref.key
    # and the correct kernel passes the numeric check at small values of the new symbols
    envs = choose_instantiations(c, r, 3, sizes=sizes)
    assert all(e[k] <= 32 for e in envs for k in sizes)
    assert numeric_check(c, r, instantiations=envs).passed


@pytest.mark.parametrize("case", MUTANTS, ids=lambda c: c.name)
def test_every_mutant_fails_the_check_at_generalized_sizes(case) -> None:
    cand, ref = case.build()
    gen = generalized(cand, ref)
    assert gen is not None, "every mutant has a fixed size above 64"
    c, r, sizes = gen
    r1 = numeric_check(c, r, instantiations=choose_instantiations(c, r, 3, sizes=sizes), hostile_input=case.hostile)
    assert not r1.passed


def test_a_size_that_only_coincides_with_a_reshape_stays_fixed() -> None:
    g = prism.Graph("heads")
    x = g.input("X", ("n", 2048))
    g.output(g.reshape(x, ("n", 16, 128)), "Y")
    with pytest.raises(PrismError):
        g.generalize({2048: D.sym("K")})      # [n, K] -> [n, 16, 128] cannot keep the element count
    assert generalized(g, g) is None
    g2 = prism.Graph("two")
    a, b = g2.input("A", ("n", 2048)), g2.input("B", (2048, 3200))
    g2.output(g2.reshape(g2.matmul(a, b), ("n", 25, 128)), "Y")   # 3200 = 25 * 128 only by value
    _, r, sizes = generalized(g2, g2)
    assert sizes == {"size2048": 2048}
    assert r.inputs["B"].shape[1] == 3200


def test_generalized_symbols_do_not_clash_with_the_programs() -> None:
    g = prism.Graph("clash")
    x, w = g.input("X", ("size512", 512)), g.input("W", (512, 512))
    g.output(g.matmul(x, w), "Y")
    _, r, sizes = generalized(g, g)
    assert list(sizes) == ["size512_"] and r.inputs["X"].shape[0] == D.sym("size512")


def test_the_search_checks_a_big_linear_at_small_sizes() -> None:
    """A Linear of a [32000, 2048] weight: 63 s of float64 checks at the real size before (whole-weight
    draws and references per candidate and run), now every check at small values of the sizes."""
    g = prism.Graph("lm_head")
    x, w = g.input("X", ("n", 2048)), g.input("W", (32000, 2048))
    g.output(g.matmul(x, g.transpose(w)), "Y")
    res = prism.search(g, Limits(max_kernel_ops=1, max_results=2, time_limit=60), env={"n": 8}, cache=False)
    assert res.candidates
    for c in res.candidates:
        assert c.verdict.ok and c.verdict.how == "formal+numeric"
        assert c.verdict.instantiations
        for env in c.verdict.instantiations:
            assert env["size32000"] <= 32 and env["size2048"] <= 32
    _, nprog = generalized_pair(res.candidates[0].graph, g)
    assert nprog.inputs["W"].shape == (D.sym("size32000"), D.sym("size2048"))
    u = UnsplitCheck(g)
    assert not u.big and u.inputs["W"].shape == (UnsplitCheck.GENERAL_VALUE, UnsplitCheck.GENERAL_VALUE)
    assert u(res.candidates[0].graph)
