"""The numeric check's instantiations: the combinations of small values tested all at once with numpy
(``numeric._fits``) are exactly those the one-by-one tests keep, in the same order, on every hand-written
mutant's candidate and reference (grid sizes over the program's dims, for-loops, divisibility constraints)
and on polynomials with fractional coefficients; dims the vectorized form cannot take fall back."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from verify_cases import MUTANTS

from prism.ir import dims as D
from prism.verify import numeric as N

pytestmark = pytest.mark.unit


def _space(names: list[str], batch: list[str]) -> list[tuple[int, ...]]:
    choices = [N._BATCH_VALUES if s in batch else N._BLOCK_VALUES for s in names]
    combos = list(itertools.product(*choices))
    if len(combos) > 4096:   # as choose_instantiations samples
        rng = np.random.default_rng(0)
        picked = [np.asarray(c)[rng.integers(0, len(c), 4096)].tolist() for c in choices]
        combos = list(zip(*picked))
    return list(dict.fromkeys(tuple(v) for v in combos))


@pytest.mark.parametrize("case", MUTANTS, ids=lambda c: c.name)
@pytest.mark.parametrize("max_work", [16, 256])
def test_fits_at_once_equal_one_by_one(case: object, max_work: int) -> None:
    cand, ref = case.build()   # type: ignore[attr-defined]
    batch, block = N._symbols(cand, ref)
    names = batch + block
    blocks = [bg for g in (cand, ref) for bg in N._block_graphs(g)]
    combos = _space(names, batch)
    fast = N._fits(names, combos, blocks, max_work)
    slow = N._fits_one_by_one(names, combos, blocks, max_work)
    assert list(fast.items()) == list(slow.items())
    assert fast or max_work == 16


def test_fractional_and_laurent_dims_are_exact() -> None:
    n, g = D.sym("n"), D.sym("g")
    cols = {"n": np.arange(1, 13, dtype=np.int64), "g": np.array([1, 2, 3, 4] * 3, np.int64)}
    for x in (D.div_exact(n * 3, 2), n * n + D.div_exact(n, g), D.div_exact(n, g) + 1, 7):
        got = N._columns(x, cols, 12)
        assert got is not None
        vals, ok = got
        for i in range(12):
            env = {"n": int(cols["n"][i]), "g": int(cols["g"][i])}
            try:
                want: int | None = D.evaluate(x, env)
            except D.DimError:
                want = None
            assert (bool(ok[i]), int(vals[i]) if ok[i] else None) == (want is not None, want)


def test_a_selector_falls_back() -> None:
    x = D.sel("m", 0, "g")
    assert N._columns(x, {"g": np.ones(3, np.int64)}, 3) is None
