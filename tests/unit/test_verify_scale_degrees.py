"""The scaled kinds of the numeric check (hostile x32, tiny x2^-10) take the normal run's reference times c**d where the
program is positively homogeneous of degree d in the scaled input (verify.numeric.scale_degrees): one float64 run
of the program per check instead of three at a tuned shape -- bfloat16 programs included, the scales being powers of
two (a bfloat16 draw scaled stays exact, a rounding to bfloat16 commutes with the scale)."""

from __future__ import annotations

import numpy as np
import pytest

from prism.ir.graph import Graph
from prism.verify.numeric import numeric_check, scale_degrees, standard_normal_inputs

pytestmark = pytest.mark.unit


def _linear(dtype: str = "float32") -> Graph:
    g = Graph("lin")
    x, w = g.input("x", (6, 32), dtype), g.input("w", (32, 16))
    g.input("b", (16,))   # (an input nothing depends on: degree 0)
    g.output(g.mul_scalar(g.relu(g.matmul(x, w)), 0.5), "y")   # degree 1 in x, in w
    g.output(g.div(g.sum(g.mul(x, x), -1), g.max(g.abs(x), -1)), "q")   # degree 2 - 1 = 1 in x, 0 in w
    return g


def test_degrees_of_products_quotients_and_positively_linear_operators() -> None:
    g = _linear()
    assert scale_degrees(g, "x") == {"y": 1, "q": 1}
    assert scale_degrees(g, "w") == {"y": 1, "q": 0}
    assert scale_degrees(g, "b") == {"y": 0, "q": 0}


@pytest.mark.parametrize("build", ["exp", "add_bias", "rms_norm", "round_to_fp16"])
def test_anything_not_homogeneous_has_no_degree(build: str) -> None:
    g = Graph(build)
    x, b = g.input("x", (4, 8)), g.input("b", (8,))
    y = {"exp": lambda: g.exp(x), "add_bias": lambda: g.add(x, b), "rms_norm": lambda: g.rms_norm(x),
         "round_to_fp16": lambda: g.cast(x, "float16")}[build]()   # (float16's range: 2^-14..2^16)
    g.output(y, "y")
    assert scale_degrees(g, "x") is None
    assert scale_degrees(g, "b") == ({"y": 1} if build == "add_bias" else {"y": 0}) or build == "add_bias"


def test_the_shortcut_reference_equals_the_evaluated_one_and_is_used(monkeypatch: pytest.MonkeyPatch) -> None:
    g = _linear()
    env: dict[str, int] = {}
    x = standard_normal_inputs(g, env, 0)
    ref = g.evaluate(x, dtype=np.float64)
    for c in (32.0, 2.0 ** -10):
        scaled = g.evaluate({**x, "x": x["x"] * c}, dtype=np.float64)
        for o, d in scale_degrees(g, "x").items():   # type: ignore[union-attr]
            np.testing.assert_allclose(ref[o] * c ** d, scaled[o], rtol=1e-13, atol=0)
    calls = []
    evaluate = Graph.evaluate

    def counting(self, inputs, dtype=np.float32, **kw):  # type: ignore[no-untyped-def]
        if self is g and dtype is np.float64:
            calls.append(1)
        return evaluate(self, inputs, dtype=dtype, **kw)

    monkeypatch.setattr(Graph, "evaluate", counting)
    assert numeric_check(g, g, instantiations=[env], seeds=(0,), hostile_input="x").passed
    assert len(calls) == 1   # the normal run's; hostile and tiny scaled it
    calls.clear()
    nonhom = Graph("exp")   # not homogeneous: every kind evaluated
    xe = nonhom.input("x", (6, 32))
    nonhom.output(nonhom.exp(nonhom.mul_scalar(xe, 0.01)), "y")
    g = nonhom
    assert numeric_check(g, g, instantiations=[env], seeds=(0,), hostile_input="x").passed
    assert len(calls) == 3
    wrong = Graph("wrong")   # 1 % off: fails at every kind, the scaled ones judged against the scaled reference
    xw, ww = wrong.input("x", (6, 32)), wrong.input("w", (32, 16))
    wrong.input("b", (16,))
    wrong.output(wrong.mul_scalar(wrong.relu(wrong.matmul(xw, ww)), 0.505), "y")
    wrong.output(wrong.div(wrong.sum(wrong.mul(xw, xw), -1), wrong.max(wrong.abs(xw), -1)), "q")
    r = numeric_check(wrong, _linear(), instantiations=[env], seeds=(0,), hostile_input="x", stop_on_failure=False)
    assert not r.passed and {c.kind for c in r.checks if not c.ok and c.output == "y"} >= {"normal", "hostile", "tiny"}


def _bf16_linear() -> Graph:
    """A bfloat16 model's Linear as the capture writes it: bfloat16 x, w and bias-free product in float32, rounded
    to bfloat16 (a rounding cast, which commutes with a power-of-two scale)."""
    g = Graph("bf16_lin")
    x, w = g.input("x", (6, 64), "bfloat16"), g.input("w", (64, 16), "bfloat16")
    g.output(g.cast(g.matmul(x, w), "bfloat16"), "y")
    return g


def test_a_bfloat16_program_takes_its_scaled_references_from_the_normal_run(monkeypatch: pytest.MonkeyPatch) -> None:
    g = _bf16_linear()
    assert scale_degrees(g, "x") == {"y": 1} and scale_degrees(g, "w") == {"y": 1}
    env: dict[str, int] = {}
    x = standard_normal_inputs(g, env, 0)
    ref = g.evaluate(x, dtype=np.float64)
    for c in (32.0, 2.0 ** -10):   # bit-exact: every rounding (the draw's, the output's) commutes with c
        for d, scaled in ((1, {**x, "x": x["x"] * c}), (2, {"x": x["x"] * c, "w": x["w"] * c})):
            np.testing.assert_array_equal(ref["y"] * c ** d, g.evaluate(scaled, dtype=np.float64)["y"])
    calls = []
    evaluate = Graph.evaluate

    def counting(self, inputs, dtype=np.float32, **kw):  # type: ignore[no-untyped-def]
        if dtype is np.float64 and self.name in ("bf16_lin", "fp16_lin"):
            calls.append(1)
        return evaluate(self, inputs, dtype=dtype, **kw)

    monkeypatch.setattr(Graph, "evaluate", counting)
    r = numeric_check(g, g, instantiations=[env], seeds=(0,))
    # normal; hostile x, hostile w, tiny x, tiny w, tiny of both at once (degree 2): one float64 run for six
    assert r.passed and len({(c.kind, c.input) for c in r.checks}) == 6 and len(calls) == 1
    calls.clear()
    h = Graph("fp16_lin")   # float16: a tiny draw (x2^-10) falls into its subnormals (< 2^-14), so it is rounded
    xh, wh = h.input("x", (6, 64), "float16"), h.input("w", (64, 16), "float16")
    h.output(h.matmul(xh, wh), "y")
    assert numeric_check(h, h, instantiations=[env], seeds=(0,), hostile_input="x").passed
    assert len(calls) == 2   # normal (hostile x32 is exact in float16: scaled), tiny evaluated
