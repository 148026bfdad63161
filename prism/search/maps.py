"""Symbolic maps as a finite-domain constraint problem.

Every customized operator has one categorical map symbol per (input, parallel dim) and per (output,
grid dim): the data dim that parallel dim splits (or concatenates along), or :data:`NONE` (⊥:
replicate / partial sums). The boolean symbol ``m[T, d, p]`` of DESIGN.md §4.5 is
``map(T, p) == d``, so the partition constraint (a parallel dim splits at most one data dim of a
tensor) holds by construction.

Dimension matching turns into constraints over these symbols (:func:`same_split`): two tile dims are
equal for every value of the grid sizes and ``F`` iff their full dims are equal and each parallel dim
splits both or neither. Every constraint search generates is *the same for every grid dim*, and no
constraint couples two parallel dims. So the problem splits into two tiny independent ones: a generic
grid column (variables ``("m", i, G)`` and ``("o", k, G)``) and the for-loop column (``("m", i, L)``).
An assignment of a block graph is then one grid-column solution per used grid dim (distinct, in
increasing order: symmetry breaking over grid-dim permutations, since equal columns would be one grid
dim of the product size) plus one loop-column solution. Satisfiability needs a grid-column solution that
splits something (the grid has at least one real dim) and a loop-column solution.

In concrete mode (Mirage-style) the columns are fixed before generation: :class:`MapCSP` then holds
singleton input domains per grid column, and the same constraints are merely checked.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from itertools import combinations
from typing import Union

NONE = -1
G = "G"  # the generic grid column
L = "L"  # the for-loop column
MAX_GRID = 3

Var = tuple  # ("m", input, G|L) | ("o", output, G)
# ("iff", v1, a1, v2, a2): [v1 == a1] <=> [v2 == a2]
# ("ne", v, a): v != a
# ("is", v, a): v == a
# ("any", vs): some v in vs is not NONE
# ("imp_any", vs_all, vs): (some v in vs_all is not NONE) => (some v in vs is not NONE)
# ("nand", v1, a1, v2, a2): not ([v1 == a1] and [v2 == a2])
# ("iff_any", lits1, lits2): (some (v, a) in lits1 has v == a) <=> (same for lits2)
# ("save_partial", lits, o, vs_all): (some lit holds) <=> (o is NONE and some v in vs_all is not NONE)
Constraint = tuple
Assignment = dict
Origin = tuple  # (input index, data dim)
Value = Union[int, None]


def mvar(i: int, col: str) -> Var:
    return ("m", i, col)


def ovar(k: int) -> Var:
    return ("o", k, G)


def iff(v1: Var, a1: int, v2: Var, a2: int) -> Constraint:
    x, y = (v1, a1), (v2, a2)
    if y < x:
        x, y = y, x
    return ("iff", x[0], x[1], y[0], y[1])


def same_split(o1: Origin, o2: Origin) -> list[Constraint]:
    """Constraints that make tile dims with origins ``o1`` and ``o2`` equal: split by the same parallel dims."""
    if o1 == o2:
        return []
    return [iff(mvar(o1[0], c), o1[1], mvar(o2[0], c), o2[1]) for c in (G, L)]


def unsplit(o: Origin) -> list[Constraint]:
    """Constraints that no parallel dim splits the tile dim with origin ``o`` (a row-wise op sees the row)."""
    return [("ne", mvar(o[0], G), o[1]), ("ne", mvar(o[0], L), o[1])]


def not_looped(inputs: Iterable[int]) -> list[Constraint]:
    """Constraints that none of ``inputs`` is walked by the for-loop (their tiles are loop-invariant)."""
    return [("is", mvar(i, L), NONE) for i in inputs]


def looped(inputs: Iterable[int]) -> Constraint:
    """Some input of ``inputs`` is walked by the for-loop (a value depending on them changes per iteration)."""
    return ("any", tuple(mvar(i, L) for i in sorted(inputs)))


def lits(origins: Iterable[Origin], col: str) -> tuple[tuple[Var, int], ...]:
    """Literals "origin is split by this column" for a set of origins."""
    return tuple(sorted((mvar(i, col), d) for i, d in origins))


def same_partial(p1: frozenset, p2: frozenset, col: str) -> list[Constraint]:
    """Two operands of a sum are partial sums over exactly the same blocks/iterations of column ``col``."""
    if p1 == p2:
        return []
    l1, l2 = lits(p1, col), lits(p2, col)
    if not l1:
        return [("ne", v, a) for v, a in l2]
    if not l2:
        return [("ne", v, a) for v, a in l1]
    return [("iff_any", *sorted((l1, l2)))]


def not_both(p1: frozenset, p2: frozenset, col: str) -> list[Constraint]:
    """A product of two partial sums over the same column is not a partial sum of the product."""
    out = []
    for o1 in p1:
        for o2 in p2:
            x, y = (mvar(o1[0], col), o1[1]), (mvar(o2[0], col), o2[1])
            if y < x:
                x, y = y, x
            if x == y:
                out.append(("ne", x[0], x[1]))
            else:
                out.append(("nand", x[0], x[1], y[0], y[1]))
    return out


def not_partial(p: Iterable[Origin], col: str) -> list[Constraint]:
    """A non-linear operator needs the whole value, not a partial sum: none of ``p`` may be split."""
    return [("ne", v, a) for v, a in lits(p, col)]


def cvars(c: Constraint) -> tuple[Var, ...]:
    k = c[0]
    if k in ("iff", "nand"):
        return (c[1], c[3])
    if k == "iff_any":
        return tuple(v for v, _ in c[1]) + tuple(v for v, _ in c[2])
    if k == "save_partial":
        return tuple(v for v, _ in c[1]) + (c[2],) + tuple(c[3])
    if k in ("ne", "is"):
        return (c[1],)
    if k == "any":
        return tuple(c[1])
    return tuple(c[1]) + tuple(c[2])


def column(c: Constraint) -> str:
    return cvars(c)[0][2]


def holds(c: Constraint, a: Mapping[Var, int]) -> bool:
    k = c[0]
    if k == "iff":
        return (a[c[1]] == c[2]) == (a[c[3]] == c[4])
    if k == "ne":
        return a[c[1]] != c[2]
    if k == "is":
        return a[c[1]] == c[2]
    if k == "any":
        return any(a[v] != NONE for v in c[1])
    if k == "nand":
        return not (a[c[1]] == c[2] and a[c[3]] == c[4])
    if k == "iff_any":
        return any(a[v] == x for v, x in c[1]) == any(a[v] == x for v, x in c[2])
    if k == "save_partial":
        return any(a[v] == x for v, x in c[1]) == (a[c[2]] == NONE and any(a[v] != NONE for v in c[3]))
    return not any(a[v] != NONE for v in c[1]) or any(a[v] != NONE for v in c[2])


def solve_column(cons: Sequence[Constraint], domains: Mapping[Var, Sequence[int]], order: Sequence[Var] | None = None
                 ) -> Iterator[Assignment]:
    """All assignments of one column's variables (``order``, default: those in ``cons``) satisfying ``cons``."""
    vs = list(order) if order is not None else sorted({v for c in cons for v in cvars(c)})
    dom: dict[Var, set[int]] = {v: set(domains[v]) for v in vs}
    by_var: dict[Var, list[Constraint]] = {v: [] for v in vs}
    for c in cons:
        if c[0] == "ne":
            dom[c[1]].discard(c[2])
        elif c[0] == "is":
            dom[c[1]] &= {c[2]}
        else:
            for v in cvars(c):
                by_var[v].append(c)
    if any(not d for d in dom.values()):
        return
    yield from _bt(vs, 0, dom, by_var, {})


def _bt(order: list[Var], k: int, dom: dict[Var, set[int]], by_var: dict[Var, list[Constraint]],
        a: Assignment) -> Iterator[Assignment]:
    if k == len(order):
        yield dict(a)
        return
    v = order[k]
    for val in sorted(dom[v]):
        a[v] = val
        ok = True
        narrowed: list[tuple[Var, set[int]]] = []
        for c in by_var[v]:
            if c[0] == "iff":
                other, oval, mine = (c[3], c[4], c[2]) if c[1] == v else (c[1], c[2], c[4])
                if other in a:
                    if (a[other] == oval) != (val == mine):
                        ok = False
                        break
                else:  # forward checking
                    d = dom[other]
                    keep = {oval} & d if val == mine else d - {oval}
                    if keep != d:
                        narrowed.append((other, d))
                        dom[other] = keep
                        if not keep:
                            ok = False
                            break
            elif all(x in a for x in cvars(c)) and not holds(c, a):
                ok = False
                break
        if ok:
            yield from _bt(order, k + 1, dom, by_var, a)
        for other, d in reversed(narrowed):  # the same variable may have been narrowed twice
            dom[other] = d
        del a[v]


class MapCSP:
    """The map symbols of one block context and their finite domains.

    Symbolic mode: one generic grid column and one loop column, domains = every data dim or NONE.
    Concrete mode (``fixed``): up to three grid columns and the loop column with the inputs' values
    fixed; saver symbols stay free and are solved per column.
    """

    def __init__(self, domains: Mapping[Var, tuple[int, ...]], n_inputs: int,
                 fixed: tuple[tuple[Assignment, ...], Assignment] | None = None, gridless: bool = False) -> None:
        self.domains = dict(domains)
        self.n_inputs = n_inputs
        self.fixed = fixed
        self.gridless = gridless   # a block may have no grid (search.block.BlockContext.gridless)
        self.solves = 0
        self._memo: dict[frozenset, bool] = {}

    def _grid_used(self) -> Constraint:
        return ("any", tuple(mvar(i, G) for i in range(self.n_inputs)))

    def satisfiable(self, cons: frozenset[Constraint]) -> bool:
        r = self._memo.get(cons)
        if r is None:
            self.solves += 1
            r = self._satisfiable(cons)
            if len(self._memo) > 200_000:
                self._memo.clear()
            self._memo[cons] = r
        return r

    def _satisfiable(self, cons: frozenset[Constraint]) -> bool:
        gcons = [c for c in cons if column(c) == G]
        lcons = [c for c in cons if column(c) == L]
        if self.fixed is None:
            used = [] if self.gridless else [self._grid_used()]
            grid = next(solve_column([*gcons, *used], self.domains), None) is not None
            return grid and next(solve_column(lcons, self.domains), None) is not None
        cols, loop = self.fixed
        for col in cols:
            if next(solve_column(gcons, {**self.domains, **{v: (x,) for v, x in col.items()}}), None) is None:
                return False
        return next(solve_column(lcons, {**self.domains, **{v: (x,) for v, x in loop.items()}}), None) is not None

    def grid_columns(self, cons: frozenset[Constraint], n_outputs: int) -> list[Assignment]:
        """Distinct used grid-column solutions (inputs + savers), sorted by their input signature."""
        gcons = [c for c in cons if column(c) == G]
        order = [mvar(i, G) for i in range(self.n_inputs)] + [ovar(k) for k in range(n_outputs)]
        sols = [a for a in solve_column(gcons, self.domains, order)
                if any(a[mvar(i, G)] != NONE for i in range(self.n_inputs))]
        sols.sort(key=lambda a: signature(a, self.n_inputs))
        return sols

    def gridless_column(self, cons: frozenset[Constraint], n_outputs: int) -> Assignment | None:
        """The grid column of a block with no grid (every input and saver unmapped: one block), where the
        context allows it (``gridless``) and the structure has no used grid column, else None."""
        if not self.gridless:
            return None
        gcons = [c for c in cons if column(c) == G]
        dom = {**self.domains, **{mvar(i, G): (NONE,) for i in range(self.n_inputs)}}
        order = [mvar(i, G) for i in range(self.n_inputs)] + [ovar(k) for k in range(n_outputs)]
        return next(solve_column(gcons, dom, order), None)

    def loop_columns(self, cons: frozenset[Constraint]) -> list[Assignment]:
        lcons = [c for c in cons if column(c) == L]
        return list(solve_column(lcons, self.domains, [mvar(i, L) for i in range(self.n_inputs)]))


def signature(a: Mapping[Var, int], n_inputs: int) -> tuple[int, ...]:
    return tuple(a[mvar(i, G)] for i in range(n_inputs))


def grid_choices(columns: Sequence[Assignment], n_inputs: int, max_grid: int = MAX_GRID
                 ) -> Iterator[tuple[Assignment, ...]]:
    """1..max_grid grid columns with strictly increasing input signatures (one per grid-permutation class)."""
    for r in range(1, max_grid + 1):
        for combo in combinations(range(len(columns)), r):
            sigs = [signature(columns[j], n_inputs) for j in combo]
            if all(sigs[k] < sigs[k + 1] for k in range(r - 1)):
                yield tuple(columns[j] for j in combo)


def decode(v: int) -> Value:
    return None if v == NONE else v
