"""``prism bench``: argument parsing, progress display, and output files."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from prism.console import console
from prism.errors import PrismError
from prism.host import usable_cores
from prism.workloads.precision import MODEL_PRECISIONS, PRECISIONS


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="prism bench",
        description="Benchmark Prism against PyTorch eager/SDPA, torch.compile (default, max-autotune), JAX jit "
                    "and ONNX Runtime on the WORKLOADS.md suite, with each case's roofline bound. Prism's numbers "
                    "come from its pipeline (search -> verify -> tune -> compile); the 'hand' column is the "
                    "hand-written structure compiled by Prism's code generator (a labelled reference).")
    p.add_argument("--workloads", default=None,
                   help="comma-separated ids, e.g. W1,W6 (default: all; --quick: W1,W6)")
    p.add_argument("--systems", default=None,
                   help="comma-separated: torch (eager + sdpa), sdpa, compile, max-autotune, jax, ort, baselines "
                        "(default: all; prism is included unless --no-prism)")
    p.add_argument("--no-prism", action="store_true",
                   help="leave Prism out (characterize the baselines alone)")
    p.add_argument("--rounds", type=int, default=None, help="timed rounds per case (default 5; --quick: 3)")
    p.add_argument("--quick", action="store_true", help="one small shape per workload, few rounds (~2 min)")
    p.add_argument("--shape", default=None, metavar="K=V[,K=V]",
                   help="only the cases whose shape has these dims, e.g. n=1 (the decode cases)")
    p.add_argument("--dtype", default="float32", choices=MODEL_PRECISIONS,
                   help="precision of the suite's programs: bfloat16 / float16 (every tensor, as "
                        "model.to(torch.bfloat16)) "
                        "or int8w (int8 weight-only, per-channel scales: W1-W3, W7; with --models every Linear; "
                        "int8w-bf16: the same in a bfloat16 model; w8a8, --models only: int8 activations too, "
                        "quantized per row at each call); "
                        "every system runs the same values (default float32)")
    p.add_argument("--threads", type=int, default=None, help="threads for every system (default: usable cores)")
    p.add_argument("--block-ms", type=float, default=50.0, help="timed block per system per round (ms)")
    p.add_argument("--warmup-ms", type=float, default=10.0, help="untimed warm-up at each visit (ms)")
    p.add_argument("--settle-ms", type=float, default=20.0,
                   help="pause after each visit (ms), then wait (at most 500 ms) until this process's other "
                        "threads -- a library's spinning workers -- are idle")
    p.add_argument("--seed", type=int, default=0, help="seed of the random inputs")
    p.add_argument("--json", metavar="PATH", help="write the full report (raw samples included) as JSON")
    p.add_argument("--plot", metavar="PATH", help="write a PNG chart of each system's fraction of the roofline")
    p.add_argument("--no-details", action="store_true", help="print only the summary table")
    p.add_argument("--corpus", action="store_true",
                   help="benchmark the corpus of small PyTorch programs (prism/bench/corpus.py) instead of the "
                        "suite: eager, torch.compile and prism.optimize, checked against float64, interleaved")
    p.add_argument("--corpus-filter", metavar="SUBSTR", default=None,
                   help="with --corpus: only the programs whose name contains SUBSTR")
    p.add_argument("--models", nargs="?", const="default", default=None, metavar="NAMES",
                   help="benchmark Hugging Face decoders end to end (generate(): start-up, prefill, decode tokens/s, "
                        "memory, share on Prism, decode roofline) under eager, torch.compile and Prism; NAMES: "
                        "comma-separated from prism/bench/models.py (default llama-1b; --quick: llama-small). "
                        "Needs transformers (pip install -e '.[models]')")
    p.add_argument("--batch", type=int, default=1,
                   help="with --models: sequences per generate() (default 1; llama.cpp runs at batch 1 only)")
    p.add_argument("--prompt", type=int, default=128, help="with --models: prompt tokens (default 128)")
    p.add_argument("--new-tokens", type=int, default=None,
                   help="with --models: tokens generated per timed call (default 32; --quick: 16)")
    p.add_argument("--new-lengths", default=None, metavar="N,N",
                   help="with --models: prompt + N tokens, the new prompt lengths timed after the rounds (default "
                        "13,29; 'none' skips them)")
    p.add_argument("--first-token", action="store_true",
                   help="with --models: after the rounds, time the first token of a new process per compiling "
                        "system on the caches the run filled (the model built untimed)")
    p.add_argument("--dynamic", action="store_true",
                   help="with --models: torch.compile(..., dynamic=True) for both compilers (every size symbolic from "
                        "the first capture: no second capture and search when a prompt length or the KV length "
                        "first changes; default: Dynamo's static-first)")
    p.add_argument("--fresh-tokens", type=int, default=None, metavar="N",
                   help="with --models: tokens decoded past the KV lengths the rounds saw, timed once after the "
                        "rounds (a generate() longer than any before; default 34, 0 skips)")
    return p


def _shape_filter(spec: str | None) -> dict[str, int]:
    out: dict[str, int] = {}
    for part in (p.strip() for p in (spec or "").split(",")):
        if not part:
            continue
        k, _, v = part.partition("=")
        try:
            out[k.strip()] = int(v)
        except ValueError:
            raise PrismError(f"--shape: expected K=V with an integer V, got {part!r}") from None
    return out


class _RichProgress:
    def __init__(self, progress: Progress) -> None:
        self.p = progress
        self.task = progress.add_task("starting", total=None)
        self.label = ""

    def case(self, index: int, total: int, label: str, steps: int) -> None:
        self.label = f"[{index + 1}/{total}] {label}"
        self.p.reset(self.task, total=steps, description=self.label)

    def step(self, message: str) -> None:
        self.p.update(self.task, description=f"{self.label}: {message}")
        self.p.advance(self.task)


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(list(argv) if argv is not None else None)
    out = console()
    err = console(stderr=True)
    threads = args.threads or usable_cores()
    if args.models is not None:
        from prism.bench.models import main as models_main
        from prism.bench.systems import configure_threads
        configure_threads(threads)
        return models_main(args, threads)
    if args.corpus:
        from prism.bench.corpus_run import main as corpus_main
        from prism.bench.systems import configure_threads
        configure_threads(threads)
        return corpus_main(args, threads)
    try:
        if args.dtype not in PRECISIONS:
            raise PrismError(f"--dtype {args.dtype} is for --models only (the suite's workloads have the precisions "
                             f"{', '.join(PRECISIONS)})")
        # thread flags must be in the environment before jax/torch spin up their pools
        from prism.bench.systems import configure_threads, select
        warnings = configure_threads(threads)
        systems = select(args.systems, prism=not args.no_prism)
        from prism.bench.run import Config, default_workloads, run, select_cases
        wl = ([w.strip().upper() for w in args.workloads.split(",") if w.strip()] if args.workloads else
              default_workloads(args.dtype, args.quick))
        rounds = args.rounds if args.rounds is not None else (3 if args.quick else 5)
        if rounds < 1:
            raise PrismError(f"--rounds must be >= 1, got {rounds}")
        cfg = Config(workloads=wl, rounds=rounds, block_ms=args.block_ms, warmup_ms=args.warmup_ms,
                     settle_ms=args.settle_ms,
                     threads=threads, seed=args.seed, quick=args.quick, precision=args.dtype,
                     shape=_shape_filter(args.shape))
        if not select_cases(cfg.workloads, cfg.quick, cfg.precision, cfg.shape):  # validate before the slow part
            raise PrismError(f"no case of {cfg.workloads} has the shape {args.shape}")
    except PrismError as e:
        err.print(f"[red]prism bench: {e}[/red]")
        return 2
    from prism.bench.machine import machine_info
    from prism.bench.report import plot, render
    from prism.tune.native import Limits
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=err, transient=True) as progress:
        rp = _RichProgress(progress)
        progress.update(rp.task, description="measuring peak FLOP/s and triad bandwidth")
        limits = Limits.load(threads)
        peak = limits.peak_flops()
        report = run(cfg, systems, limits, machine_info(threads), peak_flops=peak, progress=rp, warnings=warnings)
    if args.json:  # first: the raw data survives any problem in rendering
        report.write(args.json)
        err.print(f"wrote {args.json}")
    render(report, out, details=not args.no_details)
    if args.plot:
        plot(report, args.plot)
        err.print(f"wrote {args.plot}")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
