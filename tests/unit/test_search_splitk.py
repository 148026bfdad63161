"""The split-reduction move (prism.search.splitk) on small block graphs: where it applies, where it refuses."""

from __future__ import annotations

import pytest

from prism.ir.block import BlockBuilder
from prism.ir.graph import Graph
from prism.search.cost import machine
from prism.search.gate import numeric
from prism.search.splitk import MERGE, Refusal, SplitVariant, estimate_split, split_reduction
from prism.workloads import WORKLOADS

pytestmark = pytest.mark.unit


def _linear(acc: str) -> tuple[Graph, Graph]:
    """Y = X @ W (or rms_norm(X) @ W) as a program and as one kernel: grid over W's columns, loop over d."""
    prog = Graph("linear")
    x, w = prog.input("X", ("n", 64)), prog.input("W", (64, 32))
    prog.output(prog.matmul(prog.rms_norm(x, eps=1e-6) if acc == "rms" else x, w), "Y")
    g = Graph("linear kernel")
    x, w = g.input("X", ("n", 64)), g.input("W", (64, 32))
    bb = BlockBuilder(grid=("g0",), forloop="F", inputs=[x, w])
    xt = bb.iter(0, imap=(None,), fmap=1)
    y = bb.accumulate("sum", bb.matmul(xt, bb.iter(1, imap=(1,), fmap=0)))
    if acc == "rms":
        y = bb.div(y, bb.accumulate("rms", xt, eps=1e-6))
    bb.save(y, omap=(1,))
    (out,) = g.customized(bb.build(), [x, w])
    g.output(out, "Y")
    return prog, g


def test_merge_table_names_real_accumulators() -> None:
    from prism.ir.block import ACCUMULATORS
    assert set(MERGE) <= set(ACCUMULATORS)
    assert "rms" not in MERGE and "sum_last" not in MERGE


def test_split_k_of_a_sum_accumulator_is_correct() -> None:
    prog, g = _linear("sum")
    v = split_reduction(g)
    assert isinstance(v, SplitVariant), v
    (bg,) = v.graph.customized_ops()
    assert len(bg.grid) == 2 and v.symbol == "P0" and v.walked == ((0, 1), (1, 0))
    iters = {n.arg[0]: n.arg[1:] for n in bg.nodes if n.op == "iter"}
    assert iters[0] == ((None, 1), 1) and iters[1] == ((1, 0), 0)  # the new grid dim splits what the loop walks
    ops = [n.op for n in v.graph.nodes]
    assert ops.count("sum") == 1 and "max" not in ops  # partial sums merged by a sum, no rescaling
    verdict = numeric(v.graph, prog)
    assert verdict.ok, verdict.detail
    c = estimate_split(v, {"g0": 2, "F": 4}, {"n": 16}, machine())
    assert c.feasible and c.params["g0"] == 2 and c.params["P0"] >= 2


def test_refuses_an_rms_accumulator() -> None:
    _, g = _linear("rms")
    r = split_reduction(g)
    assert isinstance(r, Refusal) and r.reason == "no_merge_rule" and "rms" in r.detail


def test_refuses_without_a_loop_and_with_a_full_grid() -> None:
    g = Graph("no loop")
    x = g.input("X", ("n", 8))
    bb = BlockBuilder(grid=("g0",), inputs=[x])
    bb.save(bb.exp(bb.iter(0, imap=(0,))), omap=(0,))
    (out,) = g.customized(bb.build(), [x])
    g.output(out, "Y")
    r = split_reduction(g)
    assert isinstance(r, Refusal) and r.reason == "no_loop"
    w = WORKLOADS["W4"]
    hand = w.hand_written(w.shapes[0])  # already split-KV: grid (b, h, P) is full
    r = split_reduction(hand)
    assert isinstance(r, Refusal) and r.reason == "grid_full"
