"""``prism.quantize_weights``: int8 weight-only quantization of a model's Linear layers.

Each ``nn.Linear`` becomes an :class:`Int8Linear` holding the weight as int8 ``[out, in]`` with one float
scale per output channel (symmetric, ``scale = max |w_row| / 127``), the layout torchao's int8 weight-only
config produces. Its forward scales after the product, ``F.linear(x, q.to(x.dtype)) * scale + bias`` (equal to
``F.linear(x, q * scale, bias)``): eager PyTorch runs it as written (a float copy of the weight per call), and
under ``prism.optimize`` or ``torch.compile(backend="prism")`` the cast, the product and the scale are one
Prism piece that reads the int8 weight as stored (converted in registers, accumulated in float32).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn
from torch.nn import functional as F

from prism.ir.dtypes import quantize_int8


class Int8Linear(nn.Module):
    """A Linear layer with int8 weights [out, in] and per-output-channel scales (float32 [out])."""

    def __init__(self, qweight: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None) -> None:
        super().__init__()
        self.in_features, self.out_features = qweight.shape[1], qweight.shape[0]
        self.register_buffer("qweight", qweight)
        self.register_buffer("scale", scale)
        self.bias = nn.Parameter(bias.detach().clone(), requires_grad=False) if bias is not None else None

    @classmethod
    def from_linear(cls, lin: nn.Linear) -> Int8Linear:
        q, scale = quantize_int8(lin.weight.detach().float().cpu().numpy())
        return cls(torch.from_numpy(q), torch.from_numpy(scale.reshape(-1)), lin.bias)

    def dequantized(self) -> torch.Tensor:
        return self.qweight.float() * self.scale[:, None]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # the per-channel scale after the product: (x @ q^T) * s = x @ (q * s[:, None])^T, one multiply per
        # output instead of one per weight (the form Prism's search fuses: the int8 weight is read as stored).
        # The scale is stored in the shape the product needs and cast only when x's dtype differs (decided
        # at capture): a `.to` and a `.reshape` per layer and call were two PyTorch operators per Linear
        # outside Prism's pieces (112 per decode step of llama-1b)
        s = self.scale if self.scale.dtype == x.dtype else self.scale.to(x.dtype)
        y = F.linear(x, self.qweight.to(x.dtype)) * s
        return y + self.bias if self.bias is not None else y

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, int8 weight-only"


def quantize_weights(model: nn.Module, dtype: str = "int8",
                     include: Callable[[str, nn.Linear], bool] | None = None) -> nn.Module:
    """Replace the ``nn.Linear`` layers of ``model`` (in place; returned) by :class:`Int8Linear`.

    ``include(name, layer)`` chooses the layers (default: every Linear). Returns ``model``. Quantization is
    per output channel and symmetric; the float weights are dropped."""
    if dtype != "int8":
        raise ValueError(f"quantize_weights: dtype {dtype!r} is not supported (int8 weight-only)")
    targets: list[tuple[nn.Module, str, nn.Linear]] = []
    for name, mod in model.named_modules():
        for child_name, child in mod.named_children():
            full = f"{name}.{child_name}" if name else child_name
            if isinstance(child, nn.Linear) and (include is None or include(full, child)):
                targets.append((mod, child_name, child))
    for parent, child_name, lin in targets:
        setattr(parent, child_name, Int8Linear.from_linear(lin))
    return model

