"""Time the Llama-style decoder layer (examples/llama.py): eager PyTorch, ``torch.compile`` (default
backend, Inductor), ``prism.optimize`` and ``torch.compile(backend="prism")``.

    python -m prism.frontend.examples.bench_llama [--batches 3 5] [--reps 200] [--threads N]

Prints the median time per call (after warm-up, variants interleaved round by round so that load from
other processes falls on all of them alike) and the pieces Prism runs. Numbers, not assertions: the
benchmarks of record are ``prism bench``'s.
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any


def _time_rounds(fns: dict[str, Callable[[], Any]], reps: int, rounds: int = 5) -> dict[str, float]:
    samples: dict[str, list[float]] = {k: [] for k in fns}
    per_round = max(1, reps // rounds)
    for _ in range(rounds):
        for name, fn in fns.items():
            for _ in range(per_round):
                t0 = time.perf_counter()
                fn()
                samples[name].append(time.perf_counter() - t0)
    return {k: statistics.median(v) for k, v in samples.items()}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batches", type=int, nargs="+", default=[3, 5])
    p.add_argument("--reps", type=int, default=200)
    p.add_argument("--threads", type=int, default=0, help="threads for PyTorch and Prism (default: all cores)")
    p.add_argument("--no-inductor", action="store_true", help="skip torch.compile's default backend")
    args = p.parse_args(argv)
    # PyTorch and Prism's kernels share libgomp: spinning idle threads of one steal the cores of the other
    # (tens of ms per call on a loaded 2-core machine); passive waiting must be set before torch loads
    if "torch" not in sys.modules:
        os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

    import torch

    import prism
    from prism.frontend.examples.llama import make_inputs, make_layer

    threads = args.threads or len(os.sched_getaffinity(0))
    torch.set_num_threads(threads)
    os.environ["PRISM_NUM_THREADS"] = str(threads)
    layer = make_layer()
    dyn = {0: [0], 3: [0], 4: [0]}
    t0 = time.perf_counter()
    opt = prism.optimize(layer, make_inputs(layer, args.batches[0]), dynamic=dyn)
    print(f"prism.optimize: {time.perf_counter() - t0:.1f} s (search, tuning at batch {args.batches[0]}, compile)")
    variants: dict[str, Callable[..., Any]] = {"eager": layer, "prism.optimize": opt}
    if not args.no_inductor:
        variants["torch.compile (inductor)"] = torch.compile(layer, dynamic=False)
    variants['torch.compile(backend="prism")'] = torch.compile(layer, backend="prism")
    print(f"OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY', '')}; threads: {threads}; "
          f"median per call over {args.reps} calls per variant, interleaved")
    with torch.no_grad():
        for b in args.batches:
            ins = make_inputs(layer, b, seed=b)
            for i in (0, 3, 4):
                torch._dynamo.mark_dynamic(ins[i], 0)
            for name, fn in variants.items():  # warm-up: compiles, tunes at this batch size
                t0 = time.perf_counter()
                for _ in range(3):
                    fn(*ins)
                if time.perf_counter() - t0 > 1.0:
                    print(f"  warm-up of {name} at batch {b}: {time.perf_counter() - t0:.1f} s")
            calls = {k: functools.partial(f, *ins) for k, f in variants.items()}
            res = _time_rounds(calls, args.reps)
            base = res["eager"]
            print(f"batch {b}:")
            for name, s in res.items():
                print(f"  {name:34} {s * 1e6:9.1f} us   {base / s:5.2f}x eager")
    print()
    print(opt.explain())
    print(f"torch.compile(backend=\"prism\"): {len(prism.frontend.reports()) - len(opt.report)} graph(s) captured")
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
