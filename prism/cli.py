"""The ``prism`` command line: ``prism workloads | bench | search | optimize | cache | version``.

Subcommands owned by a stage (bench, search, optimize, cache) parse their own arguments."""

from __future__ import annotations

import argparse
import json
import sys


def _workloads(args: argparse.Namespace) -> int:
    from rich.table import Table

    from prism.console import console as make_console
    from prism.workloads import WORKLOADS, get

    console = make_console()
    chosen = [get(k) for k in args.workloads.split(",")] if args.workloads else list(WORKLOADS.values())
    if not args.check:
        t = Table(title="Prism built-in workloads (WORKLOADS.md)")
        for col in ("id", "name", "program", "shapes", "known-good structure"):
            t.add_column(col, overflow="fold")
        for w in chosen:
            t.add_row(w.id, w.name, w.formula, "\n".join(w.shape_label(s) for s in w.shapes), w.structure)
        console.print(t)
        return 0

    from rich.progress import Progress

    from prism.workloads.check import RTOL, check_all

    total = sum(len(w.shapes) * 2 * (1 + len(w.alt_params(w.shapes[0]))) for w in chosen)
    console.print("[bold]Checking the hand-written structures (block-graph interpreter) against each program's "
                  f"float64 reference[/] (pass: relative error <= {RTOL:g}, finite on hostile inputs)")
    with Progress(console=console, transient=True) as prog:
        task = prog.add_task("checking", total=total)
        results = check_all(chosen, on_case=lambda r: prog.update(
            task, advance=1, description=f"{r.workload} {r.shape} {r.kind}"))
    t = Table(title="hand-written structure vs program (float64)")
    for col in ("workload", "shape", "inputs", "instantiations", "max rel. error", "status"):
        t.add_column(col)
    groups: dict[tuple[str, str, str], list] = {}
    for r in results:
        groups.setdefault((r.workload, r.shape, r.kind), []).append(r)
    for (wid, shape, kind), rs in groups.items():
        ok = all(r.ok for r in rs)
        t.add_row(wid, shape, kind, str(len(rs)), f"{max(r.error for r in rs):.2e}",
                  "[green]ok[/]" if ok else "[red]FAIL[/]")
    console.print(t)
    failed = [r for r in results if not r.ok]
    if args.json:
        with open(args.json, "w") as f:
            json.dump([{**r.__dict__, "ok": r.ok} for r in results], f, indent=1)
    console.print(f"{len(results) - len(failed)} passed, {len(failed)} failed")
    return 1 if failed else 0


def _bench(args: argparse.Namespace, rest: list[str]) -> int:
    try:
        from prism.bench import main as bench_main
    except ImportError as e:  # pragma: no cover - until the benchmark harness lands
        print(f"prism bench is not available in this build ({e})", file=sys.stderr)
        return 2
    return int(bench_main(rest))


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(prog="prism", description="Prism: a symbolic superoptimizer for tensor programs")
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("workloads", help="list the built-in workloads W1-W7 (--check: verify their hand-written "
                                         "structures against the programs)")
    p.add_argument("--check", action="store_true", help="run every hand-written structure through the reference "
                                                       "interpreters at every shape, normal and hostile inputs")
    p.add_argument("--workloads", default="", help="comma-separated ids or names (default: all)")
    p.add_argument("--json", default="", help="write the check results to this JSON file")
    sub.add_parser("bench", help="benchmark the workloads against PyTorch/JAX/ONNX Runtime (see prism bench -h)",
                   add_help=False)
    sub.add_parser("search", help="search fused implementations of a workload or a program file "
                                  "(see prism search -h)", add_help=False)
    sub.add_parser("optimize", help="superoptimize a PyTorch model defined in FILE.py (see prism optimize -h)",
                   add_help=False)
    sub.add_parser("cache", help="list or clear the on-disk caches (prism cache ls|clear)", add_help=False)
    sub.add_parser("version", help="print the version")
    if argv and argv[0] == "bench":
        return _bench(parser.parse_args(["bench"]), argv[1:])
    if argv and argv[0] == "search":
        from prism.search.cli import main as search_main
        return int(search_main(argv[1:]))
    if argv and argv[0] == "optimize":
        from prism.frontend.cli import optimize_main
        return int(optimize_main(argv[1:]))
    if argv and argv[0] == "cache":
        from prism.frontend.cli import cache_main
        return int(cache_main(argv[1:]))
    args = parser.parse_args(argv)
    if args.cmd == "workloads":
        return _workloads(args)
    if args.cmd == "version":
        from prism import __version__
        print(__version__)
        return 0
    return 2  # pragma: no cover


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
