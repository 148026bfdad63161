"""The kernel-graph interpreter: runs a program op by op in NumPy (float32, or float64 for accuracy).

Values of every dtype are computed in the working type (float32; float64 in the accuracy mode): a
low-precision input is widened exactly, a ``cast`` rounds to its target's precision, and in the working mode
each output is stored in its own dtype at the end (``prism.ir.dtypes``: the mixed-precision rule)."""

from __future__ import annotations

import math
import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from prism.errors import GraphError, InputError
from prism.ir import dims as D
from prism.ir.dtypes import working_np
from prism.ir.elementwise import is_exact_cast
from prism.ir.node import Node
from prism.reference.block import simulate
from prism.reference.numpy_ops import apply

if TYPE_CHECKING:
    from prism.ir.graph import Graph


def _to_numpy(name: str, x: Any) -> np.ndarray:
    if isinstance(x, np.ndarray):
        return x
    if hasattr(x, "detach") and hasattr(x, "numpy"):  # a torch tensor, without importing torch
        return x.detach().cpu().numpy()
    try:
        return np.asarray(x)
    except Exception as e:  # pragma: no cover
        raise InputError(f"input {name!r}: cannot convert {type(x).__name__} to an array ({e})") from None


# NumPy's BLAS runs on one thread here. Measured need: after a multi-threaded NumPy matmul, OpenBLAS's worker
# threads spin for up to ~0.1 s; on a 2-core machine a Prism kernel timed in that window (the tuner measures
# candidates beside its reference, a model decodes right after a new shape's check) took 2.5x its time (a
# [256, 1024] row sum: 9.8 -> 24.4 µs; unaffected with one BLAS thread). ``threadpoolctl`` is the library
# that controls these pools.
# The controller knows the libraries loaded when it was made (0.5 ms to make); one loaded later -- SciPy's own
# OpenBLAS, imported by JAX -- would keep its threads: made again when modules were imported since.
_BLAS: list[Any] = [None, -1]   # [controller, len(sys.modules) when it was made]


def _one_blas_thread() -> Any:
    if _BLAS[0] is None or _BLAS[1] != len(sys.modules):
        from threadpoolctl import ThreadpoolController
        _BLAS[1] = len(sys.modules)
        _BLAS[0] = ThreadpoolController()
    return _BLAS[0].limit(limits=1, user_api="blas")


def evaluate_graph(g: Graph, inputs: Mapping[str, Any], dtype: Any = None,
                   params: Mapping[str, object] | None = None) -> dict[str, np.ndarray]:
    with _one_blas_thread():
        return _evaluate(g, inputs, dtype, params)


def _evaluate(g: Graph, inputs: Mapping[str, Any], dtype: Any = None,
              params: Mapping[str, object] | None = None) -> dict[str, np.ndarray]:
    if not g.outputs:
        raise GraphError("the graph has no outputs; mark results with g.output(tensor)")
    arrays = {k: _to_numpy(k, v) for k, v in inputs.items()}
    env: dict[str, object] = dict(g.bind({k: a.shape for k, a in arrays.items()}))
    if params:
        clash = sorted(k for k in params if k in env and env[k] != params[k])
        if clash:
            raise InputError(f"params {clash} contradict the values bound from the input shapes {env}")
        env.update(params)
    vals: dict[Node, Any] = {}
    bgs: dict[Node, Any] = {}
    nodes = list(g.nodes)
    fused = _scaled_contractions(nodes) if dtype is not None and np.dtype(dtype) == np.float64 else {}
    inner = {x for f in fused.values() for x in f[3:]}
    src = {n: fused[n][:3] if n in fused else n.src for n in nodes}
    last_use = {s: i for i, n in enumerate(nodes) for s in src[n]}   # a value is dropped after its last use:
    for i, n in enumerate(nodes):                                     # memory is the live set, not every value
        if i:
            for s in set(src[nodes[i - 1]]):
                if last_use[s] == i - 1:
                    vals.pop(s, None)
        if n in inner:
            continue
        if n in fused:
            vals[n] = _scaled_contraction(n, *(vals[s] for s in src[n]))
        elif n.op == "input":
            name, _, dt = n.arg
            a = arrays[name]
            if dtype is None and a.dtype != dt.np:
                raise InputError(f"input {name!r}: expected dtype {dt}, got {a.dtype}; cast it, or evaluate with "
                                 "dtype=numpy.float64 for a reference computation")
            vals[n] = a.astype(np.dtype(dtype) if dtype is not None else working_np(dt), copy=False)
        elif n.op == "output":
            vals[n] = vals[n.src[0]]
        elif n.op == "customized":
            bg = n.arg[0]
            free = bg.symbols()
            if free:
                missing = sorted(free - set(env))
                if missing:
                    raise GraphError(f"customized operator has free symbols {missing}: pass their values with "
                                     f"evaluate(..., params={{...}})")
                bg = bg.instantiate({k: env[k] for k in free})
            bgs[n] = bg
            vals[n] = simulate(bg, [vals[s] for s in n.src], dtype=np.dtype(dtype) if dtype is not None else None)
        elif n.op == "result":
            vals[n] = vals[n.src[0]][n.arg[0]]
        elif is_exact_cast(n):
            # holds every value (int8 -> bfloat16): rounding it anyway was 6.2 s of CPU in the numeric checks of
            # llama-1b int8w-bf16's first generate() (cProfile; a [32000, 2048] LM head 0.3 s a time), though
            # off its critical path: the wall time stayed 54.1-54.6 s
            vals[n] = vals[n.src[0]]
        else:
            arg = n.arg
            if n.op in ("reshape", "split"):  # symbolic sizes in attributes take their bound values
                arg = tuple(_concrete(a, env) for a in arg)
            vals[n] = apply(n.op, [vals[s] for s in n.src], arg)
    if dtype is not None:
        return {n.arg[0]: vals[n] for n in g.outputs}
    # working precision: each output stored in its dtype (a bfloat16 output rounded once, at the end)
    return {n.arg[0]: vals[n] if vals[n].dtype == n.dtype.np else np.asarray(vals[n]).astype(n.dtype.np)
            for n in g.outputs}


def _scaled_contractions(nodes: list[Node]) -> dict[Node, tuple[Node, ...]]:
    """The float64 mode's one rewrite: ``sum(matmul(A, B) * S, g)`` over a batch axis ``g`` of the product, with
    ``S`` constant along the product's rows (``S.shape[-2] == 1``) and neither intermediate used elsewhere, maps
    each such sum to ``(A, B, S, the matmul, the mul)``. It equals ``A @ (B * S)`` contracted over ``g`` and K
    together (each ``S[g]`` scales the columns of ``B[g]``), which :func:`_scaled_contraction` computes as one
    product, never making the ``[G, M, N]`` intermediate: equal in exact arithmetic; in float64 the two orders
    differ by a few ulps of the sum, far below every tolerance this mode serves. Measured need: the grouped
    int8 Linear (``frontend.capture._fuse_grouped_linear``: one product per group of 32 input features, each
    scaled, summed) at llama-1b's 1024-row batch-8 prompt made a [64, 1024, 5632] float64 intermediate (2.9 GB,
    twice) and took 4.8 s per reference run; its reference runs (search, tuning, final checks) were 25 s of
    the 86 s first ``generate()``. Not used in the working (float32) mode, whose rounding follows the program's
    order."""
    uses: dict[Node, int] = {}
    for n in nodes:
        for s in n.src:
            uses[s] = uses.get(s, 0) + 1
    out: dict[Node, tuple[Node, ...]] = {}
    for n in nodes:
        if n.op != "sum" or n.src[0].op != "mul" or uses.get(n.src[0]) != 1:
            continue
        mul = n.src[0]
        for k in (0, 1):
            prod, scale = mul.src[k], mul.src[1 - k]
            nd = len(prod.shape)
            if prod.op != "matmul" or uses.get(prod) != 1 or nd < 3 or len(scale.shape) > nd:
                continue
            axis = n.arg[0] % nd
            rows_one = len(scale.shape) >= 2 and D.is_concrete(scale.shape[-2]) and scale.shape[-2] == 1
            if axis >= nd - 2 or not rows_one or tuple(mul.shape) != tuple(prod.shape):
                continue
            out[n] = (prod.src[0], prod.src[1], scale, prod, mul)
            break
    return out


# Columns of the scaled ``B * S`` made at a time: at most this many elements (16 MB of float64), so the reference
# never holds a scaled copy of a whole weight. Measured need: llama-1b int8w-g32-bf16's LM head ([32000, 2048] int8,
# 8 decode rows) took 1.5 s per float64 reference in the model's start-up, 1.0 s of it the first ``B * S`` -- a
# 524 MB temporary whose fresh pages the VM backs on first touch --, and 0.12 s when the same process ran it again.
SCALED_CHUNK = 1 << 21


def _scaled_contraction(n: Node, a: np.ndarray, b: np.ndarray, s: np.ndarray) -> np.ndarray:
    """``sum(matmul(a, b) * s, axis)`` (keepdim) for a sum of :func:`_scaled_contractions`: ``b * s`` (the columns
    of each ``b[g]`` scaled), then one product over the axis and K together; the scaled columns made
    ``SCALED_CHUNK`` elements at a time."""
    nd = len(n.shape)
    axis = n.arg[0] % nd
    a = a.reshape((1,) * (nd - a.ndim) + a.shape)
    b = b.reshape((1,) * (nd - b.ndim) + b.shape)
    s = s.reshape((1,) * (nd - s.ndim) + s.shape)
    bshape = np.broadcast_shapes(b.shape, s.shape)
    if a.shape[axis] != bshape[axis]:   # one side broadcast along the axis: the operators as written
        return apply("sum", [apply("matmul", [a, b], ()) * s], (axis,))
    g, k, cols = a.shape[axis], a.shape[-1], bshape[-1]
    a2 = np.moveaxis(a, axis, -2)   # [.., M, G, K] -> [.., M, G*K]
    a2 = a2.reshape(*a2.shape[:-2], g * k)

    def scaled(lo: int, hi: int) -> np.ndarray:   # columns lo:hi of B * S as [.., G*K, hi - lo]
        bs = b[..., lo:hi] * (s[..., lo:hi] if s.shape[-1] == cols else s)
        bs = np.moveaxis(bs, axis, -3)  # [.., G, K, n] -> [.., G*K, n]
        return bs.reshape(*bs.shape[:-3], g * k, hi - lo)
    step = max(1, SCALED_CHUNK // max(1, math.prod(bshape) // cols))
    if step >= cols:
        return np.expand_dims(apply("matmul", [a2, scaled(0, cols)], ()), axis)
    lead = np.broadcast_shapes(a2.shape[:-2], bshape[:axis] + bshape[axis + 1:-2])
    out = np.empty((*lead, a2.shape[-2], cols), np.result_type(a, b, s))
    for lo in range(0, cols, step):
        hi = min(cols, lo + step)
        out[..., lo:hi] = apply("matmul", [a2, scaled(lo, hi)], ())
    return np.expand_dims(out, axis)


def _concrete(a: Any, env: Mapping[str, object]) -> Any:
    if isinstance(a, D.Dim):
        return D.evaluate(a, env)
    if isinstance(a, tuple):
        return tuple(_concrete(x, env) for x in a)
    return a
