"""The float64 reference's one rewrite (prism/reference/kernel.py ``_scaled_contractions``): ``sum(matmul(A, B) * S,
g)`` over a batch axis, ``S`` constant along the rows, computed as one product of ``A`` and ``B * S`` contracted
over ``g`` and K together, never making the ``[G, M, N]`` intermediate. Equal to the operators as written to
float64 rounding; not applied where it would not be the same value or in the working (float32) mode."""

from __future__ import annotations

import numpy as np
import pytest

import prism
import prism.reference.kernel as RK
from prism.reference.numpy_ops import apply

pytestmark = pytest.mark.unit


def _graph(a_shape: tuple, b_shape: tuple, s_shape: tuple, axis: int, extra_use: bool = False) -> prism.Graph:
    g = prism.Graph("scaled")
    a, b, s = g.input("a", a_shape), g.input("b", b_shape), g.input("s", s_shape)
    p = g.matmul(a, b)
    m = g.mul(s, p) if axis == 1 else g.mul(p, s)   # either operand order
    g.output(g.sum(m, axis), "y")
    if extra_use:
        g.output(p, "p")
    return g


def _inputs(g: prism.Graph, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {k: rng.standard_normal(tuple(int(d) for d in n.shape)).astype(np.float32) for k, n in g.inputs.items()}


def _as_written(x: dict[str, np.ndarray], axis: int) -> np.ndarray:
    a, b, s = (x[k].astype(np.float64) for k in "abs")
    return np.sum(np.matmul(a, b) * s, axis=axis, keepdims=True)


CASES = [
    ((64, 24, 32), (64, 32, 40), (64, 1, 40), 0),          # the grouped Linear's form: [Gn, rows, G] x [Gn, G, N]
    ((3, 5, 6, 8), (3, 5, 8, 7), (3, 5, 1, 7), 1),         # the second batch axis, a leading one kept
    ((3, 5, 6, 8), (3, 5, 8, 7), (1, 5, 1, 7), 0),         # the scale broadcast along another batch axis
    ((4, 6, 8), (4, 8, 7), (1, 7), 0),                     # a scale of lower rank
]


@pytest.mark.parametrize("a_shape,b_shape,s_shape,axis", CASES)
def test_the_rewrite_equals_the_operators_as_written(a_shape: tuple, b_shape: tuple, s_shape: tuple,
                                                      axis: int) -> None:
    g = _graph(a_shape, b_shape, s_shape, axis)
    assert len(RK._scaled_contractions(list(g.nodes))) == 1
    x = _inputs(g)
    got = g.evaluate(x, dtype=np.float64)["y"]
    want = _as_written(x, axis)
    assert got.shape == want.shape
    assert np.max(np.abs(got - want)) <= 1e-13 * np.max(np.abs(want))


@pytest.mark.parametrize("a_shape,b_shape,s_shape,axis", CASES)
@pytest.mark.parametrize("cols", [1, 3])
def test_the_scaled_columns_made_a_chunk_at_a_time_give_the_same_value(
        monkeypatch: pytest.MonkeyPatch, a_shape: tuple, b_shape: tuple, s_shape: tuple, axis: int, cols: int) -> None:
    # SCALED_CHUNK elements of B * S at a time (the LM head's weight is never scaled whole): a column at a time
    # and a few columns at a time equal the whole product
    g = _graph(a_shape, b_shape, s_shape, axis)
    x = _inputs(g)
    whole = g.evaluate(x, dtype=np.float64)["y"]
    per_col = int(np.prod(np.broadcast_shapes(b_shape, s_shape))) // b_shape[-1]
    monkeypatch.setattr(RK, "SCALED_CHUNK", cols * per_col)
    calls = []
    monkeypatch.setattr(RK, "apply", lambda op, xs, arg: calls.append(op) or apply(op, xs, arg))
    got = g.evaluate(x, dtype=np.float64)["y"]
    assert calls.count("matmul") == -(-b_shape[-1] // cols)   # one product per chunk of columns
    assert got.shape == whole.shape
    assert np.max(np.abs(got - whole)) <= 1e-13 * np.max(np.abs(whole))
    assert np.max(np.abs(got - _as_written(x, axis))) <= 1e-13 * np.max(np.abs(whole))


def test_not_applied_where_the_value_would_differ_or_is_used_elsewhere() -> None:
    # the scale varies along the rows: each row scaled differently cannot move into B
    g = _graph((4, 6, 8), (4, 8, 7), (4, 6, 7), 0)
    assert RK._scaled_contractions(list(g.nodes)) == {}
    # the sum over a row axis, not a batch axis
    assert RK._scaled_contractions(list(_graph((4, 6, 8), (4, 8, 7), (4, 1, 7), 1).nodes)) == {}
    # the product is an output too: it is made anyway
    h = _graph((4, 6, 8), (4, 8, 7), (4, 1, 7), 0, extra_use=True)
    assert RK._scaled_contractions(list(h.nodes)) == {}
    x = _inputs(h)
    out = h.evaluate(x, dtype=np.float64)
    assert np.allclose(out["y"], _as_written(x, 0), rtol=1e-13, atol=0)


def test_a_side_broadcast_along_the_summed_axis_is_computed_as_written() -> None:
    g = _graph((1, 6, 8), (4, 8, 7), (4, 1, 7), 0)   # A shared by every batch entry
    assert len(RK._scaled_contractions(list(g.nodes))) == 1
    x = _inputs(g)
    got = g.evaluate(x, dtype=np.float64)["y"]
    assert np.max(np.abs(got - _as_written(x, 0))) <= 1e-13 * np.max(np.abs(got))


def test_the_working_mode_runs_the_operators_as_written(monkeypatch: pytest.MonkeyPatch) -> None:
    called: list[int] = []
    real = RK._scaled_contraction
    monkeypatch.setattr(RK, "_scaled_contraction", lambda *a: called.append(1) or real(*a))
    g = _graph((64, 24, 32), (64, 32, 40), (64, 1, 40), 0)
    x = _inputs(g)
    g.evaluate(x)                      # float32, the program's rounding order
    assert not called
    g.evaluate(x, dtype=np.float64)
    assert called
