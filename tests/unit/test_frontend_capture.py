"""FX capture: every supported PyTorch operator becomes Prism operators that compute the same values
(the captured Prism graph is run by the NumPy reference and compared with PyTorch); unsupported ones
and other dtypes become fallbacks with a reason. No C compiler involved."""

from __future__ import annotations

import math
import subprocess
import sys
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
F = torch.nn.functional

from prism.frontend.capture import Captured, capture  # noqa: E402
from prism.frontend.ops import meta_value  # noqa: E402
from prism.frontend.symbolic import to_dim  # noqa: E402
from prism.ir import dims as D  # noqa: E402

pytestmark = pytest.mark.unit


def _capture(fn: Callable[..., Any] | torch.nn.Module, args: tuple, dynamic: Any = None) -> Captured:
    gm = torch.fx.symbolic_trace(fn)
    return capture(gm, list(args), dynamic)


def _feed(cap: Captured, args: tuple) -> dict[str, np.ndarray]:
    phs = [n for n in cap.gm.graph.nodes if n.op == "placeholder"]
    out = {}
    for name, node in cap.inputs.items():
        if node.op == "placeholder":
            v = args[phs.index(node)]
        else:
            v = cap.gm
            for part in node.target.split("."):
                v = getattr(v, part)
        out[name] = v.detach().double().numpy()
    return out


def _check(fn: Callable[..., Any] | torch.nn.Module, *args: torch.Tensor, fallbacks: int = 0,
           dynamic: Any = None, tol: float = 1e-5) -> Captured:
    cap = _capture(fn, args, dynamic)
    assert len(cap.fallbacks) == fallbacks, [(f.op, f.reason) for f in cap.fallbacks]
    with torch.no_grad():
        ref = fn(*args)
    refs = ref if isinstance(ref, (tuple, list)) else (ref,)
    got = cap.graph.evaluate(_feed(cap, args), dtype=np.float64)
    assert len(got) == len(refs)
    for k, r in enumerate(refs):
        g = got[f"out{k}"]
        r = r.detach().double().numpy()
        assert g.shape == r.shape, (g.shape, r.shape)
        assert np.max(np.abs(g - r)) <= tol * max(1.0, np.max(np.abs(r))), np.max(np.abs(g - r))
    return cap


def _r(*shape: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


X, Y = _r(3, 8, seed=1), _r(3, 8, seed=2)

ELEMENTWISE: dict[str, Callable[..., Any]] = {
    "add_sub_scalars": lambda x, y: x + y * 2 - 1,
    "rsub_scalar": lambda x, y: 1 - x + torch.rsub(y, 2),
    "div": lambda x, y: x / 4 + x / (y.exp() + 1),
    "alpha": lambda x, y: torch.add(x, y, alpha=0.5) + torch.sub(x, y, alpha=2),
    "scalar_first": lambda x, y: 3 * x + (2 + y) - (5 - x),
    "unary": lambda x, y: torch.exp(x) + torch.sqrt(y.exp()) + torch.rsqrt(x.exp()) + torch.sigmoid(x)
    + torch.tanh(y) - x,
    "activations": lambda x, y: F.silu(x) + F.gelu(y) + F.gelu(x, approximate="tanh") + F.relu(y) + x.clamp(min=0),
    "powers": lambda x, y: x ** 2 + y.pow(3) + torch.square(x) + x.exp().pow(0.5) + y.exp() ** -0.5,
    "more_powers": lambda x, y: x ** 4 + (y.exp() + 1) ** -1 + torch.pow(x.exp(), -2) + 2 ** x + torch.pow(3.5, y)
    + 0.5 ** x,
    "rounding_and_logs": lambda x, y: torch.round(x * 3) + torch.floor(y) - torch.ceil(x) + torch.trunc(y * 2)
    + torch.frac(x) + torch.sign(y) + torch.round(x, decimals=1) + torch.log1p(x.abs()) + torch.expm1(y)
    + torch.exp2(x) + torch.log2(y.abs() + 1) + torch.log10(x.abs() + 1) + torch.reciprocal(y.abs() + 1)
    + x.round() + y.floor() + x.sgn() + torch.fix(y),
    "maximum": lambda x, y: torch.maximum(x, y) * y,
    "broadcast": lambda x, y: x * y[:1] + x[:, :1],
}


@pytest.mark.parametrize("name", sorted(ELEMENTWISE))
def test_elementwise(name: str) -> None:
    _check(ELEMENTWISE[name], X, Y)


REDUCTIONS: dict[str, Callable[..., Any]] = {
    "sum_keepdim": lambda x: x.sum(-1, keepdim=True) * x,
    "sum_nokeep": lambda x: x.sum(-1),
    "sum_dim0": lambda x: torch.sum(x, dim=0),
    "mean_two_dims": lambda x: x.mean(dim=(0, 2)),
    "mean_all": lambda x: x.mean(),
    "amax": lambda x: torch.amax(x, -1, keepdim=True) - x,
    "softmax": lambda x: F.softmax(x, -1) + x.softmax(dim=0) + torch.softmax(x, 1),
}


@pytest.mark.parametrize("name", sorted(REDUCTIONS))
def test_reductions(name: str) -> None:
    _check(REDUCTIONS[name], _r(2, 3, 4))


W, Bv = _r(8, 5, seed=3), _r(5, seed=4)

CONTRACTIONS: dict[str, tuple[Callable[..., Any], tuple]] = {
    "matmul_op": (lambda x, w: x @ w, (X, W)),
    "mm": (lambda x, w: torch.mm(x, w), (X, W)),
    "matmul_broadcast": (lambda x, w: torch.matmul(x, w), (_r(2, 3, 8), W)),
    "bmm": (lambda a, b: torch.bmm(a, b), (_r(2, 3, 8), _r(2, 8, 4))),
    "linear_bias": (lambda x, w, b: F.linear(x, w, b), (_r(2, 3, 5), _r(4, 5), _r(4))),
    "linear_nobias": (lambda x, w: F.linear(x, w), (_r(2, 3, 5), _r(4, 5))),
    "addmm": (lambda b, x, w: torch.addmm(b, x, w, beta=0.5, alpha=2.0), (Bv, X, W)),
}


@pytest.mark.parametrize("name", sorted(CONTRACTIONS))
def test_contractions(name: str) -> None:
    fn, args = CONTRACTIONS[name]
    _check(fn, *args)


def test_linear_module_is_lowered_and_its_weight_read_transposed() -> None:
    m = torch.nn.Sequential(torch.nn.Linear(8, 6), torch.nn.SiLU(), torch.nn.Linear(6, 3, bias=False),
                            torch.nn.Softmax(dim=-1))
    cap = _check(m, X)
    lin = [u for u in cap.units if u.op == "linear"]
    assert len(lin) == 2 and all(u.lowered.operands[1].perm == (1, 0) for u in lin)
    assert all(u.lowered.operands[1].node in cap.persistent for u in lin)  # weights are module state


class _RMS(torch.nn.Module):
    def __init__(self, variant: str) -> None:
        super().__init__()
        self.variant = variant
        self.weight = torch.nn.Parameter(torch.rand(8) + 0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.variant == "rsqrt_pow":
            y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)
        elif self.variant == "rsqrt_mul":
            y = torch.rsqrt((x * x).mean(dim=-1, keepdim=True) + 1e-5) * x
        elif self.variant == "div_sqrt":
            y = x / torch.sqrt(torch.mean(x ** 2, -1, keepdim=True) + 1e-6)
        else:
            y = F.rms_norm(x, (8,), None, 1e-6)
        return y * self.weight


@pytest.mark.parametrize("variant", ["rsqrt_pow", "rsqrt_mul", "div_sqrt", "functional"])
def test_rms_norm_forms_become_one_operator(variant: str) -> None:
    cap = _check(_RMS(variant), _r(2, 3, 8))
    ops = [u.op for u in cap.units]
    assert ops == ["rms_norm", "mul"], ops
    assert sum(n.op == "rms_norm" for n in cap.graph.nodes) == 1


def test_rms_pattern_with_a_shared_intermediate_is_not_fused() -> None:
    def fn(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        ms = x.pow(2).mean(-1, keepdim=True)
        return x * torch.rsqrt(ms + 1e-6), ms  # the mean is also an output: fusing would lose it
    cap = _check(fn, _r(2, 8))
    assert "rms_norm" not in [u.op for u in cap.units]


class _LN(torch.nn.Module):
    """Layer norms as users write them out (nanoGPT-style, ConvNeXt's channels-first, c * rsqrt)."""

    def __init__(self, variant: str) -> None:
        super().__init__()
        self.variant = variant
        self.weight = torch.nn.Parameter(torch.rand(8) + 0.5)
        self.bias = torch.nn.Parameter(torch.rand(8))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.variant == "twice_pow_div":
            u = x.mean(-1, keepdim=True)
            s = (x - u).pow(2).mean(-1, keepdim=True)
            return (x - u) / torch.sqrt(s + 1e-5) * self.weight + self.bias
        if self.variant == "shared_mul_rsqrt":
            c = x - torch.mean(x, dim=-1, keepdim=True)
            return self.weight * (c * torch.rsqrt((c * c).mean(-1, keepdim=True) + 1e-6)) + self.bias
        # channels first ([N, C, H, W] normalized over C, ConvNeXt's LayerNorm; its affine part indexes the
        # weight with None, which this test's evaluation of the captured graph cannot feed)
        u = x.mean(1, keepdim=True)
        s = (x - u).pow(2).mean(1, keepdim=True)
        return (x - u) / torch.sqrt(s + 1e-6)


@pytest.mark.parametrize("variant", ["twice_pow_div", "shared_mul_rsqrt", "channels_first"])
def test_layer_norm_forms_become_one_operator(variant: str) -> None:
    x = _r(2, 8, 3, 5) if variant == "channels_first" else _r(2, 3, 8) * 3.0 + 5.0
    cap = _check(_LN(variant), x)
    assert [n.op for n in cap.graph.nodes].count("layer_norm") == 1
    assert not any(n.op in ("mean", "sqrt", "rsqrt") for n in cap.graph.nodes)


def test_layer_norm_pattern_with_a_shared_intermediate_is_not_fused() -> None:
    def fn(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        u = x.mean(-1, keepdim=True)
        return (x - u) / torch.sqrt((x - u).pow(2).mean(-1, keepdim=True) + 1e-5), u  # the mean is an output
    cap = _check(fn, _r(2, 8))
    assert "layer_norm" not in [u.op for u in cap.units]


@pytest.mark.parametrize("gqa", [False, True])
@pytest.mark.parametrize("scale", [None, 0.3])
def test_scaled_dot_product_attention(gqa: bool, scale: float | None) -> None:
    q = _r(2, 8 if gqa else 2, 3, 16, seed=5)
    k, v = _r(2, 2, 7, 16, seed=6), _r(2, 2, 7, 12, seed=7)
    cap = _check(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, scale=scale, enable_gqa=gqa), q, k, v)
    assert [u.op for u in cap.units] == ["scaled_dot_product_attention"]
    assert sum(n.op == "softmax" for n in cap.graph.nodes) == 1


def test_attention_written_out() -> None:
    def fn(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        s = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
        return torch.softmax(s, dim=-1) @ v
    _check(fn, _r(2, 4, 3, 16), _r(2, 4, 5, 16), _r(2, 4, 5, 16))


FOLDED: dict[str, tuple[Callable[..., Any], tuple[int, ...]]] = {
    "w.T": (lambda x, w: x @ w.T * 0.5, (2, 3)),
    "w.t()": (lambda x, w: torch.relu(x @ w.t()), (2, 3)),
    "transpose(-1, -2)": (lambda x, w: x @ w.transpose(-1, -2), (2, 3)),
    "permute then T": (lambda x, w: x @ w.permute(1, 0).T.T, (2, 3)),
}


@pytest.mark.parametrize("name", sorted(FOLDED))
def test_a_transpose_with_one_user_is_folded_into_its_operand(name: str) -> None:
    """The product reads ``w`` as stored: no layout unit is left, the operand carries the permutation."""
    fn, wshape = FOLDED[name]
    cap = _check(fn, _r(4, 3), _r(*wshape, seed=1))
    assert not cap.layout_units, [u.op for u in cap.layout_units]
    (mm,) = [u for u in cap.units if u.op == "matmul"]
    w = [n for n in cap.gm.graph.nodes if n.op == "placeholder"][1]
    assert any(o.node is w and o.perm == (1, 0) for o in mm.lowered.operands)
    assert sum(1 for n in cap.graph.nodes if n.op == "permute") == 1


def test_transposes_that_would_become_one_operand_stay_layout_units() -> None:
    def fn(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return (x @ w.T) * torch.tanh(x @ w.t())   # .T and .t(): two calls merge_common does not merge
    cap = _check(fn, _r(4, 3), _r(2, 3, seed=1))
    assert len(cap.layout_units) == 2


def test_a_no_op_conversion_with_one_user_is_folded() -> None:
    """A norm's ``.to(input_dtype)`` (float32 to float32) no longer separates it from its weight's multiply:
    the planner puts the norm and the multiply in one piece (Llama's RMSNorm as transformers writes it)."""
    from prism.frontend.compiler import plan_pieces
    from prism.frontend.partition import Budget

    def fn(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        h = x.to(torch.float32)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6)
        return w * h.to(x.dtype)
    cap = _check(fn, _r(4, 8), _r(8, seed=1))
    (first,) = cap.layout_units  # the input's .to(float32) has two users (the norm reads h twice): kept
    assert first.node.args[0].op == "placeholder"
    (piece,) = plan_pieces(cap, Budget())
    assert [cap.units[i].op for i in piece.members] == ["rms_norm", "mul"]


def test_a_mask_conversion_is_not_folded() -> None:
    """``mask.float()`` changes the dtype: it stays a unit of its own (a bool from PyTorch never enters a
    piece)."""
    def fn(x: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
        return x * m.float() + 1.0
    cap = _capture(fn, (_r(4, 8), _r(4, 8, seed=1) > 0))
    assert any(f.op.endswith("float") for f in cap.fallbacks) or any(u.op == "float" for u in cap.units)
    (mul,) = [u for u in cap.units if u.op == "mul"]
    assert all(str(meta_value(o.node).dtype) == "torch.float32" for o in mul.lowered.operands)


def test_a_transpose_with_two_users_stays_a_layout_unit() -> None:
    def fn(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        wt = w.T
        return x @ wt + wt.sum(0)
    cap = _check(fn, _r(4, 3), _r(2, 3, seed=1))
    assert len(cap.layout_units) == 1


BROADCASTS: dict[str, tuple[Callable[..., Any], tuple[tuple[int, ...], ...]]] = {
    "expand_as": (lambda x: x / x.norm(dim=-1, keepdim=True).clamp_min(1e-12).expand_as(x), ((4, 8),)),
    "expand": (lambda x, y: x.amax(-1, keepdim=True).expand(4, 8) * y, ((4, 8), (4, 8))),
    "expand_leading": (lambda x, y: y - x.sum(0).expand(4, 8), ((4, 8), (4, 8))),
    "broadcast_tensors_equal": (lambda x, y: (lambda t: (t[0] - t[1]).sum(-1))(torch.broadcast_tensors(x, y)),
                                ((4, 8), (4, 8))),
    "broadcast_tensors_rows": (lambda x, y: (lambda t: t[0] * t[1])(torch.broadcast_tensors(x, y)), ((8,), (4, 8))),
}


@pytest.mark.parametrize("name", sorted(BROADCASTS))
def test_an_expand_read_by_a_broadcasting_operator_is_folded(name: str) -> None:
    """``expand``/``expand_as``/``broadcast_tensors`` whose one user broadcasts anyway (or that change no shape)
    leave no layout unit and no copies: the operator reads the unexpanded tensor."""
    fn, shapes = BROADCASTS[name]
    cap = _check(fn, *[_r(*sh, seed=k) for k, sh in enumerate(shapes)])
    assert not cap.layout_units, [u.op for u in cap.layout_units]
    assert not any(n.op == "concat" for n in cap.graph.nodes)


def test_an_expand_that_changes_a_shape_for_another_operator_stays_a_layout_unit() -> None:
    """Read by a reduction, the expanded value is needed: it stays a layout unit (in PyTorch), and the
    captured graph lowers it as copies (a leading dim added, a size-1 dim repeated) with the same values."""
    def fn(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        t = torch.broadcast_tensors(x, y)
        return t[0].sum(0) + t[1].sum(0) + x.unsqueeze(1).expand(8, 3).sum(1)
    cap = _check(fn, _r(8), _r(4, 8, seed=1))
    assert {u.op for u in cap.layout_units} >= {"broadcast_tensors", "expand"}
    assert any(n.op == "concat" for n in cap.graph.nodes)


LAYOUT: dict[str, Callable[..., Any]] = {
    "view_transpose": lambda x: x.view(2, 3, 2, 2).transpose(1, 2).reshape(2, -1) * 2,
    "permute_t": lambda x: x.permute(2, 0, 1).contiguous().reshape(4, 6).t() + 1,
    "unsqueeze_squeeze": lambda x: x.unsqueeze(1).squeeze(1) + x.unsqueeze(0).sum(0),
    "cat_split_chunk": lambda x: torch.cat((x.split([1, 3], dim=-1)[1], x.split([1, 3], dim=-1)[0]), -1)
    + torch.cat((x.chunk(2, 1)[1], x.chunk(2, 1)[0]), 1),
    "slicing": lambda x: torch.cat((-x[..., 2:], x[..., :2]), dim=-1) + x[:, 1:2].sum(1, keepdim=True),
    "expand": lambda x: x[:, :, :1].expand(2, 3, 4) * x,
}


@pytest.mark.parametrize("name", sorted(LAYOUT))
def test_layout(name: str) -> None:
    cap = _check(LAYOUT[name], _r(2, 3, 4))
    assert any(u.kind == "layout" for u in cap.units)


def test_dynamic_dims_are_symbols_and_the_graph_serves_every_size() -> None:
    class M(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = torch.nn.Linear(8, 4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            b = x.shape[0]
            return F.silu(self.lin(x)).view(b, 2, 2).sum(-1)
    fn = M()
    gm = torch.fx.symbolic_trace(fn)
    cap = capture(gm, [_r(3, 8)], dynamic={0: [0]})
    (name,) = [k for k, n in cap.inputs.items() if n.op == "placeholder"]
    (s,) = D.symbols(cap.graph.inputs[name].shape[0])
    for n in (3, 5):
        x = _r(n, 8, seed=n)
        got = cap.graph.evaluate(_feed(cap, (x,)), dtype=np.float64)["out0"]
        assert got.shape == (n, 2)
        np.testing.assert_allclose(got, fn(x).detach().double().numpy(), rtol=1e-5, atol=1e-5)
    assert s in cap.graph.symbols()


def test_torch_export_graph() -> None:
    class M(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = torch.nn.Linear(8, 8, bias=False)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.softmax(self.lin(x) * 0.5, -1) + x

    batch = torch.export.Dim("batch", min=2)
    ep = torch.export.export(M(), (_r(3, 8),), dynamic_shapes=({0: batch},))
    gm = ep.module()
    cap = capture(gm)
    assert not cap.fallbacks
    assert [u.op for u in cap.units] == ["linear", "mul", "softmax", "add"]
    x_in = [n for n in cap.inputs.values() if n.op == "placeholder"]
    assert len(x_in) == 1 and any(not isinstance(d, int) for d in cap.graph.inputs[
        next(k for k, v in cap.inputs.items() if v is x_in[0])].shape)


def test_dynamo_graph() -> None:
    got: list[Captured] = []

    def backend(gm: torch.fx.GraphModule, example: list[Any]) -> Any:
        got.append(capture(gm))
        return gm.forward

    def fn(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return F.silu(x @ w).sum(-1, keepdim=True) / 2
    x, w = _r(4, 8), _r(8, 3)
    torch._dynamo.reset()
    torch.compile(fn, backend=backend, dynamic=True)(x, w)
    (cap,) = got
    assert [u.op for u in cap.units] == ["matmul", "silu", "sum", "div"] and not cap.fallbacks
    assert cap.graph.symbols()  # dynamic=True: sizes are symbols


def test_unsupported_operators_and_dtypes_are_fallbacks_with_reasons() -> None:
    cap = _capture(lambda x: torch.cumsum(x, -1) * 2 + x.cumsum(0), (X,))
    ops = sorted(f.op for f in cap.fallbacks)
    assert ops == ["Tensor.cumsum", "torch.cumsum"], ops
    assert all("not supported" in f.reason for f in cap.fallbacks)
    for dt in (torch.float64,):
        cap = _capture(lambda x: F.silu(x) * 2, (X.to(dt),))
        assert not cap.units and cap.fallbacks
        assert all(str(dt).removeprefix("torch.") in f.reason for f in cap.fallbacks)
    cap = _capture(lambda q: F.scaled_dot_product_attention(q, q, q, is_causal=True), (_r(1, 2, 3, 4),))
    assert "is_causal" in cap.fallbacks[0].reason
    cap = _capture(lambda x: 2 / x, (X,))
    assert "reciprocal" in cap.fallbacks[0].reason


def test_low_precision_values_keep_their_dtypes_and_casts_round_only_where_they_narrow() -> None:
    """A bfloat16 RMSNorm as Hugging Face writes it: the widening ``.to(float32)`` of a value is no operator
    (Prism computes in float32), the narrowing ``.to(input_dtype)`` is a cast, the result has PyTorch's dtype
    (a 0-dim float32 tensor does not promote a bfloat16 one)."""
    def norm(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        h = x.to(torch.float32)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6)
        return w * h.to(x.dtype) + x.float().mean()
    x, w = X.bfloat16(), torch.rand(X.shape[-1]).bfloat16()
    cap = _capture(norm, (x, w))
    assert not cap.fallbacks, cap.fallbacks
    g = cap.graph
    assert {n.dtype.name for n in g.inputs.values()} == {"bfloat16"}
    casts = [n for n in g.nodes if n.op == "cast"]
    assert [c.arg for c in casts] == [("bfloat16",)], g    # only the narrowing one
    (out,) = g.outputs
    assert out.dtype.name == str(norm(x, w).dtype).removeprefix("torch.") == "bfloat16"  # + an f32 0-dim tensor
    ref = norm(x.double(), w.double()).numpy()
    got = g.evaluate(_feed(cap, (x, w)), dtype=np.float64)["out0"]
    assert np.max(np.abs(got - ref)) <= 2 * 2.0 ** -8 * np.max(np.abs(ref))


def test_in_place_operators_stay_in_pytorch() -> None:
    def fn(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        x.add_(y)       # the caller's x must be mutated: a Prism kernel would return a new tensor
        y.mul_(2)
        return F.relu(x, inplace=True) * y
    cap = _capture(fn, (X.clone(), Y.clone()))
    assert sorted(f.op for f in cap.fallbacks) == ["Tensor.add_", "Tensor.mul_", "torch.nn.functional.relu"]
    assert [u.op for u in cap.units] == ["mul"]


def test_sizes_from_torch_symbols() -> None:
    import sympy
    from torch.utils._sympy.functions import FloorDiv

    s, t = sympy.Symbol("s0", integer=True, positive=True), sympy.Symbol("s1", integer=True, positive=True)
    assert to_dim(s * 8 + t - 2) == D.sym("s0") * 8 + D.sym("s1") - 2
    assert to_dim(FloorDiv(s * 8, 4)) == D.sym("s0") * 2
    assert to_dim(sympy.Integer(7)) == 7 and to_dim(5) == 5
    from prism.errors import UnsupportedError
    with pytest.raises(UnsupportedError):
        to_dim(FloorDiv(s, 4))  # not exact for every s0
    with pytest.raises(UnsupportedError):
        to_dim(sympy.Mod(s, 3))


def _run(code: str) -> str:
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    return r.stdout.strip()


def test_import_prism_does_not_import_torch_and_the_backend_name_registers_either_way() -> None:
    assert _run("import sys, prism; print('torch' in sys.modules, callable(prism.optimize))") == "False True"
    reg = "from torch._dynamo.backends.registry import _COMPILER_FNS; print('prism' in _COMPILER_FNS)"
    import tomllib
    from pathlib import Path
    doc = tomllib.loads((Path(__file__).resolve().parents[2] / "pyproject.toml").read_text())
    target = doc["project"]["entry-points"]["torch_dynamo_backends"]["prism"]
    assert target == "prism.frontend.dynamo:prism_backend"
    mod, fn = target.split(":")
    assert _run(f"import {mod} as m; print(callable(m.{fn}))") == "True"
    assert _run(f"import prism, torch, torch._dynamo; {reg}") == "True"        # torch imported after prism
    assert _run(f"import torch, torch._dynamo, prism; {reg}") == "True"        # torch imported before
    # prism never imported by the user: torch's lookup loads the installed entry point (whose import of the
    # module registered the name first, and the lookup's own registration then failed: "duplicate name")
    from importlib.metadata import entry_points
    if not any(e.name == "prism" for e in entry_points(group="torch_dynamo_backends")):
        pytest.skip("the package's entry points are not installed (pip install -e .)")
    lookup = "from torch._dynamo.backends.registry import lookup_backend; print(callable(lookup_backend('prism')))"
    assert _run(f"import torch, torch._dynamo; {lookup}") == "True"
    assert _run("import torch; f = torch.compile(lambda x: x.exp() * 2, backend='prism'); "
                "print(float(f(torch.ones(3)).sum()) > 16)") == "True"


def test_a_units_new_operators_include_an_interned_node_built_by_an_earlier_unit() -> None:
    """_new_ops walks from a unit's result down to its operands; a node an earlier unit built from the same
    operands (interned: the same object) is still this unit's work, as the whole-graph rule says."""
    from prism.frontend.capture import _Builder, _new_ops

    b = _Builder("t")
    x = b.g.input("x", (4, 8))
    m1 = b.g.mean(x, -1)
    assert sorted(n.op for n in _new_ops(b, m1, [x])) == ["mean"]
    s = b.g.add(b.g.mean(x, -1), x)            # the same mean(x) node again, and an add
    assert sorted(n.op for n in _new_ops(b, s, [x])) == ["add", "mean"]
    y = b.g.relu(b.g.mul_scalar(s, 2.0))       # nothing of the earlier units is reached
    assert sorted(n.op for n in _new_ops(b, y, [s])) == ["mul_scalar", "relu"]
    assert _new_ops(b, (s, y), [s, y]) == []


def test_repeated_calls_on_the_same_arguments_are_computed_once() -> None:
    # three Linears quantizing one row each (W8A8's q/k/v): the row scale is computed once; the int8 casts stay
    # one per product, so each product's piece reads the int8 row
    def fn(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        outs = []
        for k in range(3):
            s = x.abs().amax(-1, keepdim=True).clamp(min=1e-5) * (1 / 127)
            q = torch.round(x / s).clamp(-127, 127).to(torch.int8)
            outs.append(q.float() * s * (k + 1))
        return outs[0] + outs[1] + outs[2] + torch.exp(y) * torch.exp(y)
    cap = _check(fn, X, Y, tol=1e-6)
    ops = [u.op for u in cap.units]
    assert ops.count("amax") == 1 and ops.count("exp") == 1 and ops.count("round") == 1
    casts = [n for n in cap.gm.graph.nodes if n.op == "call_method" and n.target == "float"]
    assert len(casts) == 3 and len({n.args[0] for n in casts}) == 1   # three casts of one int8 value


def _mul_in_place(x: torch.Tensor, y: torch.Tensor) -> None:
    x.mul_(2)


def _mul_out(x: torch.Tensor, y: torch.Tensor) -> None:
    torch.mul(y, 2, out=x)


@pytest.mark.parametrize("change", [_mul_in_place, _mul_out])
def test_nothing_is_merged_in_a_graph_that_mutates_a_tensor(change: Callable[..., None]) -> None:
    def fn(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        a = torch.exp(x)
        change(x, y)      # the second exp reads the changed x: merged, it would return the first one's value
        return a + torch.exp(x) + y
    x = X.clone()
    cap = _capture(fn, (x, Y))
    assert [u.op for u in cap.units].count("exp") == 2


def test_nothing_is_merged_across_an_item_assignment() -> None:
    # ``x[0] = 1.0`` is ``operator.setitem`` in a graph (symbolic_trace cannot record it: built by hand)
    import operator

    g = torch.fx.Graph()
    x = g.placeholder("x")
    a = g.call_function(torch.exp, (x,))
    g.call_function(operator.setitem, (x, 0, 1.0))
    b = g.call_function(torch.exp, (x,))
    g.output(g.call_function(operator.add, (a, b)))
    cap = capture(torch.fx.GraphModule(torch.nn.Module(), g), [X.clone()])
    assert [u.op for u in cap.units].count("exp") == 2


def test_calls_differing_only_in_a_constant_are_not_merged() -> None:
    def fn(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return x * 2 + x * 2.0 + x.sum(0) + x.sum(1, keepdim=True) + y[0:2].sum() + y[1:3].sum()
    cap = _check(fn, X, Y)
    ops = [u.op for u in cap.units]
    assert ops.count("mul") == 2 and ops.count("sum") == 4


def test_two_returned_values_are_not_merged_into_one_tensor() -> None:
    # merged, the caller would get one tensor twice: changing one output in place would change the other
    def fn(x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return torch.exp(x), torch.exp(x).view(-1), torch.sin(y) + torch.sin(y)
    cap = _check(fn, X, Y)
    ops = [u.op for u in cap.units]
    assert ops.count("exp") == 2 and ops.count("sin") == 1
