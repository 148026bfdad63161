"""Kernel graphs: symbolic shape inference, structural keys, serialization, checking, printing,
instantiation and node interning (W1-W7 graphs are built, not evaluated, here)."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

from prism.errors import GraphError, PrismError
from prism.ir import BlockBuilder, Graph
from prism.ir.dims import Dim, structurally_equal, sym
from prism.ir.node import Node, toposort
from prism.ir.serialize import graph_from_json, graph_to_json
from prism.workloads import WORKLOADS

pytestmark = pytest.mark.unit

CASES = [(wid, i) for wid in sorted(WORKLOADS) for i in range(len(WORKLOADS[wid].shapes))]
CASE_IDS = [f"{wid}-{i}" for wid, i in CASES]


def expected_output_shape(wid: str, s: dict) -> tuple:
    if wid in ("W1", "W2", "W3", "W7"):
        return (sym("n"), s["m"])
    if wid in ("W4", "W5"):
        return (sym("b"), s["h"], s["q"], s["D"])
    assert wid == "W6"
    return (sym("b"), 32, 1, 128)


def same_shape(a: tuple, b: tuple) -> bool:
    return len(a) == len(b) and all(structurally_equal(x, y) for x, y in zip(a, b))


# --- symbolic shape inference on W1-W7 ------------------------------------------------------------------

@pytest.mark.parametrize("wid,i", CASES, ids=CASE_IDS)
def test_program_output_shape_is_symbolic(wid: str, i: int) -> None:
    w = WORKLOADS[wid]
    s = w.shapes[i]
    g = w.program(s)
    (shape,) = g.output_shapes.values()
    want = expected_output_shape(wid, s)
    assert same_shape(shape, want), (shape, want)
    assert shape[0] is sym(w.symbolic[0])
    assert g.symbols() == set(w.symbolic)


@pytest.mark.parametrize("wid,i", CASES, ids=CASE_IDS)
def test_hand_written_output_shape_equals_program(wid: str, i: int) -> None:
    w = WORKLOADS[wid]
    s = w.shapes[i]
    prog, hand = w.program(s), w.hand_written(s)
    assert prog.output_names == hand.output_names
    assert list(prog.inputs) == list(hand.inputs)
    for name in prog.output_names:
        assert same_shape(prog.output_shapes[name], hand.output_shapes[name])
    for name, node in prog.inputs.items():
        assert hand.inputs[name] is node  # same declaration: the interned input node is shared


def test_hand_written_block_graphs_are_symbolic_in_their_params() -> None:
    for w in WORKLOADS.values():
        s = w.shapes[0]
        bgs = w.hand_written(s).customized_ops()
        assert bgs, w.id
        free = set().union(*(bg.symbols() for bg in bgs))
        assert free == set(w.params(s)) | set(w.symbolic), (w.id, free)


@pytest.mark.parametrize("wid", sorted(WORKLOADS))
def test_instantiate_hand_graph_gives_concrete_block_graphs(wid: str) -> None:
    w = WORKLOADS[wid]
    s = w.shapes[0]
    hand = w.hand_written(s)
    only_params = hand.instantiate(w.params(s))
    for bg in only_params.customized_ops():
        assert bg.symbols() == set(w.symbolic)  # the batch dim is still symbolic
        assert not bg.is_concrete()
    full = hand.instantiate({**w.params(s), **w.env(s)})
    bgs = full.customized_ops()
    assert bgs and all(bg.is_concrete() for bg in bgs)
    assert all(not bg.constraints for bg in bgs)  # every division checked, nothing left to record
    assert full.symbols() == set()
    (shape,) = full.output_shapes.values()
    assert shape == tuple(s[w.symbolic[0]] if isinstance(d, Dim) else d
                          for d in expected_output_shape(wid, s))
    full.check()
    for alt in w.alt_params(s):
        assert all(bg.is_concrete() for bg in hand.instantiate({**alt, **w.env(s)}).customized_ops())


def test_instantiate_program_substitutes_kernel_dims() -> None:
    w = WORKLOADS["W1"]
    s = w.shapes[0]
    g = w.program(s).instantiate({"n": 8})
    assert g.output_shapes == {"Y": (8, s["m"])}
    assert g.inputs["X"].shape == (8, s["d"])
    g.check()


# --- keys, serialization, check, printing ------------------------------------------------------------------

def all_graphs() -> list[tuple[str, Graph]]:
    out = []
    for w in WORKLOADS.values():
        s = w.shapes[0]
        out += [(f"{w.id}-program", w.program(s)), (f"{w.id}-hand", w.hand_written(s))]
    return out


GRAPHS = all_graphs()


@pytest.mark.parametrize("name,g", GRAPHS, ids=[n for n, _ in GRAPHS])
def test_key_is_stable_across_builds(name: str, g: Graph) -> None:
    wid, kind = name.split("-")
    w = WORKLOADS[wid]
    again = (w.program if kind == "program" else w.hand_written)(w.shapes[0])
    assert again.key == g.key
    assert isinstance(g.key, str) and len(g.key) == 32


def test_keys_differ_between_programs() -> None:
    keys = [g.key for _, g in GRAPHS]
    assert len(set(keys)) == len(keys)
    w = WORKLOADS["W1"]
    assert w.program(w.shapes[0]).key != w.program(w.shapes[1]).key  # another d

    def build(eps: float, out: str = "Y") -> Graph:
        g = Graph()
        x, wt = g.input("X", ("n", 8)), g.input("W", (8, 4))
        g.output(g.matmul(g.rms_norm(x, eps=eps), wt), out)
        return g
    assert build(1e-6).key == build(1e-6).key
    assert build(1e-6).key != build(1e-5).key
    assert build(1e-6).key != build(1e-6, "Z").key


@pytest.mark.parametrize("name,g", GRAPHS, ids=[n for n, _ in GRAPHS])
def test_serialization_round_trip(name: str, g: Graph) -> None:
    text = graph_to_json(g)
    back = graph_from_json(text)
    assert back.key == g.key
    assert graph_to_json(back) == text
    assert back.name == g.name
    assert list(back.inputs) == list(g.inputs)
    assert back.output_names == g.output_names
    assert back.outputs == g.outputs  # interning: the reloaded nodes are the same objects
    for a, b in zip(g.customized_ops(), back.customized_ops()):
        assert a == b
        assert [str(c) for c in a.constraints] == [str(c) for c in b.constraints]


@pytest.mark.parametrize("name,g", GRAPHS, ids=[n for n, _ in GRAPHS])
def test_check_passes(name: str, g: Graph) -> None:
    g.check()


def test_check_rejects_a_forged_node() -> None:
    """A node whose stored shape disagrees with its rule (hand-forged, not built) fails the check."""
    g = Graph()
    x = g.input("x", (3, 4))
    forged = Node("exp", (x.node,), (), (4, 3), x.dtype)
    from prism.ir.builder import Tensor
    g.output(Tensor(g, forged))
    with pytest.raises(GraphError, match="disagrees with its rule"):
        g.check()


def test_serialization_keeps_unused_inputs_and_their_order() -> None:
    g = Graph("unused")
    g.input("b", (2,))
    a = g.input("a", ("n",))
    g.output(g.exp(a))
    back = graph_from_json(graph_to_json(g))
    assert list(back.inputs) == ["b", "a"]
    assert back.key == g.key


def test_printer_shows_ops_shapes_and_block_graphs() -> None:
    w = WORKLOADS["W1"]
    prog = str(w.program(w.shapes[0]))
    for part in ("input 'X'", "input 'W'", "rms_norm", "matmul", "output 'Y'", "[n, 1024]", "float32", "eps="):
        assert part in prog, part
    hand = str(w.hand_written(w.shapes[0]))
    for part in ("customized", "block_graph", "grid=(G,)", "forloop=F", "iter", "acc.sum", "acc.rms", "save",
                 "matmul", "div", "[loop]", "[post]", "constraints"):
        assert part in hand, part
    w4 = WORKLOADS["W4"]
    att = str(w4.hand_written(w4.shapes[0]))
    for part in ("acc.softmax_sum", "acc.softmax_matmul", "acc.max", "permute", "mul_scalar", "reshape", "exp",
                 "result", "[inv]"):
        assert part in att, part


def test_printer_lists_every_node() -> None:
    w = WORKLOADS["W2"]
    g = w.program(w.shapes[0])
    text = str(g)
    for n in g.nodes:
        assert n.op in text
    assert len(text.splitlines()) == 1 + len(g.nodes)  # a header, then one line per node


# --- interning and graph structure ------------------------------------------------------------------------

def test_same_expression_twice_is_the_same_node() -> None:
    g = Graph()
    x = g.input("x", ("n", 4))
    assert g.exp(x).node is g.exp(x).node
    assert g.rms_norm(x, eps=1e-6).node is g.rms_norm(x, eps=1e-6).node
    assert g.rms_norm(x, eps=1e-6).node is not g.rms_norm(x, eps=1e-5).node
    assert g.sum(x, -1).node is g.sum(x, 1).node  # negative dims are normalized
    assert g.transpose(x).node is g.permute(x, (1, 0)).node
    a = g.add(g.exp(x), g.neg(x))
    b = g.add(g.exp(x), g.neg(x))
    assert a.node is b.node


def test_an_interning_scope_holds_only_in_its_own_thread() -> None:
    """A template's trace interns its nodes apart (``interning_scope``) in the background compiler's thread; the
    caller's graphs built meanwhile are interned as ever. A process-wide scope put them in the trace's scope: a
    block graph rebuilt by the checker was then another object, and derived kernels failed their check."""
    import threading

    from prism.ir.node import interning_scope

    g = Graph()
    x = g.input("x", ("n", 4))
    before = g.exp(x).node
    entered, done = threading.Event(), threading.Event()

    def hold() -> None:
        with interning_scope(object()):
            entered.set()
            done.wait(10)
    t = threading.Thread(target=hold)
    t.start()
    try:
        assert entered.wait(10)
        assert g.exp(x).node is before
        with interning_scope(object()):   # this thread's own scope does intern apart
            assert g.exp(x).node is not before
    finally:
        done.set()
        t.join()


def test_identical_programs_share_nodes_across_graphs() -> None:
    w = WORKLOADS["W3"]
    g1, g2 = w.program(w.shapes[0]), w.program(w.shapes[0])
    assert g1 is not g2
    assert g1.outputs[0] is g2.outputs[0]
    assert len(g1.nodes) == len(g2.nodes)
    assert all(a is b for a, b in zip(g1.nodes, g2.nodes))


def test_common_subexpressions_are_shared() -> None:
    w = WORKLOADS["W2"]
    g = w.program(w.shapes[0])
    rms = [n for n in g.nodes if n.op == "rms_norm"]
    assert len(rms) == 1  # rms_norm(X) appears twice in the program text, once in the DAG


def test_nodes_are_immutable_and_pickle_to_the_same_object() -> None:
    g = Graph()
    y = g.exp(g.input("x", ("n", 4)))
    with pytest.raises(AttributeError):
        y.node.op = "neg"  # type: ignore[misc]
    assert pickle.loads(pickle.dumps(y.node)) is y.node


def test_nodes_are_toposorted() -> None:
    for _, g in GRAPHS:
        pos = {id(n): i for i, n in enumerate(g.nodes)}
        for n in g.nodes:
            assert all(pos[id(s)] < pos[id(n)] for s in n.src)
    assert toposort([]) == []


def test_toposort_handles_deep_chains() -> None:
    g = Graph()
    t = g.input("x", (2,))
    for _ in range(3000):
        t = g.neg(t)
    g.output(t)
    assert len(g.nodes) == 3002


def test_tensor_operators_map_to_ops() -> None:
    g = Graph()
    x, w = g.input("x", (2, 3)), g.input("w", (3, 4))
    cases = {
        "matmul": x @ w, "add": x + x, "sub": x - x, "mul": x * x, "div": x / x, "neg": -x,
        "add_scalar": x + 1.0, "mul_scalar": x * 2,
    }
    for op, t in cases.items():
        assert t.node.op == op
    assert (x / 4).node.op == "mul_scalar" and (x / 4).node.arg == (0.25,)
    assert (x - 1.5).node.arg == (-1.5,)
    r = 1 - x
    assert r.node.op == "add_scalar" and r.node.src[0].op == "neg"
    assert (2.0 * x).node is (x * 2.0).node


def test_split_returns_all_parts_and_shapes() -> None:
    g = Graph()
    x = g.input("x", (6, "n"))
    parts = g.split(x, (1, 2, 3), 0)
    assert [p.shape[0] for p in parts] == [1, 2, 3]
    assert all(p.shape[1] is sym("n") for p in parts)
    c = g.concat(parts, 0)
    assert c.shape[0] == 6 and c.shape[1] is sym("n")


def test_symbolic_shape_arithmetic_through_layout_ops() -> None:
    g = Graph()
    x = g.input("x", ("b", "h", 8))
    y = g.reshape(x, ("b", sym("h") * 8))
    assert y.shape[1] is sym("h") * 8
    z = g.concat([x, x], 1)
    assert z.shape[1] is 2 * sym("h")
    p = g.permute(x, (2, 0, 1))
    assert p.shape == (8, sym("b"), sym("h"))
    m = g.matmul(x, g.input("w", (8, "k")))
    assert m.shape == (sym("b"), sym("h"), sym("k"))
    s = g.sum(x, 1)
    assert s.shape == (sym("b"), 1, 8)


def test_bind_returns_symbol_values() -> None:
    w = WORKLOADS["W4"]
    s = w.shapes[0]
    g = w.program(s)
    shapes = {k: v for k, v in w.input_shapes(s).items()}
    assert g.bind(shapes) == w.env(s)


def test_customized_results_and_evaluate_params() -> None:
    """A kernel graph with a customized op: result nodes carry the block graph's output shapes, and
    evaluate() instantiates the block graph from params."""
    g = Graph()
    x = g.input("x", ("n", 8))
    bb = BlockBuilder(grid=("G",), forloop="F", inputs=[x])
    t = bb.iter(0, imap=(1,), fmap=1)
    bb.save(bb.exp(t), omap=(1,), fmap=1)
    bb.save(bb.accumulate("sum_last", t), omap=(None,))
    e, s = g.customized(bb.build(), [x])
    assert e.shape == (sym("n"), 8) and s.shape == (sym("n"), 1)
    g.output(e, "e")
    g.output(s, "s")
    g.check()
    xs = np.random.default_rng(0).standard_normal((3, 8))
    out = g.evaluate({"x": xs}, dtype=np.float64, params={"G": 2, "F": 2})
    np.testing.assert_allclose(out["e"], np.exp(xs), rtol=1e-12)
    np.testing.assert_allclose(out["s"], xs.sum(-1, keepdims=True), rtol=1e-12)
    assert graph_from_json(graph_to_json(g)).key == g.key


def test_generalize_tries_each_image_of_a_size_in_turn() -> None:
    """``images``: a reshape's 256 stands for (256, 96); with the weight's axis 0 now 96 only 96 keeps the element
    count, and the copy computes what the same graph built at those sizes does. No consistent image: an error."""
    g = Graph("img")
    q = g.input("q", (256, 256))
    g.output(g.reshape(q, (256, 8, 32)), "y")
    c = g.generalize({}, {("q", 0): 96}, images={256: (256, 96)})
    want = Graph("img")
    want.output(want.reshape(want.input("q", (96, 256)), (96, 8, 32)), "y")
    assert c.key == want.key
    with pytest.raises(PrismError):
        g.generalize({}, {("q", 0): 96}, images={256: (256, 100)})
