"""The corpus: small PyTorch programs written the way users write them (``prism bench --corpus``).

Each program is a function or ``nn.Module`` with seeded weights and an input factory, in one of six
categories: GEMM + epilogue chains, row/column reductions, norms, losses, softmax-like, element-wise. They
use every spelling users write (``F.``, ``torch.``, ``Tensor.`` methods, ``nn.`` modules) and shapes where
eager PyTorch takes roughly 5-500 µs on 2 threads. Nothing in Prism looks at which program this is.

Tolerances (float32 result vs the float64 result of the same program on the same float32 inputs, relative
to the largest finite reference value; NaN/inf must sit at the same positions): ``TOL`` per category.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

TOL = {"gemm": 1e-4, "reduction": 1e-4, "norm": 1e-4, "loss": 1e-4, "softmax": 1e-4, "elementwise": 2e-5}


@dataclass(frozen=True)
class Program:
    name: str
    category: str
    make: Callable[[], tuple[Any, tuple]]   # -> (function or nn.Module, example inputs)
    note: str = ""

    @property
    def tol(self) -> float:
        return TOL[self.category]


def _t() -> Any:
    import torch
    return torch


def _gen(seed: int) -> Any:
    return _t().Generator().manual_seed(seed)


def _x(*shape: int, seed: int = 0, scale: float = 1.0) -> Any:
    return _t().randn(*shape, generator=_gen(seed)) * scale


def _lin(d_in: int, d_out: int, seed: int = 1, bias: bool = True) -> Any:
    torch = _t()
    torch.manual_seed(seed)
    return torch.nn.Linear(d_in, d_out, bias=bias)


def _seq(*mods: Any) -> Any:
    return _t().nn.Sequential(*mods)


ROWS, D = 64, 512


def _gemm(act: Callable[[], Any]) -> Callable[[], tuple[Any, tuple]]:
    return lambda: (_seq(_lin(D, D), act()), (_x(ROWS, D),))


def _fn(f: Callable[..., Any], *shapes: tuple[int, ...], scale: float = 1.0) -> Callable[[], tuple[Any, tuple]]:
    return lambda: (f, tuple(_x(*s, seed=k, scale=scale) for k, s in enumerate(shapes)))


def _weights(f: Callable[..., Any], *shapes: tuple[int, ...]) -> Callable[[], tuple[Any, tuple]]:
    """f(x, *weights): the first shape is the input, the others seeded parameters passed as inputs."""
    return lambda: (f, tuple(_x(*s, seed=k, scale=1.0 if k == 0 else 1 / math.sqrt(s[-1]))
                             for k, s in enumerate(shapes)))


class _SwiGLUChunk:
    """silu(a) * b of ``a, b = (x W^T).chunk(2, -1)``: the gated MLP written with one Linear and ``chunk``."""

    def __new__(cls) -> Any:
        torch = _t()

        class SwiGLU(torch.nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.w12 = _lin(D, 2 * 1024, 5, bias=False)

            def forward(self, x: Any) -> Any:
                a, b = self.w12(x).chunk(2, dim=-1)
                return torch.nn.functional.silu(a) * b
        return SwiGLU()


class _Gated:
    """silu(x W_g^T) * (x W_u^T): the gated MLP's first half."""

    def __new__(cls) -> Any:
        torch = _t()

        class Gated(torch.nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.g, self.u = _lin(D, 1024, 3, bias=False), _lin(D, 1024, 4, bias=False)

            def forward(self, x: Any) -> Any:
                return torch.nn.functional.silu(self.g(x)) * self.u(x)
        return Gated()


class _RMSNormHand:
    def __new__(cls) -> Any:
        torch = _t()

        class RMSNorm(torch.nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.weight = torch.nn.Parameter(torch.rand(D, generator=_gen(7)) + 0.5)

            def forward(self, x: Any) -> Any:
                return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * self.weight
        return RMSNorm()


class _LayerNormHand:
    """nanoGPT/minGPT-era layer norm written out: the mean, the biased variance, weight and bias."""

    def __new__(cls) -> Any:
        torch = _t()

        class LayerNorm(torch.nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.weight = torch.nn.Parameter(torch.rand(D, generator=_gen(8)) + 0.5)
                self.bias = torch.nn.Parameter(torch.rand(D, generator=_gen(9)) - 0.5)

            def forward(self, x: Any) -> Any:
                u = x.mean(-1, keepdim=True)
                s = (x - u).pow(2).mean(-1, keepdim=True)
                return self.weight * ((x - u) / torch.sqrt(s + 1e-5)) + self.bias
        return LayerNorm()


def _layer_norm_module() -> Any:
    torch = _t()
    m = torch.nn.LayerNorm(D)
    with torch.no_grad():
        m.weight.copy_(torch.rand(D, generator=_gen(5)) + 0.5)
        m.bias.copy_(torch.randn(D, generator=_gen(6)) * 0.1)
    return m


def _rmsnorm_module() -> Any:
    torch = _t()
    m = torch.nn.RMSNorm(D, eps=1e-6)
    with torch.no_grad():
        m.weight.copy_(torch.rand(D, generator=_gen(5)) + 0.5)
    return m


def _programs() -> list[Program]:
    torch = _t()
    F, nn = torch.nn.functional, torch.nn
    P = Program
    out = [
        # --- GEMM + epilogue chains ---
        P("linear_relu", "gemm", _gemm(nn.ReLU)),
        P("linear_gelu", "gemm", _gemm(nn.GELU)),
        P("linear_gelu_tanh", "gemm", _gemm(lambda: nn.GELU("tanh"))),
        P("linear_leaky_relu", "gemm", _gemm(lambda: nn.LeakyReLU(0.1))),
        P("linear_hardtanh", "gemm", _gemm(lambda: nn.Hardtanh(-2.0, 2.0))),
        P("linear_relu6", "gemm", _gemm(nn.ReLU6)),
        P("linear_hardswish", "gemm", _gemm(nn.Hardswish)),
        P("linear_hardsigmoid", "gemm", _gemm(nn.Hardsigmoid)),
        P("linear_elu", "gemm", _gemm(nn.ELU)),
        P("linear_selu", "gemm", _gemm(nn.SELU)),
        P("linear_mish", "gemm", _gemm(nn.Mish)),
        P("linear_softplus", "gemm", _gemm(nn.Softplus)),
        P("linear_sigmoid", "gemm", _gemm(nn.Sigmoid)),
        P("F_linear_tanh", "gemm", _weights(lambda x, w, b: torch.tanh(F.linear(x, w, b)), (ROWS, D), (D, D), (D,))),
        P("matmul_wT_scale_clamp", "gemm",
          _weights(lambda x, w, b: torch.clamp(x @ w.T * 0.125 + b, -1.0, 1.0), (ROWS, D), (D, D), (D,))),
        P("addmm_relu", "gemm", _weights(lambda x, w, b: torch.relu(torch.addmm(b, x, w)), (ROWS, D), (D, D), (D,))),
        P("linear_silu_scaled", "gemm", _weights(lambda x, w: F.silu(x @ w.T) * 0.5, (ROWS, D), (D, D))),
        P("mlp_gelu", "gemm", lambda: (_seq(_lin(D, 1024, 1), nn.GELU(), _lin(1024, D, 2)), (_x(ROWS, D),))),
        P("gated_silu", "gemm", lambda: (_Gated(), (_x(ROWS, D),))),
        P("swiglu_chunk", "gemm", lambda: (_SwiGLUChunk(), (_x(ROWS, D),))),
        P("linear_glu", "gemm", lambda: (_seq(_lin(D, 2 * D, 6), _t().nn.GLU()), (_x(ROWS, D),))),
        # --- row and column reductions ---
        P("row_sum", "reduction", _fn(lambda x: x.sum(-1), (256, 1024))),
        P("col_mean", "reduction", _fn(lambda x: x.mean(0), (256, 1024))),
        P("row_amax", "reduction", _fn(lambda x: x.amax(-1), (256, 1024))),
        P("row_amin", "reduction", _fn(lambda x: torch.amin(x, dim=-1, keepdim=True), (256, 1024))),
        P("row_max_values", "reduction", _fn(lambda x: torch.max(x, dim=-1).values, (256, 1024))),
        P("row_l2_norm", "reduction", _fn(lambda x: x.norm(dim=-1), (256, 1024))),
        P("row_logsumexp", "reduction", _fn(lambda x: torch.logsumexp(x, dim=-1), (256, 1024))),
        P("row_sum_squares", "reduction", _fn(lambda x: (x * x).sum(-1, keepdim=True), (256, 1024))),
        # --- norms ---
        P("layer_norm_module", "norm", lambda: (_layer_norm_module(), (_x(ROWS * 4, D),))),
        P("F_layer_norm", "norm", _weights(lambda x, w, b: F.layer_norm(x, (D,), w + 1, b), (ROWS * 4, D), (D,),
                                           (D,))),
        P("layer_norm_by_hand", "norm", lambda: (_LayerNormHand(), (_x(ROWS * 4, D),))),
        P("rms_norm_by_hand", "norm", lambda: (_RMSNormHand(), (_x(ROWS * 4, D),))),
        P("rms_norm_module", "norm", lambda: (_rmsnorm_module(), (_x(ROWS * 4, D),))),
        P("F_normalize", "norm", _fn(lambda x: F.normalize(x, dim=-1), (ROWS * 4, D))),
        P("cosine_similarity", "norm", _fn(lambda a, b: F.cosine_similarity(a, b, dim=-1), (ROWS * 4, D),
                                           (ROWS * 4, D))),
        P("linear_layer_norm_relu", "norm",
          lambda: (_seq(_lin(D, D), _layer_norm_module(), nn.ReLU()), (_x(ROWS, D),))),
        # --- losses (per row, and to a scalar) ---
        P("mse_loss", "loss", _fn(lambda a, b: F.mse_loss(a, b), (ROWS * 4, D), (ROWS * 4, D))),
        P("mse_rows", "loss", _fn(lambda a, b: ((a - b) ** 2).mean(-1), (ROWS * 4, D), (ROWS * 4, D))),
        P("hinge_rows", "loss", _fn(lambda s, y: torch.clamp(1 - y * s, min=0).mean(-1), (ROWS * 4, D),
                                    (ROWS * 4, D))),
        P("logistic_rows", "loss", _fn(lambda s, y: F.softplus(-y * s).mean(-1), (ROWS * 4, D), (ROWS * 4, D))),
        P("huber_rows", "loss", _fn(lambda a, b: torch.where((a - b).abs() < 1, 0.5 * (a - b) ** 2,
                                                             (a - b).abs() - 0.5).mean(-1),
                                    (ROWS * 4, D), (ROWS * 4, D))),
        P("kl_rows", "loss", _fn(lambda x, z: (F.softmax(x, -1) * (F.log_softmax(x, -1) - F.log_softmax(z, -1)))
                                 .sum(-1), (ROWS * 4, D), (ROWS * 4, D))),
        P("cross_entropy", "loss", lambda: (lambda x, w, t: F.cross_entropy(x @ w.T, t),
                                            (_x(ROWS * 2, D), _x(1000, D, seed=1, scale=1 / math.sqrt(D)),
                                             torch.randint(0, 1000, (ROWS * 2,), generator=_gen(2))))),
        # --- softmax, log_softmax, logsumexp ---
        P("softmax", "softmax", _fn(lambda x: x.softmax(-1), (ROWS * 4, D))),
        P("log_softmax", "softmax", _fn(lambda x: F.log_softmax(x, dim=-1), (ROWS * 4, D))),
        P("scaled_softmax", "softmax", _fn(lambda x: F.softmax(x / 8.0, dim=-1), (ROWS * 4, D))),
        P("masked_softmax", "softmax",
          _fn(lambda x: x.masked_fill(x < -2.0, float("-inf")).softmax(-1), (ROWS * 4, D))),
        P("linear_log_softmax", "softmax", _weights(lambda x, w: F.log_softmax(x @ w.T / 2.0, dim=-1),
                                                    (ROWS, D), (1024, D))),
        P("attention", "softmax",
          _fn(lambda q, k, v: torch.softmax(q @ k.transpose(-1, -2) / 8.0, -1) @ v, (4, 64, 64), (4, 128, 64),
              (4, 128, 64))),
        # one input read two ways (the search's x @ x.T case, docs/search.md)
        P("self_attention_scores", "softmax",
          _fn(lambda x: torch.softmax(x @ x.transpose(-1, -2) / 8.0, -1), (4, 128, 64))),
        P("gram_relu_rowsum", "gemm", _fn(lambda x: torch.relu(x @ x.T).sum(-1), (256, 128))),
        P("cosine_similarity_matrix", "norm",
          _fn(lambda a, b: F.normalize(a, dim=-1) @ F.normalize(b, dim=-1).T, (256, 64), (192, 64))),
        P("pairwise_sq_distances", "gemm",
          _fn(lambda a, b: (a * a).sum(-1, keepdim=True) - 2.0 * (a @ b.T) + (b * b).sum(-1)[None, :],
              (256, 64), (192, 64))),
        # --- element-wise ---
        P("log_abs", "elementwise", _fn(lambda x: torch.log(x.abs() + 1.0), (ROWS * 4, D))),
        P("erf_cdf", "elementwise", _fn(lambda x: 0.5 * (1 + torch.erf(x * 0.7071067811865476)), (ROWS * 4, D))),
        P("sin_cos", "elementwise", _fn(lambda x: torch.sin(x) * torch.cos(x * 0.5), (ROWS * 4, D), scale=3.0)),
        P("where_leaky", "elementwise", _fn(lambda x: torch.where(x > 0, x, 0.01 * x), (ROWS * 4, D))),
        P("clamp_bounds", "elementwise", _fn(lambda x: x.clamp(-0.5, 0.5) * 2.0, (ROWS * 4, D))),
        P("softsign", "elementwise", _fn(lambda x: F.softsign(x), (ROWS * 4, D))),
        P("logsigmoid", "elementwise", _fn(lambda x: F.logsigmoid(x), (ROWS * 4, D))),
    ]
    names = [p.name for p in out]
    assert len(names) == len(set(names)), "duplicate corpus program names"
    return out


def programs(filter: str | None = None) -> list[Program]:
    """The corpus (optionally only the programs whose name contains ``filter``)."""
    return [p for p in _programs() if not filter or filter in p.name]
