"""NumPy reference implementation of every kernel/tile operator (the ground truth).

``IMPL[name](arrays, arg)`` computes the operator on arrays of the working dtype. Written for
clarity and numerical care (stable sigmoid/softmax), not speed.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np

Impl = Callable[[Sequence[np.ndarray], tuple], np.ndarray]
IMPL: dict[str, Impl] = {}

_erf = np.vectorize(math.erf, otypes=[np.float64])


def _sigmoid(x: np.ndarray) -> np.ndarray:
    # exp(-log(1 + exp(-x))) without overflow for large |x|
    return np.exp(-np.logaddexp(0, -x)).astype(x.dtype, copy=False)


def _gelu(x: np.ndarray, approximate: str) -> np.ndarray:
    if approximate == "tanh":
        c = math.sqrt(2.0 / math.pi)
        return (0.5 * x * (1.0 + np.tanh(c * (x + 0.044715 * x ** 3)))).astype(x.dtype, copy=False)
    return (0.5 * x * (1.0 + _erf(x.astype(np.float64) / math.sqrt(2.0)))).astype(x.dtype, copy=False)


def _softmax(x: np.ndarray, dim: int) -> np.ndarray:
    e = np.exp(x - np.max(x, axis=dim, keepdims=True))
    return e / np.sum(e, axis=dim, keepdims=True)


def _rms_norm(x: np.ndarray, dim: int, eps: float) -> np.ndarray:
    return x / np.sqrt(np.mean(x * x, axis=dim, keepdims=True) + x.dtype.type(eps))


def _split(x: np.ndarray, dim: int, sizes: tuple, index: int) -> np.ndarray:
    start = sum(int(s) for s in sizes[:index])
    sl = [slice(None)] * x.ndim
    sl[dim] = slice(start, start + int(sizes[index]))
    return x[tuple(sl)]


def _scalar(x: np.ndarray, c: float) -> np.generic:
    return x.dtype.type(c)


IMPL.update({
    "matmul": lambda a, arg: np.matmul(a[0], a[1]),
    "exp": lambda a, arg: np.exp(a[0]),
    "square": lambda a, arg: a[0] * a[0],
    "sqrt": lambda a, arg: np.sqrt(a[0]),
    "rsqrt": lambda a, arg: 1 / np.sqrt(a[0]),
    "silu": lambda a, arg: a[0] * _sigmoid(a[0]),
    "gelu": lambda a, arg: _gelu(a[0], arg[0] if arg else "none"),
    "relu": lambda a, arg: np.maximum(a[0], 0),
    "sigmoid": lambda a, arg: _sigmoid(a[0]),
    "tanh": lambda a, arg: np.tanh(a[0]),
    "neg": lambda a, arg: -a[0],
    "mul_scalar": lambda a, arg: a[0] * _scalar(a[0], arg[0]),
    "add_scalar": lambda a, arg: a[0] + _scalar(a[0], arg[0]),
    "add": lambda a, arg: a[0] + a[1],
    "sub": lambda a, arg: a[0] - a[1],
    "mul": lambda a, arg: a[0] * a[1],
    "div": lambda a, arg: a[0] / a[1],
    "maximum": lambda a, arg: np.maximum(a[0], a[1]),
    "sum": lambda a, arg: np.sum(a[0], axis=arg[0], keepdims=True),
    "max": lambda a, arg: np.max(a[0], axis=arg[0], keepdims=True),
    "mean": lambda a, arg: np.mean(a[0], axis=arg[0], keepdims=True),
    "rms_norm": lambda a, arg: _rms_norm(a[0], arg[0], arg[1]),
    "softmax": lambda a, arg: _softmax(a[0], arg[0]),
    # a view (nothing writes into values): copying W6's K cache (b = 10: 335 MB in float64) took 0.14-0.7 s
    # of every reference evaluation, and matmul reads a transposed operand directly
    "permute": lambda a, arg: np.transpose(a[0], arg[0]),
    "reshape": lambda a, arg: np.reshape(a[0], tuple(int(d) for d in arg[0])),
    "concat": lambda a, arg: np.concatenate(a, axis=arg[0]),
    "split": lambda a, arg: _split(a[0], *arg),
})


def apply(op: str, arrays: Sequence[np.ndarray], arg: tuple) -> np.ndarray:
    with np.errstate(over="ignore", under="ignore"):
        out = IMPL[op](arrays, arg)
    return np.asarray(out, dtype=arrays[0].dtype)
