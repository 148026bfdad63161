"""W1-W7 as a PyTorch user writes them (WORKLOADS.md notation), plus the SDPA forms of W4-W6.

Kept literal on purpose: PyTorch eager runs exactly these, and ``torch.compile`` compiles these same
functions. Arguments come in the order of the workload's inputs.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F

EPS = 1e-6
GQA_GROUP = 4  # W6: query head j uses KV head j // 4


def rms_norm(x: torch.Tensor) -> torch.Tensor:
    return x / torch.sqrt(torch.mean(x * x, -1, keepdim=True) + EPS)


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    return torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1]), dim=-1) @ v


def w1(X: torch.Tensor, W: torch.Tensor) -> torch.Tensor:
    return rms_norm(X) @ W


def w2(X: torch.Tensor, Wu: torch.Tensor, Wg: torch.Tensor) -> torch.Tensor:
    xn = rms_norm(X)
    return (xn @ Wu) * (xn @ Wg)


def w3(X: torch.Tensor, Wg: torch.Tensor, Wu: torch.Tensor) -> torch.Tensor:
    return F.silu(X @ Wg) * (X @ Wu)


def w4(Q: torch.Tensor, K: torch.Tensor, V: torch.Tensor) -> torch.Tensor:
    return attention(Q, K, V)


def w5(Q: torch.Tensor, K: torch.Tensor, V: torch.Tensor) -> torch.Tensor:
    return attention(rms_norm(Q), rms_norm(K), V)


def w6(Q: torch.Tensor, K: torch.Tensor, V: torch.Tensor) -> torch.Tensor:
    # what a user writes without SDPA: copy every KV head for the query heads that share it
    return attention(Q, K.repeat_interleave(GQA_GROUP, dim=1), V.repeat_interleave(GQA_GROUP, dim=1))


def w7(X: torch.Tensor, W: torch.Tensor, A: torch.Tensor, B: torch.Tensor) -> torch.Tensor:
    return X @ W + (X @ A) @ B


def w4_sdpa(Q: torch.Tensor, K: torch.Tensor, V: torch.Tensor) -> torch.Tensor:
    return F.scaled_dot_product_attention(Q, K, V)


def w5_sdpa(Q: torch.Tensor, K: torch.Tensor, V: torch.Tensor) -> torch.Tensor:
    return F.scaled_dot_product_attention(rms_norm(Q), rms_norm(K), V)


def w6_sdpa(Q: torch.Tensor, K: torch.Tensor, V: torch.Tensor) -> torch.Tensor:
    return F.scaled_dot_product_attention(Q, K, V, enable_gqa=True)


PROGRAMS: dict[str, Callable[..., torch.Tensor]] = {"W1": w1, "W2": w2, "W3": w3, "W4": w4, "W5": w5, "W6": w6,
                                                    "W7": w7}
INT8MM = {k: PROGRAMS[k] for k in ("W1", "W2", "W3", "W7")}


class _Int8Weight:
    """An int8 weight [out, in] with its per-channel scale, standing where the float weight [in, out] is:
    ``x @ w`` dequantizes it (the plain PyTorch user's way) or calls ``torch._weight_int8pack_mm``."""

    def __init__(self, q: torch.Tensor, s: torch.Tensor, packed: bool) -> None:
        self.q, self.s, self.packed = q, s, packed
        self.s1 = s.reshape(-1).contiguous()

    def __rmatmul__(self, x: torch.Tensor) -> torch.Tensor:
        if self.packed:
            return torch._weight_int8pack_mm(x.reshape(-1, x.shape[-1]), self.q, self.s1).reshape(
                *x.shape[:-1], self.q.shape[0])
        return x @ (self.q.to(x.dtype) * self.s).t()   # (a bfloat16 model's weight in bfloat16, as a user would)


def int8_weight_only(fn: Callable[..., torch.Tensor], names: Sequence[str],
                     packed: bool) -> Callable[..., torch.Tensor]:
    """``fn`` of the float32 workload called with its int8 weights. The arguments arrive in the order of
    ``names``, the int8w workload's inputs (prism.workloads.precision): a quantized weight ``W`` has its scale
    ``W + SCALE`` among them; every other name is an argument of ``fn`` as it is."""
    from prism.workloads.precision import SCALE
    where = {n: i for i, n in enumerate(names)}
    plan = [(i, where.get(n + SCALE)) for i, n in enumerate(names)
            if not (n.endswith(SCALE) and n[:-len(SCALE)] in where)]

    def run(*args: torch.Tensor) -> torch.Tensor:
        return fn(*(args[i] if s is None else _Int8Weight(args[i], args[s], packed) for i, s in plan))
    return run

SDPA: dict[str, Callable[..., torch.Tensor]] = {"W4": w4_sdpa, "W5": w5_sdpa, "W6": w6_sdpa}
