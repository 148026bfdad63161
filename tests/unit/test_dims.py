"""Symbolic dims: canonical form and interning, arithmetic, substitution, evaluation and sound comparison."""

from __future__ import annotations

import operator
import pickle
from fractions import Fraction

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from prism.errors import DimError, InconclusiveDimError
from prism.ir.dims import (
    Dim,
    Divisible,
    as_dim,
    dims_equal,
    div_exact,
    evaluate,
    format_dim,
    format_shape,
    product,
    sel,
    sign,
    structurally_equal,
    subs,
    sym,
    symbols,
)

pytestmark = pytest.mark.unit

B, C, G, F = sym("B"), sym("C"), sym("G"), sym("F")


# --- canonical form and interning ---------------------------------------------------------------

def test_symbols_are_interned() -> None:
    assert sym("B") is sym("B")
    assert sym("B") is B
    assert sym("B") is not sym("C")


def test_structurally_equal_dims_are_the_same_object() -> None:
    assert B + C is C + B
    assert B * C is C * B
    assert (B + C) * G is B * G + C * G
    assert B + B is 2 * B
    assert B * B is B * B
    assert (B + 1) - 1 is B
    assert 3 * (B + 2) is 3 * B + 6


def test_division_cancels_to_the_same_object() -> None:
    assert div_exact(B * G, G) is B
    assert B * G // G is B
    assert div_exact(B * G * F, G * F) is B
    assert div_exact(B, B) == 1
    assert div_exact(6 * B, 3) is 2 * B
    assert div_exact(B, G) * G is B


def test_constant_results_are_plain_ints() -> None:
    for x in (B - B, (B + 3) - B, B * 0, div_exact(4 * B, 2 * B), (B + 1) * (B - 1) - B * B):
        assert type(x) is int
    assert (B + 3) - B == 3
    assert (B + 1) * (B - 1) - B * B == -1
    assert B * 0 == 0


def test_int_operand_identity() -> None:
    assert B * 1 is B
    assert 1 * B is B
    assert B + 0 is B
    assert 0 + B is B


def test_format() -> None:
    assert format_dim(B) == "B"
    assert format_dim(5) == "5"
    assert format_dim(2 * B + 1) == "1 + 2*B"  # canonical order: constant term first
    assert format_dim(div_exact(B, 3)) == "B/3"
    assert format_dim(div_exact(1024, F * G)) == "1024/(F*G)"
    assert format_dim(B * B) == "B^2"
    assert format_dim(B - C) == "B - C"
    assert format_shape((B, 4)) == "[B, 4]"
    assert "m==1" in format_dim(sel("m", 1, "G"))


def test_symbols_lists_size_and_map_symbols() -> None:
    assert symbols(B * C + 1) == {"B", "C"}
    assert symbols(7) == set()
    assert symbols(div_exact(8, sel("m", 0, "G"))) == {"m", "G"}
    assert symbols(sel("m", 0, 4)) == {"m"}


def test_as_dim_and_names() -> None:
    assert as_dim("B") is B
    assert as_dim(3) == 3
    import numpy as np
    assert as_dim(np.int64(5)) == 5 and type(as_dim(np.int64(5))) is int
    for bad in (-1, True, 1.5, None):
        with pytest.raises(DimError):
            as_dim(bad)  # type: ignore[arg-type]
    for bad_name in ("", "1x", "a b", "x-y"):
        with pytest.raises(DimError, match="invalid symbol name"):
            sym(bad_name)
    with pytest.raises(DimError, match=">= 1"):
        sel("m", 0, 0)


def test_symbolic_dim_has_no_int_value() -> None:
    with pytest.raises(DimError, match="B"):
        int(B)
    with pytest.raises(DimError):
        range(B)  # type: ignore[call-overload]


# --- substitution and evaluation ----------------------------------------------------------------

def test_subs_partial_and_full() -> None:
    x = B * C + G
    assert subs(x, {"B": 2}) is 2 * C + G
    assert subs(x, {"B": 2, "C": 3}) is G + 6
    assert subs(x, {"B": 2, "C": 3, "G": 4}) == 10
    assert type(subs(x, {"B": 2, "C": 3, "G": 4})) is int
    assert subs(x, {}) is x
    assert subs(x, {"B": C}) is C * C + G  # a symbol may be replaced by another dim
    assert subs(7, {"B": 1}) == 7


def test_subs_selectors() -> None:
    s = sel("m", 1, "G")
    assert subs(s, {"m": 1}) is G                 # map symbol matches: the grid size
    assert subs(s, {"m": 0}) == 1                 # another data dim: 1
    assert subs(s, {"m": None}) == 1              # replicate: 1
    assert subs(s, {"G": 4}) is sel("m", 1, 4)    # grid size only: still a selector
    assert subs(s, {"m": 1, "G": 4}) == 4
    assert subs(s, {"G": 4, "m": 2}) == 1
    tile = div_exact(8, sel("m", 1, "G"))
    assert subs(tile, {"m": 1, "G": 4}) == 2
    assert subs(tile, {"m": 0, "G": 4}) == 8
    assert subs(tile, {"m": None}) == 8
    assert subs(tile, {"m": 1}) is div_exact(8, G)


def test_evaluate() -> None:
    assert evaluate(B * C + 1, {"B": 3, "C": 4}) == 13
    assert evaluate(5, {}) == 5
    assert evaluate(div_exact(B, 4), {"B": 8}) == 2


def test_evaluate_missing_symbol_names_it() -> None:
    with pytest.raises(DimError, match=r"no value for \['C'\]"):
        evaluate(B * C, {"B": 2})


def test_evaluate_inexact_division_names_the_values() -> None:
    x = div_exact(B, 3)
    with pytest.raises(DimError) as e:
        evaluate(x, {"B": 4})
    msg = str(e.value)
    assert "B/3" in msg and "B=4" in msg and "not an integer" in msg


def test_div_exact_errors() -> None:
    with pytest.raises(DimError, match="2 does not divide 7"):
        div_exact(7, 2)
    with pytest.raises(DimError, match="zero"):
        div_exact(B, 0)
    with pytest.raises(DimError, match=r"cannot divide by 1 \+ B"):
        div_exact(B, B + 1)  # no exact symbolic quotient by a sum
    assert div_exact(12, 4) == 3


# --- sound comparison ------------------------------------------------------------------------------

def test_sound_equality() -> None:
    assert (B == B) is True
    assert (B + 1 == B) is False
    assert (B != B + 1) is True
    assert (2 * B >= B) is True
    assert (2 * B > B) is True
    assert (B < B + 1) is True
    assert (B > 0) is True
    assert (B >= 1) is True
    assert (div_exact(B, C) > 0) is True     # a Laurent term is positive
    assert dims_equal(B, B) and dims_equal(4, 4) and not dims_equal(4, 5)


@pytest.mark.parametrize("cmp", [
    lambda: B == 8, lambda: B != 8, lambda: B < C, lambda: B <= C, lambda: B > 1, lambda: B == C,
    lambda: 2 * B == B * C, lambda: dims_equal(8, B), lambda: div_exact(B, C) >= 1,
])
def test_undecidable_comparisons_raise(cmp) -> None:
    with pytest.raises(InconclusiveDimError):
        cmp()


def test_inconclusive_message_names_symbols_and_fix() -> None:
    with pytest.raises(InconclusiveDimError) as e:
        _ = B == 8
    assert "B == 8" in str(e.value) and "substitute" in str(e.value)
    with pytest.raises(InconclusiveDimError, match=r"B < C.*\['B', 'C'\]"):
        _ = B < C


def test_structurally_equal_never_raises() -> None:
    assert structurally_equal(B, B)
    assert not structurally_equal(B, 8)
    assert not structurally_equal(B, C)
    assert structurally_equal(4, 4)
    assert not structurally_equal(4, 5)


def test_sign() -> None:
    assert sign(B) == 1
    assert sign(-B) == -1
    assert sign(B - 1) == "ge0"
    assert sign(1 - B) == "le0"
    assert sign(B - C) is None
    assert sign(0) == 0


def test_dims_hash_and_dict_keys() -> None:
    d = {B: "b", 2 * B + 1: "x"}
    assert d[sym("B")] == "b"
    assert d[B + B + 1] == "x"


# --- Divisible, product, pickling -----------------------------------------------------------------

def test_divisible_holds() -> None:
    c = Divisible(B, 4, "tile")
    assert c.holds({"B": 8}) is True
    assert c.holds({"B": 6}) is False
    assert c.holds({}) is None
    assert Divisible(F * G, 1024).holds({"F": 4, "G": 8}) is False  # den does not divide num: 32 vs 1024
    assert Divisible(1024, F * G).holds({"F": 4, "G": 8}) is True
    assert Divisible(1024, F * G).holds({"F": 4}) is None
    assert str(c) == "4 | B  (tile)"


def test_product() -> None:
    assert product([B, C, 2]) is 2 * B * C
    assert product([]) == 1
    assert product([3, 4]) == 12


@pytest.mark.parametrize("x", [B, B * C + 1, div_exact(B, 3), sel("m", 1, "G"), div_exact(8, sel("m", 0, 4)),
                               -B, B * B - 2 * C])
def test_pickle_round_trip_keeps_identity(x: Dim) -> None:
    assert pickle.loads(pickle.dumps(x)) is x
    assert pickle.loads(pickle.dumps((x, [x]))) == (x, [x])


# --- property tests ----------------------------------------------------------------------------------
# An expression tree is the oracle: build() turns it into a Dim, value() computes it with Fractions.

SYMS = ("A", "B", "C")
_leaf = st.one_of(st.sampled_from(SYMS).map(lambda s: ("sym", s)), st.integers(-3, 5).map(lambda c: ("int", c)))
_mono = st.tuples(st.integers(1, 3), st.lists(st.sampled_from(SYMS), max_size=2)).map(lambda t: ("mono",) + t)
_tree = st.recursive(
    _leaf,
    lambda kids: st.one_of(st.tuples(st.sampled_from(["+", "-", "*"]), kids, kids),
                           st.tuples(st.just("/"), kids, _mono)),
    max_leaves=6)
_env = st.fixed_dictionaries({s: st.integers(1, 9) for s in SYMS})
_OPS = {"+": operator.add, "-": operator.sub, "*": operator.mul}


def build(t: tuple):
    kind = t[0]
    if kind == "sym":
        return sym(t[1])
    if kind == "int":
        return t[1]
    if kind == "mono":
        return product([t[1], *(sym(s) for s in t[2])])
    if kind == "/":
        return div_exact(build(t[1]), build(t[2]))
    return _OPS[kind](build(t[1]), build(t[2]))


def value(t: tuple, env: dict[str, int]) -> Fraction:
    kind = t[0]
    if kind == "sym":
        return Fraction(env[t[1]])
    if kind == "int":
        return Fraction(t[1])
    if kind == "mono":
        return Fraction(product([t[1], *(env[s] for s in t[2])]))
    if kind == "/":
        return value(t[1], env) / value(t[2], env)
    return _OPS[kind](value(t[1], env), value(t[2], env))


def built(t: tuple):
    try:
        return build(t)
    except DimError:  # a non-integer constant (e.g. 3/2): legitimately not a dim
        assume(False)


def check_eval(x, t: tuple, env: dict[str, int]) -> None:
    want = value(t, env)
    if want.denominator == 1:
        assert evaluate(x, env) == want
    else:
        with pytest.raises(DimError):
            evaluate(x, env)


@given(_tree, _tree, _env)
def test_evaluate_is_a_ring_homomorphism(ta: tuple, tb: tuple, env: dict[str, int]) -> None:
    a, b = built(ta), built(tb)
    check_eval(a, ta, env)
    for op in ("+", "-", "*"):
        try:
            ab = _OPS[op](a, b)
        except DimError:
            assume(False)
        check_eval(ab, (op, ta, tb), env)
        va, vb = value(ta, env), value(tb, env)
        if va.denominator == 1 and vb.denominator == 1:
            assert evaluate(ab, env) == _OPS[op](evaluate(a, env), evaluate(b, env))


@given(_tree, _env, st.sets(st.sampled_from(SYMS)))
def test_subs_then_evaluate_equals_evaluate(t: tuple, env: dict[str, int], part: set[str]) -> None:
    x = built(t)
    want = value(t, env)
    assume(want.denominator == 1)
    try:
        partial = subs(x, {k: env[k] for k in part})
    except DimError:  # every remaining symbol cancelled to a non-integer constant
        assume(False)
    assert evaluate(partial, env) == want
    assert evaluate(x, env) == want


@given(_tree)
def test_canonical_form_is_interned(t: tuple) -> None:
    x = built(t)
    y = built(t)
    assert structurally_equal(x, y)
    if isinstance(x, Dim):
        assert x is y
        z = sym("Z")  # a symbol x does not contain: x*z is never a constant
        assert (x + z) - z is x
        assert x * z is z * x
        assert div_exact(x * z, z) is x


_CMPS = {"==": operator.eq, "!=": operator.ne, "<": operator.lt, "<=": operator.le, ">": operator.gt,
         ">=": operator.ge}
_PROBE_ENVS = [{"A": a, "B": b, "C": c} for a in (1, 2, 7) for b in (1, 3, 50) for c in (1, 4, 1000)]


@given(_tree, _tree, st.sampled_from(sorted(_CMPS)))
def test_comparisons_are_sound(ta: tuple, tb: tuple, op: str) -> None:
    """A comparison that returns a bool must be right for every value of the symbols (probed)."""
    a, b = built(ta), built(tb)
    try:
        r = _CMPS[op](a, b)
    except InconclusiveDimError:
        return
    assert isinstance(r, bool)
    for env in _PROBE_ENVS:
        assert _CMPS[op](value(ta, env), value(tb, env)) == r, (format_dim(a), op, format_dim(b), env)


def test_comparisons_are_not_vacuous() -> None:
    """The soundness property above would pass if every comparison raised; make sure many decide."""
    decided = 0
    for x in (B, B + 1, 2 * B, B * C, div_exact(B, C), 3):
        for y in (B, 1, B + 2, B * C + B):
            try:
                _ = x <= y
                decided += 1
            except InconclusiveDimError:
                pass
    assert decided >= 12


@given(_tree, _env)
def test_the_integer_fast_path_agrees_with_substitution(t: tuple, env: dict[str, int]) -> None:
    """evaluate() computes plain-variable dims with integers; numpy ints take the symbolic path (subs).
    Both give the same value, or the same error."""
    import numpy as np
    x = built(t)
    slow_env = {k: np.int64(v) for k, v in env.items()}
    try:
        fast = evaluate(x, env)
    except DimError as e:
        with pytest.raises(DimError) as slow:
            evaluate(x, slow_env)
        assert str(slow.value) == str(e)
    else:
        assert evaluate(x, slow_env) == fast and type(fast) is int


def test_the_fast_path_leaves_missing_and_selector_symbols_to_substitution() -> None:
    with pytest.raises(DimError, match=r"no value for \['C'\]"):
        evaluate(B * C + 1, {"B": 2})
    with pytest.raises(DimError, match="not an integer"):
        evaluate(div_exact(B, 4), {"B": 6})
    s = sel("m", 0, B)
    assert evaluate(s * C, {"m": 0, "B": 3, "C": 2}) == 6 and evaluate(s * C, {"m": None, "B": 3, "C": 2}) == 2
