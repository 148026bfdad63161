"""A weight read as stored ([m, d], the nt micro-kernels) against a transposed copy ([d, m], nn), batch 1.

    python benchmarks/gemv_layout.py [n d m] [blocks]      (default: 1 4096 11008, 40 blocks)

Both programs (``silu(X @ W)`` and ``silu(X @ permute(W'))``) are superoptimized, then called in one
process in alternating blocks of 5 calls (the order swapped every block), into one preallocated output;
medians of the per-call time per block. Run it on an idle machine: the memory bandwidth of this host
drifts within seconds, which is why only the interleaved ratio means anything.
"""

from __future__ import annotations

import sys
import time

import numpy as np

import prism


def main() -> None:
    a = [int(v) for v in sys.argv[1:]]
    n, d, m = a[:3] if len(a) >= 3 else (1, 4096, 11008)
    blocks = a[3] if len(a) > 3 else 40
    g1 = prism.Graph("gemv_nn")
    g1.output(g1.silu(g1.matmul(g1.input("X", (n, d)), g1.input("W", (d, m)))), "Y")
    g2 = prism.Graph("gemv_nt")
    g2.output(g2.silu(g2.matmul(g2.input("X", (n, d)), g2.permute(g2.input("W", (m, d)), (1, 0)))), "Y")
    k1, k2 = prism.superoptimize(g1), prism.superoptimize(g2)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((n, d), dtype=np.float32)
    w = (rng.standard_normal((d, m), dtype=np.float32) / np.sqrt(d)).astype(np.float32)
    wt = np.ascontiguousarray(w.T)
    out = np.empty((n, m), np.float32)
    runs = {"transposed copy (nn)": lambda: k1.call({"X": x, "W": w}, out=out),
            "as stored (nt)": lambda: k2.call({"X": x, "W": wt}, out=out)}
    times: dict[str, list[float]] = {k: [] for k in runs}
    for f in runs.values():
        for _ in range(5):
            f()
    names = list(runs)
    for b in range(blocks):
        for name in names if b % 2 == 0 else names[::-1]:
            t = time.perf_counter()
            for _ in range(5):
                runs[name]()
            times[name].append((time.perf_counter() - t) / 5 * 1e6)
    med = {k: float(np.median(v)) for k, v in times.items()}
    print(f"n={n} d={d} m={m} ({4 * d * m / 2**20:.0f} MiB of weights), {blocks} blocks")
    for k, v in med.items():
        print(f"  {k:22s} {v:9.0f} µs")
    print(f"  as stored / transposed copy: {med[names[1]] / med[names[0]]:.3f}")


if __name__ == "__main__":
    main()
