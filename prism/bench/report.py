"""Rendering a ``Report``: rich tables for the terminal and a PNG chart (matplotlib)."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console, Group
from rich.table import Table
from rich.text import Text

from prism.bench.results import CaseResult, Report, SystemResult
from prism.tune.contention import SETTLE_MAX_S, WARN_CORES

SHORT = {"torch": "eager", "torch-sdpa": "sdpa", "compile": "compile", "max-autotune": "max-auto", "jax": "jax",
         "ort": "ort", "prism": "prism", "hand": "hand", "torch-int8mm": "int8mm",
         "prism-f32": "prism f32"}


def _num(x: float | None, fmt: str = "{:.0f}") -> str:
    return "-" if x is None else fmt.format(x)


def _cell(s: SystemResult | None, best: str | None) -> Text:
    if s is None:
        return Text("n/a", style="dim")
    if s.status in ("unavailable", "failed"):
        return Text(s.status, style="dim" if s.status == "unavailable" else "red")
    text = Text(_num(s.median_us), style="bold green" if s.name == best else "")
    if s.status == "wrong":
        text.append(" ✗", style="red")
    return text


def system_names(report: Report) -> list[str]:
    """Systems that appear in some case, in the configured order."""
    present = {s.name for c in report.cases for s in c.systems}
    order = [n for n in report.config.get("systems", []) if n in present]
    return order + sorted(present - set(order))


def header(report: Report) -> Text:
    m, lim = report.machine, report.limits
    v = {k: val for k, val in m.get("versions", {}).items() if val}
    return Text.assemble(
        ("machine: ", "bold"), f"{m.get('cpu')}, {m.get('cores')} cores, {m.get('threads')} threads, "
        f"SIMD {' '.join(m.get('simd', []))}\n",
        ("software: ", "bold"), ", ".join(f"{k} {val}" for k, val in v.items()) + f", {m.get('cc')}\n",
        ("precision: ", "bold"), f"{report.config.get('precision', 'float32')} (every system runs the same values; "
        "correct = within the precision's tolerance of the float64 reference)\n",
        ("limits: ", "bold"), f"peak {lim['peak_gflops']:.0f} GFLOP/s (FP32 FMA loop), triad "
        f"{lim['startup_triad_gbs']:.1f} GB/s{_read_at_start(lim)} at start ({lim.get('method')}); each case's "
        "roofline uses the triad measured beside it, '/read' the read-only stream beside it\n",
        ("note: ", "bold yellow"), report.note)


def _read_at_start(lim: dict) -> str:
    r = lim.get("startup_read_gbs")
    return "" if r is None else f", read-only stream {r:.1f} GB/s"


def summary_table(report: Report) -> Table:
    names = system_names(report)
    t = Table(title="median µs per call (bold green: best correct baseline; ✗: wrong result, excluded)",
              title_justify="left")
    t.add_column("case", no_wrap=True)
    t.add_column("roofline µs", justify="right")
    for n in names:
        t.add_column(SHORT.get(n, n), justify="right")
    t.add_column("best baseline", justify="left")
    t.add_column("best/roof", justify="right")
    t.add_column("prism/roof", justify="right")
    t.add_column("prism/read", justify="right")
    t.add_column("prism speedup", justify="right")
    for c in report.cases:
        best = c.system(c.best_baseline) if c.best_baseline else None
        t.add_row(f"{c.workload} {c.label}", _num(c.roofline_us, "{:.1f}"),
                  *[_cell(c.system(n), c.best_baseline) for n in names],
                  SHORT.get(c.best_baseline or "", c.best_baseline or "-"),
                  _num(best.roofline_fraction if best else None, "{:.2f}"),
                  _num(c.prism_roofline_fraction, "{:.2f}"), _num(c.prism_read_fraction, "{:.2f}"),
                  _num(c.prism_speedup, "{:.2f}x"))
    return t


DETAIL_COLUMNS = (("case", "left"), ("bytes MB", "right"), ("MFLOP", "right"), ("triad GB/s", "right"),
                  ("read GB/s", "right"), ("bound", "left"), ("other procs", "right"), ("system", "left"),
                  ("status", "left"), ("median µs", "right"), ("GB/s", "right"), ("GFLOP/s", "right"),
                  ("of roofline", "right"), ("of read roof", "right"), ("rel err", "right"))


def detail_table(report: Report) -> Table:
    t = Table(title="per system: achieved rates (minimal bytes and flops / median time)", title_justify="left")
    for col, just in DETAIL_COLUMNS:
        t.add_column(col, justify=just)  # type: ignore[arg-type]
    for c in report.cases:
        case_cells = [f"{c.workload} {c.label}", _num(c.bytes / 1e6, "{:.2f}"), _num(c.flops / 1e6, "{:.1f}"),
                      _num(c.bandwidth_gbs, "{:.1f}"), _num(c.read_bandwidth_gbs, "{:.1f}"), c.bound,
                      _num(c.foreign_cores, "{:.2f}")]
        for i, s in enumerate(c.systems):
            t.add_row(*(case_cells if i == 0 else [""] * len(case_cells)), s.name, s.status, _num(s.median_us),
                      _num(s.gbs, "{:.1f}"), _num(s.gflops, "{:.1f}"), _num(s.roofline_fraction, "{:.2f}"),
                      _num(s.read_fraction, "{:.2f}"), _num(s.max_rel_err, "{:.1e}"),
                      end_section=i == len(c.systems) - 1)
    return t


def notes(report: Report) -> Text:
    """Reasons for every system that is not ``ok``, each distinct reason once with the cases it hit."""
    seen: dict[tuple[str, str, str], list[str]] = {}
    for c in report.cases:
        for s in c.systems:
            if s.status != "ok":
                seen.setdefault((s.name, s.status, s.reason or ""), []).append(f"{c.workload} {c.label}")
    out = Text()
    for w in report.warnings:
        out.append(f"warning: {w}\n", style="yellow")
    busy = [f"{c.workload} {c.label} ({c.foreign_cores:.2f})" for c in report.cases
            if c.foreign_cores is not None and c.foreign_cores > WARN_CORES]
    if busy:
        out.append("warning: other processes used CPU while these cases were timed (average cores in brackets); "
                   "their numbers are unreliable, rerun on a quiet machine: " + "; ".join(busy) + "\n",
                   style="yellow")
    spin = [f"{c.workload} {c.label}" for c in report.cases
            if c.settle_ms_max is not None and c.settle_ms_max >= SETTLE_MAX_S * 1e3]
    if spin:
        out.append(f"warning: threads of this process were still busy {SETTLE_MAX_S * 1e3:.0f} ms after a visit "
                   "(a library's workers never went idle), so a following system may have lost a core: "
                   + "; ".join(spin) + "\n", style="yellow")
    for (name, status, reason), cases in seen.items():
        where = "all cases" if len(cases) == len(report.cases) else "; ".join(cases)
        out.append(f"{name} {status}", style="red" if status in ("wrong", "failed") else "dim")
        out.append(f" ({where}): {reason}\n")
    return out


def render(report: Report, console: Console, details: bool = True) -> None:
    parts: list = [header(report), summary_table(report)]
    if details:
        parts.append(detail_table(report))
    parts.append(notes(report))
    console.print(Group(*parts))


def plot(report: Report, path: str | Path) -> None:
    """A PNG: per case, each system's fraction of the roofline (1.0 = the physical limit)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = system_names(report)
    cases: list[CaseResult] = report.cases
    n = len(names)
    height = 0.8 / max(n, 1)
    fig, ax = plt.subplots(figsize=(10, 1.0 + 0.25 * n * max(len(cases), 1) + 0.6))
    colors = plt.get_cmap("tab10")
    for j, name in enumerate(names):
        ys, xs = [], []
        for i, c in enumerate(cases):
            s = c.system(name)
            if s is not None and s.roofline_fraction is not None and s.status == "ok":
                ys.append(i + j * height)
                xs.append(s.roofline_fraction)
        statuses = sorted({s.status for c in cases if (s := c.system(name)) is not None and s.status != "ok"})
        label = name if xs else f"{name} ({'/'.join(statuses) or 'no data'})"
        ax.barh(ys, xs, height=height, label=label, color=colors(j % 10),
                edgecolor="black" if name == "prism" else None, linewidth=1.5 if name == "prism" else 0)
    ax.set_yticks([i + height * (n - 1) / 2 for i in range(len(cases))])
    ax.set_yticklabels([f"{c.workload} {c.label}" for c in cases], fontsize=8)
    ax.invert_yaxis()
    ax.axvline(1.0, color="gray", linestyle="--", linewidth=1)
    ax.set_xlabel("fraction of the roofline bound (higher is better; 1.0 = max(bytes/bandwidth, flops/peak))")
    m = report.machine
    ax.set_title(f"prism bench on {m.get('cpu')}, {m.get('threads')} threads\n"
                 "prism = search -> verify -> tune -> compile; hand = hand-written reference structure", fontsize=9)
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
