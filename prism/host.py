"""What this process may use of the host, asked of the OS in one place (imports nothing of Prism, so every
stage may use it: the reference's BLAS blocks, the tuner's machine, the bench's thread count)."""

from __future__ import annotations

import os


def usable_cores() -> int:
    """The CPUs this process may run on: its affinity mask (a container's or ``taskset``'s), else every CPU."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        return os.cpu_count() or 1
