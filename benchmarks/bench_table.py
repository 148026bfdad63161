"""Turn a `prism bench --json` report into the markdown table docs/bench.md and the issue notes use.

    python benchmarks/bench_table.py bench.json            # one row per case, then the geometric means
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path


def _us(x: float | None) -> str:
    return "-" if x is None else f"{x:.0f}"


def _shape(shape: dict[str, int]) -> str:
    return " ".join(f"{k}{v}" for k, v in shape.items() if k not in ("D", "one", "H", "KVH"))


def table(report: dict) -> str:
    rows = ["| case | prism µs | hand µs | best baseline µs | prism vs best | prism / roofline | prism / read roof "
            "| torch.compile µs | prism vs compile | foreign cores |", "|---|---|---|---|---|---|---|---|---|---|"]
    vs_best, vs_compile = [], []
    for c in report["cases"]:
        sys_ = {s["name"]: s for s in c["systems"]}
        p, h, comp = sys_.get("prism", {}), sys_.get("hand", {}), sys_.get("compile", {})
        pu = p.get("median_us") if p.get("status") == "ok" else None
        cu = comp.get("median_us") if comp.get("status") == "ok" else None
        sp = c.get("prism_speedup")
        if sp:
            vs_best.append(sp)
        if pu and cu:
            vs_compile.append(cu / pu)
        frac, rfrac = c.get("prism_roofline_fraction"), c.get("prism_read_fraction")
        best = f"{_us(c.get('best_baseline_us'))} ({c.get('best_baseline')})" if c.get("best_baseline") else "-"
        status = "" if p.get("status") == "ok" else f" ({p.get('status')})"
        mark = "**" if sp is not None and sp < 1.0 else ""
        fc = c.get("foreign_cores")
        rows.append(f"| {c['workload']} {_shape(c['shape'])} | {_us(pu)}{status} | {_us(h.get('median_us'))} | {best} "
                    f"| {mark}{'-' if sp is None else f'{sp:.2f}x'}{mark} | {'-' if frac is None else f'{frac:.2f}'} "
                    f"| {'-' if rfrac is None else f'{rfrac:.2f}'} "
                    f"| {_us(cu)} | {'-' if not (pu and cu) else f'{cu / pu:.2f}x'} "
                    f"| {'-' if fc is None else f'{fc:.2f}'} |")

    def geo(v: list[float]) -> str:
        return f"{math.exp(sum(map(math.log, v)) / len(v)):.2f}x over {len(v)} cases" if v else "n/a"
    rows += ["", f"Geometric mean: prism vs best baseline {geo(vs_best)}; prism vs torch.compile {geo(vs_compile)}; "
             f"prism >= best baseline in {sum(s >= 1.0 for s in vs_best)} of {len(vs_best)} cases."]
    return "\n".join(rows)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python benchmarks/bench_table.py REPORT.json")
    print(table(json.loads(Path(sys.argv[1]).read_text())))
