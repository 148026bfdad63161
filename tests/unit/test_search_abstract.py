"""Abstract expressions, the lax e-graph and its frozen sub-expression table."""

from __future__ import annotations

import pytest

from prism.errors import UnsupportedError
from prism.ir.graph import Graph
from prism.search.abstract import TreeAlgebra, acc_expr, format_tree, graph_exprs, op_expr
from prism.search.egraph import AXIOMS, LaxEGraph

pytestmark = pytest.mark.unit

T = TreeAlgebra()
X, W, C = T.atom("X"), T.atom("W"), T.atom("c")


def mm(a: tuple, b: tuple) -> tuple:
    return op_expr(T, "matmul", (), [a, b])


def test_translations() -> None:
    assert mm(X, W) == ("sum", ("mul", X, W))
    assert op_expr(T, "rms_norm", (1, 1e-6), [X]) == ("div", X, ("sqrt", ("sum", ("mul", X, X))))
    assert op_expr(T, "softmax", (1,), [X]) == ("div", ("exp", X), ("sum", ("exp", X)))
    assert op_expr(T, "mul_scalar", (0.5,), [X]) == ("mul", X, C)  # the constant is kept, its value dropped
    # a permute of an input is an atom of its own (x @ x.T has two atoms), of anything else the identity
    assert op_expr(T, "permute", ((1, 0),), [X]) == ("atom", "X^(-1,-2)")
    assert op_expr(T, "permute", ((0, 2, 1),), [X]) == ("atom", "X^(-1,-2)")   # the same, on a rank-3 tile
    assert op_expr(T, "permute", ((1, 0),), [op_expr(T, "permute", ((1, 0),), [X])]) == X
    assert op_expr(T, "permute", ((2, 0, 1),), [op_expr(T, "permute", ((1, 2, 0),), [X])]) == X
    assert op_expr(T, "permute", ((1, 0),), [mm(X, W)]) == mm(X, W)
    assert op_expr(T, "mean", (1,), [X]) == ("sum", X)
    assert op_expr(T, "sum", (1,), [mm(X, W)]) == mm(X, W)  # sum of sum collapses
    assert acc_expr(T, "rms", [X]) == ("sqrt", ("sum", ("mul", X, X)))
    assert acc_expr(T, "softmax_matmul", [X, W]) == ("sum", ("mul", ("exp", X), W))


def test_unsupported_program_names_the_operator() -> None:
    g = Graph("cat")
    a = g.input("A", (4, 8))
    b = g.input("B", (4, 8))
    g.output(g.concat([a, b], 1))
    with pytest.raises(UnsupportedError, match="concat"):
        graph_exprs(g, T)


def _w1() -> tuple:
    return mm(op_expr(T, "rms_norm", (1, 1e-6), [X]), W)


def test_w1_target_contains_the_fused_form_and_not_nonsense() -> None:
    eg = LaxEGraph([_w1()])
    tab = eg.table
    fused = ("div", mm(X, W), ("sqrt", ("sum", ("mul", X, X))))
    assert tab.lookup(fused) == tab.roots[0]  # the algebraic move of WORKLOADS.md W1, found by the axioms
    assert tab.lookup(mm(X, W)) is not None
    assert tab.lookup(("mul", W, W)) is None
    assert tab.lookup(("exp", X)) is None
    assert tab.u("sum", tab.lookup(mm(X, W))) == tab.lookup(mm(X, W))  # sum of a sum is the same class


def test_frozen_table_agrees_with_egglog_queries() -> None:
    eg = LaxEGraph([_w1()])
    terms = [X, W, C, ("mul", X, W), ("mul", W, X), mm(X, W), ("sum", X), ("mul", X, X), ("mul", W, W),
             ("div", X, W), ("sqrt", ("sum", ("mul", X, X))), ("div", mm(X, W), ("sqrt", ("sum", ("mul", X, X)))),
             ("exp", X), ("div", ("mul", X, W), ("sqrt", ("sum", ("mul", X, X)))), ("add", X, W)]
    for t in terms:
        assert (eg.table.lookup(t) is not None) == eg.contains_egglog(t), format_tree(t)


def test_axiom_subset_changes_what_is_reachable() -> None:
    names = [a.name for a in AXIOMS if a.name not in ("sum-div", "mul-div", "sum-mul")]
    eg = LaxEGraph([_w1()], axioms=names)
    fused = ("div", mm(X, W), ("sqrt", ("sum", ("mul", X, X))))
    assert eg.table.lookup(fused) is None
    with pytest.raises(ValueError, match="unknown axioms"):
        LaxEGraph([_w1()], axioms=["no-such-axiom"])


def test_saturation_report_and_default_axioms() -> None:
    eg = LaxEGraph([_w1()])
    assert eg.report.saturated and eg.report.nodes == eg.table.size > 0
    assert "sum-mul" not in eg.report.axioms
    lax = LaxEGraph([_w1()], axioms=[a.name for a in AXIOMS])
    # the laxest axiom equates x * sum(x) with sum(x * x): why it is off by default
    assert lax.table.lookup(("mul", X, ("sum", X))) is not None
    assert eg.table.lookup(("mul", X, ("sum", X))) is None


def test_gate_non_finite_values_must_match_the_program() -> None:
    import numpy as np

    from prism.search.gate import relative_error, same_nonfinite
    r = np.array([1.0, np.nan, np.inf, -np.inf])
    assert same_nonfinite(r.copy(), r) and relative_error(r.copy(), r) == 0.0
    assert not same_nonfinite(np.array([1.0, 0.0, np.inf, -np.inf]), r)      # NaN missing
    assert not same_nonfinite(np.array([np.nan, np.nan, np.inf, -np.inf]), r)  # extra NaN
    assert not same_nonfinite(np.array([1.0, np.nan, -np.inf, -np.inf]), r)    # wrong sign of inf
    assert relative_error(np.array([1.1, np.nan, np.inf, -np.inf]), r) > 0.09
