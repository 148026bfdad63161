"""A Llama-style decoder layer in plain PyTorch, one decode step over a KV cache.

RMSNorm with weight (written out), Q/K/V projections, rotary embeddings (``rotate_half``), grouped-query
attention (``F.scaled_dot_product_attention(..., enable_gqa=True)``) over the cache concatenated with the
new keys and values, output projection, SwiGLU MLP, residuals. Small default sizes keep tests fast.

This file follows the ``prism optimize FILE.py`` convention: it defines ``model`` and
``example_inputs`` (and ``dynamic``: the batch dims).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def rotary(seq: int, head_dim: int, start: int = 0, base: float = 10000.0) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin tables [seq, head_dim] for positions start .. start + seq - 1."""
    inv = 1.0 / base ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
    ang = torch.arange(start, start + seq, dtype=torch.float32)[:, None] * inv[None, :]
    ang = torch.cat((ang, ang), dim=-1)
    return ang.cos(), ang.sin()


class DecoderLayer(nn.Module):
    def __init__(self, hidden: int = 256, heads: int = 8, kv_heads: int = 2, head_dim: int = 32, mlp: int = 512,
                 eps: float = 1e-6) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, head_dim
        self.input_norm = RMSNorm(hidden, eps)
        self.q_proj = nn.Linear(hidden, heads * head_dim, bias=False)
        self.k_proj = nn.Linear(hidden, kv_heads * head_dim, bias=False)
        self.v_proj = nn.Linear(hidden, kv_heads * head_dim, bias=False)
        self.o_proj = nn.Linear(heads * head_dim, hidden, bias=False)
        self.post_norm = RMSNorm(hidden, eps)
        self.gate = nn.Linear(hidden, mlp, bias=False)
        self.up = nn.Linear(hidden, mlp, bias=False)
        self.down = nn.Linear(mlp, hidden, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, k_cache: torch.Tensor,
                v_cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        b, s, _ = x.shape
        h = self.input_norm(x)
        q = self.q_proj(h).view(b, s, self.heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(h).view(b, s, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(h).view(b, s, self.kv_heads, self.head_dim).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        k = torch.cat((k_cache, k), dim=2)
        v = torch.cat((v_cache, v), dim=2)
        a = F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
        a = a.transpose(1, 2).reshape(b, s, self.heads * self.head_dim)
        x = x + self.o_proj(a)
        h = self.post_norm(x)
        x = x + self.down(F.silu(self.gate(h)) * self.up(h))
        return x, k, v


def make_inputs(layer: DecoderLayer, batch: int, cache: int = 48, seed: int = 0) -> tuple[torch.Tensor, ...]:
    """(x, cos, sin, k_cache, v_cache) for one decode step at position ``cache``."""
    g = torch.Generator().manual_seed(seed)
    hidden = layer.q_proj.in_features
    x = torch.randn(batch, 1, hidden, generator=g)
    cos, sin = rotary(1, layer.head_dim, start=cache)
    kc = torch.randn(batch, layer.kv_heads, cache, layer.head_dim, generator=g)
    vc = torch.randn(batch, layer.kv_heads, cache, layer.head_dim, generator=g)
    return x, cos, sin, kc, vc


def make_layer(seed: int = 0, **sizes: int) -> DecoderLayer:
    with torch.random.fork_rng():  # deterministic weights without touching the caller's RNG state
        torch.manual_seed(seed)
        layer = DecoderLayer(**sizes).eval()
        with torch.no_grad():  # non-trivial norm weights, so that a dropped weight multiply would show
            for norm in (layer.input_norm, layer.post_norm):
                norm.weight.uniform_(0.5, 1.5)
    return layer


# the `prism optimize FILE.py` convention
model = make_layer()
example_inputs = make_inputs(model, batch=3)
dynamic = {0: [0], 3: [0], 4: [0]}   # batch dims of x, k_cache and v_cache
