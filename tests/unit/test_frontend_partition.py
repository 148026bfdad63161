"""The frontend's piece planner on hand-made unit graphs (no torch)."""

from __future__ import annotations

import pytest

from prism.frontend.partition import Budget, PlanUnit, plan

pytestmark = pytest.mark.unit


def _swiglu_mlp() -> tuple[list[PlanUnit], dict[int, list[object]]]:
    """x -> rms_norm(0) -> mul w(1) -> gate(2) -> silu(3); up(4); mul(5); down(6); add x(7) -> out."""
    u = [PlanUnit(0, "compute", ("x",), 1, 0, True), PlanUnit(1, "compute", (0, "w"), 1),
         PlanUnit(2, "compute", (1, "Wg"), 1, 1, True), PlanUnit(3, "compute", (2,), 1),
         PlanUnit(4, "compute", (1, "Wu"), 1, 1, True), PlanUnit(5, "compute", (3, 4), 1),
         PlanUnit(6, "compute", (5, "Wd"), 1, 1, True), PlanUnit(7, "compute", ("x", 6), 1)]
    users: dict[int, list[object]] = {0: [1], 1: [2, 4], 2: [3], 3: [5], 4: [5], 5: [6], 6: [7], 7: ["out"]}
    return u, users


def test_swiglu_mlp_is_cut_after_the_gated_product() -> None:
    units, users = _swiglu_mlp()
    pieces = plan(units, users)
    assert [p.members for p in pieces] == [[0, 1, 2, 3, 4, 5], [6, 7]]
    first, second = pieces
    assert first.output == 5 and first.inputs == ["x", "w", "Wg", "Wu"] and first.matmuls == 2
    assert second.output == 7 and sorted(map(str, second.inputs)) == ["5", "Wd", "x"]
    assert all(p.searched for p in pieces)


def test_budget_bounds_every_piece() -> None:
    units, users = _swiglu_mlp()
    for budget in (Budget(max_inputs=2), Budget(max_ops=2), Budget(max_matmuls=1), Budget(3, 4, 1)):
        for p in plan(units, users, budget):
            assert len(p.inputs) <= budget.max_inputs or len(p.members) == 1
            assert p.ops <= budget.max_ops_for(p.matmuls) or len(p.members) == 1
            assert p.matmuls <= budget.max_matmuls or len(p.members) == 1
    # one matmul per piece: gate and up cannot share a piece any more
    pieces = plan(units, users, Budget(max_matmuls=1))
    assert not any(2 in p.members and 4 in p.members for p in pieces)


def test_a_value_with_users_in_two_pieces_ends_its_piece() -> None:
    # h = norm(x) feeds three projections that cannot share a piece (budget: one matmul each)
    units = [PlanUnit(0, "compute", ("x",), 1, 0, True)] + \
        [PlanUnit(i, "compute", (0, f"W{i}"), 1, 1, True) for i in (1, 2, 3)]
    users: dict[int, list[object]] = {0: [1, 2, 3], 1: ["o1"], 2: ["o2"], 3: ["o3"]}
    pieces = plan(units, users, Budget(max_matmuls=1))
    assert [p.members for p in pieces] == [[0], [1], [2], [3]]
    assert pieces[1].inputs == [0, "W1"]


def test_layout_units_never_join_pieces_and_separate_them() -> None:
    # mm(0) -> view(1, layout) -> mul(2): the view stays in PyTorch, so mm and mul are separate pieces
    units = [PlanUnit(0, "compute", ("a", "b"), 1, 1, True), PlanUnit(1, "layout", (0,), 1),
             PlanUnit(2, "compute", (1, "c"), 1)]
    users: dict[int, list[object]] = {0: [1], 1: [2], 2: ["out"]}
    pieces = plan(units, users)
    assert [p.members for p in pieces] == [[0], [2]]
    assert pieces[1].inputs == [1, "c"] and not pieces[1].searched  # a lone mul is not worth a search


def test_single_output_pieces_have_no_outside_users_inside() -> None:
    units, users = _swiglu_mlp()
    users[3] = [5, "leak"]  # silu's value is also a graph output: it must end its piece
    pieces = plan(units, users)
    owner = {m: i for i, p in enumerate(pieces) for m in p.members}
    for i, p in enumerate(pieces):
        for m in p.members:
            if m != p.output:
                assert all(owner.get(c) == i for c in users[m]), (m, users[m])
    assert any(p.output == 3 for p in pieces)


def _chain(n: int, first_matmuls: int = 0) -> tuple[list[PlanUnit], dict[int, list[object]]]:
    """n compute units in a chain over x (the first one a matmul when ``first_matmuls``)."""
    units = [PlanUnit(0, "compute", ("x", "w") if first_matmuls else ("x",), 1, first_matmuls, bool(first_matmuls))]
    units += [PlanUnit(i, "compute", (i - 1,), 1) for i in range(1, n)]
    users: dict[int, list[object]] = {i: [i + 1] for i in range(n - 1)}
    users[n - 1] = ["out"]
    return units, users


def test_a_piece_without_a_contraction_may_have_twice_the_operators() -> None:
    """Element-wise chains and row reductions: up to ``max_ops_no_matmul`` operators in one piece; with a
    contraction the bound stays ``max_ops``."""
    b = Budget()
    assert (b.max_ops_for(0), b.max_ops_for(1)) == (16, 8)
    units, users = _chain(12)
    assert [p.ops for p in plan(units, users)] == [12]
    assert [p.ops for p in plan(units, users, Budget(max_ops_no_matmul=8))] == [8, 4]
    units, users = _chain(12, first_matmuls=1)
    pieces = plan(units, users)
    assert [p.ops for p in pieces] == [8, 4] and [p.matmuls for p in pieces] == [1, 0]
    units, users = _chain(20)
    assert [p.ops for p in plan(units, users)] == [16, 4]
