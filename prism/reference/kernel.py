"""The kernel-graph interpreter: runs a program op by op in NumPy (float32, or float64 for accuracy).

Values of every dtype are computed in the working type (float32; float64 in the accuracy mode): a
low-precision input is widened exactly, a ``cast`` rounds to its target's precision, and in the working mode
each output is stored in its own dtype at the end (``prism.ir.dtypes``: the mixed-precision rule)."""

from __future__ import annotations

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
    last_use = {s: i for i, n in enumerate(nodes) for s in n.src}   # a value is dropped after its last use:
    for i, n in enumerate(nodes):                                     # memory is the live set, not every value
        if i:
            for s in set(nodes[i - 1].src):
                if last_use[s] == i - 1:
                    vals.pop(s, None)
        if n.op == "input":
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


def _concrete(a: Any, env: Mapping[str, object]) -> Any:
    if isinstance(a, D.Dim):
        return D.evaluate(a, env)
    if isinstance(a, tuple):
        return tuple(_concrete(x, env) for x in a)
    return a
