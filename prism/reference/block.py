"""Literal simulation of a concrete block graph: loop over blocks, loop over iterations, slice tiles
per imap/fmap, update accumulators (online softmax exactly as a kernel would), save per omap/fmap.

This is deliberately slow and obvious: it is the ground truth that generated code and the verifier are
tested against. Semantics are documented in ``prism.ir.block``.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import numpy as np

from prism.errors import GraphError, InputError
from prism.ir.block import BlockGraph, MapEntry
from prism.ir.dims import format_shape
from prism.ir.dtypes import working_np
from prism.ir.node import Node
from prism.reference.numpy_ops import apply


def _region(shape: Sequence[int], tile: Sequence[int], grid: Sequence[int], F: int, pmap: Sequence[MapEntry],
            fmap: MapEntry, b: Sequence[int], i: int) -> tuple[slice, ...]:
    """The slice of a tensor of ``shape`` seen by block ``b`` in iteration ``i`` (chunk order: grid dims
    that split the data dim, lower grid dim outermost, then the for-loop innermost)."""
    out = []
    for d in range(len(shape)):
        idx = 0
        for p, e in enumerate(pmap):
            if e == d:
                idx = idx * grid[p] + b[p]
        if fmap == d:
            idx = idx * F + i
        out.append(slice(idx * tile[d], (idx + 1) * tile[d]))
    return tuple(out)


class _Acc:
    """State of one accumulator inside one block."""

    def __init__(self, node: Node, F: int, dtype: np.dtype) -> None:
        self.kind, self.params = node.arg
        self.node, self.F, self.dt = node, F, dtype
        self.s: np.ndarray | None = None
        self.m: np.ndarray | None = None
        self.count = 0

    def update(self, xs: Sequence[np.ndarray]) -> None:
        x = xs[0]
        k = self.kind
        if k == "sum":
            self.s = x.copy() if self.s is None else self.s + x
        elif k == "sum_last":
            v = np.sum(x, axis=-1, keepdims=True)
            self.s = v if self.s is None else self.s + v
        elif k == "rms":
            v = np.sum(x * x, axis=-1, keepdims=True)
            self.s = v if self.s is None else self.s + v
            self.count += x.shape[-1]
        elif k == "max":
            v = np.max(x, axis=-1, keepdims=True)
            self.s = v if self.s is None else np.maximum(self.s, v)
        elif k in ("softmax_sum", "softmax_matmul"):
            rowmax = np.max(x, axis=-1, keepdims=True)
            m_new = rowmax if self.m is None else np.maximum(self.m, rowmax)
            p = np.exp(x - m_new)
            contrib = np.sum(p, axis=-1, keepdims=True) if k == "softmax_sum" else np.matmul(p, xs[1])
            if self.s is None:
                self.s = contrib
            else:
                scale = np.exp(self.m - m_new)  # rescale what was accumulated against the old max
                self.s = self.s * scale + contrib
            self.m = m_new
        else:  # pragma: no cover - the builder rejects unknown kinds
            raise GraphError(f"unknown accumulator {k}")

    def final(self) -> np.ndarray:
        if self.s is None:
            raise GraphError(f"accumulator {self.kind} never received a value (for-loop range 0?)")
        if self.kind == "rms":
            (eps,) = self.params
            return np.sqrt(self.s / self.dt.type(self.count) + self.dt.type(eps)).astype(self.dt)
        return self.s.astype(self.dt, copy=False)


def simulate(bg: BlockGraph, inputs: Sequence[np.ndarray], dtype: np.dtype | None = None) -> list[np.ndarray]:
    """Run a concrete block graph on ``inputs`` (one array per block-graph input)."""
    if not bg.is_concrete():
        raise GraphError(f"cannot simulate a block graph with free symbols {sorted(bg.symbols())}; "
                         "instantiate it first (bg.instantiate({...}))")
    if len(inputs) != len(bg.inputs):
        raise InputError(f"block graph takes {len(bg.inputs)} inputs, got {len(inputs)}")
    arrays = []
    for k, (a, spec) in enumerate(zip(inputs, bg.inputs)):
        a = np.asarray(a)
        if tuple(a.shape) != tuple(spec.shape):
            raise InputError(f"block graph input {k} ({spec.name}): expected shape {format_shape(spec.shape)}, "
                             f"got {a.shape}")
        arrays.append(a.astype(dtype or working_np(spec.dtype), copy=False))
    dt = np.dtype(dtype or working_np(bg.inputs[0].dtype))  # intermediates and results: the working type
    grid = [int(g) for g in bg.grid]
    F = int(bg.forloop)
    nodes = bg.nodes
    phase = bg.phase
    inv = [n for n in nodes if phase[n] == "inv" and n.op != "save"]
    loop = [n for n in nodes if phase[n] == "loop" and n.op != "save"]
    post = [n for n in nodes if phase[n] == "post" and n.op not in ("acc", "save")]
    accs = [n for n in nodes if n.op == "acc"]
    outs = [np.zeros(tuple(int(d) for d in s), dtype=dt) for s in bg.output_shapes]

    def run(n: Node, vals: dict, b: tuple[int, ...], i: int) -> np.ndarray:
        if n.op == "iter":
            idx, im, fm = n.arg
            sl = _region(arrays[idx].shape, [int(t) for t in n.shape], grid, F, im, fm, b, i)
            return arrays[idx][sl]
        return apply(n.op, [vals[s] for s in n.src], n.arg)

    def store(n: Node, tile: np.ndarray, b: tuple[int, ...], i: int) -> None:
        k, om, fm = n.arg
        sl = _region(outs[k].shape, [int(t) for t in n.shape], grid, F, om, fm, b, i)
        if tile.shape != outs[k][sl].shape:  # broadcast tiles are not allowed to be saved
            raise GraphError(f"save {k}: tile {tile.shape} does not fill its region {outs[k][sl].shape}")
        outs[k][sl] += tile  # zero-initialized: a concatenation writes each region once, partial sums add

    for b in itertools.product(*(range(g) for g in grid)):
        vals: dict[Node, np.ndarray] = {}
        for n in inv:
            vals[n] = run(n, vals, b, 0)
        states = {n: _Acc(n, F, dt) for n in accs}
        for i in range(F):
            for n in loop:
                vals[n] = run(n, vals, b, i)
            for n, st in states.items():
                st.update([vals[s] for s in n.src])
            for s in bg.outputs:
                if phase[s] == "loop":
                    store(s, vals[s.src[0]], b, i)
        for n, st in states.items():
            vals[n] = st.final()
        for n in post:
            vals[n] = run(n, vals, b, 0)
        for s in bg.outputs:
            if phase[s] != "loop":
                store(s, vals[s.src[0]], b, 0)
    return outs
