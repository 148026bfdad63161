"""``prism.quantize_weights``: int8 quantization of a model's Linear layers (weight-only, or W8A8).

Each ``nn.Linear`` becomes an :class:`Int8Linear` holding the weight as int8 ``[out, in]`` with one float
scale per output channel (symmetric, ``scale = max |w_row| / 127``), the layout torchao's int8 weight-only
config produces. Its forward scales after the product, ``F.linear(x, q.to(x.dtype)) * scale + bias`` (equal to
``F.linear(x, q * scale, bias)``): eager PyTorch runs it as written (a float copy of the weight per call), and
under ``prism.optimize`` or ``torch.compile(backend="prism")`` the cast, the product and the scale are one
Prism piece that reads the int8 weight as stored (converted in registers, accumulated in float32).

``group_size=G`` (weight-only): one scale per group of G consecutive input features of each output channel
(float16 ``[out, in / G]``; G = 32 is llama.cpp's ``q8_0`` weight format). The forward dequantizes the weight and
multiplies; under Prism the capture reads that as a sum of per-group products, one piece per Linear over the int8
weight as stored (float32 models; docs/frontend.md "int8 weights with group scales"). On llama-1b's seeded weights its
logits are 3.2e-2 from the float64 model's, the most accurate of the int8 forms (q8_0 4.5e-2).

``activations="int8"`` (W8A8: torchao's int8 dynamic activation, int8 weight; what llama.cpp's ``q8_0`` does
with its activations) makes each layer an :class:`Int8DynLinear`: each row of the input is quantized too, at
every call, symmetric with its own scale (``s_x = max |x_row| / 127``), and the product is of the two int8
tensors, exact in float32, then scaled by ``s_x * s_w``. Under Prism the row scale is one piece and the
quantizer with the product and its scales another, multiplying 64 int8 pairs per instruction with
``vpdpbusd`` where the machine has AVX512_VNNI. The quantizer and the product run in float32 whatever the
input's dtype (a bfloat16 model's layers return bfloat16). It is less accurate than weight-only (a row with one large
value quantizes the others coarsely: per-row scales, not llama.cpp's blocks of 32): on llama-1b's seeded weights its
logits are 8.2e-2 (relative RMS) from the float64 model's against int8w's 4.95e-2 and q8_0's 4.50e-2
(``benchmarks/quant_accuracy.py``, docs/bench.md "Accuracy of the int8 forms against q8_0").
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn
from torch.nn import functional as F

from prism.ir.dtypes import quantize_int8


class Int8Linear(nn.Module):
    """A Linear layer with int8 weights [out, in] and per-output-channel scales (float32 [out]), or with
    ``group_size`` G one scale per group of G consecutive input features of each output ([out, in / G], float16
    from ``from_linear``)."""

    def __init__(self, qweight: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None,
                 group_size: int | None = None) -> None:
        super().__init__()
        self.in_features, self.out_features = qweight.shape[1], qweight.shape[0]
        self.group_size = group_size
        self.register_buffer("qweight", qweight)
        self.register_buffer("scale", scale)
        self.bias = nn.Parameter(bias.detach().clone(), requires_grad=False) if bias is not None else None

    @classmethod
    def from_linear(cls, lin: nn.Linear, group_size: int | None = None) -> Int8Linear:
        """Group scales are stored as float16 (as llama.cpp's q8_0 stores its blocks': 2 bytes per G weights, a
        relative rounding of 2^-11 against the weights' own 2^-8), per-channel ones as float32."""
        q, scale = quantize_int8(lin.weight.detach().float().cpu().numpy(), group_size)
        if group_size:
            return cls(torch.from_numpy(q), torch.from_numpy(scale).to(torch.float16), lin.bias, group_size)
        return cls(torch.from_numpy(q), torch.from_numpy(scale.reshape(-1)), lin.bias)

    def dequantized(self) -> torch.Tensor:
        if self.group_size:
            n, k = self.qweight.shape
            return (self.qweight.float().view(n, -1, self.group_size) * self.scale.float()[:, :, None]).view(n, k)
        return self.qweight.float() * self.scale[:, None]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.group_size:
            # the weight dequantized per group, then the product: eager PyTorch makes one float copy of the weight
            # per call (as the per-channel form's cast); under Prism the capture reads the pattern as a sum of
            # per-group products (capture._fuse_grouped_linear) that one piece computes from the int8 weight as
            # stored, each group's dot product scaled in registers (codegen: matmul.emit_grouped)
            n, k = self.qweight.shape
            s = self.scale if self.scale.dtype == x.dtype else self.scale.to(x.dtype)
            w = (self.qweight.view(n, k // self.group_size, self.group_size).to(x.dtype) * s.unsqueeze(-1)).view(n, k)
            return F.linear(x, w, self.bias)
        # the per-channel scale after the product: (x @ q^T) * s = x @ (q * s[:, None])^T, one multiply per
        # output instead of one per weight (the form Prism's search fuses: the int8 weight is read as stored).
        # The scale is stored in the shape the product needs and cast only when x's dtype differs (decided
        # at capture): a `.to` and a `.reshape` per layer and call were two PyTorch operators per Linear
        # outside Prism's pieces (112 per decode step of llama-1b)
        s = self.scale if self.scale.dtype == x.dtype else self.scale.to(x.dtype)
        y = F.linear(x, self.qweight.to(x.dtype)) * s
        return y + self.bias if self.bias is not None else y

    def extra_repr(self) -> str:
        g = f", groups of {self.group_size}" if self.group_size else ""
        return f"in_features={self.in_features}, out_features={self.out_features}, int8 weight-only{g}"


ACT_SCALE_FLOOR = 1e-5   # of max |x_row|: a row of zeros (or nearly) quantizes against this


class Int8DynLinear(Int8Linear):
    """W8A8: an :class:`Int8Linear` whose input rows are quantized to int8 at each call (per-row symmetric
    scales; dynamic, as torchao's int8 dynamic-activation int8-weight layout), multiplied as int8 x int8."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # written as the program Prism captures (tests/cpu/test_low_precision.py): the row scale (a zero row
        # gets the floor's scale, so it quantizes to zeros), the quantizer -- round half to even, saturating,
        # .to(int8) -- and the product of the two int8 tensors cast to float, which the search takes as an
        # int8 x int8 matmul (exact: every product and sum of up to 2^10 of them fits float32's 24 bits in the
        # chunks the kernels sum in int32)
        # In float32 whatever x's dtype (a bfloat16 model): eager bfloat16 would round x / s to 8 significant bits
        # before rounding to an integer -- a step off for many values -- and Prism computes element-wise operators
        # in float32, so the search's checks rejected every implementation of the bfloat16 form (its pieces ran in
        # PyTorch). For float32 x the casts are no-ops.
        xf = x.float()
        sx = xf.abs().amax(-1, keepdim=True).clamp(min=ACT_SCALE_FLOOR) * (1 / 127)
        xq = torch.round(xf / sx).clamp(-127, 127).to(torch.int8)
        y = ((xq.float() @ self.qweight.float().t()) * sx * self.scale.float()).to(x.dtype)
        return y + self.bias if self.bias is not None else y

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, int8 weights and activations"


ACTIVATIONS = (None, "int8")


def quantize_weights(model: nn.Module, dtype: str = "int8",
                     include: Callable[[str, nn.Linear], bool] | None = None,
                     activations: str | None = None, group_size: int | None = None) -> nn.Module:
    """Replace the ``nn.Linear`` layers of ``model`` (in place; returned) by :class:`Int8Linear`
    (int8 weight-only), or with ``activations="int8"`` by :class:`Int8DynLinear` (W8A8: each input row is
    quantized to int8 at every call too).

    ``include(name, layer)`` chooses the layers (default: every Linear). Returns ``model``. Quantization is
    per output channel (per input row for activations) and symmetric; the float weights are dropped.
    ``group_size`` G (weight-only): one scale per group of G consecutive input features of each output channel
    instead (llama.cpp's q8_0 takes 32; every layer's input features must be a multiple of G). Under Prism a
    float32 model's grouped layers each run as one piece over the int8 weight (docs/frontend.md, "int8 weights
    with group scales")."""
    if dtype != "int8":
        raise ValueError(f"quantize_weights: dtype {dtype!r} is not supported (int8 weights)")
    if activations not in ACTIVATIONS:
        raise ValueError(f"quantize_weights: activations={activations!r} is not supported: None (weight-only) or "
                         "'int8' (W8A8, dynamic per-row activation scales)")
    if group_size is not None:
        if activations is not None:
            raise ValueError("quantize_weights: group_size is for int8 weight-only layers; W8A8 (activations='int8') "
                             "has per-channel weight scales only: pass group_size=None")
        if not isinstance(group_size, int) or group_size < 1:
            raise ValueError(f"quantize_weights: group_size must be a positive int, got {group_size!r}")
    layer = Int8DynLinear if activations == "int8" else Int8Linear
    targets: list[tuple[nn.Module, str, nn.Linear]] = []
    for name, mod in model.named_modules():
        for child_name, child in mod.named_children():
            full = f"{name}.{child_name}" if name else child_name
            if isinstance(child, nn.Linear) and (include is None or include(full, child)):
                targets.append((mod, child_name, child))
    if group_size is not None:
        bad = [f"{lin.in_features}" for _, _, lin in targets if lin.in_features % group_size]
        if bad:
            raise ValueError(f"quantize_weights: group_size {group_size} does not divide the input features of "
                             f"{len(bad)} layer(s) (e.g. {bad[0]}); choose a divisor or leave those layers out "
                             "with include=")
    for parent, child_name, lin in targets:
        setattr(parent, child_name, layer.from_linear(lin, group_size))
    return model

