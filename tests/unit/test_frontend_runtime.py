"""The piece runner's decisions (Prism kernel vs the piece's PyTorch code) and the cache of prepared
module state, with a stand-in kernel (no compiler), and the reshape-sinking normalization."""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import prism  # noqa: E402
from prism.frontend.compiler import sink_reshapes  # noqa: E402
from prism.frontend.runtime import PREPARED, InputSpec, PieceRunner, reset_warnings  # noqa: E402

pytestmark = pytest.mark.unit


class _Compiled:
    """What the runner uses of a compiled prism Kernel: input/output names and torch_launcher. Its inputs are
    in the reverse order of the piece's, so the runner's reordering is exercised."""

    input_names = ("x1", "x0")
    output_names = ("y",)

    def __init__(self, owner: _Kernel) -> None:
        self.owner = owner

    def torch_launcher(self, shapes: tuple, out_view: tuple | None = None) -> Any:
        if self.owner.fail:
            raise prism.PrismError("no verified sGraph tiles this shape")

        def launch(args: list[torch.Tensor]) -> list[torch.Tensor]:
            ins = dict(zip(self.input_names, args))
            self.owner.seen.append({k: (tuple(v.shape), v.is_contiguous()) for k, v in ins.items()})
            return [ins["x0"] @ ins["x1"] * 10]  # recognizably not the fallback's result
        return launch


class _Kernel:
    """What the runner uses of a SuperKernel: program.bind and specialize(...).kernel."""

    def __init__(self) -> None:
        g = prism.Graph()
        g.output(g.matmul(g.input("x0", ("n", 4)), g.input("x1", (4, 3))), "y")
        self.program = g
        self.fail = False
        self.seen: list[dict[str, Any]] = []
        self.specialized: list[dict[str, int]] = []

    def specialize(self, **env: int) -> Any:
        self.specialized.append(env)
        return type("Spec", (), {"kernel": _Compiled(self)})()


class _Fallback(torch.nn.Module):
    def forward(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return x @ w.t()


def _runner(persistent: bool = True) -> tuple[PieceRunner, _Kernel]:
    k = _Kernel()
    specs = [InputSpec("x0", None, False), InputSpec("x1", (1, 0), persistent)]
    return PieceRunner("0 (linear)", k, specs, _Fallback()), k


def test_prism_path_transposes_weights_and_copies_strided_inputs() -> None:
    r, k = _runner()
    w = torch.nn.Parameter(torch.randn(3, 4))
    x = torch.randn(4, 5).t()  # not contiguous
    with torch.no_grad():
        y = r(x, w)
        torch.testing.assert_close(y, x @ w.t() * 10)
        r(torch.randn(5, 4), w)
        r(torch.randn(2, 4), w)
    assert r.prism_calls == 3 and r.fallback_calls == 0
    assert k.seen[0] == {"x0": ((5, 4), True), "x1": ((4, 3), True)}
    assert k.specialized == [{"n": 5}, {"n": 2}]  # one specialization per shape


def test_prepared_weights_are_cached_until_the_tensor_changes() -> None:
    w = torch.nn.Parameter(torch.randn(3, 4))
    h0 = PREPARED.hits
    a = PREPARED.get(w, (1, 0))
    b = PREPARED.get(w, (1, 0))
    assert a is b and PREPARED.hits == h0 + 1
    with torch.no_grad():
        w.mul_(2)  # an in-place update bumps the version counter
    c = PREPARED.get(w, (1, 0))
    assert c is not a and torch.equal(c, w.detach().t())
    with torch.no_grad():
        w.data = torch.randn(3, 4)  # new storage
    assert torch.equal(PREPARED.get(w, (1, 0)), w.detach().t())


@pytest.mark.parametrize("case", ["bfloat16", "grad", "error"])
def test_fallback_cases_run_pytorch_and_log_once(case: str, caplog: pytest.LogCaptureFixture) -> None:
    r, k = _runner()
    w = torch.nn.Parameter(torch.randn(3, 4))
    x = torch.randn(5, 4)
    if case == "bfloat16":
        x, w = x.bfloat16(), torch.nn.Parameter(w.detach().bfloat16())
    if case == "error":
        k.fail = True
    ctx = torch.enable_grad() if case == "grad" else torch.no_grad()
    reset_warnings()
    with caplog.at_level(logging.WARNING, logger="prism"), ctx:
        for _ in range(2):
            y = r(x, w)
            torch.testing.assert_close(y, x @ w.t())
    assert r.prism_calls == 0 and r.fallback_calls == 2
    lines = [rec.getMessage() for rec in caplog.records]
    assert len(lines) == 1 and "runs in PyTorch" in lines[0], lines
    assert {"bfloat16": "bfloat16", "grad": "autograd", "error": "no verified sGraph"}[case] in lines[0]


def test_sink_reshapes_moves_unary_operators_before_reshapes() -> None:
    g = prism.Graph("t")
    x = g.input("x", ("b", 8, 4))
    y = g.mul_scalar(g.exp(g.reshape(g.softmax(x, -1), ("b", 2, 16))), 2.0)
    g.output(y, "y")
    h = sink_reshapes(g)
    ops = [n.op for n in h.nodes]
    assert ops == ["input", "softmax", "exp", "mul_scalar", "reshape", "output"], ops
    a = np.random.default_rng(0).standard_normal((3, 8, 4))
    np.testing.assert_allclose(h.evaluate({"x": a}, dtype=np.float64)["y"], g.evaluate({"x": a}, dtype=np.float64)["y"])


def test_sink_reshapes_moves_a_reduction_before_a_squeeze() -> None:
    """``x.mean(-1).mean()``: the squeeze between the two means moves to the output, where the search peels
    it off; a reshape that merges dims is left alone."""
    g = prism.Graph("t")
    x = g.input("x", ("b", 8, 4))
    r = g.mean(g.reshape(g.mean(x, 2), ("b", 8)), 1)              # [b, 1]
    m = g.sum(g.reshape(x, ("b", 32)), 1)                         # merges dims: stays
    g.output(g.reshape(r, ("b",)), "r")
    g.output(m, "m")
    h = sink_reshapes(g)
    ops = [n.op for n in h.nodes]
    assert ops.count("mean") == 2 and not any(
        n.op == "mean" and n.src[0].op == "reshape" for n in h.nodes), ops
    assert any(n.op == "sum" and n.src[0].op == "reshape" for n in h.nodes), ops
    a = np.random.default_rng(1).standard_normal((3, 8, 4))
    for k in ("r", "m"):
        np.testing.assert_allclose(h.evaluate({"x": a}, dtype=np.float64)[k], g.evaluate({"x": a}, dtype=np.float64)[k])


def _getitem_node(shape: tuple[int, ...], idx: Any) -> Any:
    import operator

    g = torch.fx.Graph()
    x = g.placeholder("x")
    x.meta["val"] = torch.empty(shape)
    return x, g.call_function(operator.getitem, (x, idx))


@pytest.mark.parametrize("shape,idx", [
    ((1, 1, 4), (slice(None), slice(-1, None), slice(None))),   # a decode step's h[:, -1:, :]
    ((2, 3), (Ellipsis, slice(0, 3))),
    ((2, 3), slice(None, None, 1)),
    ((5,), (slice(-10, 10),)),
])
def test_a_slice_keeping_every_element_is_the_tensor_itself(shape: tuple[int, ...], idx: Any) -> None:
    from prism.frontend.compiler import _identity_slice_input
    x, n = _getitem_node(shape, idx)
    assert _identity_slice_input(n) is x


@pytest.mark.parametrize("shape,idx", [
    ((1, 2, 4), (slice(None), slice(-1, None), slice(None))),   # a prompt's last position
    ((4,), slice(None, None, 2)),
    ((4,), (slice(None, None, -1),)),
    ((2, 3), (0, slice(None))),                                  # an integer index drops a dim
    ((2, 3), (None, slice(None))),                               # None adds one
    ((2, 3), (Ellipsis, Ellipsis)),
    ((2, 3), (slice(None), slice(None), slice(None))),           # more indices than dims
])
def test_other_indexing_is_not_an_identity(shape: tuple[int, ...], idx: Any) -> None:
    from prism.frontend.compiler import _identity_slice_input
    _, n = _getitem_node(shape, idx)
    assert _identity_slice_input(n) is None


@pytest.mark.parametrize("on", [True, False])
def test_huge_pages_are_asked_for_the_module_state_a_runner_reads(on: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    from prism.runtime import memory
    asked: list[Any] = []
    monkeypatch.setattr(memory, "collapse", lambda t: asked.append(t) or 0)
    k = _Kernel()
    specs = [InputSpec("x0", None, False), InputSpec("x1", (1, 0), True)]
    r = PieceRunner("0 (linear)", k, specs, _Fallback(), huge_pages=on)
    w = torch.nn.Parameter(torch.randn(3, 4))
    with torch.no_grad():
        r(torch.randn(5, 4), w)
        r(torch.randn(5, 4), w)   # planned once: asked once
        r(torch.randn(2, 4), w)   # a new shape is planned: asked again (collapse remembers the storage)
    assert [a is w for a in asked] == ([True, True] if on else [])
