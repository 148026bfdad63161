"""Interleaved block timing of several systems in one process.

Each round visits every system once, in an order rotated by one each round (so no system always
follows the same neighbour). A visit is an untimed warm-up sequence (the previous library's worker
threads may still be spinning on the cores; caches and pools must refill) followed by a timed *block*
of back-to-back calls lasting about ``block_s``, each call timed on its own. Alternating single calls
made JAX and ONNX Runtime up to 2.4x slower on our 2-core machine; blocks avoid that. Leading
``warmup_rounds`` are run and discarded.
"""

from __future__ import annotations

import gc
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field


@dataclass
class Timings:
    """Per system: the timed samples (seconds) and the round each came from; the visit order."""

    samples: dict[str, list[float]] = field(default_factory=dict)
    rounds_of: dict[str, list[int]] = field(default_factory=dict)
    visits: list[tuple[int, str]] = field(default_factory=list)   # (round, system), warm-up rounds < 0
    errors: dict[str, BaseException] = field(default_factory=dict)  # systems dropped after raising

    def median(self, name: str) -> float | None:
        s = self.samples.get(name)
        return statistics.median(s) if s else None

    def round_medians(self, name: str) -> list[float]:
        by: dict[int, list[float]] = {}
        for r, t in zip(self.rounds_of.get(name, []), self.samples.get(name, [])):
            by.setdefault(r, []).append(t)
        return [statistics.median(by[r]) for r in sorted(by)]


def rotation(names: Sequence[str], r: int) -> list[str]:
    """The visit order of round ``r``: ``names`` rotated left by r."""
    if not names:
        return []
    k = r % len(names)
    return list(names[k:]) + list(names[:k])


def _run_for(call: Callable[[], object], seconds: float, min_calls: int, clock: Callable[[], float],
             out: list[float] | None) -> None:
    start = clock()
    n = 0
    while n < min_calls or clock() - start < seconds:
        t0 = clock()
        call()
        t1 = clock()
        if out is not None:
            out.append(t1 - t0)
        n += 1


def interleave(calls: Mapping[str, Callable[[], object]], rounds: int, block_s: float = 0.05,
               warmup_s: float = 0.01, warmup_rounds: int = 1, min_calls: int = 1,
               clock: Callable[[], float] = time.perf_counter,
               before_round: Callable[[int], None] | None = None,
               after_visit: Callable[[int, str], None] | None = None) -> Timings:
    """Time every call in ``calls`` for ``rounds`` rounds (plus ``warmup_rounds`` discarded ones).

    A call that raises drops its system from the remaining rounds (``Timings.errors``).
    ``before_round(r)`` runs before each round (r < 0 for warm-up rounds) and once more after the last
    with r = rounds (the bench measures the triad there). Python's GC is paused inside timed blocks.
    """
    if rounds < 1:
        raise ValueError(f"rounds must be >= 1, got {rounds}")
    names = list(calls)
    t = Timings({n: [] for n in names}, {n: [] for n in names})
    for r in range(-warmup_rounds, rounds):
        if before_round is not None:
            before_round(r)
        for name in rotation(names, r + warmup_rounds):
            if name in t.errors:
                continue
            t.visits.append((r, name))
            block: list[float] = []
            gc_was = gc.isenabled()
            try:
                _run_for(calls[name], warmup_s, 1, clock, None)
                gc.disable()
                _run_for(calls[name], block_s, min_calls, clock, block)
            except Exception as e:  # one system failing mid-run must not cost the others' numbers
                t.errors[name] = e
                continue
            finally:
                if gc_was:
                    gc.enable()
            if r >= 0:
                t.samples[name].extend(block)
                t.rounds_of[name].extend([r] * len(block))
            if after_visit is not None:
                after_visit(r, name)
    if before_round is not None:
        before_round(rounds)
    return t
