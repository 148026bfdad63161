"""prism.ir.rows: the proof that a program is row-separable along a dim, from one of its sGraphs."""

from __future__ import annotations

import pytest

import prism
from prism.ir.block import BlockBuilder
from prism.ir.rows import NotRowSeparable, row_axes, row_witness


def _program(rows: object = "L") -> prism.Graph:
    g = prism.Graph("rows")
    x, w = g.input("X", (1, rows, 64)), g.input("W", (48, 64))
    g.output(g.matmul(x, g.permute(w, (1, 0))), "Y")
    return g


def _sgraph(x_rows: object = 1, out_rows: object = 1) -> prism.Graph:
    """The program with W's rows split by g0 and X's rows by g1 (``x_rows``/``out_rows``: the data dim g1 splits
    in X and in Y; None replicates X over g1)."""
    g = prism.Graph("rows")
    x, w = g.input("X", (1, "L", 64)), g.input("W", (48, 64))
    bb = BlockBuilder(grid=("g0", "g1"), forloop=1, inputs=[x, w])
    t = bb.matmul(bb.iter(0, imap=(None, x_rows)), bb.transpose(bb.iter(1, imap=(0, None)), 0, 1))
    bb.save(t, omap=(2, out_rows))
    (y,) = g.customized(bb.build(), [x, w])
    g.output(y, "Y")
    return g


def test_a_grid_over_every_row_axis_witnesses_row_separability() -> None:
    assert row_axes(_program(), "L") == ({"X": 1, "W": None}, {"Y": 1})
    assert row_witness(_sgraph(), _program(), "L", {"g0": 2, "g1": 4}, {"L": 64}, [67, 64, 3]) == "g1"


def test_no_witness_without_a_grid_over_the_rows_or_with_rows_elsewhere() -> None:
    # the rows replicated over every grid dim (each block computes all of them): nothing proves separability
    g = prism.Graph("rows")
    x, w = g.input("X", (1, "L", 64)), g.input("W", (48, 64))
    bb = BlockBuilder(grid=("g0",), forloop=1, inputs=[x, w])
    bb.save(bb.matmul(bb.iter(0, imap=(None,)), bb.transpose(bb.iter(1, imap=(0,)), 0, 1)), omap=(2,))
    (y,) = g.customized(bb.build(), [x, w])
    g.output(y, "Y")
    with pytest.raises(NotRowSeparable, match="no grid dim"):
        row_witness(g, _program(), "L", {"g0": 2}, {"L": 64})
    # a program whose output has no row axis (the rows are contracted: X^T X)
    p = prism.Graph("gram")
    x = p.input("X", ("L", 16))
    p.output(p.matmul(p.permute(x, (1, 0)), x), "Y")
    with pytest.raises(NotRowSeparable, match="no L axis"):
        row_axes(p, "L")
    # the dim inside another size (a reshape merging rows with columns)
    q = prism.Graph("merged")
    from prism.ir import dims as D
    q.output(q.reshape(q.input("X", ("L", 16)), (D.sym("L") * 2, 8)), "Y")
    with pytest.raises(NotRowSeparable, match="inside another size"):
        row_axes(q, "L")


def test_one_row_per_block_must_be_a_valid_instance_at_every_length() -> None:
    """The witness instance is one row per block at each length checked: a grid size that is not a free
    parameter (a constant 2 splitting the rows) proves nothing about a split at one row."""
    g = prism.Graph("rows")
    x, w = g.input("X", (1, "L", 64)), g.input("W", (48, 64))
    bb = BlockBuilder(grid=("g0", 2), forloop=1, inputs=[x, w])
    t = bb.matmul(bb.iter(0, imap=(None, 1)), bb.transpose(bb.iter(1, imap=(0, None)), 0, 1))
    bb.save(t, omap=(2, 1))
    (y,) = g.customized(bb.build(), [x, w])
    g.output(y, "Y")
    with pytest.raises(NotRowSeparable, match="no grid dim"):
        row_witness(g, _program(), "L", {"g0": 2}, {"L": 64}, [67])
