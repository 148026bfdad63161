"""Accuracy of Prism's int8 forms against llama.cpp's ``q8_0`` on the same weights, against float64.

Prism's int8 forms (``prism.quantize_weights``): **int8w**, int8 weights with one scale per output channel, float
activations; **int8w-g32**, int8 weights with one scale per group of 32 input features (q8_0's weights), float
activations; **w8a8**, the per-channel weights with each input row quantized to int8 at every call (one scale per
row).
llama.cpp's **q8_0** quantizes weights and activations in blocks of 32 values along the contraction, each block
with its own float16 scale (``quantize_row_q8_0``: ``d = max|x| / 127``, ``q = roundf(x / d)``; the dot product
sums each block's integer products and scales them by both blocks' ``d``). Emulated here in float64 on the
seeded weights of a ``prism bench --models`` config (ggml sums the scaled blocks in float32: its rounding is
below every error shown).

Two measures, each against the float64 model:

* **per layer**: the inputs that the float64 model feeds each Linear of one decoder layer and the LM head over
  a prompt, through each form's product: relative RMS error ``||y - ref|| / ||ref||`` and relative max error
  ``max |y - ref| / max |ref|``; and the same inputs with outlier channels (1 % of the channels times 30, as
  trained LLMs' activations have and these random-weight models do not), where one scale per row is coarse;
* **end to end**: the logits of the whole model over the prompt with every Linear in that form (the LM head
  too, as llama.cpp's q8_0 files): relative RMS error and the share of positions whose top token is the float64
  model's.

    python benchmarks/quant_accuracy.py llama-1b --prompt 128

Needs ``transformers`` (``pip install -e '.[models]'``); runs on the CPU in a few minutes (the float64 model of
llama-1b takes 3.5 GB).
"""

from __future__ import annotations

import argparse
import copy
import json
from collections.abc import Callable

import torch
from torch import nn

from prism.bench.models import MODELS, build, prompt_ids
from prism.frontend.quantize import Int8DynLinear, Int8Linear

BLOCK = 32   # q8_0's block of the contraction
FORMS = ("int8w", "int8w-g32", "w8a8", "q8_0")


def _q8_0(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """q8_0 blocks of the last dim of ``t``, float64: (integer values [..., B, 32], float16-rounded scales [..., B])."""
    b = t.reshape(*t.shape[:-1], t.shape[-1] // BLOCK, BLOCK).float()
    d = b.abs().amax(-1) / 127
    inv = torch.where(d > 0, 1 / d, torch.zeros_like(d))
    x = b * inv[..., None]
    q = torch.sign(x) * torch.floor(x.abs() + 0.5)   # roundf: half away from zero
    return q.double(), d.half().double()


def q8_0_linear(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """``x @ w.T`` as llama.cpp's q8_0 x q8_0 dot product computes it (in float64)."""
    lead = x.shape[:-1]
    xq, xd = _q8_0(x.reshape(-1, x.shape[-1]))
    wq, wd = _q8_0(w)
    y = torch.zeros(xq.shape[0], wq.shape[0], dtype=torch.float64)
    for b in range(xq.shape[1]):
        y += (xq[:, b] @ wq[:, b].T) * xd[:, b, None] * wd[None, :, b]
    return y.reshape(*lead, w.shape[0])


def int8w_linear(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    lin = Int8Linear.from_linear(_linear(w))
    return x.double() @ lin.dequantized().double().T


def int8w_g32_linear(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    lin = Int8Linear.from_linear(_linear(w), BLOCK)
    return x.double() @ lin.dequantized().double().T


def w8a8_linear(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    lin = Int8DynLinear.from_linear(_linear(w))
    with torch.no_grad():
        return lin(x.float()).double()


def _linear(w: torch.Tensor) -> nn.Linear:
    lin = nn.Linear(w.shape[1], w.shape[0], bias=False)
    lin.weight.data = w.float()
    return lin


PRODUCTS: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "int8w": int8w_linear, "int8w-g32": int8w_g32_linear, "w8a8": w8a8_linear, "q8_0": q8_0_linear}


class FormLinear(nn.Module):
    """A Linear computed in one of FORMS (float64 out; the model runs in float64 around it)."""

    def __init__(self, lin: nn.Linear, form: str) -> None:
        super().__init__()
        self.w, self.bias, self.form = lin.weight.detach().float(), lin.bias, form

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = PRODUCTS[self.form](x, self.w).to(x.dtype)
        return y + self.bias if self.bias is not None else y


def _errors(y: torch.Tensor, ref: torch.Tensor) -> dict[str, float]:
    d = (y.double() - ref).flatten()
    return {"rms": float(d.norm() / ref.norm()), "max": float(d.abs().max() / ref.abs().max())}


def _with_outliers(x: torch.Tensor, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    ch = torch.randperm(x.shape[-1], generator=g)[: max(1, x.shape[-1] // 100)]
    x = x.clone()
    x[..., ch] *= 30
    return x


def per_layer(model: nn.Module, ids: torch.Tensor, layer: int) -> dict[str, dict[str, dict[str, float]]]:
    """Each Linear of decoder layer ``layer`` and the LM head on the inputs the float64 model gives it."""
    inputs: dict[str, torch.Tensor] = {}
    hooks = []
    names = {n: m for n, m in model.named_modules() if isinstance(m, nn.Linear)
             and (n.startswith(f"model.layers.{layer}.") or n == "lm_head")}
    for n, m in names.items():
        hooks.append(m.register_forward_hook(lambda mod, a, out, n=n: inputs.__setitem__(n, a[0].detach())))
    with torch.no_grad():
        model(ids)
    for h in hooks:
        h.remove()
    out: dict[str, dict[str, dict[str, float]]] = {}
    for n, m in names.items():
        w = m.weight.detach()
        for tag, x in (("", inputs[n]), (" outliers", _with_outliers(inputs[n]))):
            ref = x.double() @ w.double().T
            out[n.removeprefix("model.") + tag] = {f: _errors(PRODUCTS[f](x, w), ref) for f in FORMS}
    return out


def end_to_end(model: nn.Module, ids: torch.Tensor) -> dict[str, dict[str, float]]:
    with torch.no_grad():
        ref = model(ids).logits.double()
    out = {}
    for form in FORMS:
        m = copy.deepcopy(model)
        targets = [(p, c, lin) for _, p in m.named_modules() for c, lin in p.named_children()
                   if isinstance(lin, nn.Linear)]
        for parent, child, lin in targets:
            setattr(parent, child, FormLinear(lin, form))
        with torch.no_grad():
            got = m(ids).logits.double()
        out[form] = {**_errors(got, ref), "top1": float((got.argmax(-1) == ref.argmax(-1)).double().mean())}
        del m
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", choices=sorted(MODELS))
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--layer", type=int, default=0, help="the decoder layer measured per Linear (default 0)")
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args()
    spec = MODELS[args.model]
    model = build(spec, dtype="float32", from_checkpoint=False).double()
    ids = prompt_ids(spec, args.prompt)
    layers = per_layer(model, ids, args.layer)
    e2e = end_to_end(model, ids)
    print(f"{args.model}, {args.prompt}-token prompt, against the float64 model; relative RMS / max error")
    print(f"{'Linear':32s}" + "".join(f"{f:>22s}" for f in FORMS))
    for n, r in layers.items():
        print(f"{n:32s}" + "".join(f"{r[f]['rms']:10.2e} / {r[f]['max']:8.2e}  " for f in FORMS))
    print(f"{'logits (every Linear)':32s}" + "".join(f"{e2e[f]['rms']:10.2e} / {e2e[f]['max']:8.2e}  " for f in FORMS))
    print(f"{'top token = float64 model':32s}" + "".join(f"{e2e[f]['top1']:21.1%} " for f in FORMS))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"model": args.model, "prompt": args.prompt, "layer": args.layer, "per_layer": layers,
                       "end_to_end": e2e}, fh, indent=1)


if __name__ == "__main__":
    main()
