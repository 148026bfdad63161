"""Concrete-mode search against symbolic on one small program (its own file: 74 s, run beside the
workload searches of test_search_workloads.py rather than after them on the same pytest-xdist worker)."""

from __future__ import annotations

import pytest

from prism.ir.graph import Graph
from prism.search import Limits, search

pytestmark = pytest.mark.slow


def _ops(bg: object) -> list[str]:
    return [n.op if n.op != "acc" else f"acc.{n.arg[0]}" for n in bg.nodes]  # type: ignore[attr-defined]


def test_concrete_mode_finds_the_same_structure_with_more_states() -> None:
    g = Graph("small rmsnorm linear")
    x = g.input("X", ("n", 64))
    w = g.input("W", (64, 64))
    g.output(g.matmul(g.rms_norm(x), w), "Y")
    lim = Limits(max_kernel_ops=1, max_block_ops=4, max_results=1, time_limit=300)
    sym = search(g, lim, "symbolic", env={"n": 8}, cache=False)
    con = search(g, lim, "concrete", env={"n": 8}, cache=False)
    assert sym.best is not None and con.best is not None
    assert con.stats.states > sym.stats.states
    assert not con.best.graph.customized_ops()[0].symbols() - {"n"}  # concrete: numbers, not symbols
    assert sorted(_ops(sym.best.graph.customized_ops()[0])) == sorted(_ops(con.best.graph.customized_ops()[0]))
