"""NumPy reference implementation of every kernel/tile operator (the ground truth).

``IMPL[name](arrays, arg)`` computes the operator on arrays of the working dtype. Written for
clarity and numerical care (stable sigmoid/softmax), not speed. The element-wise operators' references
come from their definitions (``OpDef.numpy`` in ``prism.ir.elementwise``); the structural ones are here.
"""

from __future__ import annotations

import itertools
import math
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from prism.host import usable_cores
from prism.ir.ops import OPS, decompose

Impl = Callable[[Sequence[np.ndarray], tuple], np.ndarray]
IMPL: dict[str, Impl] = {}

def _split(x: np.ndarray, dim: int, sizes: tuple, index: int) -> np.ndarray:
    start = sum(int(s) for s in sizes[:index])
    sl = [slice(None)] * x.ndim
    sl[dim] = slice(start, start + int(sizes[index]))
    return x[tuple(sl)]


IMPL.update({n: o.numpy for n, o in OPS.items() if o.numpy is not None})
IMPL.update({
    "matmul": lambda a, arg: np.matmul(a[0], a[1]),
    # a view (nothing writes into values): copying W6's K cache (b = 10: 335 MB in float64) took 0.14-0.7 s
    # of every reference evaluation, and matmul reads a transposed operand directly
    "permute": lambda a, arg: np.transpose(a[0], arg[0]),
    "reshape": lambda a, arg: np.reshape(a[0], tuple(int(d) for d in arg[0])),
    "concat": lambda a, arg: np.concatenate(a, axis=arg[0]),
    "split": lambda a, arg: _split(a[0], *arg),
})


# composites: their decomposition (OpDef.decomp) with the references above
IMPL.update({n: (lambda name: lambda a, arg: decompose(name, lambda op, s, r: _apply(op, s, r), a, tuple(arg)))(n)
             for n, o in OPS.items() if o.decomp is not None})


def apply(op: str, arrays: Sequence[np.ndarray], arg: tuple) -> np.ndarray:
    with np.errstate(all="ignore"):  # NaN and inf are results like any other (log(-1), 1/0)
        out = _apply(op, arrays, arg)
    return np.asarray(out, dtype=arrays[0].dtype)


# Large matrix products run on every core, in blocks of the output's first axis with a block per worker (a batch
# axis, or M), each a NumPy matmul into its part of the output in a thread of its own: BLAS releases the GIL,
# and a BLAS call in a thread of ours runs single-threaded (the interpreter holds BLAS at one thread:
# prism/reference/kernel.py), so no BLAS worker thread is left spinning after it. The result is the whole call's
# to the last bits of float64 (the BLAS may take a block's edge rows through another kernel: tested within 8 ulps
# of the largest value; equal bit for bit at llama-1b's sizes).
# Measured need: llama-1b float32's fused MLP checked at ~500 rows, a new template region after 128 tokens: each
# float64 reference run is ~35 GFLOP of products on one of the two cores. A [1030, 2048] @ [2048, 5632] float64
# product: 444 -> 237 ms on 2 cores. Element-wise operators were tried the same way and lost (np.exp over 17 M
# float64: 28 -> 73 ms; the parts' results copied into one array, and fresh pages for each).
PARALLEL_MIN_FLOPS = 1 << 26      # a product of at least this many flops (~1 ms in float64 on one core)
_POOL: list[Any] = [None]
_POOL_LOCK = threading.Lock()
_IN_PART = threading.local()   # set in the pool's threads: what runs there runs whole (no nesting)


def _mark_part_thread() -> None:
    _IN_PART.on = True


def _pool() -> ThreadPoolExecutor:
    with _POOL_LOCK:
        if _POOL[0] is None:
            # every pool thread is marked from its start (not only once it has run a part: a thread that first ran
            # something else would cut it again and wait on the pool from inside it)
            _POOL[0] = ThreadPoolExecutor(max_workers=usable_cores(), thread_name_prefix="prism-ref",
                                          initializer=_mark_part_thread)
        return _POOL[0]


def _apply(op: str, arrays: Sequence[np.ndarray], arg: tuple) -> Any:
    if op == "matmul":
        parts = _product_parts(*arrays)
        if parts is not None:
            return _product_in_parts(*arrays, *parts)
    return IMPL[op](arrays, arg)


def _product_parts(a: Any, b: Any) -> tuple[tuple[int, ...], int, bool, bool] | None:
    """(the output's shape, the axis cut, whether A and B are cut along it) where ``a @ b`` is worth running in
    blocks (:data:`PARALLEL_MIN_FLOPS`), else None. The axis is the first (not N) with a block per worker."""
    workers = usable_cores()
    if (workers < 2 or getattr(_IN_PART, "on", False) or not isinstance(a, np.ndarray)
            or not isinstance(b, np.ndarray) or a.ndim < 2 or b.ndim < 2):
        return None
    shape = np.broadcast_shapes(a.shape[:-2], b.shape[:-2]) + (a.shape[-2], b.shape[-1])
    if 2 * math.prod(shape) * a.shape[-1] < PARALLEL_MIN_FLOPS:
        return None
    axis = next((i for i in range(len(shape) - 1) if shape[i] >= workers), None)
    if axis is None:
        return None

    def cut(x: np.ndarray) -> bool:   # its axis aligned with that one has all of it (one of size 1: broadcast)
        ax = x.ndim - len(shape) + axis
        return ax >= 0 and x.shape[ax] == shape[axis]
    return tuple(shape), axis, cut(a), axis < len(shape) - 2 and cut(b)   # B at the M axis has K there


def _product_in_parts(a: np.ndarray, b: np.ndarray, shape: tuple[int, ...], axis: int, cut_a: bool,
                      cut_b: bool) -> np.ndarray:
    out = np.empty(shape, np.result_type(a, b))
    bounds = np.linspace(0, shape[axis], usable_cores() + 1).astype(int)

    def piece(x: np.ndarray, lo: int, hi: int) -> np.ndarray:
        return x[(slice(None),) * (x.ndim - len(shape) + axis) + (slice(lo, hi),)]

    def part(lo: int, hi: int) -> None:
        _IN_PART.on = True
        np.matmul(piece(a, lo, hi) if cut_a else a, piece(b, lo, hi) if cut_b else b, out=piece(out, lo, hi))
    from prism.reference.kernel import _one_blas_thread  # (already so inside the interpreter: a cheap re-entry)
    with _one_blas_thread():
        for f in [_pool().submit(part, int(lo), int(hi)) for lo, hi in itertools.pairwise(bounds) if hi > lo]:
            f.result()
    return out
