"""The bench's results as plain dataclasses, their derived columns, and the JSON form (schema below).

Statuses of a system in a case: ``ok`` (checked against the float64 reference and timed), ``wrong``
(ran but failed the check: timed, but excluded from the best baseline with the reason), ``failed``
(raised while preparing or checking), ``unavailable`` (not installed / not built; the reason says which).
"""

from __future__ import annotations

import json
import statistics
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

SCHEMA = "prism-bench/1"
PRISM_NOTE = ("'prism' is Prism's pipeline on the program as written (search -> verify -> tune -> compile); "
              "'hand' is the HAND-WRITTEN reference structure of WORKLOADS.md compiled by Prism's code generator "
              "(a reference column, not a search result, never counted as Prism's result or as a baseline).")
STATUSES = ("ok", "wrong", "failed", "unavailable")


@dataclass
class SystemResult:
    name: str
    label: str
    kind: str                       # "prism" | "baseline"
    status: str                     # one of STATUSES
    reason: str | None = None
    max_rel_err: float | None = None
    median_us: float | None = None
    gbs: float | None = None        # minimal bytes / median time
    gflops: float | None = None     # flops / median time
    roofline_fraction: float | None = None   # roofline bound / median time (1.0 = at the physical limit)
    read_fraction: float | None = None       # the same with the read-only stream's bandwidth (weight streams)
    samples_us: list[float] = field(default_factory=list)
    sample_rounds: list[int] = field(default_factory=list)
    round_medians_us: list[float] = field(default_factory=list)
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def timed(self) -> bool:
        return self.median_us is not None


@dataclass
class CaseResult:
    workload: str
    name: str
    shape: dict[str, int]
    label: str
    bytes: int
    flops: int
    peak_gflops: float
    triad_gbs: list[float]          # triads measured beside the case (before each round and after the last)
    bandwidth_gbs: float            # their median: the bandwidth of this case's roofline
    roofline_us: float
    bound: str                      # "memory" | "compute": which term of the roofline is larger
    systems: list[SystemResult] = field(default_factory=list)
    best_baseline: str | None = None
    best_baseline_us: float | None = None
    prism_us: float | None = None
    prism_roofline_fraction: float | None = None
    prism_speedup: float | None = None   # best baseline time / Prism time (> 1: Prism is faster)
    foreign_cores: float | None = None   # CPU other processes used while timing (see contention.py)
    settle_ms_max: float | None = None   # the longest wait after a visit for this process to go idle
    read_gbs: list[float] = field(default_factory=list)   # read-only streams measured beside the triads
    read_bandwidth_gbs: float | None = None   # their median
    read_roofline_us: float | None = None     # max(bytes / read bandwidth, flops / peak)
    prism_read_fraction: float | None = None

    def system(self, name: str) -> SystemResult | None:
        return next((s for s in self.systems if s.name == name), None)


@dataclass
class Report:
    machine: dict[str, Any]
    limits: dict[str, Any]
    config: dict[str, Any]
    cases: list[CaseResult] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    note: str = PRISM_NOTE
    schema: str = SCHEMA
    started: str = ""
    duration_s: float = 0.0

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1, default=str)  # str: never lose a long run to one odd value

    def write(self, path: str | Path) -> None:
        Path(path).write_text(self.to_json())

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Report:
        if d.get("schema") != SCHEMA:
            raise ValueError(f"not a {SCHEMA} report (schema {d.get('schema')!r})")
        cases = [CaseResult(**{**c, "systems": [SystemResult(**s) for s in c["systems"]]}) for c in d["cases"]]
        known = {f.name for f in fields(cls)}
        return cls(**{**{k: v for k, v in d.items() if k in known}, "cases": cases})

    @classmethod
    def from_json(cls, text: str) -> Report:
        return cls.from_dict(json.loads(text))


def finish_case(case: CaseResult) -> CaseResult:
    """Fill the derived columns: per-system GB/s, GFLOP/s and roofline fractions (triad and read-only
    stream); the best baseline (the
    fastest *correct* one: ``wrong`` systems are excluded); Prism's fraction and speedup."""
    for s in case.systems:
        if s.samples_us:
            s.median_us = statistics.median(s.samples_us)
        if s.median_us:
            sec = s.median_us * 1e-6
            s.gbs = case.bytes / sec / 1e9
            s.gflops = case.flops / sec / 1e9
            s.roofline_fraction = case.roofline_us / s.median_us
            if case.read_roofline_us is not None:
                s.read_fraction = case.read_roofline_us / s.median_us
    ok = [s for s in case.systems if s.kind == "baseline" and s.status == "ok" and s.median_us]
    best = min(ok, key=lambda s: s.median_us or 0.0, default=None)
    case.best_baseline = best.name if best else None
    case.best_baseline_us = best.median_us if best else None
    p = next((s for s in case.systems if s.kind == "prism"), None)
    if p is not None and p.status == "ok" and p.median_us:
        case.prism_us = p.median_us
        case.prism_roofline_fraction = p.roofline_fraction
        case.prism_read_fraction = p.read_fraction
        if best is not None and best.median_us:
            case.prism_speedup = best.median_us / p.median_us
    return case
