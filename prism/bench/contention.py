"""How much CPU *other* processes used while we measured (the bench machine may be shared).

Busy time of the whole machine from /proc/stat minus this process's own CPU time (all its threads, so
the spinning pools of torch/JAX/ORT count as ours), divided by wall time: the average number of cores
taken by someone else. On a 2-core machine even 0.3 of a foreign core distorts 2-thread timings badly
(an OpenMP barrier waits for a descheduled thread for a whole scheduler quantum).
"""

from __future__ import annotations

import os
import time

WARN_CORES = 0.25


def contention_limit() -> float:
    """Foreign cores above which the tuner does not persist a measurement (the tuning result, the machine's
    bandwidth): ``PRISM_TUNE_CONTENTION_LIMIT`` (cores; ``inf`` persists everything), default ``WARN_CORES``."""
    raw = os.environ.get("PRISM_TUNE_CONTENTION_LIMIT", "").strip()
    if not raw:
        return WARN_CORES
    try:
        v = float(raw)
    except ValueError:
        raise ValueError(f"PRISM_TUNE_CONTENTION_LIMIT must be a number of cores (or inf), got {raw!r}") from None
    if not v >= 0:
        raise ValueError(f"PRISM_TUNE_CONTENTION_LIMIT must be >= 0, got {raw!r}")
    return v


def contended(foreign_cores: float | None) -> bool:
    """True when a measurement saw more foreign load than :func:`contention_limit` (unknown load: False)."""
    return foreign_cores is not None and foreign_cores >= contention_limit()


def _machine_busy_s() -> float | None:
    try:
        with open("/proc/stat") as f:
            parts = f.readline().split()
    except OSError:
        return None
    if not parts or parts[0] != "cpu":
        return None
    v = [int(x) for x in parts[1:]]
    idle = v[3] + (v[4] if len(v) > 4 else 0)
    busy = sum(v[:8]) - idle  # user nice system idle iowait irq softirq steal; guest is inside user
    return busy / os.sysconf("SC_CLK_TCK")


def _own_s() -> float:
    t = os.times()
    return t.user + t.system


class CpuMeter:
    """``start()`` then ``stop()`` -> average foreign cores over the interval (None where unknown)."""

    def start(self) -> None:
        self._t = time.perf_counter()
        self._busy = _machine_busy_s()
        self._own = _own_s()

    def stop(self) -> float | None:
        busy = _machine_busy_s()
        if busy is None or self._busy is None:
            return None
        wall = time.perf_counter() - self._t
        if wall <= 0:
            return None
        return max(0.0, (busy - self._busy) - (_own_s() - self._own)) / wall
