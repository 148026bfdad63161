"""A/B of chains (prism/frontend/chain.py) on a decode step: two copies of a ``prism bench --models`` config in
one process, compiled with ``options={"chains": True}`` and ``{"chains": False}``, ``generate()`` timed in
interleaved rounds (order alternating). Per round and copy: the decode step (T(34 tokens) - T(2)) / 32, the
kernels' accounted time in it (``prism.runtime.fastcall.set_profiling``), the pieces' own cost and the rest.
The step's time outside the kernels is what chains change; the kernels' time moves with the host's bandwidth.

    python benchmarks/chain_ab.py llama-1b bfloat16 --rounds 9 --order nc

Needs ``transformers`` (``pip install -e '.[models]'``). Run on an idle machine and state its load.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from prism.bench.models import MODELS, build, copy_model, prompt_ids
from prism.runtime import fastcall


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", choices=sorted(MODELS))
    ap.add_argument("dtype", choices=("float32", "bfloat16", "int8w"))
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--order", default="cn", help="compile order: c = chains on, n = off (default cn)")
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    base = build(MODELS[a.model], dtype=a.dtype)
    base.generation_config.eos_token_id = None
    ids = prompt_ids(MODELS[a.model], 128)
    kw = dict(do_sample=False, pad_token_id=0)
    systems = {}
    for c in a.order:
        label, opts = {"c": ("chains", {}), "n": ("no chains", {"chains": False})}[c]
        m = copy_model(base)
        m.forward = torch.compile(m.forward, backend="prism", options=opts)
        systems[label] = m
    fastcall.set_profiling(True)
    with torch.inference_mode():
        ref = base.generate(ids, max_new_tokens=8, **kw)
        for label, m in systems.items():
            for n in (1, 2, 34, 34):
                m.generate(ids, max_new_tokens=n, **kw)
            same = torch.equal(m.generate(ids, max_new_tokens=8, **kw), ref)
            print(f"{label}: tokens equal eager's: {same}")
        rows: dict[str, list[tuple[float, ...]]] = {k: [] for k in systems}
        for rnd in range(a.rounds):
            for label, m in list(systems.items())[:: 1 if rnd % 2 == 0 else -1]:
                p0 = fastcall.profile_totals()
                t0 = time.perf_counter()
                m.generate(ids, max_new_tokens=2, **kw)
                t1 = time.perf_counter()
                p1 = fastcall.profile_totals()
                m.generate(ids, max_new_tokens=34, **kw)
                t2 = time.perf_counter()
                p2 = fastcall.profile_totals()
                d2, d34 = p1 - p0, p2 - p1
                step = ((t2 - t1) - (t1 - t0)) / 32 * 1e3
                kern = (d34.kernel_s - d2.kernel_s) / 32 * 1e3
                own = (d34.piece_s - d2.piece_s) / 32 * 1e3 - kern
                rows[label].append((step, kern, own, step - kern))
    print(f"{a.model} {a.dtype}, {a.rounds} rounds, medians, ms per decode step:")
    for label, v in rows.items():
        med = [statistics.median(x[i] for x in v) for i in range(4)]
        print(f"  {label:10s} step {med[0]:.3f}  kernels {med[1]:.3f}  pieces' own cost {med[2]:.3f}  "
              f"outside the kernels {med[3]:.3f}")


if __name__ == "__main__":
    main()
