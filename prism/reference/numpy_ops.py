"""NumPy reference implementation of every kernel/tile operator (the ground truth).

``IMPL[name](arrays, arg)`` computes the operator on arrays of the working dtype. Written for
clarity and numerical care (stable sigmoid/softmax), not speed. The element-wise operators' references
come from their definitions (``OpDef.numpy`` in ``prism.ir.elementwise``); the structural ones are here.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

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
IMPL.update({n: (lambda name: lambda a, arg: decompose(name, lambda op, s, r: IMPL[op](s, r), a, tuple(arg)))(n)
             for n, o in OPS.items() if o.decomp is not None})


def apply(op: str, arrays: Sequence[np.ndarray], arg: tuple) -> np.ndarray:
    with np.errstate(all="ignore"):  # NaN and inf are results like any other (log(-1), 1/0)
        out = IMPL[op](arrays, arg)
    return np.asarray(out, dtype=arrays[0].dtype)
