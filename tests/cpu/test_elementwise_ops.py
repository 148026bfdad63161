"""Every element-wise operator, compiled on every ISA path this machine runs, against the float64 reference
on ordinary and hostile inputs (±0, subnormals, ±1e-30, ±1e30, ±inf, NaN, values at the operators'
thresholds).

Tolerance (float32 kernel vs float64 reference of the same float32 inputs): NaN and ±inf at the same
positions; finite results within 4e-6 relative + 1e-6 absolute of the reference value (absolute for
results near a zero of the function: sin near k*pi, log near 1). The functions' own ulp bounds, measured
on dense sweeps, are in docs/codegen.md.
"""

from __future__ import annotations

import numpy as np
import pytest
from cg_helpers import supported_isas

import prism
from prism.ir import OPS

pytestmark = pytest.mark.cpu

# op -> attribute tuples to test (the defaults first)
ATTRS: dict[str, list[tuple]] = {
    "gelu": [("none",), ("tanh",)], "mul_scalar": [(2.5,)], "add_scalar": [(-1.25,)],
    "clamp": [(-1.0, 1.0), (0.0, float("inf")), (float("-inf"), 0.5)], "leaky_relu": [(0.01,), (0.2,)],
    "elu": [(1.0, 1.0, 1.0), (1.6732632423543772, 1.0507009873554805, 1.0), (0.5, 1.0, 2.0)],
    "softplus": [(1.0, 20.0), (2.0, 5.0)], "round": [(0.0,), (2.0,), (-1.0,)],
}
UNARY = sorted(n for n, o in OPS.items() if o.group == "unary")
BINARY = sorted(n for n, o in OPS.items() if o.group == "binary")
# sin/cos of |x| > 6.5e6 are NaN by design (docs/codegen.md), so the 1e30 values are left out for them
HOSTILE = [0.0, -0.0, 1e-45, -1e-45, 1e-38, -1e-38, 1e-30, -1e-30, 1e30, -1e30, np.inf, -np.inf, np.nan,
           3.0, -3.0, 20.0, -20.0, 88.0, 89.0, -87.0, -104.0, 1.0, -1.0, 0.5, 1e4, -1e4]


def _inputs(rng: np.random.Generator, op: str = "") -> np.ndarray:
    hostile = [v for v in HOSTILE if op not in ("sin", "cos") or not abs(v) > 6.5e6]
    hostile += [0.0] * (len(HOSTILE) - len(hostile))
    body = np.concatenate([rng.standard_normal(600) * 4, rng.standard_normal(200) * 40,
                           rng.uniform(0.0, 2.0, 200), np.array(hostile)])
    return body.astype(np.float32).reshape(2, -1)


def _compare(out: np.ndarray, ref: np.ndarray, what: str) -> None:
    out = np.asarray(out, dtype=np.float64)
    assert out.shape == ref.shape
    nan_o, nan_r = np.isnan(out), np.isnan(ref)
    assert (nan_o == nan_r).all(), f"{what}: NaN at {np.flatnonzero(nan_o != nan_r)[:5]}"
    inf_r = np.isinf(ref)
    ref32 = ref.astype(np.float32).astype(np.float64)  # a finite float64 value may round to inf in float32
    inf_ok = np.isinf(ref32)
    assert (np.isinf(out) == inf_ok).all() or (np.isinf(out) == inf_r).all(), f"{what}: inf positions differ"
    fin = np.isfinite(out) & np.isfinite(ref32)
    err = np.abs(out[fin] - ref[fin])
    bound = 4e-6 * np.abs(ref[fin]) + 1e-6
    bad = err > bound
    assert not bad.any(), (f"{what}: {int(bad.sum())} values out of tolerance, worst at "
                           f"ref={ref[fin][bad][np.argmax(err[bad] / bound[bad])]!r}")


@pytest.mark.parametrize("isa", supported_isas())
@pytest.mark.parametrize("op", UNARY)
def test_unary_compiled(op: str, isa: str, rng: np.random.Generator) -> None:
    x = _inputs(rng, op)
    for arg in ATTRS.get(op, [tuple(OPS[op].defaults)]):
        g = prism.Graph()
        xi = g.input("x", x.shape)
        g.output(g._apply(op, (xi,), arg), "y")
        ref = g.evaluate({"x": x}, dtype=np.float64)["y"]
        out = prism.compile(g, isa=isa)(x=x)
        _compare(out, ref, f"{op}{arg} [{isa}]")


@pytest.mark.parametrize("op", BINARY)
def test_binary_compiled_with_broadcast(op: str, rng: np.random.Generator) -> None:
    a = _inputs(rng)
    b = (rng.standard_normal((2, 1)) + 2).astype(np.float32)
    g = prism.Graph()
    ai, bi = g.input("a", a.shape), g.input("b", b.shape)
    g.output(getattr(g, op)(ai, bi), "y")
    ref = g.evaluate({"a": a, "b": b}, dtype=np.float64)["y"]
    _compare(prism.compile(g)(a=a, b=b), ref, op)
