"""Inputs every system shares (64-byte aligned) and the correctness check against the float64 reference."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from prism.workloads import Workload
from prism.workloads.base import Shape

ALIGN = 64
# float32 results against the float64 reference, relative to the largest reference magnitude: float32
# rounding over a 4096-deep contraction stays near 1e-6, a wrong kernel is off by O(1).
RTOL = 1e-3
# per precision (prism.workloads.precision): bfloat16 outputs are rounded to 8 significant bits, and eager
# PyTorch rounds every operator's result (a few 2^-8 relative roundings); int8 weight-only computes in float32
# on the same quantized values as the reference
RTOLS = {"float32": RTOL, "bfloat16": 3e-2, "float16": 1e-2, "int8w": RTOL, "int8w-bf16": 3e-2}


def aligned(a: np.ndarray, align: int = ALIGN) -> np.ndarray:
    """A C-contiguous copy of ``a`` whose data starts on an ``align``-byte boundary (torch's matmul ran
    1.55x slower on merely 16-byte aligned buffers on our machine)."""
    a = np.asarray(a)
    buf = np.empty(a.nbytes + align, dtype=np.uint8)
    off = (-buf.ctypes.data) % align
    out = buf[off:off + a.nbytes].view(a.dtype).reshape(a.shape)
    out[...] = a
    return out


def case_inputs(w: Workload, shape: Shape, seed: int = 0) -> dict[str, np.ndarray]:
    """The workload's standard-normal inputs (float32, or its precision's), each 64-byte aligned."""
    return {k: aligned(v) for k, v in w.inputs(shape, "normal", seed=seed).items()}


def reference(w: Workload, shape: Shape, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The program evaluated in float64 by the NumPy reference interpreter."""
    return w.program(shape).evaluate(dict(inputs), dtype=np.float64)


@dataclass(frozen=True)
class Check:
    ok: bool
    max_rel_err: float | None
    reason: str | None


def check_outputs(got: Mapping[str, object], ref: Mapping[str, np.ndarray], rtol: float = RTOL) -> Check:
    """Compare a system's outputs with the reference: names, shapes, finiteness, then
    max|got - ref| / max|ref| <= rtol for every output."""
    missing = sorted(set(ref) - set(got))
    if missing:
        return Check(False, None, f"missing output(s) {missing}; got {sorted(got)}")
    worst = 0.0
    for name, r in ref.items():
        g = np.asarray(got[name], dtype=np.float64)
        if g.shape != r.shape:
            return Check(False, None, f"output {name!r} has shape {g.shape}, expected {r.shape}")
        if not np.all(np.isfinite(g)):
            return Check(False, None, f"output {name!r} has {int(np.sum(~np.isfinite(g)))} non-finite values")
        scale = float(np.max(np.abs(r))) or 1.0
        err = float(np.max(np.abs(g - r))) / scale if g.size else 0.0
        worst = max(worst, err)
        if err > rtol:
            return Check(False, err, f"output {name!r} differs from the float64 reference: max relative error "
                                     f"{err:.3g} > {rtol:g}")
    return Check(True, worst, None)
