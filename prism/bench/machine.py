"""A description of the machine and software the numbers were taken on (goes into every report)."""

from __future__ import annotations

import os
import platform
from importlib import metadata
from typing import Any

SIMD_FLAGS = ("sse4_2", "avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_vnni",
              "avx512_bf16", "amx_tile", "neon", "asimd", "sve")
PACKAGES = ("prism-superopt", "numpy", "torch", "jax", "jaxlib", "onnxruntime", "onnx", "rich", "matplotlib")


def _cpuinfo() -> tuple[str, set[str]]:
    model, flags = platform.processor() or platform.machine(), set()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, val = line.partition(":")
                key = key.strip()
                if key in ("model name", "Model") and model in ("", platform.machine(), platform.processor()):
                    model = val.strip()
                elif key in ("flags", "Features") and not flags:
                    flags = set(val.split())
    except OSError:
        pass
    return model, flags


def versions() -> dict[str, str | None]:
    out: dict[str, str | None] = {"python": platform.python_version()}
    for p in PACKAGES:
        try:
            out[p] = metadata.version(p)
        except metadata.PackageNotFoundError:
            out[p] = None
    return out


def machine_info(threads: int) -> dict[str, Any]:
    from prism.tune.native import cc_version, find_cc
    model, flags = _cpuinfo()
    cc = find_cc()
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        usable = os.cpu_count() or 1
    return {
        "cpu": model,
        "cores": os.cpu_count(),
        "usable_cores": usable,
        "threads": threads,
        "simd": [f for f in SIMD_FLAGS if f in flags],
        "os": platform.platform(),
        "cc": cc_version(cc) if cc else None,
        "versions": versions(),
    }
