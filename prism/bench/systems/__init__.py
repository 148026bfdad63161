"""The benchmarked systems (report columns), their selection from the command line, and thread setup."""

from __future__ import annotations

import os
import sys

from prism.bench.systems import jax_system, ort_system, prism_system, torch_systems
from prism.bench.systems.base import Prepared, System, Unavailable
from prism.errors import PrismError

ALL: tuple[System, ...] = (*prism_system.SYSTEMS, *torch_systems.SYSTEMS, *jax_system.SYSTEMS, *ort_system.SYSTEMS)
BY_NAME = {s.name: s for s in ALL}
ALIASES = {
    "torch": ("torch", "torch-sdpa"),          # eager as written, plus SDPA where it applies
    "eager": ("torch",),
    "sdpa": ("torch-sdpa",),
    "torch.compile": ("compile",),
    "autotune": ("max-autotune",),
    "onnxruntime": ("ort",),
    "baselines": tuple(s.name for s in ALL if s.kind == "baseline"),
    "all": tuple(s.name for s in ALL),
}


def select(spec: str | None, prism: bool = True) -> list[System]:
    """Systems named by a comma-separated ``spec`` (names or aliases; all when empty), in report order.
    Prism is always included unless ``prism`` is False (which wins): it is the column every other one is
    compared with (it reads "unavailable" when ``prism.compile`` is absent)."""
    names = _parse(spec) if spec else {s.name for s in ALL}
    if prism:
        names.add("prism")
    else:
        names -= {"prism", "hand", "prism-f32"}
    return [s for s in ALL if s.name in names]


def _parse(spec: str) -> set[str]:
    names: set[str] = set()
    for part in (p.strip() for p in spec.split(",")):
        if not part:
            continue
        if part in ALIASES:  # first: "torch" names a system and, as an alias, eager + SDPA
            names.update(ALIASES[part])
        elif part in BY_NAME:
            names.add(part)
        else:
            raise PrismError(f"unknown system {part!r}; choose from {sorted(BY_NAME)} or aliases {sorted(ALIASES)}")
    return names


def configure_threads(n: int) -> list[str]:
    """Give every system ``n`` threads: torch.set_num_threads, XLA_FLAGS (read when jax is imported),
    PRISM_NUM_THREADS and OMP_NUM_THREADS (Prism's generated OpenMP code); ONNX Runtime takes it per
    session. Returns warnings (e.g. jax imported before the flags could take effect)."""
    if n < 1:
        raise PrismError(f"thread count must be >= 1, got {n}")
    warnings = []
    flags = f"--xla_cpu_multi_thread_eigen={'true' if n > 1 else 'false'} intra_op_parallelism_threads={n}"
    if "jax" in sys.modules:
        warnings.append("jax was imported before prism.bench set XLA_FLAGS; its thread count may differ from "
                        f"{n} (run the bench in a fresh process)")
    keep = [f for f in os.environ.get("XLA_FLAGS", "").split()
            if not f.startswith(("--xla_cpu_multi_thread_eigen", "intra_op_parallelism_threads"))]
    os.environ["XLA_FLAGS"] = " ".join([*keep, flags])
    os.environ["PRISM_NUM_THREADS"] = str(n)
    os.environ["OMP_NUM_THREADS"] = str(n)
    torch_systems.set_threads(n)
    return warnings


__all__ = ["ALIASES", "ALL", "BY_NAME", "Prepared", "System", "Unavailable", "configure_threads", "select"]
