"""Shared helpers of the CPU-tier tests (tolerance, float64 references of the workloads, a split-K block graph,
an online-softmax attention block graph)."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

import prism
from prism.codegen.isa import ISAS, cpu_flags
from prism.ir import BlockBuilder
from prism.workloads import WORKLOADS

# fp32 kernels against a float64 reference: the largest error, relative to the largest reference value.
# Reductions here are at most 11008 long; measured errors are 4e-7 .. 2e-5 (hostile attention).
RTOL = 1e-4


def assert_close(out: np.ndarray, ref: np.ndarray, what: str, rtol: float = RTOL) -> float:
    out = np.asarray(out, dtype=np.float64)
    assert out.shape == ref.shape, f"{what}: shape {out.shape} != reference {ref.shape}"
    assert np.all(np.isfinite(out)), f"{what}: non-finite values in the output"
    scale = float(np.max(np.abs(ref))) or 1.0
    err = float(np.max(np.abs(out - ref))) / scale
    assert err <= rtol, f"{what}: max|out - ref| / max|ref| = {err:.3e} > {rtol:g}"
    return err


_CASES: dict[tuple[str, int, str], tuple[dict[str, np.ndarray], np.ndarray]] = {}


def workload_case(wid: str, si: int, kind: str) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """Inputs and the float64 reference output of the program (small cases are cached: the reference
    is the slow part of these tests)."""
    key = (wid, si, kind)
    if key in _CASES:
        return _CASES[key]
    w = WORKLOADS[wid]
    s = w.shapes[si]
    x = w.inputs(s, kind)
    (ref,) = w.program(s).evaluate(x, dtype=np.float64).values()
    if input_mib(wid, si) <= 20:
        _CASES[key] = (x, ref)
    return x, ref


def input_mib(wid: str, si: int) -> float:
    w = WORKLOADS[wid]
    return sum(4 * int(np.prod(shape)) for shape in w.input_shapes(w.shapes[si]).values()) / 2 ** 20


def supported_isas() -> list[str]:
    flags = cpu_flags()
    return [name for name, isa in ISAS.items() if all(f in flags for f in isa.required_flags)]


def split_k_graph(row_sums: bool = False) -> prism.Graph:
    """Y = X @ W as a block graph over (column blocks, K splits ``S``): blocks of one column range add their
    partial products (a workspace of partial-sum slots and per-thread scratch). ``row_sums``: also the
    output T, Y's row sums."""
    g = prism.Graph()
    X, W = g.input("X", (6, 128)), g.input("W", (128, 96))
    bb = BlockBuilder(grid=(2, "S"), forloop=2, inputs=[X, W])
    x = bb.iter(0, imap=(None, 1), fmap=1)
    w = bb.iter(1, imap=(1, 0), fmap=0)
    bb.save(bb.accumulate("sum", bb.matmul(x, w)), omap=(1, None))
    (y,) = g.customized(bb.build(), [X, W])
    g.output(y, "Y")
    if row_sums:
        g.output(g.sum(y, 1), "T")
    return g


def online_softmax_attention(name: str, q: Sequence[int | str], kv: Sequence[int | str], grid: tuple,
                             forloop: int | str, dtype: str = "float32") -> prism.Graph:
    """O = softmax(Q K^T / sqrt(E)) V written as one block graph: Q ``q`` = [heads, rows, E], K and V ``kv`` =
    [heads, keys, E]; a grid over heads, a loop over key chunks with online-softmax accumulators."""
    g = prism.Graph(name)
    Q, K, V = g.input("Q", tuple(q), dtype), g.input("K", tuple(kv), dtype), g.input("V", tuple(kv), dtype)
    bb = BlockBuilder(grid=grid, forloop=forloop, inputs=[Q, K, V])
    qt = bb.iter(0, imap=(0,))
    kt = bb.iter(1, imap=(0,), fmap=1)
    vt = bb.iter(2, imap=(0,), fmap=1)
    s = bb.mul_scalar(bb.matmul(qt, bb.transpose(kt, -1, -2)), 1 / math.sqrt(int(q[-1])))
    bb.save(bb.div(bb.accumulate("softmax_matmul", s, vt), bb.accumulate("softmax_sum", s)), omap=(0,))
    (o,) = g.customized(bb.build(), [Q, K, V])
    g.output(o, "O")
    return g
