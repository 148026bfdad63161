"""Bad inputs get a clear error of the right type that names the operator, the operands and their
shapes/dtypes (or the node, map or input at fault) and, where there is one, the fix."""

from __future__ import annotations

import json

import numpy as np
import pytest

from prism.errors import (
    DimError,
    DTypeError,
    GraphError,
    InconclusiveDimError,
    InputError,
    MapError,
    PrismError,
    ShapeError,
    UnsupportedError,
)
from prism.ir import BlockBuilder, Graph, MapVar
from prism.ir import ops as O
from prism.ir.dims import div_exact, sel, sym
from prism.ir.serialize import graph_from_json, graph_to_json
from prism.reference import simulate

pytestmark = pytest.mark.unit


def message(excinfo: pytest.ExceptionInfo) -> str:
    return str(excinfo.value)


def assert_mentions(msg: str, *parts: str) -> None:
    missing = [p for p in parts if p not in msg]
    assert not missing, f"error message {msg!r} does not mention {missing}"


def test_all_errors_are_prism_errors() -> None:
    for e in (DimError, InconclusiveDimError, ShapeError, DTypeError, GraphError, MapError, UnsupportedError,
              InputError):
        assert issubclass(e, PrismError)
    assert issubclass(MapError, GraphError) and issubclass(InconclusiveDimError, DimError)


# --- operator shape and dtype rules ---------------------------------------------------------------------

def test_matmul_inner_dim_mismatch() -> None:
    g = Graph()
    a, b = g.input("a", (3, 4)), g.input("b", (5, 6))
    with pytest.raises(ShapeError) as e:
        g.matmul(a, b)
    assert_mentions(message(e), "matmul", "[3, 4]", "[5, 6]", "float32", "inner dims")


def test_matmul_symbolic_inner_dim_mismatch() -> None:
    g = Graph()
    a, b = g.input("a", ("n", "k")), g.input("b", ("j", 6))
    with pytest.raises(InconclusiveDimError) as e:
        g.matmul(a, b)
    assert_mentions(message(e), "matmul", "[n, k]", "[j, 6]")


def test_matmul_rank_and_batch_errors() -> None:
    g = Graph()
    v, m = g.input("v", (4,)), g.input("m", (4, 2))
    with pytest.raises(ShapeError) as e:
        g.matmul(v, m)
    assert_mentions(message(e), "matmul", "[4]", "[4, 2]", "rank >= 2")
    a, b = g.input("a", (2, 3, 4)), g.input("b", (5, 4, 6))
    with pytest.raises(ShapeError) as e:
        g.matmul(a, b)
    assert_mentions(message(e), "matmul", "[2, 3, 4]", "[5, 4, 6]", "batch dims do not broadcast")


@pytest.mark.parametrize("op", ["add", "sub", "mul", "div", "maximum"])
def test_broadcasting_failure(op: str) -> None:
    g = Graph()
    a, b = g.input("a", (3, 4)), g.input("b", (2, 4))
    with pytest.raises(ShapeError) as e:
        getattr(g, op)(a, b)
    assert_mentions(message(e), op, "[3, 4]", "[2, 4]", "broadcast", "3 vs 2")


def test_broadcasting_never_assumes_a_symbol_is_one() -> None:
    g = Graph()
    a, b = g.input("a", ("n", 4)), g.input("b", ("m", 4))
    with pytest.raises(InconclusiveDimError) as e:
        g.add(a, b)
    assert_mentions(message(e), "add", "[n, 4]", "[m, 4]")


def test_operand_dtype_mismatch() -> None:
    g = Graph()
    a, b = g.input("a", (3, 4), "float32"), g.input("b", (3, 4), "float64")
    with pytest.raises(DTypeError) as e:
        g.add(a, b)
    assert_mentions(message(e), "add", "float32", "float64", "[3, 4]")


def test_unknown_dtypes_and_mixed_precision_errors() -> None:
    g = Graph()
    with pytest.raises(DTypeError) as e:
        g.input("x", (2, 2), "float7")
    assert_mentions(message(e), "float7", "unknown", "float32", "bfloat16", "int8")
    x, w = g.input("y", (2, 3), "float32"), g.input("w", (3, 2), "bfloat16")
    assert g.matmul(x, w).dtype.name == "float32"   # float operands promote to the wider, as in PyTorch
    q = g.input("q", (3, 2), "int8")
    assert g.matmul(x, q).dtype.name == "float32"   # an int8 weight is exact in float32
    with pytest.raises(DTypeError) as e:   # integers alone do not compute: they are weights to scale
        g.mul(q, q)
    assert_mentions(message(e), "mul", "int8", "cast", "float32", "scale")
    with pytest.raises(DTypeError) as e:
        g.exp(q)
    assert_mentions(message(e), "exp", "int8", "cast")
    with pytest.raises(DTypeError) as e:   # only a float value is quantized
        g.cast(q, "int8")
    assert_mentions(message(e), "cast", "int8", "float")
    xq = g.cast(x, "int8")                 # a quantizer's cast: an int8 value of the program
    assert xq.dtype.name == "int8" and g.matmul(xq, q).dtype.name == "float32"   # int8 x int8 sums in float32
    assert g.cast(q, "float32").dtype.name == "float32" and g.permute(q, (1, 0)).dtype.name == "int8"


@pytest.mark.parametrize("build,parts", [
    (lambda g, x: g.reshape(x, (5, 5)), ["reshape", "[3, 4]", "[5, 5]", "12", "25"]),
    (lambda g, x: g.permute(x, (0, 0)), ["permute", "(0, 0)", "[3, 4]"]),
    (lambda g, x: g.split(x, (1, 1), 0), ["split", "[1, 1]", "[3, 4]", "add up to 2"]),
    (lambda g, x: g.sum(x, 2), ["sum", "dim 2", "rank 2"]),
    (lambda g, x: g.softmax(x, -3), ["softmax", "dim -3", "rank 2"]),
    (lambda g, x: g.rms_norm(x, dim=5), ["rms_norm", "dim 5"]),
    (lambda g, x: g.transpose(x, 0, 2), ["transpose", "dim 2"]),
    (lambda g, x: g.gelu(x, approximate="fast"), ["gelu", "'fast'", "'tanh'"]),
    (lambda g, x: g.div(x, 0.0), ["div", "0"]),
    (lambda g, x: g.concat([x, g.input("z", (3, 5))], 0), ["concat", "dim 1", "[3, 4]", "[3, 5]"]),
    (lambda g, x: g.concat([x], 0), ["concat", "at least 2"]),
])
def test_layout_and_reduction_errors(build, parts: list[str]) -> None:
    g = Graph()
    x = g.input("x", (3, 4))
    with pytest.raises(ShapeError) as e:
        build(g, x)
    assert_mentions(message(e), *parts)


def test_reshape_with_unprovable_element_count() -> None:
    g = Graph()
    x = g.input("x", ("n", 4))
    with pytest.raises(ShapeError) as e:
        g.reshape(x, ("m", 4))
    assert_mentions(message(e), "reshape", "[n, 4]", "[m, 4]", "cannot prove")


def test_unknown_operator() -> None:
    with pytest.raises(UnsupportedError) as e:
        O.get("conv2d")
    assert_mentions(message(e), "conv2d", "matmul")


# --- graph construction -------------------------------------------------------------------------------

def test_foreign_tensor_from_another_graph() -> None:
    g1, g2 = Graph(), Graph()
    t = g1.input("x", (3, 4))
    y = g2.input("y", (3, 4))
    with pytest.raises(GraphError) as e:
        g2.add(t, y)
    assert_mentions(message(e), "add", "another graph", "[3, 4]")
    with pytest.raises(GraphError, match="another graph"):
        g2.exp(t)
    with pytest.raises(GraphError, match="another graph"):
        g2.output(t)
    with pytest.raises(GraphError, match="another graph"):
        g2.sum(t)


def test_not_a_tensor() -> None:
    g = Graph()
    with pytest.raises(GraphError) as e:
        g.exp(np.zeros(3))  # type: ignore[arg-type]
    assert_mentions(message(e), "exp", "ndarray")


def test_input_declaration_errors() -> None:
    g = Graph()
    g.input("x", (3, 4))
    with pytest.raises(GraphError, match="'x' is declared twice"):
        g.input("x", (3, 4))
    with pytest.raises(GraphError, match="identifier"):
        g.input("not a name", (3,))
    n = sym("n")
    with pytest.raises(GraphError) as e:
        g.input("z", (n * 2,))
    assert_mentions(message(e), "'z'", "2*n", "reshape")
    for bad in (n * n, n + 1, div_exact(8, n), sel("m", 0, "G"), sel("m", 0, 4)):
        with pytest.raises(GraphError, match="input dims must be ints or single symbols"):
            g.input("z", (bad,))
    with pytest.raises(DimError):
        g.input("w", (-1, 4))


def test_duplicate_output_name() -> None:
    g = Graph()
    x = g.input("x", (3,))
    g.output(x, "y")
    with pytest.raises(GraphError, match="'y' is used twice"):
        g.output(g.exp(x), "y")


def test_graph_without_outputs() -> None:
    g = Graph()
    g.input("x", (3, 4))
    with pytest.raises(GraphError) as e:
        g.evaluate({"x": np.zeros((3, 4), np.float32)})
    assert_mentions(message(e), "no outputs", "g.output")
    with pytest.raises(GraphError, match=r"g\.output"):
        g.check()


def _chain_json() -> dict:
    g = Graph("chain")
    x = g.input("x", (3, 4))
    g.output(g.neg(g.exp(x)), "y")
    return json.loads(graph_to_json(g))


def test_cycle_in_serialized_graph() -> None:
    doc = _chain_json()
    ops = [n["op"] for n in doc["nodes"]]
    exp_i, neg_i = ops.index("exp"), ops.index("neg")
    assert doc["nodes"][neg_i]["src"] == [exp_i]
    doc["nodes"][exp_i]["src"] = [neg_i]  # exp <- neg <- exp
    with pytest.raises(GraphError) as e:
        graph_from_json(json.dumps(doc))
    assert_mentions(message(e), "cycle", "exp", "neg")


def test_self_loop_and_dangling_reference() -> None:
    doc = _chain_json()
    exp_i = [n["op"] for n in doc["nodes"]].index("exp")
    doc["nodes"][exp_i]["src"] = [exp_i]
    with pytest.raises(GraphError, match="cycle"):
        graph_from_json(json.dumps(doc))
    doc["nodes"][exp_i]["src"] = [99]
    with pytest.raises(GraphError) as e:
        graph_from_json(json.dumps(doc))
    assert_mentions(message(e), "missing node 99", "exp")


def test_not_a_prism_graph() -> None:
    doc = _chain_json()
    doc["format"] = "onnx"
    with pytest.raises(GraphError, match="not a Prism graph"):
        graph_from_json(json.dumps(doc))


def test_serialized_graph_is_rechecked_on_load() -> None:
    """Loading replays the shape rules: a hand-edited shape that breaks matmul is rejected."""
    g = Graph()
    a, b = g.input("a", (3, 4)), g.input("b", (4, 5))
    g.output(a @ b)
    doc = json.loads(graph_to_json(g))
    for n in doc["nodes"]:
        if n["op"] == "input" and n["arg"]["t"][0] == "b":
            n["arg"]["t"][1] = {"t": [7, 5]}
    with pytest.raises(ShapeError, match=r"matmul.*\[3, 4\].*\[7, 5\]"):
        graph_from_json(json.dumps(doc))


# --- evaluate: the caller's arrays --------------------------------------------------------------------------

def _two_input_graph() -> Graph:
    g = Graph()
    a, b = g.input("a", ("n", 4)), g.input("b", ("n", 4))
    g.output(g.add(a, b), "y")
    return g


def _z(*shape: int, dtype=np.float32) -> np.ndarray:
    return np.zeros(shape, dtype)


def test_evaluate_missing_input() -> None:
    with pytest.raises(InputError) as e:
        _two_input_graph().evaluate({"a": _z(3, 4)})
    assert_mentions(message(e), "missing", "'b'", "'a'")


def test_evaluate_unknown_input() -> None:
    with pytest.raises(InputError) as e:
        _two_input_graph().evaluate({"a": _z(3, 4), "b": _z(3, 4), "c": _z(1)})
    assert_mentions(message(e), "unknown", "'c'")


def test_evaluate_wrong_shape() -> None:
    with pytest.raises(InputError) as e:
        _two_input_graph().evaluate({"a": _z(3, 4), "b": _z(3, 5)})
    assert_mentions(message(e), "'b'", "dim 1", "must be 4", "(3, 5)", "[n, 4]")
    with pytest.raises(InputError) as e:
        _two_input_graph().evaluate({"a": _z(3), "b": _z(3, 4)})
    assert_mentions(message(e), "'a'", "rank 2", "(3,)")


def test_evaluate_conflicting_symbol_binding() -> None:
    with pytest.raises(InputError) as e:
        _two_input_graph().evaluate({"a": _z(3, 4), "b": _z(2, 4)})
    assert_mentions(message(e), "'b'", "symbol n", "already bound to 3", "got 2")


def test_evaluate_params_contradicting_shapes() -> None:
    with pytest.raises(InputError) as e:
        _two_input_graph().evaluate({"a": _z(3, 4), "b": _z(3, 4)}, params={"n": 5})
    assert_mentions(message(e), "['n']", "contradict", "'n': 3")


def test_evaluate_wrong_dtype() -> None:
    with pytest.raises(InputError) as e:
        _two_input_graph().evaluate({"a": _z(3, 4, dtype=np.float64), "b": _z(3, 4)})
    assert_mentions(message(e), "'a'", "expected dtype float32", "got float64", "dtype=numpy.float64")


def test_evaluate_customized_with_free_symbols() -> None:
    bb = BlockBuilder(grid=("G",), inputs=[((4, 4), "float32", "x")])
    bb.save(bb.exp(bb.iter(0, imap=(0,))), omap=(0,))
    g = Graph()
    x = g.input("x", (4, 4))
    (y,) = g.customized(bb.build(), [x])
    g.output(y)
    with pytest.raises(GraphError) as e:
        g.evaluate({"x": _z(4, 4)})
    assert_mentions(message(e), "free symbols", "['G']", "params")


# --- block graphs: maps ---------------------------------------------------------------------------------------

def _bb(grid=(2,), forloop=1, shape=(6, 4)) -> BlockBuilder:
    return BlockBuilder(grid=grid, forloop=forloop, inputs=[(shape, "float32", "X")])


def test_map_split_that_does_not_divide_at_build_time() -> None:
    with pytest.raises(MapError) as e:
        _bb(grid=(4,)).iter(0, imap=(0,))
    assert_mentions(message(e), "input 0", "X", "[6, 4]", "dim 0", "size 6", "grid dim 0=4", "does not divide")
    with pytest.raises(MapError) as e:
        _bb(grid=(2,), forloop=4).iter(0, imap=(0,), fmap=0)
    assert_mentions(message(e), "X", "size 6", "grid dim 0=2", "for-loop=4", "8 does not divide 6")


def test_map_split_that_does_not_divide_at_instantiate() -> None:
    bb = _bb(grid=("G",), forloop="F")
    bb.save(bb.accumulate("sum", bb.iter(0, imap=(0,), fmap=1)), omap=(0,))
    bg = bb.build()
    assert bg.instantiate({"G": 3, "F": 2}).is_concrete()  # 3 | 6 and 2 | 4
    with pytest.raises(MapError) as e:
        bg.instantiate({"G": 4, "F": 2})
    assert_mentions(message(e), "X", "[6, 4]", "dim 0", "size 6", "4 does not divide 6")
    with pytest.raises(MapError) as e:
        bg.instantiate({"G": 2, "F": 3})
    assert_mentions(message(e), "X", "dim 1", "size 4", "for-loop=3")


def test_map_symbol_choice_that_does_not_divide() -> None:
    bb = _bb(grid=(4,))
    bb.save(bb.exp(bb.iter(0, imap=(MapVar("m"),))), omap=(MapVar("m"),))
    bg = bb.build()
    assert bg.instantiate({"m": 1}).is_concrete()  # 4 | 4
    with pytest.raises(MapError, match="4 does not divide 6"):
        bg.instantiate({"m": 0})
    with pytest.raises(MapError) as e:
        bg.instantiate({"m": "rows"})
    assert_mentions(message(e), "map symbol m", "'rows'")


def test_map_entries_out_of_range() -> None:
    with pytest.raises(MapError) as e:
        _bb().iter(0, imap=(2,))
    assert_mentions(message(e), "imap", "X", "data dim 2", "rank 2")
    with pytest.raises(MapError, match=r"fmap.*data dim 5"):
        _bb().iter(0, fmap=5)
    with pytest.raises(MapError, match="2 entries but the grid has 1 dims"):
        _bb().iter(0, imap=(0, 0))
    with pytest.raises(MapError, match=r"grid dims \[3\] do not exist"):
        _bb().iter(0, imap={3: 0})
    with pytest.raises(MapError, match="map entry must be"):
        _bb().iter(0, imap=("rows",))
    bb = _bb()
    x = bb.iter(0, imap=(0,))
    with pytest.raises(MapError, match=r"omap of output 0.*data dim 3"):
        bb.save(x, omap=(3,))


def test_grid_and_forloop_limits() -> None:
    with pytest.raises(GraphError) as e:
        BlockBuilder(grid=(1, 2, 3, 4))
    assert_mentions(message(e), "1 to 3 grid dims", "got 4", "(1, 2, 3, 4)")
    with pytest.raises(GraphError, match="1 to 3 grid dims"):
        BlockBuilder(grid=())
    with pytest.raises(GraphError, match="grid dim 0 must be >= 1"):
        BlockBuilder(grid=(0,))
    with pytest.raises(GraphError, match="for-loop range must be >= 1"):
        BlockBuilder(grid=(1,), forloop=0)
    with pytest.raises(GraphError, match="input index 3 out of range"):
        _bb().iter(3)
    with pytest.raises(GraphError, match="block graph input 0"):
        BlockBuilder(grid=(1,), inputs=["X"])  # type: ignore[list-item]


# --- block graphs: structural rules ----------------------------------------------------------------------------

def _loop_and_acc() -> tuple[BlockBuilder, object, object]:
    bb = BlockBuilder(grid=(2,), forloop=2, inputs=[((4, 8), "float32", "X")])
    x = bb.iter(0, imap=(0,), fmap=1)
    return bb, x, bb.accumulate("sum", x)


def test_accumulating_an_accumulated_value() -> None:
    bb, _, s = _loop_and_acc()
    with pytest.raises(GraphError) as e:
        bb.accumulate("sum", s)
    assert_mentions(message(e), "accumulate sum", "acc [2, 4] float32", "after the loop")
    with pytest.raises(GraphError, match="after the loop"):
        bb.accumulate("max", bb.exp(s))  # still post-loop through a tile op


def test_mixing_loop_and_post_loop_values() -> None:
    bb, x, s = _loop_and_acc()
    with pytest.raises(GraphError) as e:
        bb.add(x, s)
    assert_mentions(message(e), "add", "mixes", "[loop]", "[post]", "iter [2, 4]", "acc [2, 4]")


def test_saving_a_loop_value_without_fmap() -> None:
    bb, x, _ = _loop_and_acc()
    with pytest.raises(GraphError) as e:
        bb.save(bb.exp(x), omap=(0,))
    assert_mentions(message(e), "save", "output 0", "inside the for-loop", "exp [2, 4]", "fmap")


def test_fmap_on_a_value_outside_the_loop() -> None:
    bb, _, s = _loop_and_acc()
    with pytest.raises(GraphError, match="has an fmap but is not computed inside the for-loop"):
        bb.save(s, omap=(0,), fmap=1)


def test_unknown_accumulator_and_bad_parameters() -> None:
    bb, x, _ = _loop_and_acc()
    with pytest.raises(GraphError) as e:
        bb.accumulate("prod", x)
    assert_mentions(message(e), "'prod'", "sum", "softmax_matmul")
    with pytest.raises(GraphError, match=r"rms takes parameters \['eps'\]"):
        bb.accumulate("rms", x)
    with pytest.raises(GraphError, match="sum takes 1 operand"):
        bb.accumulate("sum", x, x)
    with pytest.raises(GraphError, match="softmax_matmul takes 2 operand"):
        bb.accumulate("softmax_matmul", x)


def test_accumulator_shape_error_names_the_accumulator() -> None:
    bb = BlockBuilder(grid=(1,), forloop=2, inputs=[((4, 8), "float32", "S"), ((4, 8), "float32", "V")])
    s, v = bb.iter(0, fmap=1), bb.iter(1, fmap=0)
    with pytest.raises(ShapeError) as e:
        bb.accumulate("softmax_matmul", s, v)  # [4, 4] @ [2, 8]
    assert_mentions(message(e), "softmax_matmul", "[4, 4]", "[2, 8]")


def test_block_graph_without_outputs() -> None:
    bb, _, _ = _loop_and_acc()
    with pytest.raises(GraphError, match="no outputs; call save"):
        bb.build()


def test_customized_input_mismatch() -> None:
    bb = BlockBuilder(grid=(1,), inputs=[((4, 8), "float32", "X")])
    bb.save(bb.iter(0), omap=(None,))
    bg = bb.build()
    g = Graph()
    x = g.input("x", (4, 7))
    with pytest.raises(GraphError) as e:
        g.customized(bg, [x])
    assert_mentions(message(e), "customized", "input 0", "[4, 7]", "[4, 8]")
    with pytest.raises(GraphError, match="takes 1 inputs, got 2"):
        g.customized(bg, [x, x])
    with pytest.raises(GraphError, match="expected a BlockGraph, got BlockBuilder"):
        g.customized(bb, [x])  # type: ignore[arg-type]


def test_simulate_errors() -> None:
    bb = BlockBuilder(grid=("G",), inputs=[((4, 8), "float32", "X")])
    bb.save(bb.iter(0, imap=(0,)), omap=(0,))
    bg = bb.build()
    with pytest.raises(GraphError) as e:
        simulate(bg, [_z(4, 8)])
    assert_mentions(message(e), "free symbols", "['G']", "instantiate")
    concrete = bg.instantiate({"G": 2})
    with pytest.raises(InputError) as e:
        simulate(concrete, [_z(4, 7)])
    assert_mentions(message(e), "input 0", "X", "[4, 8]", "(4, 7)")
    with pytest.raises(InputError, match="takes 1 inputs, got 2"):
        simulate(concrete, [_z(4, 8), _z(4, 8)])
