"""Minimal DRAM traffic and arithmetic of a program, and the roofline bound derived from them.

Conventions (documented in docs/bench.md):
- bytes: every program input read once and every output written once, at its dtype's size; no
  intermediate ever reaches DRAM. It is the traffic of a perfectly fused kernel.
- flops: 2 per multiply-accumulate of a matmul; 1 per output element of each element-wise op
  (transcendentals such as exp or sigmoid count 1); 1 per input element of a reduction; the composites
  as their expansion: rms_norm 3 per element (square, sum, divide), layer_norm 6 (sum, subtract,
  square, sum, subtract again, multiply), softmax 5 (max, subtract, exp, sum, divide). Layout ops
  (permute, reshape, concat, split) are free.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from prism.errors import UnsupportedError
from prism.ir import dims as D
from prism.ir.graph import Graph
from prism.ir.node import Node

COMPOSITE_FLOPS = {"rms_norm": 3, "layer_norm": 6, "softmax": 5, "rotate_half": 1}  # rotate_half: the negation
FREE = frozenset({"input", "output", "permute", "reshape", "concat", "split"})


@dataclass(frozen=True)
class Cost:
    bytes: int
    flops: int


def _numel(shape: tuple, env: Mapping[str, int]) -> int:
    return math.prod(int(D.evaluate(d, env)) if isinstance(d, D.Dim) else int(d) for d in shape)


def _node_flops(n: Node, env: Mapping[str, int]) -> int:
    if n.op in FREE:
        return 0
    if n.op == "matmul":
        k = n.src[0].shape[-1]
        return 2 * _numel(n.shape, env) * _numel((k,), env)
    from prism.ir.ops import OPS
    if n.op in OPS and OPS[n.op].group == "reduction":
        return _numel(n.src[0].shape, env)
    if n.op in COMPOSITE_FLOPS:
        return COMPOSITE_FLOPS[n.op] * _numel(n.shape, env)
    if n.op in OPS and OPS[n.op].elementwise:
        return _numel(n.shape, env)
    raise UnsupportedError(f"no flop count for operator {n.op!r} (bench accounting covers the predefined "
                           "operators of a program; customized operators have no single count)")


def program_cost(g: Graph, env: Mapping[str, int] | None = None) -> Cost:
    """Bytes and flops of the program ``g`` with its symbolic dims bound by ``env``."""
    env = dict(env or {})
    nbytes = sum(_numel(n.shape, env) * n.dtype.itemsize for n in g.inputs.values())
    nbytes += sum(_numel(n.shape, env) * n.dtype.itemsize for n in g.outputs)
    return Cost(nbytes, sum(_node_flops(n, env) for n in g.nodes))


def roofline_seconds(cost: Cost, bandwidth: float, peak_flops: float) -> float:
    """The physical lower bound max(bytes / bandwidth, flops / peak) in seconds."""
    if bandwidth <= 0 or peak_flops <= 0:
        raise ValueError(f"bandwidth and peak must be positive, got {bandwidth} B/s and {peak_flops} FLOP/s")
    return max(cost.bytes / bandwidth, cost.flops / peak_flops)
