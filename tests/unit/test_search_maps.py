"""Map symbols as a constraint problem: dimension matching, the solver, symmetry breaking."""

from __future__ import annotations

import itertools

import pytest

from prism.search import maps as M

pytestmark = pytest.mark.unit


def _dom(n_inputs: int, rank: int) -> dict:
    return {M.mvar(i, c): (M.NONE, *range(rank)) for i in range(n_inputs) for c in (M.G, M.L)}


def _brute(cons: list, dom: dict, order: list) -> list[dict]:
    out = []
    for vals in itertools.product(*(dom[v] for v in order)):
        a = dict(zip(order, vals))
        if all(M.holds(c, a) for c in cons):
            out.append(a)
    return out


def test_same_split_is_one_iff_per_column_and_nothing_for_one_origin() -> None:
    cons = M.same_split((0, 1), (1, 0))
    assert sorted(M.column(c) for c in cons) == [M.G, M.L]
    assert all(c[0] == "iff" for c in cons)
    assert M.same_split((2, 3), (2, 3)) == []


def test_solver_matches_brute_force_on_matmul_constraints() -> None:
    # x [n, d] @ w [d, m]: x dim 1 and w dim 0 split alike; x's rows are reduced by a row-wise op
    dom = _dom(2, 2)
    cons = M.same_split((0, 1), (1, 0)) + M.unsplit((0, 0))
    g = [c for c in cons if M.column(c) == M.G]
    order = [M.mvar(0, M.G), M.mvar(1, M.G)]
    got = sorted(tuple(a.values()) for a in M.solve_column(g, dom, order))
    assert got == sorted(tuple(a.values()) for a in _brute(g, dom, order))
    assert (1, 0) in got and (0, M.NONE) not in got and (1, 1) not in got


def test_forward_checking_restores_a_domain_narrowed_twice() -> None:
    # two constraints narrow the same variable when v0 is assigned; a wrong restore order lost solutions
    dom = {("m", 0, M.G): (M.NONE, 0, 1, 3), ("m", 1, M.G): (M.NONE, 0, 1, 3)}
    a, b = ("m", 0, M.G), ("m", 1, M.G)
    cons = [M.iff(a, 0, b, 0), M.iff(a, 1, b, 1), M.iff(a, 3, b, 3)]
    got = {(s[a], s[b]) for s in M.solve_column(cons, dom, [a, b])}
    assert got == {(M.NONE, M.NONE), (0, 0), (1, 1), (3, 3)}


def test_satisfiable_needs_a_grid_column_that_splits_something() -> None:
    dom = _dom(1, 2)
    csp = M.MapCSP(dom, 1)
    assert csp.satisfiable(frozenset())
    every_dim_unsplit = frozenset(M.unsplit((0, 0)) + M.unsplit((0, 1)))
    assert not csp.satisfiable(every_dim_unsplit)


def test_loop_column_any_and_is() -> None:
    csp = M.MapCSP(_dom(2, 2), 2)
    looped = M.looped([0, 1])
    assert csp.satisfiable(frozenset({looped}))
    assert not csp.satisfiable(frozenset({looped, *M.not_looped([0, 1])}))


@pytest.mark.parametrize("kind", ["nand", "iff_any", "save_partial"])
def test_new_constraint_kinds_hold_as_documented(kind: str) -> None:
    v0, v1, o = M.mvar(0, M.G), M.mvar(1, M.G), M.ovar(0)
    dom = {v0: (M.NONE, 0, 1), v1: (M.NONE, 0, 1), o: (M.NONE, 0, 1)}
    if kind == "nand":
        c = ("nand", v0, 1, v1, 0)
        pred = lambda a: not (a[v0] == 1 and a[v1] == 0)
    elif kind == "iff_any":
        c = ("iff_any", ((v0, 1),), ((v1, 0), (v1, 1)))
        pred = lambda a: (a[v0] == 1) == (a[v1] in (0, 1))
    else:
        c = ("save_partial", ((v0, 1),), o, (v0, v1))
        pred = lambda a: (a[v0] == 1) == (a[o] == M.NONE and (a[v0] != M.NONE or a[v1] != M.NONE))
    order = [v0, v1, o]
    for vals in itertools.product(*(dom[v] for v in order)):
        a = dict(zip(order, vals))
        assert M.holds(c, a) == pred(a)
    assert len(list(M.solve_column([c], dom, order))) == len(_brute([c], dom, order))


def test_grid_choices_break_grid_permutation_symmetry() -> None:
    cols = [{M.mvar(0, M.G): x, M.mvar(1, M.G): y} for x, y in ((0, M.NONE), (1, 0), (M.NONE, 1))]
    cols.sort(key=lambda a: M.signature(a, 2))
    choices = list(M.grid_choices(cols, 2))
    # 3 single columns + 3 pairs + 1 triple: each set of distinct columns exactly once, in one order
    assert len(choices) == 7
    seen = set()
    for ch in choices:
        sigs = [M.signature(c, 2) for c in ch]
        assert sigs == sorted(sigs) and len(set(sigs)) == len(sigs)
        key = frozenset(sigs)
        assert key not in seen
        seen.add(key)


def test_partial_sum_helpers() -> None:
    p = frozenset({(0, 1)})
    q = frozenset({(1, 0)})
    assert M.same_partial(p, p, M.G) == []
    assert M.same_partial(p, frozenset(), M.G) == [("ne", M.mvar(0, M.G), 1)]
    assert M.same_partial(p, q, M.L)[0][0] == "iff_any"
    assert M.not_both(p, p, M.G) == [("ne", M.mvar(0, M.G), 1)]
    assert M.not_both(p, q, M.G)[0][0] == "nand"
    assert M.not_partial(p | q, M.L) == [("ne", M.mvar(0, M.L), 1), ("ne", M.mvar(1, M.L), 0)]
