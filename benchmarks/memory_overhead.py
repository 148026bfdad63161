"""Resident memory that ``prism.optimize`` adds to a model of large Linear layers (issue 14's memory item).

    python benchmarks/memory_overhead.py

A stack of 4 gated blocks (Linear 2048 -> 5632, silu, Linear 5632 -> 2048, residual; 352 MiB of float32
weights) at batch 1, under ``torch.inference_mode()``: RSS before ``prism.optimize``, after it and one
call, and after ``malloc_trim(0)`` (glibc keeps freed heap pages; the trimmed number is what stays
live), beside the same for ``torch.compile(backend="eager")`` (what Dynamo alone adds). Run it twice:
the first run searches and tunes (empty caches), the second reads the caches.
"""

from __future__ import annotations

import ctypes
import os

import torch

import prism


def rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def trim() -> None:
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except OSError:  # not glibc
        pass


class Blocks(torch.nn.Module):
    def __init__(self, n: int = 4, d: int = 2048, h: int = 5632) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.up = torch.nn.ModuleList([torch.nn.Linear(d, h, bias=False) for _ in range(n)])
        self.down = torch.nn.ModuleList([torch.nn.Linear(h, d, bias=False) for _ in range(n)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for a, b in zip(self.up, self.down):
            x = x + b(torch.nn.functional.silu(a(x)))
        return x


def main() -> None:
    torch.set_num_threads(2)
    m = Blocks().eval()
    x = torch.randn(1, 2048)
    weights = sum(p.numel() * 4 for p in m.parameters()) / 2**20
    with torch.inference_mode():
        m(x)
        r0 = rss_mib()
        dyn = torch.compile(m, backend="eager")
        dyn(x)
        trim()
        r1 = rss_mib()
        opt = prism.optimize(m, (x,))
        opt(x)
        r2 = rss_mib()
        trim()
        r3 = rss_mib()
        err = float((opt(x) - m(x)).abs().max())
    print(f"weights {weights:.0f} MiB; Prism pieces {len(opt.prism_pieces())}; max |prism - eager| {err:.1e}")
    print(f"  torch.compile(backend='eager') adds  {r1 - r0:6.0f} MiB")
    print(f"  prism.optimize then adds            {r2 - r1:6.0f} MiB ({(r2 - r1) / weights:.2f} of the weights)")
    print(f"  ... after malloc_trim(0)            {r3 - r1:6.0f} MiB ({(r3 - r1) / weights:.2f} of the weights)")


if __name__ == "__main__":
    main()
