"""Inputs read through views (prism.search.program.InputView): a Linear weight read transposed, an int8
weight's per-channel scale. The core reads the viewed tensor; the built block graphs read the stored one."""

from __future__ import annotations

import numpy as np
import pytest

from prism.ir.dtypes import exact_cast, quantize_int8
from prism.ir.graph import Graph
from prism.search import Limits, search
from prism.search.program import InputView, peel

pytestmark = pytest.mark.unit

LIMITS = Limits(max_kernel_ops=1, max_block_ops=6, max_results=2, time_limit=60)


def _linear(int8: bool, rms: bool = True) -> Graph:
    """``rms_norm(x) @ w.T`` with ``w`` stored [out, in] (a Linear), optionally int8 weight-only."""
    g = Graph("linear")
    x = g.input("X", ("n", 32))
    a = g.rms_norm(x) if rms else x
    if int8:
        q = g.permute(g.cast(g.input("Q", (48, 32), "int8"), "float32"), (1, 0))
        s = g.permute(g.input("S", (48, 1)), (1, 0))
        g.output(g.mul(g.matmul(a, q), s), "Y")
    else:
        g.output(g.matmul(a, g.permute(g.input("W", (48, 32)), (1, 0))), "Y")
    return g


def test_a_transposed_input_is_a_view() -> None:
    p = peel(_linear(int8=False))
    assert p.views == {"W": InputView((1, 0))}
    assert "permute" not in [n.op for n in p.core.nodes]
    assert p.core.inputs["W"].shape == (32, 48)


def test_an_int8_weight_and_its_scale_are_one_view() -> None:
    p = peel(_linear(int8=True))
    assert p.views == {"Q": InputView((1, 0), "S", 0)}   # one scale per row of the stored [out, in] weight
    assert list(p.core.inputs) == ["X", "Q"]              # the scale is not a core input
    ops = [n.op for n in p.core.nodes]
    assert "mul" not in ops and "cast" not in ops and "permute" not in ops
    assert p.core.outputs[0].src[0].op == "matmul"


def test_exact_casts_are_dropped_and_rounding_ones_kept() -> None:
    """A cast that holds every value of its operand (dtypes.exact_cast) is the identity on values: int8 ->
    bfloat16 (int8 weight-only on a bfloat16 model) joins the weight's view like a cast to float32; float32 ->
    bfloat16 rounds and stays in the core."""
    assert exact_cast("int8", "bfloat16") and exact_cast("int8", "float16") and exact_cast("bfloat16", "float32")
    assert not exact_cast("float32", "bfloat16") and not exact_cast("bfloat16", "float16")
    assert not exact_cast("float16", "bfloat16") and not exact_cast("float32", "int8")
    assert not exact_cast("bfloat16", "bfloat16")   # an operator's bfloat16 result holds float32 until stored
    g = Graph("int8w_bf16")
    x = g.input("X", ("n", 32), "bfloat16")
    q = g.permute(g.cast(g.input("Q", (48, 32), "int8"), "bfloat16"), (1, 0))
    g.output(g.mul(g.matmul(x, q), g.permute(g.input("S", (48, 1), "bfloat16"), (1, 0))), "Y")
    p = peel(g)
    assert p.views == {"Q": InputView((1, 0), "S", 0)}
    assert [n.op for n in p.core.nodes if n.op not in ("input", "output")] == ["matmul"]
    for x_dtype in ("float32", "bfloat16"):   # Llama's norm on a bfloat16 model: x.to(float32) ... .to(bfloat16)
        g = Graph("rounded")
        y = g.cast(g.rms_norm(g.cast(g.input("X", ("n", 32), x_dtype), "float32")), "bfloat16")
        g.output(g.matmul(y, g.input("W", (32, 48), "bfloat16")), "Y")
        assert "cast" in [n.op for n in peel(g).core.nodes], x_dtype


def test_inputs_used_twice_are_not_views() -> None:
    g = Graph("tied")
    x = g.input("X", ("n", 32))
    w = g.input("W", (32, 32))
    g.output(g.add(g.matmul(x, g.permute(w, (1, 0))), g.matmul(x, w)), "Y")
    assert peel(g).views == {}
    # a scale that is also used elsewhere stays a multiply of the core (the weight is still read transposed)
    g = Graph("shared scale")
    x = g.input("X", ("n", 32))
    s = g.input("S", (1, 48))
    q = g.permute(g.cast(g.input("Q", (48, 32), "int8"), "float32"), (1, 0))
    g.output(g.add(g.mul(g.matmul(x, q), s), s), "Y")
    p = peel(g)
    assert p.views == {"Q": InputView((1, 0))} and "mul" in [n.op for n in p.core.nodes]


def test_a_scale_along_the_contraction_is_not_absorbed() -> None:
    g = Graph("row scale")
    x = g.input("X", (48, 48))
    q = g.cast(g.input("Q", (48, 48), "int8"), "float32")
    s = g.input("S", (48, 1))
    g.output(g.mul(g.matmul(x, q), s), "Y")   # [48, 48] * [48, 1]: one factor per output row, not column
    assert all(v.scale is None for v in peel(g).views.values())


@pytest.mark.parametrize("int8", [False, True])
def test_searched_views_read_the_stored_tensors(int8: bool) -> None:
    g = _linear(int8)
    r = search(g, LIMITS, env={"n": 4}, cache=False)
    assert r.best is not None and r.best.verdict.ok
    (bg,) = r.best.graph.customized_ops()
    iters = [n for n in bg.nodes if n.op == "iter"]
    stored = bg.inputs[iters[1].arg[0]] if not int8 else next(bg.inputs[i.arg[0]] for i in iters
                                                                  if bg.inputs[i.arg[0]].name == "Q")
    assert stored.shape == (48, 32)          # the weight as stored, not a transposed copy
    assert "permute" in [n.op for n in bg.nodes]
    if int8:
        # the scale multiplies the accumulated product (one multiply per output), not the weight tile
        muls = [n for n in bg.nodes if n.op == "mul" and any(s.op == "acc" for s in n.src)]
        assert muls and bg.phase[muls[0]] == "post"
    rng = np.random.default_rng(0)
    x = rng.standard_normal((4, 32)).astype(np.float32)
    if int8:
        q, s = quantize_int8(rng.standard_normal((48, 32)).astype(np.float32))
        feeds = {"X": x, "Q": q, "S": s}
    else:
        feeds = {"X": x, "W": rng.standard_normal((48, 32)).astype(np.float32)}
    want = g.evaluate(feeds, dtype=np.float64)["Y"]
    params = {k: 1 for b in r.best.graph.customized_ops() for k in b.symbols() - b.map_symbols() if k != "n"}
    got = r.best.graph.evaluate(feeds, dtype=np.float64, params=params)["Y"]
    np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-9)
