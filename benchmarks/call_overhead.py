"""Per-call overhead of a tiny program, from the C call up to prism.optimize (docs/frontend.md quotes it).

    python benchmarks/call_overhead.py

Best of 5 repetitions of 20000 calls each, after a warm-up; one process; torch at 2 threads. Run it on an
idle machine (check /proc/loadavg) - another process on a core changes every number.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

import torch

import prism


def bench(f: Callable[[], object], n: int = 20000) -> float:
    for _ in range(200):
        f()
    best = []
    for _ in range(5):
        t = time.perf_counter()
        for _ in range(n):
            f()
        best.append((time.perf_counter() - t) / n * 1e6)
    return min(best)


def main() -> None:
    torch.set_num_threads(2)

    def fn(x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x * 2.0 + 1.0)
    x = torch.randn(8, 16)
    print(f"load {os.getloadavg()[0]:.2f}; program relu(x * 2 + 1) on [8, 16]")
    opt = prism.optimize(fn, (x,))
    optfx = prism.optimize(torch.fx.symbolic_trace(fn), (x,))
    with torch.inference_mode():
        runner = opt.prism_pieces()[-1].runner
        kernel, _order, variant, out_shapes = next(iter(runner._compiled.values()))
        out = torch.empty(out_shapes[0])
        ptrs = [x.data_ptr(), out.data_ptr()]
        compiled_eager = torch.compile(fn, backend="eager")
        rows = [("eager PyTorch", lambda: fn(x)),
                ("C call (Variant.run: ctypes, OpenMP entry)", lambda: variant.run(ptrs)),
                ("Kernel.call_tensors (outputs allocated)", lambda: kernel.call_tensors([x])),
                ("Kernel.call (dict of inputs, checks)", lambda: kernel.call({kernel.input_names[0]: x})),
                ("piece runner (input checks + call)", lambda: runner(x)),
                ("prism.optimize(fx.GraphModule)", lambda: optfx(x)),
                ("torch.compile(backend='eager') (Dynamo alone)", lambda: compiled_eager(x)),
                ("prism.optimize(function) (through Dynamo)", lambda: opt(x))]
        for name, f in rows:
            print(f"{name:48s} {bench(f):7.1f} µs")
    print(f"load {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
