"""``prism bench --corpus``: each corpus program under eager PyTorch, ``torch.compile`` (inductor, default
mode), ``prism.optimize`` (its default capture, ``"auto"``: exported once and called without Dynamo, or
through Dynamo where the function does not export) and ``prism.optimize(..., capture="dynamo")``
(``prism-dynamo``: Dynamo's frame evaluation and guards on every call, as ``torch.compile``), checked against
float64 and timed in one interleaved run.

Per program: the four systems are prepared (compile and Prism's search/tuning happen here, untimed),
each output is compared with the float64 result of the same program on the same inputs, then the four
calls are timed in interleaved blocks (``prism.bench.schedule.interleave``: rotated order, warm-up, a
settle pause until the process is idle), medians of per-call times. Every system returns fresh outputs
(none writes into a preallocated buffer) and runs with the same thread count, under
``torch.inference_mode()``. Prism's pieces that stayed in PyTorch are listed per program (a fallback is
flagged, never hidden).
"""

from __future__ import annotations

import copy
import json
import math
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from prism.bench.corpus import Program, programs
from prism.bench.schedule import interleave
from prism.tune.contention import CpuMeter, wait_until_idle

SYSTEMS = ("eager", "compile", "prism", "prism-dynamo")
PRISMS = ("prism", "prism-dynamo")


@dataclass
class Row:
    name: str
    category: str
    tol: float
    us: dict[str, float | None] = field(default_factory=dict)      # median µs per system
    err: dict[str, float | None] = field(default_factory=dict)     # max relative error vs float64
    status: dict[str, str] = field(default_factory=dict)           # ok | wrong | failed: reason
    fallbacks: list[str] = field(default_factory=list)             # Prism: operators left in PyTorch
    dynamo_fallbacks: list[str] = field(default_factory=list)      # the same, of prism-dynamo
    capture: str = ""                                               # how the default captured it
    prism_pieces: int = 0
    prepare_s: dict[str, float] = field(default_factory=dict)
    foreign_cores: float | None = None

    def speedup(self, base: str, system: str = "prism") -> float | None:
        p, b = self.us.get(system), self.us.get(base)
        if p is None or b is None or self.status.get(system) != "ok" or self.status.get(base) != "ok":
            return None
        return b / p


def _outputs(v: Any) -> list[Any]:
    return list(v) if isinstance(v, (tuple, list)) else [v]


def rel_error(got: Any, ref: Any) -> float:
    """max |got - ref| / max |ref| over the finite reference values; inf when NaN/inf positions differ."""
    import torch
    worst = 0.0
    for g, r in zip(_outputs(got), _outputs(ref)):
        g, r = g.detach().double(), r.detach().double()
        if g.shape != r.shape:
            return math.inf
        fin = torch.isfinite(r)
        if not torch.equal(torch.isnan(g), torch.isnan(r)) or not torch.equal(g[torch.isinf(r)], r[torch.isinf(r)]):
            return math.inf
        if not bool(torch.isfinite(g[fin]).all()):
            return math.inf
        if fin.any():
            scale = max(float(r[fin].abs().max()), 1e-30)
            worst = max(worst, float((g[fin] - r[fin]).abs().max()) / scale)
    return worst


def _reference(fn: Any, inputs: tuple) -> Any:
    import torch
    f64 = copy.deepcopy(fn).double() if isinstance(fn, torch.nn.Module) else fn
    with torch.inference_mode():
        return f64(*[x.double() if x.is_floating_point() else x for x in inputs])   # (integer ids stay)


def run_program(p: Program, rounds: int, block_ms: float, warmup_ms: float, settle_ms: float,
                prism_options: dict[str, Any], log: Callable[[str], None]) -> Row:
    import torch

    import prism
    row = Row(p.name, p.category, p.tol)
    fn, inputs = p.make()
    if isinstance(fn, torch.nn.Module):
        fn.eval()
    ref = _reference(fn, inputs)
    calls: dict[str, Callable[[], Any]] = {}

    def prepare(name: str, build: Callable[[], Callable[[], Any]]) -> None:
        t0 = time.perf_counter()
        try:
            call = build()
            with torch.inference_mode():
                out = call()
            row.prepare_s[name] = time.perf_counter() - t0
            e = rel_error(out, ref)
            row.err[name] = e
            if e <= p.tol:
                row.status[name] = "ok"
                calls[name] = call
            else:
                row.status[name] = f"wrong: error {e:.2e} > {p.tol:g}"
        except Exception as ex:  # a system failing on one program must not stop the corpus
            row.prepare_s[name] = time.perf_counter() - t0
            row.status[name] = f"failed: {type(ex).__name__}: {str(ex).splitlines()[0][:200] if str(ex) else ''}"

    prepare("eager", lambda: lambda: fn(*inputs))

    def build_compile() -> Callable[[], Any]:
        torch._dynamo.reset()
        c = torch.compile(fn)
        return lambda: c(*inputs)
    prepare("compile", build_compile)

    def build_prism() -> Callable[[], Any]:
        opt = prism.optimize(fn, inputs, **prism_options)
        row.fallbacks = sorted({f"{f.op}: {f.reason}" for r in opt.report for f in r.fallbacks})
        row.prism_pieces = len(opt.prism_pieces())
        row.capture = opt.capture
        return lambda: opt(*inputs)
    prepare("prism", build_prism)

    def build_prism_dynamo() -> Callable[[], Any]:
        opt = prism.optimize(fn, inputs, capture="dynamo", **prism_options)  # the same pieces: cached searches
        row.dynamo_fallbacks = sorted({f"{f.op}: {f.reason}" for r in opt.report for f in r.fallbacks})
        return lambda: opt(*inputs)
    prepare("prism-dynamo", build_prism_dynamo)
    log(f"{p.name}: prepared in " + ", ".join(f"{k} {v:.1f} s" for k, v in row.prepare_s.items())
        + (f"; {len(row.fallbacks)} fallback(s)" if row.fallbacks else ""))

    def settle(_r: int, _name: str) -> None:
        if settle_ms > 0:
            wait_until_idle(settle_ms / 1e3)

    meter = CpuMeter()
    meter.start()
    with torch.inference_mode():
        t = interleave(calls, rounds, block_ms / 1e3, warmup_ms / 1e3, 1, after_visit=settle)
    row.foreign_cores = meter.stop()
    for name in SYSTEMS:
        if name in t.errors:
            row.status[name] = f"failed while timing: {t.errors[name]}"
        med = t.median(name) if name in calls else None
        row.us[name] = med * 1e6 if med is not None else None
    return row


def geomean(xs: list[float]) -> float | None:
    return math.exp(statistics.fmean(math.log(x) for x in xs)) if xs else None


def summary(rows: list[Row], system: str = "prism") -> dict[str, Any]:
    """Totals of ``system`` (``prism`` or ``prism-dynamo``); ``dynamo`` holds those of ``prism-dynamo``."""
    vs_eager = [r.speedup("eager", system) for r in rows]
    vs_compile = [r.speedup("compile", system) for r in rows]
    clean = [r for r in rows if r.status.get(system) == "ok"
             and not (r.dynamo_fallbacks if system == "prism-dynamo" else r.fallbacks)]
    out: dict[str, Any] = {
        "programs": len(rows),
        "prism_ok": sum(r.status.get(system) == "ok" for r in rows),
        "without_fallback": len(clean),
        "geomean_vs_eager": geomean([x for x in vs_eager if x]),
        "geomean_vs_compile": geomean([x for x in vs_compile if x]),
        "at_or_above_eager": sum(1 for x in vs_eager if x and x >= 1.0),
        "compared": sum(1 for x in vs_eager if x),
    }
    if system == "prism":
        out["exported"] = sum(r.capture == "export" for r in rows)
        out["dynamo"] = summary(rows, "prism-dynamo")
    return out


def _fmt(x: float | None, spec: str = "{:.1f}") -> str:
    return spec.format(x) if x is not None else "-"


def markdown(rows: list[Row], meta: dict[str, Any]) -> str:
    s = summary(rows)
    x = s["dynamo"]
    lines = [f"Machine: {meta.get('cpu', '?')}, {meta.get('threads')} threads; load before {meta.get('load_before')}, "
             f"after {meta.get('load_after')}; {meta.get('rounds')} rounds of {meta.get('block_ms')} ms blocks.",
             "",
             "| program | category | eager µs | compile µs | prism µs | vs eager | vs compile | capture | "
             "prism-dynamo µs | vs eager | vs compile | max err | notes |",
             "|---|---|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|---|"]
    for r in rows:
        notes = []
        for k in SYSTEMS:
            if r.status.get(k, "ok") != "ok":
                notes.append(f"{k} {r.status[k]}")
        if r.fallbacks:
            notes.append("fallback: " + "; ".join(r.fallbacks))
        if r.dynamo_fallbacks:
            notes.append("prism-dynamo fallback: " + "; ".join(r.dynamo_fallbacks))
        lines.append(f"| {r.name} | {r.category} | {_fmt(r.us.get('eager'))} | {_fmt(r.us.get('compile'))} | "
                     f"{_fmt(r.us.get('prism'))} | {_fmt(r.speedup('eager'), '{:.2f}x')} | "
                     f"{_fmt(r.speedup('compile'), '{:.2f}x')} | {r.capture or '-'} | "
                     f"{_fmt(r.us.get('prism-dynamo'))} | "
                     f"{_fmt(r.speedup('eager', 'prism-dynamo'), '{:.2f}x')} | "
                     f"{_fmt(r.speedup('compile', 'prism-dynamo'), '{:.2f}x')} | "
                     f"{_fmt(r.err.get('prism'), '{:.1e}')} | "
                     f"{'; '.join(notes)} |")
    lines += ["", f"{s['programs']} programs ({s['exported']} exported by prism.optimize's default capture, the "
              f"others through Dynamo); Prism correct on {s['prism_ok']}, with no fallback on "
              f"{s['without_fallback']}; at or above eager on {s['at_or_above_eager']} of {s['compared']} compared. "
              f"Geometric mean speedup: {_fmt(s['geomean_vs_eager'], '{:.2f}x')} over eager, "
              f"{_fmt(s['geomean_vs_compile'], '{:.2f}x')} over torch.compile.",
              f"prism-dynamo (capture='dynamo', Dynamo per call as torch.compile): correct on {x['prism_ok']}, "
              f"with no fallback "
              f"on {x['without_fallback']}; at or above "
              f"eager on {x['at_or_above_eager']} of {x['compared']}; geometric mean "
              f"{_fmt(x['geomean_vs_eager'], '{:.2f}x')} over eager, {_fmt(x['geomean_vs_compile'], '{:.2f}x')} over "
              "torch.compile."]
    return "\n".join(lines)


def main(args: Any, threads: int) -> int:
    import os

    import torch
    torch.set_num_threads(threads)
    progs = programs(args.corpus_filter)
    if not progs:
        print(f"prism bench --corpus: no program matches {args.corpus_filter!r}", file=sys.stderr)
        return 2
    rounds = args.rounds if args.rounds is not None else (2 if args.quick else 5)
    block_ms = 10.0 if args.quick else args.block_ms
    opts = {"time_limit": 60.0}
    meta = {"threads": threads, "rounds": rounds, "block_ms": block_ms, "load_before": os.getloadavg()[0]}
    from prism.bench.machine import machine_info
    meta["cpu"] = machine_info(threads).get("cpu")
    rows = []

    def log(m: str) -> None:
        print(m, file=sys.stderr, flush=True)
    for k, p in enumerate(progs):
        log(f"[{k + 1}/{len(progs)}] {p.name}")
        rows.append(run_program(p, rounds, block_ms, args.warmup_ms, args.settle_ms, opts, log))
    meta["load_after"] = os.getloadavg()[0]
    text = markdown(rows, meta)
    print(text)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"meta": meta, "summary": summary(rows), "rows": [asdict(r) for r in rows]}, f, indent=1)
        print(f"wrote {args.json}", file=sys.stderr)
    return 0
