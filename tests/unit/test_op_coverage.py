"""Every stage covers every operator: adding an operator without one of its stage rules fails here.

The stages: builder method, NumPy reference, verifier term (translation + interpretation of the term),
search abstract expression, C lowering, cost, frontend spellings, and the bench's JAX and ONNX
translations. Each check builds a one-operator program and runs the stage on it, so a stage that keys on
a list of names it forgot is caught, not only a missing table entry.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from prism.codegen import generate
from prism.ir import OPS, Graph
from prism.ir.builder import OpMethods
from prism.ir.reductions import MONOIDS
from prism.reference.numpy_ops import IMPL
from prism.search.abstract import SUPPORTED, WHY_UNSUPPORTED, TreeAlgebra, graph_exprs
from prism.tune.cost import OP_FLOPS
from prism.verify.translate import evaluate_dag, translate

pytestmark = pytest.mark.unit

NOT_COMPUTE = {"input", "output", "customized", "result"}
COMPUTE = sorted(n for n in OPS if n not in NOT_COMPUTE)
SPELLED = sorted(n for n, o in OPS.items() if o.elementwise or o.group == "reduction")  # spellings in OpDef.torch


def one_op(op: str) -> tuple[Graph, dict[str, np.ndarray]]:
    """A program applying ``op`` once to [4, 6] inputs (attributes: the defaults, or typical values)."""
    g = Graph()
    x = g.input("x", (4, 6))
    d = OPS[op]
    rng = np.random.default_rng(0)
    arrays = {"x": (rng.random((4, 6)) + 0.5).astype(np.float32)}
    if d.group == "binary":
        y = g.input("y", (4, 6))
        arrays["y"] = (rng.random((4, 6)) + 0.5).astype(np.float32)
        out = getattr(g, op)(x, y)
    elif op in ("mul_scalar", "add_scalar"):
        out = getattr(g, op)(x, 1.5)
    elif op == "cast":
        out = g.cast(x, "bfloat16")
    elif d.group == "unary":
        out = getattr(g, op)(x)
    elif op == "matmul":
        w = g.input("w", (6, 3))
        arrays["w"] = rng.random((6, 3)).astype(np.float32)
        out = g.matmul(x, w)
    elif d.group in ("reduction", "composite"):
        out = getattr(g, op)(x, 1e-6, -1) if OPS[op].attrs == ("dim", "eps") else getattr(g, op)(x, dim=-1)
    elif op == "permute":
        out = g.permute(x, (1, 0))
    elif op == "reshape":
        out = g.reshape(x, (6, 4))
    elif op == "concat":
        out = g.concat([x, x], 0)
    elif op == "split":
        out = g.split(x, (2, 4), 1)[1]
    else:
        raise AssertionError(f"test_op_coverage has no one-operator program for {op!r} (group {d.group}); add one")
    g.output(out, "out")
    return g, arrays


@pytest.mark.parametrize("op", COMPUTE)
def test_builder_and_reference(op: str) -> None:
    assert hasattr(OpMethods, op), f"no builder method for {op}"
    assert op in IMPL, f"no NumPy reference for {op}"
    g, arrays = one_op(op)
    assert np.isfinite(g.evaluate(arrays)["out"]).all()


@pytest.mark.parametrize("op", COMPUTE)
def test_verifier_term_matches_reference(op: str) -> None:
    g, arrays = one_op(op)
    dag, outs = translate({"a": g})
    vals = evaluate_dag(dag, {k: v.astype(np.float64) for k, v in arrays.items()}, {})
    got = vals[outs["a"]["out"].name]
    got = got.member({})
    want = g.evaluate(arrays, dtype=np.float64)["out"]
    np.testing.assert_allclose(np.asarray(got).reshape(want.shape), want, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("op", COMPUTE)
def test_search_abstract_expression(op: str) -> None:
    if op in WHY_UNSUPPORTED:
        return  # stated reason (positional operators)
    assert op in SUPPORTED, f"search has no abstract expression for {op}"
    g, _ = one_op(op)
    assert graph_exprs(g, TreeAlgebra())[0] is not None


@pytest.mark.parametrize("op", COMPUTE)
def test_c_lowering_and_cost(op: str) -> None:
    g, _ = one_op(op)
    src = generate(g, "portable").source
    assert "prism" in src
    if OPS[op].elementwise or OPS[op].group == "reduction":
        assert OP_FLOPS.get(op, 0) >= 1
    if OPS[op].elementwise:
        assert OPS[op].c is not None
    if OPS[op].group == "reduction":
        assert OPS[op].monoid in MONOIDS


# operators without a spelling of their own: the PyTorch calls whose converters produce them
PRODUCED_BY = {"add": ["add"], "sub": ["sub"], "mul": ["mul"], "div": ["div"], "mul_scalar": ["mul", "div"],
               "add_scalar": ["add", "sub", "rsub"], "compare": ["gt", "ge", "lt", "le", "eq", "ne", "logical_not"],
               "mask_scalar": ["masked_fill", "where"], "mask_select": ["where", "masked_fill"],
               "cast": ["to", "_to_copy", "type_as", "float", "bfloat16", "half"]}


@pytest.mark.parametrize("op", SPELLED)
def test_frontend_spelling(op: str) -> None:
    from prism.frontend.ops import CONVERTERS, SIGS
    d = OPS[op]
    names = [n for spec in d.torch for n in spec.names] or PRODUCED_BY.get(op, [])
    assert names, f"{op} has no PyTorch spelling (OpDef.torch)"
    for n in names:
        assert n in CONVERTERS and n in SIGS, f"{op}: spelling {n!r} has no frontend converter"


class _FakeOnnx:
    """Records the ONNX operators a lowering emits (no onnx install needed)."""

    def __init__(self) -> None:
        self.kinds: list[str] = []

    def op(self, kind: str, ins: list[str], out: str | None = None, **attrs: Any) -> str:
        self.kinds.append(kind)
        return f"t{len(self.kinds)}"

    def const(self, value: Any) -> str:
        return "c"

    def scalar(self, value: float) -> str:
        return "c"

    def reduce(self, kind: str, x: str, dim: int) -> str:
        return self.op(kind, [x])


@pytest.mark.parametrize("op", COMPUTE)
def test_bench_translations(op: str) -> None:
    from prism.bench.systems.jax_system import _op_table
    from prism.bench.systems.ort_system import _lower
    assert op in _op_table(None, None), f"no JAX translation for {op}"
    g, _ = one_op(op)
    n = next(n for n in g.nodes if n.op == op)
    b = _FakeOnnx()
    _lower(b, op, ["x"] * len(n.src), n.arg)  # type: ignore[arg-type]
    assert b.kinds, f"no ONNX lowering for {op}"
