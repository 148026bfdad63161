"""Every PyTorch spelling of the element-wise operators and composites (F., torch., Tensor., nn. modules)
is captured with no fallback, and the captured Prism graph (NumPy reference, float64) matches PyTorch.

Tolerance: 1e-5 relative to the largest output (both sides compute in float64 from the same inputs;
PyTorch's float64 kernels and NumPy's differ only in rounding)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
F = torch.nn.functional
nn = torch.nn

from prism.frontend.capture import capture  # noqa: E402

pytestmark = pytest.mark.unit


def _check(fn: Callable[..., Any] | torch.nn.Module, *args: torch.Tensor) -> Any:
    gm = torch.fx.symbolic_trace(fn)
    cap = capture(gm, list(args), None)
    assert not cap.fallbacks, [(f.op, f.reason) for f in cap.fallbacks]
    phs = [n for n in cap.gm.graph.nodes if n.op == "placeholder"]
    feed = {}
    for name, node in cap.inputs.items():
        if node.op == "placeholder":
            v = args[phs.index(node)]
        else:
            v = cap.gm
            for part in node.target.split("."):
                v = getattr(v, part)
        feed[name] = v.detach().double().numpy()
    with torch.no_grad():
        ref = fn(*[a.double() for a in args]) if not isinstance(fn, nn.Module) else fn.double()(
            *[a.double() for a in args])
    got = cap.graph.evaluate(feed, dtype=np.float64)["out0"]
    r = ref.detach().numpy()
    assert got.shape == r.shape, (got.shape, r.shape)
    np.testing.assert_allclose(got, r, rtol=1e-5, atol=1e-5 * max(1.0, float(np.max(np.abs(r)))))
    return cap


X = torch.randn(8, 16, generator=torch.Generator().manual_seed(0)) * 3
Y = torch.randn(8, 16, generator=torch.Generator().manual_seed(1))

FUNCTIONS: dict[str, Callable[[Any], Any]] = {
    "F.leaky_relu": lambda x: F.leaky_relu(x),
    "F.leaky_relu.slope": lambda x: F.leaky_relu(x, negative_slope=0.2),
    "F.hardtanh": lambda x: F.hardtanh(x, -2.0, 2.5),
    "F.relu6": lambda x: F.relu6(x),
    "torch.clamp": lambda x: torch.clamp(x, -1.0, 2.0),
    "torch.clamp.min": lambda x: torch.clamp(x, min=0.5),
    "Tensor.clamp.max": lambda x: x.clamp(max=0.5),
    "Tensor.clip": lambda x: x.clip(-0.5, 0.5),
    "torch.clamp_min": lambda x: torch.clamp_min(x, 0.1),
    "F.hardsigmoid": lambda x: F.hardsigmoid(x),
    "F.hardswish": lambda x: F.hardswish(x),
    "F.softplus": lambda x: F.softplus(x),
    "F.softplus.beta": lambda x: F.softplus(x, beta=2.0, threshold=5.0),
    "F.elu": lambda x: F.elu(x, alpha=0.7),
    "F.selu": lambda x: F.selu(x),
    "torch.selu": lambda x: torch.selu(x),
    "F.celu": lambda x: F.celu(x, alpha=0.5),
    "F.mish": lambda x: F.mish(x),
    "torch.abs": lambda x: torch.abs(x),
    "Tensor.abs": lambda x: x.abs(),
    "torch.log": lambda x: torch.log(x.abs() + 1),
    "Tensor.log": lambda x: (x * x + 0.5).log(),
    "torch.erf": lambda x: torch.erf(x),
    "torch.special.erf": lambda x: torch.special.erf(x),
    "torch.sin": lambda x: torch.sin(x),
    "Tensor.cos": lambda x: x.cos(),
    "F.logsigmoid": lambda x: F.logsigmoid(x),
    "F.softsign": lambda x: F.softsign(x),
    "torch.amin": lambda x: torch.amin(x, dim=-1),
    "Tensor.amin.keepdim": lambda x: x.amin(1, keepdim=True),
    "torch.logsumexp": lambda x: torch.logsumexp(x, dim=-1),
    "Tensor.logsumexp.keepdim": lambda x: x.logsumexp(0, keepdim=True),
    "F.log_softmax": lambda x: F.log_softmax(x, dim=-1),
    "Tensor.log_softmax": lambda x: x.log_softmax(0),
    "torch.log_softmax": lambda x: torch.log_softmax(x, 1),
    "F.layer_norm": lambda x: F.layer_norm(x, (16,)),
    "Tensor.var": lambda x: (x * 3 + 50).var(-1),
    "torch.var.biased.keepdim": lambda x: torch.var(x, 0, keepdim=True, unbiased=False),
    "torch.var.correction": lambda x: torch.var(x, dim=1, correction=0),
    "Tensor.std": lambda x: x.std(dim=-1, keepdim=True),
    "torch.std.two_dims": lambda x: torch.std(x, (0, 1)),
    "Tensor.norm": lambda x: x.norm(dim=-1),
    "torch.norm.p1": lambda x: torch.norm(x, p=1, dim=1, keepdim=True),
    "torch.linalg.vector_norm": lambda x: torch.linalg.vector_norm(x, dim=-1),
    "F.normalize": lambda x: F.normalize(x, dim=-1),
    "getitem.int": lambda x: x[:, 3] * 2,
    "torch.max.values": lambda x: torch.max(x, dim=-1).values * 2,
    "Tensor.min.getitem": lambda x: x.min(0, keepdim=True)[0] + 1,
    "F.mse_loss": lambda x: F.mse_loss(x, x * 0.5),
    "getitem.int_last_row": lambda x: x[-1] + 1,
    "getitem.none_first": lambda x: x.sum(0)[None, :] + x[:1],
    "getitem.none_last": lambda x: x + x.amax(-1)[:, None],
    "getitem.none_ellipsis": lambda x: x - x.mean(-1)[..., None],
    "getitem.none_alone": lambda x: (x[None] * 2).sum(0),
}


@pytest.mark.parametrize("name", sorted(FUNCTIONS))
def test_function_spelling(name: str) -> None:
    fn = FUNCTIONS[name]

    class M(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return fn(x)
    _check(M(), X)


LOSSES: dict[str, Callable[..., Any]] = {
    "mse_mean": lambda a, b: F.mse_loss(a, b),
    "mse_sum": lambda a, b: F.mse_loss(a, b, reduction="sum"),
    "mse_none": lambda a, b: F.mse_loss(a, b, reduction="none"),
    "l1": lambda a, b: F.l1_loss(a, b),
    "smooth_l1": lambda a, b: F.smooth_l1_loss(a * 3, b, beta=0.5),
    "huber": lambda a, b: F.huber_loss(a * 3, b, delta=2.0),
    "bce_logits": lambda a, b: F.binary_cross_entropy_with_logits(a * 4, torch.sigmoid(b)),
    "mean_all": lambda a, b: ((a - b) ** 2).mean(),
}


@pytest.mark.parametrize("fn", [lambda x: torch.amin(x, dim=-1), lambda x: x.amin((0, 1)),
                                lambda x: torch.min(x, dim=0).values, lambda x: torch.min(x, 1, keepdim=True)[0],
                                lambda x: torch.min(x)], ids=["amin", "amin.dims", "min.values", "min.keepdim",
                                                              "min.all"])
def test_min_spellings_are_the_min_reduction(fn: Callable[[Any], Any]) -> None:
    """Every spelling of a minimum is the ``min`` reduction (prism.ir.reductions), not ``-max(-x)``."""
    cap = _check(fn, X)
    ops = [n.op for n in cap.graph.nodes]
    assert "min" in ops and "max" not in ops and "neg" not in ops, ops


def test_layer_norm_written_with_var_is_one_layer_norm() -> None:
    """``(x - mean) / sqrt(var(unbiased=False) + eps)`` is a layer norm: one operator (capture's fuser)."""
    cap = _check(lambda x: (x - x.mean(-1, keepdim=True)) / torch.sqrt(x.var(-1, keepdim=True, unbiased=False)
                                                                      + 1e-5), X * 4 + 9)
    assert [n.op for n in cap.graph.nodes].count("layer_norm") == 1
    assert not any(n.op in ("mean", "sqrt") for n in cap.graph.nodes)


@pytest.mark.parametrize("name", sorted(LOSSES))
def test_losses(name: str) -> None:
    _check(LOSSES[name], X, Y)


def test_binary_minimum_and_cosine_similarity() -> None:
    _check(lambda a, b: torch.minimum(a, b), X, Y)
    _check(lambda a, b: F.cosine_similarity(a, b, dim=-1), X, Y)


MODULES: dict[str, Callable[[], nn.Module]] = {
    "LeakyReLU": lambda: nn.LeakyReLU(0.1), "Hardtanh": lambda: nn.Hardtanh(-0.5, 1.5), "ReLU6": nn.ReLU6,
    "Hardsigmoid": nn.Hardsigmoid, "Hardswish": nn.Hardswish, "ELU": lambda: nn.ELU(0.3), "SELU": nn.SELU,
    "CELU": lambda: nn.CELU(0.8), "Mish": nn.Mish, "Softplus": lambda: nn.Softplus(1.5, 10.0),
    "GELU.tanh": lambda: nn.GELU("tanh"), "SiLU": nn.SiLU, "Sigmoid": nn.Sigmoid, "Tanh": nn.Tanh,
    "LayerNorm": lambda: nn.LayerNorm(16), "LayerNorm.noaffine": lambda: nn.LayerNorm(16, elementwise_affine=False),
}


@pytest.mark.parametrize("name", sorted(MODULES))
def test_module_spelling(name: str) -> None:
    torch.manual_seed(0)
    mod = MODULES[name]()
    if isinstance(mod, nn.LayerNorm) and mod.weight is not None:
        with torch.no_grad():
            mod.weight.uniform_(0.5, 1.5)
            mod.bias.uniform_(-0.5, 0.5)
    _check(nn.Sequential(nn.Linear(16, 16), mod), X)


def test_unsupported_attribute_is_a_fallback_with_reason() -> None:
    gm = torch.fx.symbolic_trace(lambda x, y: torch.clamp(x, min=y))  # a tensor bound
    cap = capture(gm, [X, Y], None)
    assert [f.op for f in cap.fallbacks] == ["torch.clamp"]
    assert "must be a constant" in cap.fallbacks[0].reason


def _dynamo_check(fn: Callable[..., Any], *args: torch.Tensor) -> None:
    """The same through Dynamo's graph (its spellings differ: F.* inlined to torch._C._nn.*, methods)."""
    got: list[Any] = []

    def backend(gm: torch.fx.GraphModule, example: list[Any]) -> Any:
        got.append((gm, capture(gm)))
        return gm.forward
    torch._dynamo.reset()
    torch.compile(fn, backend=backend)(*args)
    assert len(got) == 1, "graph break"
    gm, cap = got[0]
    assert not cap.fallbacks, [(f.op, f.reason) for f in cap.fallbacks]
    phs = [n for n in gm.graph.nodes if n.op == "placeholder"]
    feed = {name: args[phs.index(node)].detach().double().numpy() for name, node in cap.inputs.items()}
    with torch.no_grad():
        r = fn(*[a.double() for a in args]).numpy()
    out = cap.graph.evaluate(feed, dtype=np.float64)["out0"]
    np.testing.assert_allclose(out, r, rtol=1e-5, atol=1e-5 * max(1.0, float(np.max(np.abs(r)))))


@pytest.mark.parametrize("name", sorted(FUNCTIONS))
def test_function_spelling_through_dynamo(name: str) -> None:
    _dynamo_check(FUNCTIONS[name], X)


MASKS: dict[str, Callable[..., Any]] = {
    "where_gt": lambda x: torch.where(x > 0, x, 0.1 * x),
    "masked_fill_inf_softmax": lambda x: x.masked_fill(x < -0.5, float("-inf")).softmax(-1),
    "where_scalar_first": lambda x: torch.where(x.abs() >= 1, 0.0, x),
    "mask_float_mul": lambda x: (x * (x > 0).float()).sum(-1),
    "not_and": lambda x: torch.where(~(x > 0) & (x > -1), x, 2.0),
    "or_le_eq": lambda x: torch.where((x <= -1) | (x == 0), 1.0, x),
    "reversed_compare": lambda x: torch.where(0.5 < x, x, -x),
    "bool_method": lambda x: x * x.bool().float(),
}


@pytest.mark.parametrize("name", sorted(MASKS))
def test_masks(name: str) -> None:
    fn = MASKS[name]

    class M(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return fn(x)
    _check(M(), X)


def test_masks_from_pytorch_enter_as_inputs_and_masks_for_pytorch_stay_there() -> None:
    """A bool mask PyTorch computes is an input of the piece that reads it (the runner converts it); a
    mask whose user is PyTorch, or made from a PyTorch mask, stays in PyTorch."""
    cap = capture(torch.fx.symbolic_trace(lambda x, m: x.masked_fill(m, 0.0)), [X, X > 0], None)
    assert cap.fallbacks == [] and [u.op for u in cap.units] == ["masked_fill"]
    cap = capture(torch.fx.symbolic_trace(lambda x: x > 0), [X], None)
    assert "used outside Prism" in cap.fallbacks[0].reason
    cap = capture(torch.fx.symbolic_trace(lambda x, m: x.masked_fill(m & (x > 0), 0.0)), [X, X > 0.5], None)
    why = {f.op: f.reason for f in cap.fallbacks}
    assert [u.op for u in cap.units] == ["masked_fill"] and set(why) == {"operator.and_", "operator.gt"}
    assert "made in PyTorch too" in why["operator.and_"] and "used outside Prism" in why["operator.gt"]


VALUES: dict[str, Callable[..., Any]] = {
    "max_dim_values": lambda x: torch.max(x, dim=-1).values * 2,
    "max_dim_getitem": lambda x: torch.max(x, 1, keepdim=True)[0] + 1,
    "min_dim_values": lambda x: x.min(dim=0).values,
    "max_all": lambda x: torch.max(x) * 2,
    "max_two_tensors": lambda x: torch.max(x, x * 0.5),
}


@pytest.mark.parametrize("name", sorted(VALUES))
def test_max_min_values(name: str) -> None:
    fn = VALUES[name]

    class M(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return fn(x)
    _check(M(), X)


def test_max_indices_stay_in_pytorch_with_a_true_reason() -> None:
    cap = capture(torch.fx.symbolic_trace(lambda x: torch.max(x, dim=-1).indices), [X], None)
    assert cap.fallbacks and all("int64" in f.reason or "indices" in f.reason for f in cap.fallbacks)
