"""Sizes equal but named differently (prism.frontend.symbolic.identify): an undecided equality becomes an
identification only when the example values agree and a symbol can be solved for; never otherwise."""

from __future__ import annotations

import pytest

from prism.errors import InconclusiveDimError
from prism.frontend.symbolic import SymbolEnv, identify, symbol_env, to_dim
from prism.ir import dims as D

pytestmark = pytest.mark.unit

s31, s55, s1, s3 = (D.sym(n) for n in ("s31", "s55", "s1", "s3"))


def test_the_newer_symbol_is_read_as_the_older() -> None:
    env = SymbolEnv(hints={"s31": 9, "s55": 9})
    assert identify((1 + s55) - (1 + s31), env, "needed by sdpa") == ("s55", s31)
    assert env.aliases == {"s55": s31}
    (a,) = env.assumptions()
    assert a.startswith("s55 == s31") and "sdpa" in a and "checked on every call" in a


def test_solved_for_a_lone_symbol_with_unit_coefficient() -> None:
    env = SymbolEnv(hints={"s1": 4, "s3": 8})
    assert identify(s3 - 2 * s1, env) == ("s3", 2 * s1)
    env = SymbolEnv(hints={"s1": 2, "s3": 3, "s31": 6})
    assert identify(s1 * s3 - s31, env) == ("s31", s1 * s3)  # s31 alone: its value may be a product


@pytest.mark.parametrize("diff, hints", [
    ((1 + s55) - (1 + s31), {"s31": 9, "s55": 10}),      # the example values differ
    ((1 + s55) - (1 + s31), {"s31": 9}),                  # one example value unknown
    (2 * s3 - 2 * s1, {"s1": 4, "s3": 4}),                 # coefficient 2: not solved for
    (s1 * s3 - s1 * s31, {"s1": 2, "s3": 3, "s31": 3}),    # only products
])
def test_never_a_guess(diff: D.Dim, hints: dict[str, int]) -> None:
    env = SymbolEnv(hints=dict(hints))
    assert identify(diff, env) is None and env.aliases == {}


def test_an_undecided_equality_carries_its_difference() -> None:
    with pytest.raises(InconclusiveDimError) as e:
        _ = (1 + s55) == (1 + s31)
    assert D.structurally_equal(e.value.diff, s55 - s31)


def test_sizes_are_read_through_the_identifications() -> None:
    import sympy
    env = SymbolEnv(hints={"s31": 9, "s55": 9})
    identify(s55 - s31, env)
    assert to_dim(sympy.Symbol("s55") + 1) == D.sym("s55") + 1   # outside: as named
    with symbol_env(env):
        assert to_dim(sympy.Symbol("s55") + 1) == s31 + 1
        assert to_dim(sympy.Symbol("s31") * 2) == 2 * s31
