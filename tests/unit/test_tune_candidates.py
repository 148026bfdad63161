"""Instantiation of sGraphs: candidate values, exact divisibility, machine filters, clear failures."""

from __future__ import annotations

import dataclasses
import itertools

import numpy as np
import pytest

import prism
from prism.ir import dims as D
from prism.ir.block import BlockBuilder, MapVar
from prism.tune import NoInstanceError, instantiate, symbol_values, tune
from prism.tune.candidates import divisors, sgraph_symbols, thin, working_sizes
from prism.tune.machine import Machine
from prism.tune.tuner import expected_shapes
from prism.workloads import WORKLOADS

pytestmark = pytest.mark.unit

MACHINE = Machine(cores=2, threads=2, l1=32 << 10, l2=1 << 20, l3=32 << 20, simd=16, isa="avx512",
                  fingerprint="test", bandwidth=40e9, bandwidth_1=25e9, cache_bandwidth=100e9, peak_flops=200e9,
                  measured=False)


def test_divisors_and_thinning() -> None:
    assert divisors(12) == [1, 2, 3, 4, 6, 12]
    assert divisors(1) == [1]
    vals = thin(divisors(6144), limit=16)  # 6144 = 2^11 * 3: 24 divisors
    assert len(vals) == 16 and all(6144 % v == 0 for v in vals)
    assert [v for v in vals if v & (v - 1) == 0] == [1 << k for k in range(12)]  # every power of two kept
    assert len([v for v in vals if v % 3 == 0]) == 4  # the rest of the room: multiples of 3


@pytest.mark.parametrize("wid", ["W1", "W4", "W6", "W7"])
def test_symbol_values_divide_the_dims(wid: str) -> None:
    w = WORKLOADS[wid]
    s = w.shapes[0]
    hand = w.hand_written(s)
    vals = symbol_values(hand, w.env(s))
    size, maps = sgraph_symbols(hand)
    assert sorted(vals) == size and not maps
    splits = {s for bg in hand.customized_ops() for s in bg.splits}
    assert splits <= set(size)
    for name, vs in vals.items():
        # 1 always, except for a split count (one split = the base structure plus a useless combine)
        assert (1 not in vs) if name in splits else (1 in vs), (name, vs)
        for c in (c for bg in hand.customized_ops() for c in bg.constraints):
            if name in D.symbols(c.den):
                num = D.evaluate(c.num, w.env(s))
                assert all(num % v == 0 for v in vs), (name, str(c), vs)
    # the workload's own known-good parameters are among the candidates
    for k, v in w.params(s).items():
        assert v in vals[k]


def test_non_power_of_two_dims_get_their_divisors() -> None:
    w = WORKLOADS["W1"]
    s = next(s for s in w.shapes if s["m"] == 6144)
    vals = symbol_values(w.hand_written(s), w.env(s))
    assert any(v % 3 == 0 for v in vals["G"]), vals["G"]


def _brute_force(g: prism.Graph, env: dict[str, int]) -> set[tuple]:
    size, _ = sgraph_symbols(g)
    cons = [c for bg in g.customized_ops() for c in bg.constraints]
    pools = []
    for name in size:
        bound = [D.evaluate(c.num, env) for c in cons if name in D.symbols(c.den)]
        pools.append(sorted({v for b in bound for v in divisors(b)}))
    ok = set()
    for combo in itertools.product(*pools):
        full = {**env, **dict(zip(size, combo))}
        if all(c.holds(full) for c in cons):
            ok.add(combo)
    return ok


@pytest.mark.parametrize("wid", ["W1", "W4"])
def test_every_exact_assignment_is_found_and_each_instance_is_concrete(wid: str) -> None:
    w = WORKLOADS[wid]
    s = w.shapes[0]
    hand, env = w.hand_written(s), w.env(s)
    r = instantiate(hand, env, MACHINE, expected=expected_shapes(w.program(s), env))
    size, _ = sgraph_symbols(hand)
    got = {tuple(i.params[k] for k in size) for i in r.kept + r.dropped}
    marked = {s for bg in hand.customized_ops() for s in bg.splits}
    split = [j for j, k in enumerate(size) if k in marked]
    want = {a for a in _brute_force(hand, env) if all(a[j] != 1 for j in split)}
    assert got == want  # values are thinned only beyond 20 per symbol: none here
    for inst in r.kept:
        assert not inst.graph.symbols() and all(bg.is_concrete() for bg in inst.graph.customized_ops())
        assert inst.estimate.seconds > 0


def test_instances_compute_the_program() -> None:
    w = WORKLOADS["W1"]
    s = {"n": 4, "d": 64, "m": 96}
    hand, prog = w.hand_written(s), w.program(s)
    env = {"n": 4}
    r = instantiate(hand, env, MACHINE)
    x = {k: np.random.default_rng(0).standard_normal((4, 64) if k == "X" else (64, 96)) for k in ("X", "W")}
    ref = prog.evaluate(x, dtype=np.float64)["Y"]
    insts = r.kept + r.dropped
    assert len(insts) > 5
    for inst in insts[::3]:
        got = inst.graph.evaluate(x, dtype=np.float64)["Y"]
        np.testing.assert_allclose(got, ref, rtol=1e-10, atol=1e-10)


def test_machine_filters_and_relaxation() -> None:
    w = WORKLOADS["W1"]
    s = w.shapes[0]
    hand, env = w.hand_written(s), w.env(s)
    many = dataclasses.replace(MACHINE, threads=8, cores=8)
    r = instantiate(hand, env, many)
    assert r.kept and not r.relaxed
    assert all(i.estimate.min_blocks >= 8 for i in r.kept)
    assert any(i.dropped == "cores" for i in r.dropped)
    assert any(i.dropped == "vector" for i in r.dropped)  # e.g. G = 1024: 1-column weight tiles
    for i in r.kept:  # split innermost tile dims are whole vectors
        for bg in i.graph.customized_ops():
            for n in bg.nodes:
                if n.op == "iter" and n.shape[-1] != bg.inputs[n.arg[0]].shape[-1]:
                    assert n.shape[-1] % 16 == 0
    tiny = dataclasses.replace(MACHINE, l2=64)  # nothing fits: the cache filter is relaxed, not fatal
    r2 = instantiate(hand, env, tiny)
    assert "cache" in r2.relaxed and r2.kept


def test_map_symbols_are_enumerated() -> None:
    g = prism.Graph("mapvar")
    X = g.input("X", ("n", 64))
    bb = BlockBuilder(grid=("G",), forloop=1, inputs=[X])
    bb.save(bb.relu(bb.iter(0, imap=(MapVar("m"),))), omap=(MapVar("m"),))
    (y,) = g.customized(bb.build(), [X])
    g.output(y, "Y")
    r = instantiate(g, {"n": 6}, MACHINE, expected={"Y": (6, 64)})
    insts = r.kept + r.dropped
    choices = {i.params["m"] for i in insts}
    assert choices == {None, 0, 1}
    assert {i.params["G"] for i in insts if i.params["m"] == 0} == {1, 2, 3, 6}  # divisors of n = 6
    x = {"X": np.random.default_rng(1).standard_normal((6, 64))}
    for i in insts:
        if i.params["m"] is not None or i.params["G"] == 1:  # replicate + partial sums is G * relu(x)
            np.testing.assert_allclose(i.graph.evaluate(x, dtype=np.float64)["Y"], np.maximum(x["X"], 0))


def _fixed_grid_sgraph() -> tuple[prism.Graph, prism.Graph]:
    """An sGraph whose grid is the literal 4 over the symbolic dim h: only multiples of 4 work."""
    g = prism.Graph("fixed-grid")
    X = g.input("X", (8, "h"))
    bb = BlockBuilder(grid=(4,), forloop="F", inputs=[X])
    t = bb.iter(0, imap=(1,), fmap=0)
    bb.save(bb.relu(t), omap=(1,), fmap=0)
    (y,) = g.customized(bb.build(), [X])
    g.output(y, "Y")
    p = prism.Graph("fixed-grid program")
    Xp = p.input("X", (8, "h"))
    p.output(p.relu(Xp), "Y")
    return g, p


def test_no_instance_names_the_sizes_that_work() -> None:
    g, p = _fixed_grid_sgraph()
    assert instantiate(g, {"h": 12}, MACHINE).kept
    r = instantiate(g, {"h": 6}, MACHINE)
    assert not r.kept and "4 | h" in r.failure
    assert working_sizes(g, {"h": 6}, MACHINE)["h"][:3] == [4, 8, 12]
    with pytest.raises(NoInstanceError, match=r"h=6.*\n.*4 \| h(.|\n)*h in \[4, 8, 12"):
        tune([g], p, {"h": 6}, MACHINE)


def test_split_counts_are_marked_in_the_block_graph_not_named() -> None:
    """A grid symbol named P is an ordinary size unless the block graph marks it as a split count; the
    mark survives serialization and partial instantiation, and naming a non-grid symbol is an error."""
    from prism.ir import BlockBuilder
    from prism.ir.serialize import graph_from_json, graph_to_json

    def graph(splits: tuple[str, ...]) -> prism.Graph:
        g = prism.Graph()
        x = g.input("X", (64, 256))
        bb = BlockBuilder(grid=("P", "Q"), inputs=[x], splits=splits)
        t = bb.iter(0, imap=(0, 1))
        bb.save(bb.exp(t), omap=(0, 1))
        (y,) = g.customized(bb.build(), [x])
        g.output(y, "Y")
        return g

    plain, marked = graph(()), graph(("Q",))
    assert 1 in symbol_values(plain, {})["P"] and 1 in symbol_values(plain, {})["Q"]
    vals = symbol_values(marked, {})
    assert 1 in vals["P"] and 1 not in vals["Q"] and len(vals["Q"]) > 1
    back = graph_from_json(graph_to_json(marked))
    assert [bg.splits for bg in back.customized_ops()] == [frozenset({"Q"})]
    (bg,) = marked.customized_ops()
    assert bg.instantiate({"P": 4}).splits == frozenset({"Q"}) and bg.instantiate({"Q": 4}).splits == frozenset()
    with pytest.raises(prism.GraphError, match="not size symbols of the grid"):
        BlockBuilder(grid=("P",), inputs=[((4, 4), "float32")], splits=("F",))
