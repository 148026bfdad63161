"""Quick measurement of generated kernels (not the benchmark suite; that is ``prism bench``).

    PRISM_NUM_THREADS=2 python -m prism.codegen.measure W1:2 W1:2:G=8,F=16 W6:3 --torch

For each case ``<workload>:<shape index>``: the median time of the compiled hand-written structure
(``kernel.call`` into a reused output buffer), of the same program in numpy, and (``--torch``) in torch
eager, in interleaved blocks of calls; the bytes the kernel must move (inputs + output) over its
median (GB/s); and a STREAM-like triad measured right before the case, because this VM's bandwidth
drifts. Inputs are 64-byte aligned, as in the benchmark harness.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from collections.abc import Callable

import numpy as np

from prism.runtime.kernel import _aligned_empty, compile
from prism.workloads import WORKLOADS


def _median_us(fn: Callable[[], object], seconds: float, min_calls: int = 20) -> list[float]:
    fn()
    ts: list[float] = []
    t_end = time.perf_counter() + seconds
    while time.perf_counter() < t_end or len(ts) < min_calls:
        t0 = time.perf_counter()
        fn()
        ts.append((time.perf_counter() - t0) * 1e6)
    return ts


def triad_gbps(n: int = 1 << 24) -> float:
    """a = b + 2c over 3 x 64 MiB with the same thread count, via a generated kernel."""
    from prism.ir.graph import Graph
    g = Graph("triad")
    b, c = g.input("B", (n,)), g.input("C", (n,))
    g.output(g.add(b, g.mul_scalar(c, 2.0)), "A")
    k = compile(g)
    x = {"B": _aligned_empty((n,)), "C": _aligned_empty((n,))}
    x["B"].fill(1.0)
    x["C"].fill(2.0)
    out = _aligned_empty((n,))
    ts = _median_us(lambda: k.call(x, out=out), 0.3, 10)
    return 3 * 4 * n / (statistics.median(ts) * 1e-6) / 1e9


def _numpy_program(wid: str, x: dict[str, np.ndarray]) -> Callable[[], object]:
    def rms(a: np.ndarray) -> np.ndarray:
        return a / np.sqrt((a * a).mean(-1, keepdims=True) + np.float32(1e-6))

    def sdpa(q: np.ndarray, k: np.ndarray, v: np.ndarray) -> np.ndarray:
        s = q @ np.swapaxes(k, -1, -2) * np.float32(1 / np.sqrt(q.shape[-1]))
        e = np.exp(s - s.max(-1, keepdims=True))
        return (e / e.sum(-1, keepdims=True)) @ v

    def silu(a: np.ndarray) -> np.ndarray:
        return a / (1 + np.exp(-a))
    programs: dict[str, Callable[[], object]] = {
        "W1": lambda: rms(x["X"]) @ x["W"],
        "W2": lambda: (rms(x["X"]) @ x["Wu"]) * (rms(x["X"]) @ x["Wg"]),
        "W3": lambda: silu(x["X"] @ x["Wg"]) * (x["X"] @ x["Wu"]),
        "W4": lambda: sdpa(x["Q"], x["K"], x["V"]),
        "W5": lambda: sdpa(rms(x["Q"]), rms(x["K"]), x["V"]),
        "W6": lambda: sdpa(x["Q"].reshape(x["Q"].shape[0], 8, 4, 128), x["K"], x["V"]),
        "W7": lambda: x["X"] @ x["W"] + (x["X"] @ x["A"]) @ x["B"],
    }
    return programs[wid]


def _torch_program(wid: str, x: dict[str, np.ndarray]) -> Callable[[], object]:
    import torch  # only for this optional comparison
    import torch.nn.functional as F
    t = {k: torch.from_numpy(v) for k, v in x.items()}

    def rms(a):  # type: ignore[no-untyped-def]
        return a * torch.rsqrt((a * a).mean(-1, keepdim=True) + 1e-6)
    programs = {
        "W1": lambda: rms(t["X"]) @ t["W"],
        "W2": lambda: (rms(t["X"]) @ t["Wu"]) * (rms(t["X"]) @ t["Wg"]),
        "W3": lambda: F.silu(t["X"] @ t["Wg"]) * (t["X"] @ t["Wu"]),
        "W4": lambda: F.scaled_dot_product_attention(t["Q"], t["K"], t["V"]),
        "W5": lambda: F.scaled_dot_product_attention(rms(t["Q"]), rms(t["K"]), t["V"]),
        "W6": lambda: F.scaled_dot_product_attention(t["Q"], t["K"], t["V"], enable_gqa=True),
        "W7": lambda: t["X"] @ t["W"] + (t["X"] @ t["A"]) @ t["B"],
    }
    return programs[wid]


def measure(wid: str, si: int, params: dict[str, int] | None, use_torch: bool, rounds: int = 5,
            block_s: float = 0.3) -> dict[str, object]:
    w = WORKLOADS[wid]
    s = w.shapes[si]
    p = params or w.params(s)
    kernel = compile(w.hand_written(s), params=p)
    x = {}
    for k, v in w.inputs(s).items():
        x[k] = _aligned_empty(v.shape)
        x[k][...] = v
    out = _aligned_empty(tuple(kernel.call(x).shape))
    systems: dict[str, Callable[[], object]] = {"prism": lambda: kernel.call(x, out=out),
                                                "numpy": _numpy_program(wid, x)}
    if use_torch:
        import torch
        torch.set_num_threads(int(os.environ.get("PRISM_NUM_THREADS", "0")) or torch.get_num_threads())
        systems["torch"] = _torch_program(wid, x)
    triad = triad_gbps()
    times: dict[str, list[float]] = {k: [] for k in systems}
    for r in range(rounds):  # interleaved blocks, order rotating
        names = list(systems)
        names = names[r % len(names):] + names[:r % len(names)]
        for name in names:
            times[name] += _median_us(systems[name], block_s, 5)
    nbytes = sum(a.nbytes for a in x.values()) + out.nbytes
    med = {k: statistics.median(v) for k, v in times.items()}
    return {"case": f"{wid} {w.shape_label(s)}", "params": p, "threads": os.environ.get("PRISM_NUM_THREADS", ""),
            "triad_GBps": round(triad, 1), "median_us": {k: round(v, 1) for k, v in med.items()},
            "min_us": {k: round(min(v), 1) for k, v in times.items()},
            "calls": {k: len(v) for k, v in times.items()},
            "prism_GBps": round(nbytes / (med["prism"] * 1e-6) / 1e9, 1),
            "prism_fraction_of_triad": round(nbytes / (med["prism"] * 1e-6) / 1e9 / triad, 2)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("cases", nargs="+", help="workload:shape_index[:params], e.g. W1:2 or W1:2:G=8,F=16")
    ap.add_argument("--torch", action="store_true", help="also time torch eager (SDPA for attention)")
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args(argv)
    for case in args.cases:
        wid, si, *rest = case.split(":", 2)
        params = {k: int(v) for k, v in (kv.split("=") for kv in rest[0].split(","))} if rest else None
        print(json.dumps(measure(wid, int(si), params, args.torch, args.rounds)), flush=True)
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
