"""``prism search WORKLOAD_OR_FILE``: run a search with a live progress display.

WORKLOAD_OR_FILE is a built-in workload id or name (``W1``, ``rmsnorm_linear``) or a ``.py`` file that
defines ``graph`` (a ``prism.Graph``) or ``build() -> prism.Graph``.
"""

from __future__ import annotations

import argparse
import json
import runpy
import sys
import time
from pathlib import Path
from typing import Any

from prism.console import console as make_console
from prism.errors import PrismError
from prism.ir.graph import Graph


def _load(target: str, shape_index: int) -> tuple[Graph, dict[str, int], str]:
    if target.endswith(".py") or Path(target).is_file():
        path = Path(target)
        if not path.is_file():
            raise PrismError(f"no such file: {target}")
        ns = runpy.run_path(str(path))
        g = ns.get("graph")
        if g is None and callable(ns.get("build")):
            g = ns["build"]()
        if not isinstance(g, Graph):
            raise PrismError(f"{target} must define `graph` (a prism.Graph) or `build() -> prism.Graph`")
        return g, {}, path.name
    from prism.workloads import get

    w = get(target)
    if not 0 <= shape_index < len(w.shapes):
        raise PrismError(f"{w.id} has {len(w.shapes)} shapes; --shape must be in 0..{len(w.shapes) - 1}")
    s = w.shapes[shape_index]
    return w.program(s), w.env(s), f"{w.id} {w.name} ({w.shape_label(s)})"


def _parser() -> argparse.ArgumentParser:
    from prism.search.space import Limits

    d = Limits()
    p = argparse.ArgumentParser(prog="prism search", description="Search fused implementations (sGraphs) of a "
                                "program: symbolic grid sizes, for-loop range and maps; verified results, best first.")
    p.add_argument("target", help="workload id/name (W1..W7) or a .py file defining `graph` or `build()`")
    p.add_argument("--mode", choices=("symbolic", "concrete"), default="symbolic",
                   help="symbolic (default) or concrete (Mirage-style numbers up front, for comparison)")
    p.add_argument("--shape", type=int, default=0, help="workload shape index (default 0)")
    p.add_argument("--time-limit", type=float, default=d.time_limit, help=f"seconds of generation ({d.time_limit:g})")
    p.add_argument("--state-limit", type=int, default=d.state_limit, help=f"generated states ({d.state_limit})")
    p.add_argument("--max-kernel-ops", type=int, default=d.max_kernel_ops)
    p.add_argument("--max-customized", type=int, default=d.max_customized)
    p.add_argument("--max-block-ops", type=int, default=d.max_block_ops)
    p.add_argument("--max-block-inputs", type=int, default=d.max_block_inputs)
    p.add_argument("--max-block-outputs", type=int, default=d.max_block_outputs)
    p.add_argument("--max-accumulators", type=int, default=d.max_accumulators)
    p.add_argument("--max-results", type=int, default=d.max_results)
    p.add_argument("--no-split", action="store_true",
                   help="do not add split-reduction variants of the results (Limits.split_reductions=False)")
    p.add_argument("--workers", type=int, default=1, help="processes for independent sub-trees (default 1)")
    p.add_argument("--no-cache", action="store_true", help="ignore and do not write the result cache")
    p.add_argument("--json", default="", help="write results and statistics to this JSON file")
    p.add_argument("--show", type=int, default=1, help="print the IR of the best N results (default 1)")
    p.add_argument("--compare", action="store_true",
                   help="run symbolic and concrete mode with the same limits and report time and states of both")
    p.add_argument("--concrete-time-limit", type=float, default=None,
                   help="time budget of the concrete run of --compare (default: --time-limit)")
    return p


def main(argv: list[str] | None = None) -> int:
    from rich.live import Live
    from rich.table import Table

    from prism.search import Limits, search

    args = _parser().parse_args(sys.argv[1:] if argv is None else argv)
    console = make_console()
    try:
        graph, env, label = _load(args.target, args.shape)
        limits = Limits(args.max_kernel_ops, args.max_customized, args.max_block_ops, args.max_block_inputs,
                        args.max_block_outputs, args.max_accumulators, args.time_limit, args.state_limit,
                        args.max_results, not args.no_split)
    except PrismError as e:
        console.print(f"[red]error:[/] {e}")
        return 2
    console.print(f"[bold]prism search[/] {label} — mode {args.mode}, limits: kernel ops {limits.max_kernel_ops}, "
                  f"customized {limits.max_customized}, block ops {limits.max_block_ops}, accumulators "
                  f"{limits.max_accumulators}, {limits.time_limit:g} s")
    if args.compare:
        return _compare(console, graph, env, limits, args)
    state: dict[str, Any] = {"phase": "start"}
    t0 = time.monotonic()

    def render() -> Table:
        t = Table.grid(padding=(0, 2))
        el = time.monotonic() - t0
        if state.get("phase") == "verify":
            t.add_row("[cyan]verifying[/]", f"verified {state.get('verified', 0)}",
                      f"rejected {state.get('rejected', 0)}", f"{el:.1f} s")
        else:
            t.add_row("[cyan]generating[/]", f"kernel ops <= {state.get('level', '-')}",
                      f"states {state.get('states', 0):,}", f"structures {state.get('structures', 0):,}", f"{el:.1f} s")
        return t

    try:
        with Live(render(), console=console, transient=True, refresh_per_second=4) as live:
            def progress(ev: dict[str, Any]) -> None:
                state.update(ev)
                live.update(render())
            result = search(graph, limits, args.mode, env=env, workers=args.workers, cache=not args.no_cache,
                            progress=progress)
    except PrismError as e:
        console.print(f"[red]error:[/] {e}")
        return 2
    _report(console, result, args.show)
    if args.json:
        Path(args.json).write_text(json.dumps(result.to_json(), indent=1))
        console.print(f"results and statistics written to {args.json}")
    return 0 if result.candidates else 1


def _compare(console: Any, graph: Graph, env: dict[str, int], limits: Any, args: argparse.Namespace) -> int:
    """Symbolic and concrete mode on the same limits (the concrete run may get its own time budget)."""
    import dataclasses

    from rich.table import Table

    from prism.search import search

    runs = {}
    for mode in ("symbolic", "concrete"):
        lim = limits
        if mode == "concrete" and args.concrete_time_limit is not None:
            lim = dataclasses.replace(limits, time_limit=args.concrete_time_limit)
        with console.status(f"{mode} search ..."):
            runs[mode] = search(graph, lim, mode, env=env, workers=args.workers, cache=not args.no_cache)
    t = Table(title="symbolic vs concrete (same limits)")
    for col in ("mode", "stop reason", "seconds", "generation s", "states", "block searches", "verified",
                "best est. µs", "best structure"):
        t.add_column(col, overflow="fold")
    for mode, r in runs.items():
        gen = r.stats.seconds.get("generate", 0.0)
        best = r.best
        t.add_row(mode, r.stop_reason.value, f"{r.seconds:.1f}", f"{gen:.1f}", f"{r.stats.states:,}",
                  f"{r.stats.block_searches:,}", str(r.stats.verified),
                  f"{best.cost.seconds * 1e6:.1f}" if best else "-", best.structure if best else "-")
    console.print(t)
    sym, con = runs["symbolic"], runs["concrete"]
    bound = "" if con.stop_reason.value == "exhausted" else " (concrete stopped at its budget: a lower bound)"
    console.print(f"concrete / symbolic: time {con.seconds / max(sym.seconds, 1e-9):.1f}x, states "
                  f"{con.stats.states / max(sym.stats.states, 1):.1f}x{bound}")
    if args.json:
        Path(args.json).write_text(json.dumps({m: r.to_json() for m, r in runs.items()}, indent=1))
        console.print(f"results and statistics written to {args.json}")
    return 0 if sym.candidates else 1


def _report(console: Any, r: Any, show: int) -> None:
    from rich.table import Table

    s = r.stats
    head = (f"stop reason: [bold]{r.stop_reason.value}[/]  states {s.states:,} (kernel {s.states_kernel:,}, "
            f"block {s.states_block:,})  structures {s.block_structures:,}  sGraphs {s.sgraphs:,}  "
            f"verified {s.verified} / rejected {s.rejected}  {r.seconds:.1f} s")
    if r.cached:
        head += "  [dim](cached result)[/]"
    console.print(head)
    console.print(f"target (abstract): {r.target}")
    pr = Table(title="pruned, by rule")
    pr.add_column("rule")
    pr.add_column("count", justify="right")
    for k, v in sorted(s.pruned.items(), key=lambda kv: -kv[1]):
        pr.add_row(k, f"{v:,}")
    ph = Table(title="time per phase (s)")
    ph.add_column("phase")
    ph.add_column("seconds", justify="right")
    for k, v in sorted(s.seconds.items()):
        ph.add_row(k, f"{v:.3f}")
    console.print(pr, ph)
    if not r.candidates:
        console.print("[yellow]no verified candidate within these limits[/] (raise --max-block-ops / "
                      "--max-kernel-ops / --time-limit)")
        return
    t = Table(title=f"verified results, best first ({r.verification})")
    for col in ("#", "kernels", "est. µs", "DRAM MB", "working set KB", "representative params", "structure"):
        t.add_column(col, overflow="fold")
    for i, c in enumerate(r.candidates):
        t.add_row(str(i + 1), str(c.cost.kernels), f"{c.cost.seconds * 1e6:.1f}", f"{c.cost.dram_bytes / 1e6:.2f}",
                  f"{c.cost.working_set / 1024:.1f}", ", ".join(f"{k}={v}" for k, v in c.cost.params.items()),
                  c.structure)
    console.print(t)
    for c in r.candidates[:show]:
        console.print(str(c.graph), markup=False, highlight=False)
        console.print(f"verified ({c.verdict.how}): {c.verdict.detail}", markup=False, highlight=False)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
