"""Check the hand-written structures of W1-W7 against their programs with the reference interpreters.

Used by ``prism workloads --check`` and by the test suite: for each workload, shape, input kind
(normal, hostile) and instantiation of the block-graph symbols, the hand-written kernel graph run
through the block-graph interpreter must match the program's float64 reference.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np

from prism.workloads.base import Shape, Workload

RTOL = 1e-4


def rel_error(out: np.ndarray, ref: np.ndarray) -> float:
    """max |out - ref| / (|ref| + 1e-4 * max|ref|): an element-wise relative error that does not blow
    up on entries that are ~0 by cancellation."""
    scale = np.abs(ref) + 1e-4 * float(np.max(np.abs(ref)) or 1.0)
    return float(np.max(np.abs(out.astype(np.float64) - ref) / scale))


@dataclass(frozen=True)
class CaseResult:
    workload: str
    shape: str
    kind: str
    params: dict[str, int]
    error: float
    finite: bool

    @property
    def ok(self) -> bool:
        return self.finite and self.error <= RTOL


def check_case(w: Workload, s: Shape, kind: str, seed: int = 0) -> Iterator[CaseResult]:
    prog, hand = w.program(s), w.hand_written(s)
    x = w.inputs(s, kind, seed=seed)
    ref = prog.evaluate(x, dtype=np.float64)
    for p in [w.params(s), *w.alt_params(s)]:
        out = hand.evaluate(x, dtype=np.float64, params=p)
        err = max(rel_error(out[k], ref[k]) for k in ref)
        fin = all(bool(np.all(np.isfinite(out[k]))) for k in out)
        yield CaseResult(w.id, w.shape_label(s), kind, p, err, fin)


def check_all(workloads: list[Workload], on_case: Callable[[CaseResult], None] | None = None) -> list[CaseResult]:
    results = []
    for w in workloads:
        for s in w.shapes:
            for kind in ("normal", "hostile"):
                for r in check_case(w, s, kind):
                    results.append(r)
                    if on_case:
                        on_case(r)
    return results
