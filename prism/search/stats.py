"""Budgets, the typed stop reason and search statistics."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any


class StopReason(StrEnum):
    """Why a search stopped."""

    EXHAUSTED = "exhausted"      # every state within the limits was generated
    TIME_LIMIT = "time_limit"    # the time budget ran out (results so far are returned)
    STATE_LIMIT = "state_limit"  # the state budget ran out (results so far are returned)


# Pruning rules, by name (each prunes a state or a candidate operator; counted in Stats.pruned).
RULES = {
    "canonical": "operator order: a new operator must not sort before the previous one (permutation duplicates)",
    "abstract": "abstract expression is not a sub-expression of the target's saturated e-graph",
    "duplicate": "same abstract class, phase and shape as an existing tensor (a redundant recomputation)",
    "dims": "operand shapes can never match (different full dims, or a contraction against a broadcast)",
    "maps": "dimension-matching constraints on the symbolic maps are unsatisfiable",
    "partial": "a partial sum (a contraction split by a grid dim or the loop) would reach a non-linear operator, "
               "be added to a non-partial value, or be multiplied by another partial sum",
    "structural": "builder rules: no accumulating a non-loop value, no mixing loop and post-loop values, "
                  "no reduction of a size-1 dim, ...",
    "limits": "the state cannot be completed within the operator/output limits (too many unused tensors)",
    "hardware": "the per-block working set exceeds the cache for every value of the symbols",
    "bound": "a lower bound of the static cost of every completion exceeds the best verified cost so far "
             "(branch and bound across the iterative-deepening levels)",
    "final": "the last kernel operator must produce the program's outputs",
    "unsplit": "the structure is wrong with every grid size and F set to 1 (one float64 run per structure), "
               "so it is wrong under every map assignment",
    "enumerate_budget": "map assignments not costed: the enumeration ran past its budget (the search's deadline, "
                        "at least GRACE of time_limit after generation; MAX_CHOICES per structure)",
    "verify_budget": "ranked sGraphs not verified: the time limit was reached with a verified candidate in hand",
}


class StopSearch(Exception):
    def __init__(self, reason: StopReason) -> None:
        super().__init__(reason.value)
        self.reason = reason


@dataclass
class Budget:
    """Time and state limits of one search task (checked on every generated state). ``deadline`` is on
    the ``time.monotonic`` clock, which is shared by all processes of the machine."""

    deadline: float
    state_limit: int
    states: int = 0
    on_tick: Callable[[int], None] | None = None

    @classmethod
    def starting_now(cls, seconds: float, state_limit: int) -> Budget:
        return cls(time.monotonic() + seconds, state_limit)

    def tick(self) -> None:
        self.states += 1
        if self.states > self.state_limit:
            raise StopSearch(StopReason.STATE_LIMIT)
        if (self.states & 1023) == 1:  # the first state and every 1024th
            if time.monotonic() > self.deadline:
                raise StopSearch(StopReason.TIME_LIMIT)
            if self.on_tick is not None:
                self.on_tick(self.states)

    def check_time(self) -> None:
        if time.monotonic() > self.deadline:
            raise StopSearch(StopReason.TIME_LIMIT)


@dataclass
class Stats:
    """What a search did. ``states_*``: generated states; ``pruned[rule]``: candidates cut by each rule."""

    states_kernel: int = 0
    states_block: int = 0
    block_searches: int = 0
    block_structures: int = 0
    complete_structures: int = 0
    map_assignments: int = 0
    sgraphs: int = 0
    verified: int = 0
    rejected: int = 0
    build_errors: int = 0
    csp_solves: int = 0
    unsplit_skipped: int = 0           # structures too big for the whole-tensor unsplit check
    split_generated: int = 0           # split-reduction variants built (prism.search.splitk)
    split_verified: int = 0            # ... of which passed the verification gate
    split_rejected: int = 0            # ... of which the gate rejected
    pruned: Counter = field(default_factory=Counter)
    split_refused: Counter = field(default_factory=Counter)  # why the move did not apply, by reason
    seconds: dict[str, float] = field(default_factory=dict)

    @property
    def states(self) -> int:
        return self.states_kernel + self.states_block

    @contextmanager
    def phase(self, name: str) -> Any:
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - t0

    def merge(self, other: Stats) -> None:
        for k in _COUNTERS:
            setattr(self, k, getattr(self, k) + getattr(other, k))
        self.pruned.update(other.pruned)
        self.split_refused.update(other.split_refused)
        for k, v in other.seconds.items():
            self.seconds[k] = self.seconds.get(k, 0.0) + v

    def to_json(self) -> dict[str, Any]:
        return {"states": self.states, "states_kernel": self.states_kernel, "states_block": self.states_block,
                "block_searches": self.block_searches, "block_structures": self.block_structures,
                "complete_structures": self.complete_structures, "map_assignments": self.map_assignments,
                "sgraphs": self.sgraphs, "verified": self.verified, "rejected": self.rejected,
                "build_errors": self.build_errors, "csp_solves": self.csp_solves,
                "unsplit_skipped": self.unsplit_skipped, "split_generated": self.split_generated,
                "split_verified": self.split_verified, "split_rejected": self.split_rejected,
                "split_refused": dict(sorted(self.split_refused.items())),
                "pruned": dict(sorted(self.pruned.items())),
                "seconds": {k: round(v, 4) for k, v in sorted(self.seconds.items())}}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Stats:
        s = cls()
        for k in _COUNTERS:
            setattr(s, k, int(d.get(k, 0)))
        s.pruned = Counter(d.get("pruned", {}))
        s.split_refused = Counter(d.get("split_refused", {}))
        s.seconds = dict(d.get("seconds", {}))
        return s


_COUNTERS = ("states_kernel", "states_block", "block_searches", "block_structures", "complete_structures",
             "map_assignments", "sgraphs", "verified", "rejected", "build_errors", "csp_solves", "unsplit_skipped",
             "split_generated", "split_verified", "split_rejected")
