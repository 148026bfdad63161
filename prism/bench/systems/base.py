"""What a benchmarked system is: a name and a ``prepare`` that turns (workload, shape, inputs) into a call."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import numpy as np

from prism.workloads import Workload
from prism.workloads.base import Shape


class Unavailable(Exception):
    """The system cannot run here (library not installed, Prism's code generator not built yet...).
    Reported as "unavailable" with the reason; never replaced by another system's numbers."""


@dataclass
class Prepared:
    """A ready-to-time system for one case.

    ``call()`` runs the program once on the prepared inputs and returns only when the result is
    ready (synchronous); ``fetch(result)`` turns what ``call`` returned into named NumPy arrays for the
    correctness check. ``info`` carries facts worth reporting (compile seconds...)."""

    call: Callable[[], object]
    fetch: Callable[[object], dict[str, np.ndarray]]
    info: dict[str, object] = field(default_factory=dict)
    keep: object = None  # objects the call needs alive (bound buffers) but does not reference itself


Prepare = Callable[[Workload, Shape, Mapping[str, np.ndarray], int], Prepared]


@dataclass(frozen=True)
class System:
    """A column of the report. ``kind`` is "prism" or "baseline"; ``applies`` limits a system to some
    workloads (SDPA to attention); ``cleanup`` runs after each case (drops compiled caches)."""

    name: str
    label: str
    kind: str
    prepare: Prepare
    applies: Callable[[Workload], bool] = lambda w: True
    cleanup: Callable[[], None] | None = None
