"""How much CPU *other* processes used while we measured (the bench machine may be shared).

Busy time of the whole machine from /proc/stat minus this process's own CPU time (all its threads, so
the spinning pools of torch/JAX/ORT count as ours, and its finished child processes, the C compiler),
divided by wall time: the average number of cores taken by someone else. On a 2-core machine even 0.3 of
a foreign core distorts 2-thread timings badly (an OpenMP barrier waits for a descheduled thread for a
whole scheduler quantum).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

WARN_CORES = 0.25
SETTLE_MAX_S = 0.5   # the longest the bench waits after a visit for this process to go idle


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
    """CPU seconds of this process and of its finished children: the compiler Prism runs is not someone
    else's load (counted as foreign, the native probes' compile marked every machine measurement of a fresh
    cache as contended, so it was never stored and every new process measured the machine again)."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


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


def wait_until_idle(min_s: float, max_s: float = SETTLE_MAX_S, window_s: float = 0.005,
                    idle_cores: float = 0.2, *, clock: Callable[[], float] = time.perf_counter,
                    cpu: Callable[[], float] = time.process_time,
                    sleep: Callable[[float], None] = time.sleep) -> float:
    """Sleep ``min_s``, then in ``window_s`` steps until the threads of this process -- other libraries'
    worker pools, since the caller is asleep -- used fewer than ``idle_cores`` over a step; at most
    ``max_s`` in all. Returns the seconds waited.

    Measured: after 50 ms of ONNX Runtime on W4 b2 q128 the process keeps burning 0.8-1.6 cores for
    ~40 ms (its intra-op workers spin), longer than the fixed 20 ms pause plus 10 ms warm-up the bench
    used, and Prism's first samples after ORT ran 2-3x slow (W4 q128: 14-18 ms instead of 6 ms)."""
    t0 = clock()
    if min_s > 0:
        sleep(min_s)
    while clock() - t0 < max_s:
        c0, w0 = cpu(), clock()
        sleep(window_s)
        wall = clock() - w0
        if wall > 0 and (cpu() - c0) / wall < idle_cores:
            break
    return clock() - t0
