"""Start-up of the tests' tiny Llama: the first ``generate()`` under ``torch.compile(backend="prism")`` and
under inductor, each from empty caches, each in a process of its own (docs/bench.md quotes it).

    python benchmarks/startup.py [--systems prism,inductor] [--repeat 2] [--warm]

The model is the one of tests/cpu/test_frontend_transformers.py (2 layers, hidden 64, MLP 128, 4/2 heads,
vocab 128, seeded random weights), a 7-token prompt and 6 new tokens, 2 threads. Each run gets fresh
``PRISM_CACHE_DIR`` and ``TORCHINDUCTOR_CACHE_DIR`` directories; the token ids must equal eager's. Prism's
runs also print its counters (searches, tunings, compiles) and the seconds of its stages. Needs
``transformers`` (``pip install -e '.[models]'``). ``--warm``: each system runs a second process on the caches
the first one filled (a new process with warm caches). Run it on an idle machine (check /proc/loadavg).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

CHILD = r"""
import json, sys, time, collections
import torch, transformers
torch.set_num_threads(2)
system = sys.argv[1]
common = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, vocab_size=128, max_position_embeddings=128)
torch.manual_seed(0)
m = transformers.LlamaForCausalLM(transformers.LlamaConfig(**common)).eval()
ids = torch.randint(0, 128, (1, 7))
spent = collections.Counter()
if system == "prism":
    import prism.search as S
    from prism.tune import measure as MS
    from prism.tune import STATS

    def timed(mod, name, key):
        f = getattr(mod, name)

        def w(*a, **k):
            t = time.perf_counter()
            try:
                return f(*a, **k)
            finally:
                spent[key] += time.perf_counter() - t
        setattr(mod, name, w)
    timed(S, "search", "search")
    timed(MS, "compile_all", "tuning compiles")
    timed(MS, "time_interleaved", "tuning measurements")
with torch.no_grad():
    ref = m.generate(ids, max_new_tokens=6, do_sample=False)
    m.forward = torch.compile(m.forward, backend="prism" if system == "prism" else "inductor")
    t = time.perf_counter()
    got = m.generate(ids, max_new_tokens=6, do_sample=False)
    dt = time.perf_counter() - t
out = {"system": system, "seconds": dt, "same_tokens": bool(torch.equal(got, ref)),
       "stages": {k: round(v, 2) for k, v in spent.items()}}
if system == "prism":
    out["counters"] = {k: v for k, v in STATS.to_json().items() if v}
print(json.dumps(out))
"""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--systems", default="prism,inductor")
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--warm", action="store_true", help="then a second process on the same caches")
    args = ap.parse_args()
    with open("/proc/loadavg") as f:
        print(f"load before: {f.read().split()[0]}", flush=True)
    for _ in range(args.repeat):
        for system in args.systems.split(","):
            with tempfile.TemporaryDirectory() as pc, tempfile.TemporaryDirectory() as ic:
                env = {**os.environ, "PRISM_CACHE_DIR": pc, "TORCHINDUCTOR_CACHE_DIR": ic}
                for caches in ("empty", "warm")[:1 + args.warm]:
                    t = time.perf_counter()
                    p = subprocess.run([sys.executable, "-c", CHILD, system], env=env, capture_output=True, text=True)
                    if p.returncode != 0:
                        print(p.stderr[-3000:], file=sys.stderr)
                        return 1
                    res = json.loads(p.stdout.strip().splitlines()[-1])
                    res["caches"], res["process_s"] = caches, round(time.perf_counter() - t, 1)
                    print(json.dumps(res), flush=True)
    with open("/proc/loadavg") as f:
        print(f"load after: {f.read().split()[0]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
