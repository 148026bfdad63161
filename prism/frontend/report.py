"""What the frontend did with a captured graph: which pieces Prism runs, which stay in PyTorch and why.

Plain data (no torch). ``prism.frontend.reports()`` returns every :class:`GraphReport` of this process;
``Optimized.report`` those of one ``prism.optimize`` result. Tests assert on these (and on the runners'
call counters) so that a silent total fallback cannot pass.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any


@dataclass
class PieceReport:
    index: int
    ops: list[str]                 # the PyTorch operators of the piece, in order
    prism_ops: int                 # Prism operators it expands to
    inputs: list[str]              # input shapes, e.g. "[s0, 256]" (after hoisted transposes)
    status: str                    # "prism" | "small" (left to PyTorch: nothing to fuse) | "failed" | "split"
    #                                (a wide piece that found no kernel, planned again as smaller pieces)
    reason: str = ""
    program_key: str = ""
    structure: str = ""            # the chosen sGraph's one-line description (status "prism")
    runner: object | None = None   # the PieceRunner (call counters), when status is "prism"

    @property
    def by_prism(self) -> bool:
        return self.status == "prism"

    @property
    def label(self) -> str:
        return "+".join(self.ops)


@dataclass
class Fallback:
    op: str                        # e.g. "torch.cumsum", "aten.cumsum.default", "Tensor.cumsum"
    reason: str
    count: int = 1


@dataclass
class GraphReport:
    index: int
    source: str                                # "dynamo" | "fx" | "export"
    nodes: int                                 # FX call nodes
    pieces: list[PieceReport] = field(default_factory=list)
    fallbacks: list[Fallback] = field(default_factory=list)
    layout: int = 0                            # supported layout operators run as PyTorch views/copies
    error: str = ""                            # capture failed entirely: the graph runs in PyTorch
    assumptions: list[str] = field(default_factory=list)  # sizes identified (frontend.symbolic.identify)
    chains: list[Any] = field(default_factory=list)   # PieceChains: pieces called as one (frontend/chain.py)

    def prism_pieces(self) -> list[PieceReport]:
        return [p for p in self.pieces if p.by_prism]

    def summary(self) -> str:
        n = len(self.prism_pieces())
        failed = sum(p.status == "failed" for p in self.pieces)
        small = sum(p.status == "small" for p in self.pieces)
        if self.error:
            return f"graph {self.index} ({self.source}): capture failed, runs in PyTorch: {self.error}"
        split = sum(p.status == "split" for p in self.pieces)
        return (f"graph {self.index} ({self.source}, {self.nodes} operators): {n} piece(s) run by Prism, "
                + (f"{split} split again, " if split else "")
                + f"{failed} failed to superoptimize, {small} too small, {self.layout} layout operator(s) and "
                f"{sum(f.count for f in self.fallbacks)} unsupported operator(s) left to PyTorch"
                + (f"; {len(self.chains)} chain(s) of pieces called as one" if self.chains else ""))

    def table(self) -> str:
        lines = [self.summary()]
        for p in self.pieces:
            calls = ""
            r = p.runner
            if r is not None:
                calls = f"  calls: prism {getattr(r, 'prism_calls', 0)}, pytorch {getattr(r, 'fallback_calls', 0)}"
            lines.append(f"  piece {p.index} [{p.status}] {p.label}  inputs {', '.join(p.inputs)}"
                         + (f"  -- {p.reason}" if p.reason else "") + calls)
            if p.structure:
                lines.append(f"      sGraph: {p.structure}")
        for c in self.chains:
            lines.append(f"  chain {c.label}: {getattr(c, 'prism_calls', 0)} call(s) as one C call"
                         + (f" (its pieces run one by one: {c._why_not})" if getattr(c, '_why_not', '') else ""))
        for a in self.assumptions:
            lines.append(f"  assumes {a}")
        for f in self.fallbacks:
            lines.append(f"  unsupported: {f.op} x{f.count}: {f.reason}")
        return "\n".join(lines)


_LOCK = threading.Lock()
_REPORTS: list[GraphReport] = []


def new_report(source: str, nodes: int) -> GraphReport:
    with _LOCK:
        r = GraphReport(len(_REPORTS), source, nodes)
        _REPORTS.append(r)
        return r


def reports() -> list[GraphReport]:
    """Every graph report of this process, oldest first."""
    with _LOCK:
        return list(_REPORTS)


def clear_reports() -> None:
    with _LOCK:
        _REPORTS.clear()
