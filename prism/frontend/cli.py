"""``prism optimize FILE.py`` and ``prism cache ls|clear|retune`` (wired into ``prism.cli``).

``prism optimize FILE.py``: FILE is run as a script; it must define

* ``model``: an ``nn.Module`` or a function (``fn`` is accepted too), and
* ``example_inputs``: a tensor or a tuple of positional arguments;

optionally ``dynamic`` (as ``prism.optimize``'s argument, e.g. ``{0: [0]}``: dim 0 of the first input is
symbolic) and ``options`` (a dict of ``prism.optimize`` options). The command superoptimizes it with a
progress bar, prints which pieces run on Prism and what stays in PyTorch, checks the result against
eager PyTorch, and with ``--bench`` times both. Exit status: 0 ok, 1 the check failed, 2 bad file/usage.

``prism cache ls`` lists ``$PRISM_CACHE_DIR`` (compiled kernels, search results, tuning results,
machine measurements); ``prism cache clear [kernels|search|tuning|all]`` deletes them; ``prism cache retune``
tunes again the entries stored as measured under contention (other processes loaded the machine), and tunes
the shapes served from a tuning more than 2x away (pending: ``api.DERIVE_WINDOW``).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any

from prism.console import console as make_console

CATEGORIES = {  # name -> (sub-path of the cache dir, what it holds)
    "kernels": ("so", "compiled kernels (.c sources, .so libraries, sidecars)"),
    "search": ("search", "search results (verified sGraphs per program and limits)"),
    "tuning": ("tune/results", "tuning results (per program, shape and machine)"),
    "machine": ("tune/machine", "machine measurements (bandwidth, peak FLOP/s)"),
}


def _root() -> Path:
    from prism.runtime.cache import cache_dir
    return cache_dir()


def _usage(dirpath: Path) -> tuple[int, int]:
    files = size = 0
    if dirpath.is_dir():
        for p in dirpath.rglob("*"):
            if p.is_file():
                files += 1
                size += p.stat().st_size
    return files, size


def _human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


def cache_main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="prism cache", description="list or clear Prism's on-disk caches "
                                "($PRISM_CACHE_DIR, else $XDG_CACHE_HOME/prism, else ~/.cache/prism)")
    sub = p.add_subparsers(dest="cmd", required=True)
    ls = sub.add_parser("ls", help="list the cache's contents per category")
    ls.add_argument("--json", action="store_true", help="print JSON instead of a table")
    ls.add_argument("-v", "--verbose", action="store_true", help="also list every entry")
    rt = sub.add_parser("retune", help="tune again the entries stored as measured under contention, and tune the "
                        "shapes served from a tuning more than 2x away (pending); run it when the machine is quiet")
    rt.add_argument("--list", action="store_true", help="only list the marked and pending entries")
    cl = sub.add_parser("clear", help="delete cache entries")
    cl.add_argument("what", nargs="*", metavar="{" + ",".join([*CATEGORIES, "all"]) + "}",
                    help="categories to delete (default: all)")
    args = p.parse_args(list(sys.argv[1:] if argv is None else argv))
    if args.cmd == "clear":
        bad = [w for w in args.what if w not in (*CATEGORIES, "all")]
        if bad:
            p.error(f"unknown cache categories {bad}; choose from {[*CATEGORIES, 'all']}")
        args.what = args.what or ["all"]
    root = _root()
    if args.cmd == "retune":
        return _retune(args.list)
    if args.cmd == "ls":
        rows = []
        for name, (sub_path, what) in CATEGORIES.items():
            files, size = _usage(root / sub_path)
            rows.append({"category": name, "path": str(root / sub_path), "files": files, "bytes": size,
                         "holds": what})
        if args.json:
            print(json.dumps({"root": str(root), "categories": rows}, indent=1))
            return 0
        from rich.table import Table
        console = make_console()
        t = Table(title=f"Prism cache: {root}")
        for col in ("category", "files", "size", "path", "holds"):
            t.add_column(col, overflow="fold")
        for r in rows:
            t.add_row(r["category"], str(r["files"]), _human(r["bytes"]), r["path"], r["holds"])
        console.print(t)
        if args.verbose:
            for name, (sub_path, _) in CATEGORIES.items():
                d = root / sub_path
                if d.is_dir():
                    for f in sorted(x for x in d.rglob("*") if x.is_file()):
                        console.print(f"  {name:8} {_human(f.stat().st_size):>10}  {f.relative_to(root)}")
        return 0
    chosen = list(CATEGORIES) if "all" in args.what else list(dict.fromkeys(args.what))
    total_files = total_bytes = 0
    for name in chosen:
        d = root / CATEGORIES[name][0]
        files, size = _usage(d)
        if d.exists():
            shutil.rmtree(d)
        total_files, total_bytes = total_files + files, total_bytes + size
        print(f"cleared {name}: {files} files, {_human(size)} ({d})")
    print(f"removed {total_files} files, {_human(total_bytes)} in total")
    return 0


def _retune(only_list: bool) -> int:
    from prism.api import contended_entries, retune_contended
    marked = contended_entries()
    print(f"{len(marked)} tuning entries are marked as measured under contention or pending (served from a tuning "
          "more than 2x away)")
    if only_list:
        for path in marked:
            print(f"  {path}")
        return 0

    def progress(i: int, n: int, text: str) -> None:
        print(f"[{i + 1}/{n}] tuning {text} again", flush=True)
    rows = retune_contended(progress)
    for r in rows:
        print(f"  {r.status:16} {r.program} {r.shape}")
    still = sum(r.status == "still contended" for r in rows)
    if still:
        print(f"{still} entries were measured under contention again and stay marked: run this when the machine "
              "is quiet")
    return 0


# --- prism optimize ---------------------------------------------------------------------------------------

class _BadFile(Exception):
    """The user's file cannot be used (exit status 2, one message, no traceback)."""


def _load(path: str) -> dict[str, Any]:
    import runpy
    import traceback
    if not os.path.isfile(path):
        raise _BadFile(f"no such file {path!r}")
    try:
        return runpy.run_path(path, run_name="__prism_optimize__")
    except SyntaxError as e:
        raise _BadFile(f"{path} has a syntax error at line {e.lineno}: {e.msg}") from None
    except Exception as e:
        where = traceback.extract_tb(e.__traceback__)[-1]
        raise _BadFile(f"running {path} raised {type(e).__name__}: {e} (at {where.filename}:{where.lineno})") from None


def _check_inputs(ex: Any, path: str) -> None:
    import torch
    bad = [f"argument {i}: {type(a).__name__}" for i, a in enumerate(ex)
           if not isinstance(a, (torch.Tensor, int, float, bool))]
    if bad:
        raise _BadFile(f"{path}: example_inputs must be a tensor or a tuple of tensors (and Python numbers); "
                       f"got {', '.join(bad)}")


def _max_rel_err(got: Any, ref: Any) -> float:
    import torch
    import torch.utils._pytree as pytree
    worst = 0.0
    for a, b in zip(pytree.tree_leaves(got), pytree.tree_leaves(ref)):
        if isinstance(b, torch.Tensor) and b.is_floating_point():
            scale = float(b.abs().max()) or 1.0
            worst = max(worst, float((a.float() - b.float()).abs().max()) / scale)
    return worst


def _median_s(fn: Any, args: tuple, reps: int) -> float:
    import statistics
    for _ in range(2):
        fn(*args)
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn(*args)
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def optimize_main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="prism optimize", description="superoptimize a PyTorch model defined in a "
                                "file (globals `model` and `example_inputs`; optional `dynamic`, `options`)")
    p.add_argument("file")
    p.add_argument("--time-limit", type=float, default=None, help="search seconds per piece (default 60)")
    p.add_argument("--top-k", type=int, default=None, help="candidates measured per piece and shape")
    p.add_argument("--bench", action="store_true", help="time eager PyTorch and the optimized model")
    p.add_argument("--reps", type=int, default=20, help="timed calls per variant with --bench")
    p.add_argument("--explain", action="store_true", help="print every Prism kernel's explain() as well")
    p.add_argument("--tolerance", type=float, default=1e-4,
                   help="max |optimized - eager| / max |eager| (default 1e-4)")
    p.add_argument("--capture", choices=("auto", "dynamo", "export"), default="auto",
                   help="auto (default: torch.export once, no Dynamo per call, Python state fixed at capture; Dynamo "
                        "where the export fails or a call does not match it), dynamo (graph breaks fine, Dynamo's "
                        "guards per call) or export (export only; docs/frontend.md)")
    args = p.parse_args(list(sys.argv[1:] if argv is None else argv))
    if "torch" not in sys.modules:  # see docs/frontend.md "Threads": PyTorch and Prism share libgomp
        os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    try:
        return _optimize(args)
    except _BadFile as e:
        print(f"prism optimize: {e}", file=sys.stderr)
        return 2


def _optimize(args: argparse.Namespace) -> int:
    ns = _load(args.file)
    model = ns.get("model", ns.get("fn"))
    if model is None or "example_inputs" not in ns:
        raise _BadFile(f"{args.file} must define `model` (an nn.Module or a function) and `example_inputs` (a tensor "
                       "or a tuple of arguments)")
    if not callable(model):
        raise _BadFile(f"{args.file}: `model` must be an nn.Module or a function, got {type(model).__name__}")
    import torch
    from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    import prism
    from prism.frontend.api import _as_args

    console = make_console(stderr=True)
    try:
        ex = _as_args(ns["example_inputs"])
    except TypeError as e:
        raise _BadFile(f"{args.file}: {e}") from None
    _check_inputs(ex, args.file)
    try:
        with torch.no_grad():
            ref = model(*ex)
    except Exception as e:
        raise _BadFile(f"the model in {args.file} raised {type(e).__name__} on example_inputs: {e}") from None
    options = dict(ns.get("options") or {})
    if args.time_limit is not None:
        options["time_limit"] = args.time_limit
    if args.top_k is not None:
        options["top_k"] = args.top_k
    with Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/"
                  "{task.total}"), TimeElapsedColumn(), console=console, transient=True) as prog:
        task = prog.add_task("capturing", total=None)

        def progress(event: str, i: int, n: int, label: str) -> None:
            if event == "search":
                prog.update(task, total=n, completed=i - 1, description=f"superoptimizing {label}")
            else:
                prog.update(task, total=n, completed=i)
        options["progress"] = progress
        t0 = time.perf_counter()
        try:
            opt = prism.optimize(model, ex, dynamic=ns.get("dynamic"), capture=args.capture, options=options)
        except prism.UnsupportedError as e:  # e.g. the function does not export: the message names the fix
            raise _BadFile(str(e)) from None
        prog.update(task, description="done")
    console.print(f"[bold]optimized in {time.perf_counter() - t0:.1f} s[/]")
    print(opt.explain(kernels=args.explain))
    with torch.no_grad():
        got = opt(*ex)
    err = _max_rel_err(got, ref)
    ok = err <= args.tolerance
    print(f"check against eager PyTorch: max |optimized - eager| / max |eager| = {err:.2e} "
          f"({'ok' if ok else 'FAILED'}, tolerance {args.tolerance:g})")
    if args.bench:
        with torch.no_grad():
            te = _median_s(model, ex, args.reps)
            tp = _median_s(opt, ex, args.reps)
        print(f"median per call: eager {te * 1e6:.1f} us, prism {tp * 1e6:.1f} us ({te / tp:.2f}x)")
    return 0 if ok else 1
