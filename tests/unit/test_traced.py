"""Traced ints (prism/ir/traced.py): they compute what ints compute, their expressions give the same values
at other values of the dims, and every decision on them is a guard that holds exactly where it was taken."""

from __future__ import annotations

import random

import pytest

from prism.ir.traced import Trace, Traced, any_of, lin_c, lin_eval, varies

pytestmark = pytest.mark.unit


def _program(n: int, m: int) -> list[int]:
    """Integer arithmetic as code generation does it (sizes, strides, tails, alignment, ceil-divisions)."""
    out = [n * 64, 8 * n, -(-n // 16), n // 4 * 4, n - n // 4 * 4, (8 * n + 15) // 16 * 16, n % 32, (n * m) // 3,
           -n // 5, n - m, 3 - n, abs(n - 100), max(n, 16), min(4 * n, 1000), divmod(n, 7)[1], n ** 2 // 9]
    out.append(sum(out) + (1 if n % 4 else 0))
    return out


def test_traced_values_and_expressions_match_plain_ints() -> None:
    rng = random.Random(3)
    for _ in range(200):
        n, m = rng.randrange(1, 3000), rng.randrange(1, 50)
        tr = Trace({"n": n, "m": m})
        d = tr.dims()
        got = _program(d["n"], d["m"])
        assert [int(x) for x in got] == _program(n, m)   # the traced run computes what the plain run does
        for _ in range(20):   # at any other values where the guards hold, the expressions give plain values
            n2, m2 = rng.randrange(1, 3000), rng.randrange(1, 50)
            env = {"n": n2, "m": m2}
            if tr.holds(env):
                want = _program(n2, m2)
                assert [lin_eval(x.expr, env) if isinstance(x, Traced) else x for x in got] == want, (n, m, env)


def test_decisions_are_guards_that_hold_where_they_were_taken() -> None:
    tr = Trace({"n": 70})
    n = tr.dims()["n"]
    assert n % 4 != 0 and n > 64 and not n < 16
    assert tr.holds({"n": 71}) and tr.holds({"n": 1001})
    assert not tr.holds({"n": 72}) and not tr.holds({"n": 63}) and not tr.holds({"n": 12})


def test_what_the_trace_cannot_follow_pins_the_value() -> None:
    for use in (lambda n: n / 3, lambda n: float(n), lambda n: n & 7, lambda n: 1 << n, lambda n: f"{n:x}"):
        tr = Trace({"n": 70})
        use(tr.dims()["n"])
        assert tr.specialized() and tr.holds({"n": 70}) and not tr.holds({"n": 71})


def test_printing_leaves_holes_with_c_expressions() -> None:
    tr = Trace({"n": 70})
    n = tr.dims()["n"]
    text = f"a[{n * 4 + 2}] = {(n + 15) // 16}; b = {5};"
    assert text.count("\x01") == 2 and "b = 5;" in text
    assert [lin_c(h) for h in tr.holes] == ["(4 * pr_dim_n + 2)", "pr_fdiv((pr_dim_n + 15), 16)"]
    assert f"{n - n}" == "0"   # a size that no longer depends on the dims is printed as a literal


def test_floor_division_matches_python_on_negative_values() -> None:
    tr = Trace({"n": 10})
    n = tr.dims()["n"]
    q = (3 - n) // 4    # Python floors: -2 at n = 10
    assert int(q) == -2
    assert "pr_fdiv" in lin_c(q.expr)
    for v in range(1, 40):
        assert lin_eval(q.expr, {"n": v}) == (3 - v) // 4


def test_traces_do_not_mix() -> None:
    a, b = Trace({"n": 4}).dims()["n"], Trace({"n": 4}).dims()["n"]
    with pytest.raises(ValueError):
        _ = a + b


def test_any_of_is_one_guard_that_holds_wherever_a_true_predicate_still_holds() -> None:
    """traced.any_of: ``a or b`` on traced ints records the comparison it evaluated (a region that ends where that one
    flips, though the other would keep the result); any_of records where the result stays true: the union of the
    true predicates' regions. A false result records every comparison (each must stay false)."""
    def region(tr: Trace) -> list[int]:
        return [v for v in range(1, 2000) if tr.holds({"d": v})]

    tr = Trace({"d": 24})
    d = tr.dims()["d"]
    assert (d >= 16 or d * 128 <= 65536) and region(tr) == list(range(16, 2000))   # plain `or`: one side only
    tr = Trace({"d": 24})
    d = tr.dims()["d"]
    assert any_of(lambda: d >= 16, lambda: d * 128 <= 65536) and region(tr) == list(range(1, 2000))
    tr = Trace({"d": 8})   # only the second is true here: its region, not the first's
    d = tr.dims()["d"]
    assert any_of(lambda: d >= 16, lambda: d * 128 <= 65536) and region(tr) == list(range(1, 513))
    tr = Trace({"d": 8})
    d = tr.dims()["d"]
    assert not any_of(lambda: d >= 16, lambda: d > 100) and region(tr) == list(range(1, 16))
    tr = Trace({"d": 8})   # a true predicate that compares nothing traced: true everywhere, no guard
    d = tr.dims()["d"]
    assert any_of(lambda: d >= 16, lambda: 3 > 2) and not tr.guards
    tr = Trace({"d": 24})   # nested: the inner one's guard is one path of the outer
    d = tr.dims()["d"]
    assert any_of(lambda: any_of(lambda: d < 10, lambda: d > 20), lambda: d == 1000)
    assert region(tr) == list(range(21, 2000))
    assert any_of(lambda: 5 > 6, lambda: 7 > 6)   # plain ints: plain any


def test_varies_says_whether_a_size_depends_on_the_dims_without_a_guard() -> None:
    tr = Trace({"n": 70})
    n = tr.dims()["n"]
    assert varies(n) and varies(n // 4 + 1) and not varies(n - n) and not varies(64) and not tr.guards
