"""Symbolic dimension matching: with symbolic maps, operand pairings become DimEq constraints."""

from __future__ import annotations

import itertools

import pytest

from prism.errors import PrismError
from prism.ir import BlockBuilder, MapVar
from prism.ir.dims import DimEq, Divisible

pytestmark = pytest.mark.unit


def _split_matmul():
    bb = BlockBuilder(grid=("G",), forloop="F", inputs=[((8, 64), "float32", "X"), ((64, 32), "float32", "W")])
    x = bb.iter(0, imap=(MapVar("mX0"),), fmap=MapVar("mXf"))
    w = bb.iter(1, imap=(MapVar("mW0"),), fmap=MapVar("mWf"))
    bb.save(bb.accumulate("sum", bb.matmul(x, w)), omap=(MapVar("mY0"),))
    return bb.build()


def test_matmul_inner_dims_become_a_constraint() -> None:
    bg = _split_matmul()
    eqs = [c for c in bg.constraints if isinstance(c, DimEq)]
    assert len(eqs) == 1 and "matmul" in eqs[0].why
    assert any(isinstance(c, Divisible) for c in bg.constraints)


def test_constraint_decides_exactly_the_assignments_that_instantiate() -> None:
    bg = _split_matmul()
    (eq,) = [c for c in bg.constraints if isinstance(c, DimEq)]
    names = sorted(bg.map_symbols())
    agree = 0
    for values in itertools.product([None, 0, 1], repeat=len(names)):
        env = dict(zip(names, values))
        holds = eq.holds(env)
        assert holds is not None
        try:
            bg.instantiate(env)
            ok = True
        except PrismError:
            ok = False
        # the DimEq holding is necessary for the instantiation to build (other rules may still reject it)
        assert holds or not ok, env
        agree += holds and ok
    assert agree > 0
    good = {"mX0": None, "mXf": 1, "mW0": 1, "mWf": 0, "mY0": 1}
    assert eq.holds(good) is True
    assert eq.holds({**good, "mXf": 0}) is False
    assert eq.holds({"mX0": None}) is None  # map symbols remain


def test_kernel_level_inconclusive_comparisons_still_raise() -> None:
    import prism
    g = prism.Graph()
    a = g.input("A", ("n", "k"))
    b = g.input("B", ("j", 4))
    with pytest.raises(prism.InconclusiveDimError, match="matmul"):
        g.matmul(a, b)
