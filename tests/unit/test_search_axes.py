"""Kept axes (prism.search.axes): which dims of a program's inputs no operator reduces and every output keeps,
and the search rule built on them (never reduce such a dim, never line it up with another axis)."""

from __future__ import annotations

import pytest
from search_programs import grouped_linear

from prism.ir.graph import Graph
from prism.search.axes import after, kept_axes
from prism.search.block import BlockContext
from prism.search.program import peel

pytestmark = pytest.mark.unit


def test_grouped_linear_keeps_rows_and_columns_and_reduces_groups_and_their_elements() -> None:
    core = peel(grouped_linear(256, 256, rows=8)).core
    # x [rows, groups, 32], q [N, groups, 32], s [N, groups, 1]: rows and N kept; groups and the 32 reduced
    assert kept_axes(core) == {"x": (True, False, False), "q": (True, False, False), "s": (True, False, None)}


def test_a_softmax_or_norm_along_an_output_axis_makes_it_reduced() -> None:
    g = Graph("softmax_linear")
    x, w = g.input("x", ("n", 64)), g.input("w", (64, 32))
    g.output(g.softmax(g.matmul(x, w), -1), "y")
    assert kept_axes(peel(g).core) == {"x": (True, False), "w": (False, False)}
    g = Graph("rms_norm")
    x = g.input("x", ("n", 64))
    g.output(g.rms_norm(x, 1e-6, -1), "y")
    assert kept_axes(peel(g).core) == {"x": (True, False)}


def test_an_axis_not_in_any_output_is_not_kept() -> None:
    g = Graph("row_sums")
    x = g.input("x", (16, 64))
    g.output(g.sum(x, 0), "y")   # the 16 rows are summed: only the 64 columns are kept
    assert kept_axes(peel(g).core) == {"x": (False, True)}


def test_layout_changes_across_an_axis_make_it_unknown() -> None:
    g = Graph("split_heads")
    x, w = g.input("x", (4, 64)), g.input("w", (64, 64))
    y = g.exp(g.reshape(g.matmul(x, w), (4, 8, 8)))   # the 64 output columns split into heads
    g.output(g.sum(y, -1), "y")
    assert kept_axes(peel(g).core) == {"x": (True, False), "w": (False, None)}
    g = Graph("rope")
    x = g.input("x", (4, 64))
    g.output(g.rotate_half(g.exp(x), -1), "y")
    assert kept_axes(peel(g).core) == {"x": (True, None)}


def test_predefined_operators_carry_and_refuse_kept_axes() -> None:
    kept, other = (True, False), (False, True)
    assert after("permute", ((1, 0),), [kept], [(8, 64)], 2) == (True, (False, True))
    assert after("reduce", (0,), [kept], [(8, 64)], 2) == (False, None)     # sums the kept rows
    assert after("reduce", (1,), [kept], [(8, 64)], 2) == (True, (True, None))
    assert after("binary", (), [kept, other], [(8, 8), (8, 8)], 2) == (False, None)   # kept lined up with other
    assert after("binary", (), [kept, None], [(8, 64), (1, 64)], 2) == (True, (True, False))
    # a product: the contraction must not run over a kept dim; the result has the rows of one, columns of the other
    assert after("matmul", (), [(True, False), (False, True)], [(8, 64), (64, 32)], 2) == (True, (True, True))
    assert after("matmul", (), [(False, True), (True, False)], [(64, 8), (8, 32)], 2) == (False, None)
    assert after("reshape", ((512,),), [kept], [(8, 64)], 1) == (True, None)


def test_block_contexts_with_different_axes_are_different_memo_keys() -> None:
    a = BlockContext(((1, (8, 64)),), False, ((True, False),))
    b = BlockContext(((1, (8, 64)),), False, ())
    assert a != b and a == BlockContext(((1, (8, 64)),), False, ((True, False),))
    assert a.kept((8, 0, 0)) is True and a.kept((64, 0, 1)) is False and a.kept(None) is None
    assert b.kept((8, 0, 0)) is None
