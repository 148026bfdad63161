"""The built-in workloads W1-W7 of WORKLOADS.md (``prism workloads`` lists them)."""

from prism.errors import PrismError
from prism.workloads.base import Workload
from prism.workloads.library import WORKLOADS


def get(key: str) -> Workload:
    """A workload by id (``W1``) or name (``rmsnorm_linear``), case-insensitive."""
    k = key.strip().lower()
    for w in WORKLOADS.values():
        if k in (w.id.lower(), w.name.lower()):
            return w
    raise PrismError(f"unknown workload {key!r}; built-in: "
                     + ", ".join(f"{w.id} ({w.name})" for w in WORKLOADS.values()))


__all__ = ["WORKLOADS", "Workload", "get"]
