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
from prism.runtime import fastcall


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
    optex = prism.optimize(fn, (x,), capture="export")
    with torch.inference_mode():
        runner = opt.prism_pieces()[-1].runner
        kernel = runner.kernel.specialize().kernel
        variant, out_shapes = kernel.variant_for((tuple(x.shape),))
        launch = kernel.torch_launcher((tuple(x.shape),))
        # the same launch through the Python launcher (ctypes), as where the C one cannot be built
        os.environ["PRISM_C_LAUNCHER"] = "0"
        fastcall.reset()
        py_launch = variant.torch_launcher(out_shapes, kernel.torch_output_dtypes())
        del os.environ["PRISM_C_LAUNCHER"]
        fastcall.reset()
        out = torch.empty(out_shapes[0])
        ptrs = [x.data_ptr(), out.data_ptr()]
        arr = variant.ptr_type(*ptrs)
        ws = variant.workspace(torch.get_num_threads())
        nth = torch.get_num_threads()
        compiled_eager = torch.compile(fn, backend="eager")
        rows = [("eager PyTorch", lambda: fn(x)),
                ("ctypes call of the entry (no Python around it)", lambda: variant.fn(arr, ws, nth)),
                ("Variant.run (pointer array, threads, lock)", lambda: variant.run(ptrs)),
                ("the launch in Python (ctypes; PRISM_C_LAUNCHER=0)", lambda: py_launch([x])),
                ("Kernel.torch_launcher's launch (C launcher)", lambda: launch([x])),
                ("Kernel.call_tensors (+ variant lookup)", lambda: kernel.call_tensors([x])),
                ("Kernel.call (dict of inputs, checks)", lambda: kernel.call({kernel.input_names[0]: x})),
                ("piece runner (input checks + launch)", lambda: runner(x)),
                ("prism.optimize(fn, capture='export')", lambda: optex(x)),
                ("prism.optimize(fx.GraphModule)", lambda: optfx(x)),
                ("torch.compile(backend='eager') (Dynamo alone)", lambda: compiled_eager(x)),
                ("prism.optimize(function) (through Dynamo)", lambda: opt(x))]
        for name, f in rows:
            print(f"{name:52s} {bench(f):7.1f} µs")
    print(f"load {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
