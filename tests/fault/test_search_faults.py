"""Search faults (issue 12): programs the search crashed on or gave up on with a misleading message.

Each test superoptimizes a small program from scratch (fresh cache directory, see conftest.py) and checks
the compiled results against NumPy in float64 at several sizes of the symbolic dim, or the precise error.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

import prism
from prism.api import NoVerifiedKernelError
from prism.errors import PrismError, UnsupportedError

SIZES = (1, 5, 8, 33)
RTOL = 1e-4


def _close(got: np.ndarray, ref: np.ndarray) -> None:
    got = np.asarray(got, dtype=np.float64)
    assert got.shape == ref.shape
    scale = max(float(np.max(np.abs(ref))), 1e-30) if ref.size else 1.0
    err = float(np.max(np.abs(got - ref))) / scale if ref.size else 0.0
    assert err <= RTOL, f"relative error {err:.2e}"


def _check_rows(k: prism.api.SuperKernel, make: Callable[[np.random.Generator, int], dict[str, np.ndarray]],
                ref: Callable[[dict[str, np.ndarray]], np.ndarray]) -> None:
    rng = np.random.default_rng(0)
    for n in SIZES:
        ins = make(rng, n)
        _close(k(**ins), ref({name: v.astype(np.float64) for name, v in ins.items()}))


def _customized(k: prism.api.SuperKernel) -> bool:
    """Some verified implementation is a fused kernel (a customized operator), not just the program."""
    return any(impl.graph.customized_ops() for impl in k.implementations)


def test_transposed_weight_with_symbolic_rows() -> None:
    """``X @ W.T`` with X [n, 8]: the search compared ``n == 8`` (undecidable) and raised InconclusiveDimError."""
    g = prism.Graph("xwt")
    X, W = g.input("X", ("n", 8)), g.input("W", (8, 8))
    g.output(g.matmul(X, g.transpose(W)), "Y")
    k = prism.superoptimize(g, time_limit=20)
    assert _customized(k)
    _check_rows(k, lambda r, n: {"X": r.standard_normal((n, 8)).astype(np.float32),
                                 "W": r.standard_normal((8, 8)).astype(np.float32)},
                lambda d: d["X"] @ d["W"].T)


def test_relu_of_transpose_with_symbolic_rows() -> None:
    g = prism.Graph("relu_xt")
    X = g.input("X", ("n", 8))
    g.output(g.relu(g.transpose(X)), "Y")
    k = prism.superoptimize(g, time_limit=20)
    assert _customized(k)
    _check_rows(k, lambda r, n: {"X": r.standard_normal((n, 8)).astype(np.float32)},
                lambda d: np.maximum(d["X"].T, 0.0))


def test_gram_matrix_with_symbolic_rows() -> None:
    """``X.T @ X`` contracts the symbolic dim."""
    g = prism.Graph("xtx")
    X = g.input("X", ("n", 8))
    g.output(g.matmul(g.transpose(X), X), "Y")
    k = prism.superoptimize(g, time_limit=20)
    assert _customized(k)
    _check_rows(k, lambda r, n: {"X": r.standard_normal((n, 8)).astype(np.float32)},
                lambda d: d["X"].T @ d["X"])


def test_torch_transpose_attribute() -> None:
    """``x @ w.T`` through prism.optimize: ``w.T`` (Dynamo's getattr) is a layout operator, not unsupported."""
    torch = pytest.importorskip("torch")
    w = torch.randn(8, 8)
    f = prism.optimize(lambda x, w: x @ w.T, (torch.randn(5, 8), w), dynamic={0: [0]}, time_limit=20)
    for n in SIZES:
        x = torch.randn(n, 8)
        with torch.no_grad():
            y = f(x, w)
        _close(y.numpy(), x.double().numpy() @ w.double().numpy().T)
    assert f.prism_pieces()
    assert "getattr" not in f.explain()


def test_identity_program() -> None:
    """An output that is an input: NoVerifiedKernelError told the user to raise the limits of an exhausted
    search. The search's level 0 (no kernel operator) is its result; the compiled kernel copies."""
    g = prism.Graph("identity")
    X = g.input("X", ("n", 8))
    g.output(X, "Y")
    k = prism.superoptimize(g, time_limit=20)
    assert k.stop_reason == "exhausted"
    _check_rows(k, lambda r, n: {"X": r.standard_normal((n, 8)).astype(np.float32)}, lambda d: d["X"])


def test_two_outputs_residual_and_projection() -> None:
    """A layer returning its residual ``h = x + r`` and ``rms_norm(h) @ W``: the last kernel may save several
    program outputs, including a tile the block uses further (``h``)."""
    g = prism.Graph("residual_and_projection")
    x, r, W = g.input("x", ("n", 16)), g.input("r", ("n", 16)), g.input("W", (16, 8))
    h = g.add(x, r)
    g.output(h, "h")
    g.output(g.matmul(g.rms_norm(h, eps=1e-6), W), "y")
    k = prism.superoptimize(g, limits=prism.search.Limits(max_block_ops=6, time_limit=30))
    # one kernel computes and saves both
    assert any(len(bgs) == 1 and len(bgs[0].outputs) == 2
               for bgs in (impl.graph.customized_ops() for impl in k.implementations))
    rng = np.random.default_rng(0)
    for n in SIZES:
        ins = {"x": rng.standard_normal((n, 16)).astype(np.float32),
               "r": rng.standard_normal((n, 16)).astype(np.float32),
               "W": rng.standard_normal((16, 8)).astype(np.float32)}
        out = k(**ins)
        hh = ins["x"].astype(np.float64) + ins["r"]
        yy = hh / np.sqrt(np.mean(hh * hh, axis=-1, keepdims=True) + 1e-6) @ ins["W"].astype(np.float64)
        assert set(out) == {"h", "y"}
        _close(out["h"], hh)
        _close(out["y"], yy)


def test_fixed_zero_size_dim() -> None:
    """A fixed zero-size dim: a raw NumPy ValueError from the search's numeric check; now an
    UnsupportedError naming the input and the dim, before any search."""
    g = prism.Graph("empty_rows")
    X, W = g.input("X", (0, 8)), g.input("W", (8, 4))
    g.output(g.matmul(X, W), "Y")
    with pytest.raises(UnsupportedError) as e:
        prism.superoptimize(g, time_limit=20)
    msg = str(e.value)
    assert "'X'" in msg and "zero-size dim (dim 0 of [0, 8])" in msg and "Fix:" in msg


def test_exhausted_search_does_not_advise_more_time() -> None:
    """When the search exhausted its space, NoVerifiedKernelError says so instead of advising larger limits."""
    g = prism.Graph("too_small_space")
    X = g.input("X", ("n", 8))
    g.output(g.relu(g.exp(X)), "Y")
    with pytest.raises(NoVerifiedKernelError) as e:
        prism.superoptimize(g, limits=prism.search.Limits(max_kernel_ops=1, max_block_ops=1, time_limit=20))
    msg = str(e.value)
    assert isinstance(e.value, PrismError)
    assert "stop reason: exhausted" in msg and "more time will not help" in msg
    assert "max_kernel_ops=1, max_block_ops=1" in msg and "raise its budget" not in msg


def test_a_proof_stopped_at_a_limit_on_the_shared_egraph_is_tried_on_a_fresh_one(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Proofs share one e-graph of the rules through push/pop, and a proof's course can depend on the proofs
    before it (a cached attention candidate hit the node limit as the 52nd proof of a process and proved in
    12 iterations on a fresh e-graph: every start-up re-searched its piece). A proof that stops at a limit is
    tried once more on a fresh e-graph, which replaces the shared one; one that saturates unproved is not."""
    from prism.verify import egraph as E

    def pair(c: float) -> tuple[prism.Graph, prism.Graph]:
        cand, ref = prism.Graph("cand"), prism.Graph("ref")
        cand.output(cand.mul_scalar(cand.mul_scalar(cand.input("x", ("n", 8)), 2.0), 3.0))
        ref.output(ref.mul_scalar(ref.input("x", ("n", 8)), c))
        return cand, ref

    calls: list[object] = []
    real = E._search

    def polluted_once(eg, prog, limits, record, t0):  # type: ignore[no-untyped-def]
        calls.append(eg)
        if len(calls) == 1:   # the shared e-graph, as if earlier proofs had made it blow up
            return E.FormalResult(False, "node_limit", E.ProofStats(1.0, 28, 101682), {})
        return real(eg, prog, limits, record, t0)

    E.prove(*pair(6.0))                       # the shared e-graph exists
    shared = E._BASE["egraph"]
    monkeypatch.setattr(E, "_search", polluted_once)
    r = E.prove(*pair(6.0))
    assert r.proved, str(r)
    assert calls[0] is shared and calls[1] is not shared and E._BASE["egraph"] is calls[1]
    calls.clear()
    monkeypatch.setattr(E, "_search", real)
    wrong = E.prove(*pair(7.0))               # false: unproved, whatever e-graph it ran on
    assert not wrong.proved
