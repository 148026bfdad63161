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


def _rope(neg: bool = False) -> prism.Graph:
    """RoPE at batch 8 with a prompt length equal to the head dim (128): x * cos + rotate_half(x) * sin."""
    g = prism.Graph("rope")
    x = g.input("x0", (8, 16, 128, 128))
    c, s = g.input("x1", (8, 1, 128, 128)), g.input("x2", (8, 1, 128, 128))
    r = g.rotate_half(x, 3)
    g.output(x * c - r * s if neg else x * c + r * s, "y")
    return g


def test_a_size_that_cannot_be_a_symbol_everywhere_generalizes_per_axis() -> None:
    """The head dim 128 is halved by rotate_half (a known size is needed); the sequence axis, also 128, is not:
    it alone becomes a symbol, in every input at that axis counted from the end."""
    g = _rope()
    with pytest.raises(PrismError):
        g.generalize({128: D.sym("S")})
    c, r, sizes = generalized(g, g)
    assert sizes == {"size128": 128}
    S = D.sym("size128")
    assert r.inputs["x0"].shape == (8, 16, S, 128) and r.inputs["x1"].shape == (8, 1, S, 128)
    assert r.instantiate(sizes).key == g.key and c.instantiate(sizes).key == g.key
    envs = choose_instantiations(c, r, 3, sizes=sizes)
    assert all(e["size128"] <= 32 for e in envs)
    assert numeric_check(c, r, instantiations=envs).passed
    wrong = _rope(neg=True)
    cw, rw, sizes_w = generalized(wrong, g)
    assert sizes_w == sizes
    assert not numeric_check(cw, rw, instantiations=envs).passed


def test_the_search_checks_rope_at_small_sizes_of_the_sequence_axis() -> None:
    """The search's candidates (block graphs included: they take their operands' generalized shapes) are
    checked at small sequence lengths: llama-1b at batch 8 spent 4.5 s checking six RoPE candidates at the
    real [8, 16, 128, 128] before."""
    g = _rope()
    res = prism.search(g, Limits(max_kernel_ops=1, max_results=2, time_limit=60), cache=False)
    assert res.candidates
    assert any(c.graph.customized_ops() for c in res.candidates)
    for c in res.candidates:
        assert c.verdict.ok and c.verdict.how == "formal+numeric"
        assert c.verdict.instantiations and all(e["size128"] <= 32 for e in c.verdict.instantiations)
    u = UnsplitCheck(g)
    assert not u.big and u.inputs["x0"].shape == (8, 16, UnsplitCheck.GENERAL_VALUE, 128)
    assert all(u(c.graph) for c in res.candidates)


def test_a_flattened_batch_generalizes_with_its_product() -> None:
    """A Linear over [8, 128, 96] rows flattened to 1024: 128 is a symbol and the reshape's 1024 its multiple
    (8 * size128), so the numeric check runs at a few rows instead of 1024; at the real sizes the graphs are the
    given ones."""
    g = prism.Graph("flat")
    x, w = g.input("x", (8, 128, 96)), g.input("w", (96, 80))
    y = g.matmul(g.reshape(x, (1024, 96)), w)
    g.output(g.reshape(y, (8, 128, 80)), "y")
    gen = generalized(g, g)
    assert gen is not None
    _, r, fixed = gen
    assert fixed.get("size128") == 128, fixed
    shapes = {str(n.shape) for n in r.nodes if n.op == "reshape"}
    assert any("size128" in s for s in shapes), shapes
    assert r.instantiate(fixed).key == g.key   # the given graph at the real sizes


def _grouped_linear(n: int, k: int, rows: tuple[int, ...] = (8, 128)) -> prism.Graph:
    """The frontend's grouped int8 Linear (``capture._fuse_grouped_linear``): ``x @ (q * s)^T`` as a sum of
    per-group products, groups of 32."""
    gn = k // 32
    m = 1
    for r in rows:
        m *= r
    g = prism.Graph("grouped")
    x, q, s = g.input("x", (*rows, k)), g.input("q", (n, k), "int8"), g.input("s", (n, gn))
    xg = g.permute(g.reshape(x, (m, gn, 32)), (1, 0, 2))
    qg = g.cast(g.permute(g.reshape(q, (n, gn, 32)), (1, 2, 0)), "float32")
    sc = g.permute(g.reshape(s, (n, gn, 1)), (1, 2, 0))
    g.output(g.reshape(g.sum(g.mul(g.matmul(xg, qg), sc), 0), (*rows, n)), "y")
    return g


def test_an_output_size_equal_to_a_grouped_one_generalizes_at_its_reshape() -> None:
    """A [2048, 2048] int8 weight with K cut into groups of 32: K cannot be a symbol (the reshape to [.., 64, 32]
    fixes it), N can at the weight's and the scales' first axis, and the output's reshape back to [8, 128, N]
    takes N's symbol (an image of 2048 tried there): the numeric check runs at a few output columns instead of
    all 2048 (llama-1b's batch-8 q/o projections: 1.2-3.7 s per candidate before, 0.08 s after)."""
    g = _grouped_linear(2048, 2048)
    c, r, fixed = generalized(g, g)
    n = D.sym("size2048")
    assert fixed["size128"] == 128 and fixed["size2048"] == 2048, fixed
    assert r.inputs["q"].shape == (n, 2048) and r.inputs["s"].shape == (n, 64)
    assert r.inputs["x"].shape == (8, D.sym("size128"), 2048)
    assert r.outputs[0].shape == (8, D.sym("size128"), n)
    assert r.instantiate(fixed).key == g.key and c.instantiate(fixed).key == g.key
    envs = choose_instantiations(c, r, 3, sizes=fixed)
    assert all(e["size2048"] <= 32 and e["size128"] <= 32 for e in envs)
    assert numeric_check(c, r, instantiations=envs).passed
    # a wrong product (the groups summed before their scales) fails at the small sizes
    cw, rw, fixed_w = generalized(_scaled_once(), g)
    assert fixed_w == fixed
    assert not numeric_check(cw, rw, instantiations=envs).passed


def _scaled_once() -> prism.Graph:
    """The grouped Linear with the groups' products summed first, then scaled by the sum of their scales: wrong."""
    g = prism.Graph("grouped")
    x, q, s = g.input("x", (8, 128, 2048)), g.input("q", (2048, 2048), "int8"), g.input("s", (2048, 64))
    xg = g.permute(g.reshape(x, (1024, 64, 32)), (1, 0, 2))
    qg = g.cast(g.permute(g.reshape(q, (2048, 64, 32)), (1, 2, 0)), "float32")
    sc = g.permute(g.reshape(s, (2048, 64, 1)), (1, 2, 0))
    g.output(g.reshape(g.mul(g.sum(g.matmul(xg, qg), 0), g.sum(sc, 0)), (8, 128, 2048)), "y")
    return g
