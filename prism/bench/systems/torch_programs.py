"""W1-W7 as a PyTorch user writes them (WORKLOADS.md notation), plus the SDPA forms of W4-W6.

Kept literal on purpose: PyTorch eager runs exactly these, and ``torch.compile`` compiles these same
functions. Arguments come in the order of the workload's inputs.
"""

from __future__ import annotations

import math
from collections.abc import Callable

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
SDPA: dict[str, Callable[..., torch.Tensor]] = {"W4": w4_sdpa, "W5": w5_sdpa, "W6": w6_sdpa}
