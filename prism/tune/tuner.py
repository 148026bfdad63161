"""Auto-tuning: rank every instantiation of the verified sGraphs with the cost model, compile the top-k in
parallel, measure them, keep the fastest correct one, and record how well the model predicted.

The tuning table has one row per measured candidate: sGraph, parameters, predicted and measured time,
status (``ok``, ``compile error``, ``wrong result``, ``not measured``), and the result reports the
model's agreement with the measurement: Spearman's rank correlation over the measured rows and the
ratio of the measured time of the model's #1 to the best measured time (``top1_within_10pct``).
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from prism.errors import PrismError
from prism.ir import dims as D
from prism.ir.graph import Graph
from prism.runtime.kernel import Kernel
from prism.tune import measure as MS
from prism.tune.candidates import Instance, Instantiation, instantiate, working_sizes
from prism.tune.contention import WARN_CORES, CpuMeter
from prism.tune.machine import Machine
from prism.tune.stats import STATS
from prism.verify.numeric import Float32Program, max_error, normal_reference

# tune/3: the nt lowering changed (whole-K GEMV calls, W @ x emitted transposed): winners measured under
# the old one may rank differently; tune/4: a tile permuted into a right matmul operand (an input view's
# iterator) is streamed, not resident: wide weight tiles pass the cache filter; tune/5: a product whose right
# operand is shared by the whole batch runs the batch's rows as one product (batch-8 decode's winners measured
# each sequence streaming the weights); tune/6: only the first row group of a K-chunked nt run prefetches;
# tune/7: float16 keys of a whole-K GEMV take one key at a time (the float16 winners were measured with 8 keys);
# tune/8: bfloat16 x bfloat16 nn products take B's rows in pairs with vdpbf16ps (microkernels.nn_pairs: the
# bfloat16 winners of row-major weights were measured with the widening loads); tune/9: a whole-K GEMV whose
# row fits in half the L1 takes one key at a time with prefetch along the keys (microkernels.nt_row_stream);
# tune/10: short B rows prefetch PF_AHEAD bytes ahead, short keys back to back none (attention's winners);
# tune/11: grouped products (int8 weights with group scales): 4 x 4 tiles from 4 rows, 8 x 2 from 8, and the cost
# model's resident bytes over 8 rows (tune.cost._grouped_resident), so the candidates measured and winners differ
TUNE_VERSION = "tune/11"
# candidates compiled and measured per shape (default). 4, not 6: over 169 stored tunings of 147 programs
# (corpus, models, suite; 2026-11-26) the fastest of the first 4 selected was within 0.6 % of the fastest of
# 6 (geometric mean; p90 1.9 %, worst 11 %, one [256, 512] row program): the last two rarely win by more
# than the noise, and compiling and measuring them was a third of a model's tuning time. Where every
# measured candidate fails the final check, the next ones are tuned (SuperKernel._tune).
TOP_K = 4
# A program whose favourite instance the model predicts under TINY_S is tuned with at most TINY_TOP_K candidates:
# the measured time of such a kernel is mostly its call, and its candidates tie. Measured need: llama-1b bf16's
# start-up, the 12 tunings predicted under 5 µs measured their 3-4 candidates within 0.2-2 % of each other
# (7.8-15.5 µs each through the tuner's call), and compiled each (~0.07 s of gcc per candidate on 2 cores). Over
# 76 stored tunings of such programs (10 kinds of model piece, many shapes, 4 measured each), the better of the
# model's first two was within 0.13 % of the best at the median, 1.6 % at p90, 9.3 % at worst.
TINY_S = 5e-6
TINY_TOP_K = 2
Progress = Callable[[str], None]


def _clip(text: str, n: int = 240) -> str:
    """A one-line summary of a candidate's error: file paths shortened to their names (a compile error
    names the source and the output between its words: a long temporary directory cut "wrote no shared
    library" off), then cut to about ``n`` characters keeping both ends."""
    text = re.sub(r"(?:/[^\s/:()]+)+/(?=[^\s/]+)", ".../", text)
    return text if len(text) <= n else text[: n * 2 // 3] + " ... " + text[-(n // 3):]


class NoInstanceError(PrismError):
    """No verified sGraph can be instantiated at the requested shape; the message says which sizes work."""


class TuningError(PrismError):
    """Every measured candidate failed (compile error or wrong result); the message lists the failures."""


@dataclass
class Row:
    sgraph: int
    params: dict[str, Any]
    predicted_s: float
    model_rank: int                  # 0 = the model's favourite
    status: str = "not measured"     # ok | compile error | wrong result | not measured
    measured_s: float = math.inf     # median; inf when it failed or was not measured
    error: float = math.nan          # max relative error against the float64 reference
    calls: int = 0
    detail: str = ""

    @property
    def label(self) -> str:
        return ",".join(f"{k}={v}" for k, v in sorted(self.params.items())) or "-"


@dataclass
class TuneResult:
    program_key: str
    env: dict[str, int]
    shapes: dict[str, list[int]]
    machine: dict[str, Any]
    sgraph_keys: list[str]
    rows: list[Row]
    winner: int                      # index into rows
    candidates: int                  # instances that passed the constraints (all sGraphs)
    per_sgraph: list[dict[str, Any]] = field(default_factory=list)
    spearman: float | None = None
    top1_ratio: float | None = None
    seconds: dict[str, float] = field(default_factory=dict)
    contention: float | None = None  # cores' worth of CPU other processes used while measuring

    @property
    def best(self) -> Row:
        return self.rows[self.winner]

    @property
    def top1_within_10pct(self) -> bool | None:
        return None if self.top1_ratio is None else self.top1_ratio <= 1.10

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["rows"] = [asdict(r) for r in self.rows]
        return d

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> TuneResult:
        rows = [Row(**r) for r in d["rows"]]
        kw = {k: d[k] for k in ("program_key", "env", "shapes", "machine", "sgraph_keys", "winner", "candidates",
                                "per_sgraph", "spearman", "top1_ratio", "seconds", "contention")}
        r = cls(rows=rows, **kw)
        if not 0 <= r.winner < len(rows) or rows[r.winner].status != "ok":
            raise ValueError("tuning result has no valid winner")
        return r

    def table(self) -> str:
        """The tuning table as text (rich renders it in explain())."""
        head = f"{'':2}{'sGraph':>6}  {'params':<28}{'model µs':>10}{'rank':>6}{'measured µs':>13}  status"
        lines = [head]
        for r in sorted(self.rows, key=lambda r: (r.measured_s, r.model_rank)):
            mark = "* " if self.rows[self.winner] is r else "  "
            meas = f"{r.measured_s * 1e6:13.1f}" if math.isfinite(r.measured_s) else f"{'inf':>13}"
            extra = f" ({r.detail})" if r.detail else ""
            lines.append(f"{mark}{r.sgraph:>6}  {r.label:<28}{r.predicted_s * 1e6:10.1f}{r.model_rank:>6}{meas}  "
                         f"{r.status}{extra}")
        sp = "n/a" if self.spearman is None else f"{self.spearman:.2f}"
        t1 = "n/a" if self.top1_ratio is None else f"{self.top1_ratio:.2f}x the best"
        lines.append(f"model vs measurement: Spearman {sp} over {sum(r.status == 'ok' for r in self.rows)} measured; "
                     f"model's #1 measured {t1}; {self.candidates} valid instantiations")
        if self.contention is not None and self.contention >= WARN_CORES:
            lines.append(f"warning: other processes used {self.contention:.2f} cores while measuring; multi-threaded "
                         "timings lose whole scheduler quanta under contention (re-tune on a quiet machine)")
        return "\n".join(lines)


def spearman(x: Sequence[float], y: Sequence[float]) -> float | None:
    """Spearman's rank correlation (average ranks for ties); None for fewer than 3 points or no spread."""
    if len(x) < 3:
        return None

    def ranks(v: Sequence[float]) -> np.ndarray:
        a = np.asarray(v, dtype=float)
        order = np.argsort(a, kind="mergesort")
        r = np.empty(len(a))
        i = 0
        while i < len(a):
            j = i
            while j + 1 < len(a) and a[order[j + 1]] == a[order[i]]:
                j += 1
            r[order[i:j + 1]] = (i + j) / 2
            i = j + 1
        return r
    rx, ry = ranks(x), ranks(y)
    if rx.std() == 0 or ry.std() == 0:
        return None
    return float(np.corrcoef(rx, ry)[0, 1])


SPREAD = 1.5   # the diversity pass considers instances predicted within this factor of the model's favourite
# The structure passes (best per family, best per sGraph) consider instances predicted within this factor
# of the favourite. Measured over the 34 bench cases (2026-11-21): every winner was predicted within 1.05x
# of the favourite, and every candidate predicted >= 1.5x slower measured >= 1.47x slower. Without the
# bound, W3 d4096 m11008 at n = 29 measured two sGraphs that tile only the batch rows (predicted 12.6x,
# measured 7.5x slower): 10 calls of 190 ms, 1.9 s of a 6 s tuning.
STRUCTURE_SPREAD = 4.0


def family(g: Graph) -> tuple:
    """What an sGraph computes, without its maps and sizes: the kernel-level operators and, per customized
    operator, its block operators (accumulators by kind). sGraphs that differ only in maps share a family;
    a split-reduction variant (an extra combine) is a family of its own."""
    out: list[object] = []
    for n in g.nodes:
        if n.op == "customized":
            out.append(tuple(m.arg[0] if m.op == "acc" else m.op for m in n.arg[0].nodes
                             if m.op not in ("iter", "save")))
        elif n.op not in ("input", "output", "result"):
            out.append(n.op)
    return tuple(out)


def candidate_key(sgraph: int, params: Mapping[str, Any]) -> tuple:
    """A candidate's identity across tunings of one shape: its sGraph and map/size parameters."""
    return (sgraph, tuple(sorted(params.items())))


def select(instances: Sequence[Instance], k: int) -> list[Instance]:
    """The ``k`` instances to compile and measure, in four passes, each in predicted order while room
    remains: (1) the best instance of every *family* (:func:`family`: e.g. flash attention and its
    split-KV variant), so the measurement decides between structures the model ranks apart; (2) the best
    of every other sGraph -- both among instances predicted within ``STRUCTURE_SPREAD`` of the favourite;
    (3) among the instances predicted within ``SPREAD`` of the favourite, one per not-yet-measured
    (family, block count) -- the model cannot tell memory-bound near-ties apart (W1's 4-, 8-, 16- and
    32-block tilings, predicted within 1 % of each other, measured 10 % apart on the 2-core VM because
    wider blocks read longer contiguous weight rows); (4) the rest. Before (3), the instance within
    ``SPREAD`` that moves the fewest DRAM bytes, if the picks so far move more: a compute-bound block ties
    every tiling on compute, and the ranking falls to per-block overheads (llama-1b bf16's MLP piece at 1024
    prefill rows measured four tilings that split only the rows, streaming its 46 MB of weights once per
    16 rows, 1.31-1.46x eager's time; a 64 x 352 tiling predicted 0.5 % slower ran at 1.04-1.14x; the whole
    batch-8 prefill 1.17-1.19x eager's time -> 1.06-1.08x, processes alternating)."""
    ranked = sorted(instances, key=lambda i: i.estimate.seconds)
    fam: dict[int, tuple] = {}
    for i in ranked:
        if i.sgraph not in fam:
            fam[i.sgraph] = family(i.source)
    picked: list[Instance] = []

    def take(key: Callable[[Instance], object], within: float = math.inf) -> None:
        seen = {key(i) for i in picked}
        for inst in ranked:
            if len(picked) >= k or inst.estimate.seconds > within:
                return
            kk = key(inst)
            if kk not in seen and inst not in picked:
                seen.add(kk)
                picked.append(inst)

    bound = ranked[0].estimate.seconds * STRUCTURE_SPREAD if ranked else math.inf
    take(lambda i: fam[i.sgraph], bound)
    take(lambda i: i.sgraph, bound)
    if ranked:
        near = ranked[0].estimate.seconds * SPREAD
        lean = min((i for i in ranked if i.estimate.seconds <= near), key=lambda i: i.estimate.dram_bytes)
        if len(picked) < k and lean not in picked and lean.estimate.dram_bytes < min(
                i.estimate.dram_bytes for i in picked):
            picked.append(lean)
        take(lambda i: (fam[i.sgraph], i.estimate.min_blocks), near)
    take(id)
    return sorted(picked, key=lambda i: i.estimate.seconds)


def expected_shapes(program: Graph, env: Mapping[str, int]) -> dict[str, tuple[int, ...]]:
    return {k: tuple(int(D.evaluate(d, env)) for d in s) for k, s in program.output_shapes.items()}


@dataclass
class Tuned:
    """A tuning result with the compiled kernels of this process (winner first)."""

    result: TuneResult
    kernels: dict[int, Kernel]       # row index -> compiled kernel
    instances: dict[int, Instance]   # row index -> instance
    seed: int = 0
    # the standard-normal draw the candidates were checked on (float64) and its float32 copy: the final
    # numeric check of the winner starts from them instead of drawing again (W3 m11008: 1.9 s saved)
    draw: dict[str, np.ndarray] = field(default_factory=dict)
    inputs: dict[str, np.ndarray] = field(default_factory=dict)
    reference: dict[str, np.ndarray] = field(default_factory=dict)  # the float64 reference's outputs on draw


@dataclass
class Plan:
    """What a tuning compiles, decided before any compile (:func:`plan`): each sGraph's instantiations at ``env``,
    the pool of candidates and the ``chosen`` ones (:func:`select`, each built by the IR). :func:`tune` takes one
    made ahead (``SuperKernel.compile_ahead``: the candidates compiled while the search of other pieces runs)
    where its ``key`` is the tuning's own."""

    key: tuple
    insts: list[Instantiation]
    pool: list[Instance]
    chosen: list[Instance]
    seconds: float   # instantiating


def plan_key(sgraphs: Sequence[Graph], program: Graph, env: Mapping[str, int], m: Machine, top_k: int,
             skip: Collection[tuple] = ()) -> tuple:
    return (program.key, tuple(g.key for g in sgraphs), tuple(sorted((k, int(v)) for k, v in env.items())),
            m.fingerprint, m.threads, m.isa, top_k, tuple(sorted(skip)))


def plan(sgraphs: Sequence[Graph], program: Graph, env: Mapping[str, int], m: Machine, *, top_k: int = TOP_K,
         skip: Collection[tuple] = ()) -> Plan:
    """The candidates :func:`tune` compiles and measures at ``env`` (the others of the pool are not measured);
    raises :class:`NoInstanceError` where no sGraph instantiates."""
    if top_k < 1:
        raise PrismError(f"top_k must be >= 1, got {top_k}")
    t0 = time.perf_counter()
    env = {k: int(v) for k, v in env.items()}
    missing = sorted(program.symbols() - set(env))
    if missing:
        raise PrismError(f"tune: give values for the program's dims {missing}")
    expected = expected_shapes(program, env)
    insts: list[Instantiation] = [instantiate(g, env, m, i, expected) for i, g in enumerate(sgraphs)]
    pool = [x for r in insts for x in r.kept if candidate_key(x.sgraph, x.params) not in skip]
    if not pool:
        raise NoInstanceError(_no_instance_message(sgraphs, insts, env, m))
    k = top_k
    if min(x.estimate.seconds for x in pool) < TINY_S:
        k = min(k, TINY_TOP_K)
    chosen = select(pool, k)
    while True:  # the IR builds the chosen ones; one it rejects is replaced by the next in the ranking
        bad = [x for x in chosen if not _builds(x)]
        if not bad:
            break
        pool = [x for x in pool if x not in bad]
        if not pool:
            raise NoInstanceError(f"no instantiation of the sGraphs builds at {env}: {bad[0].label} and others "
                                  "were rejected by the IR")
        chosen = select(pool, k)
    return Plan(plan_key(sgraphs, program, env, m, top_k, skip), insts, pool, chosen, time.perf_counter() - t0)


def tune(sgraphs: Sequence[Graph], program: Graph, env: Mapping[str, int], m: Machine, *, top_k: int = TOP_K,
         workers: int | None = None, budget_s: float | None = None, seed: int = 0,
         progress: Progress | None = None, measure_s: float = 0.4,
         skip: Collection[tuple] = (), planned: Plan | None = None) -> Tuned:
    """Tune ``sgraphs`` (verified implementations of ``program``) at batch dims ``env`` on machine ``m``.
    ``skip``: candidates (:func:`candidate_key`) already tried; the others are selected. ``planned``: a
    :func:`plan` made before (used where its key is this tuning's)."""
    t0 = time.perf_counter()
    deadline = t0 + budget_s if budget_s else math.inf
    env = {k: int(v) for k, v in env.items()}
    made_ahead = planned is not None and planned.key == plan_key(sgraphs, program, env, m, top_k, skip)
    if planned is None or not made_ahead:
        planned = plan(sgraphs, program, env, m, top_k=top_k, skip=skip)
    insts, pool, chosen = planned.insts, planned.pool, planned.chosen
    # a plan made ahead was instantiated before this tuning's clock started: named apart from its phases
    seconds = {"instantiate_ahead" if made_ahead else "instantiate": planned.seconds}
    per = [{"sgraph": r.sgraph, "kept": len(r.kept), "dropped": len(r.dropped), "relaxed": r.relaxed,
            "invalid": r.invalid, "failure": r.failure, "values": r.values} for r in insts]
    STATS.tunings += 1
    rank = {id(x): i for i, x in enumerate(sorted(pool, key=lambda i: i.estimate.seconds))}
    rows = [Row(x.sgraph, dict(x.params), x.estimate.seconds, rank[id(x)]) for x in chosen]
    if progress:
        progress(f"compiling {len(chosen)} of {len(pool)} candidates")
    t1 = time.perf_counter()
    n_workers = workers or max(1, min(len(chosen), m.cores))
    compiled = MS.compile_all([x.graph for x in chosen], n_workers)
    seconds["compile"] = time.perf_counter() - t1
    STATS.compiles += len(chosen)
    t2 = time.perf_counter()
    draw, ref = normal_reference(program, env, seed)   # shared with the search's big-shape check, if any
    inputs = MS.typed_inputs(program, draw)
    tol = MS.reference_tolerance(program, env)
    kernels: dict[int, Kernel] = {}
    own = Float32Program(program, draw, env)   # the program's own float32 error, for every candidate (max_error)
    out: dict[str, np.ndarray] | None = None  # one set of output buffers for every candidate: bounded memory
    for i, (row, k) in enumerate(zip(rows, compiled)):
        if isinstance(k, BaseException):
            row.status, row.detail = "compile error", _clip(f"{type(k).__name__}: {str(k).splitlines()[0]}")
            STATS.compile_failures += 1
            continue
        try:
            if out is None:
                out = MS.output_buffers(k, {})
            k.call(inputs, out=out)
            row.error = max_error(out, ref, own)
        except Exception as e:  # a kernel that cannot run is a failed candidate
            row.status, row.detail = "error", _clip(f"{type(e).__name__}: {e}")
            continue
        if not row.error <= tol:
            row.status, row.detail = "wrong result", f"error {row.error:.3g} > tolerance {tol:.3g}"
            STATS.wrong_results += 1
            continue
        kernels[i] = k
    if progress and kernels:
        progress(f"measuring {len(kernels)} candidates (interleaved, {measure_s:.1f} s)")
    idx = list(kernels)
    meter = CpuMeter()
    meter.start()
    # the correctness call above was each kernel's first call on these very buffers (page faults, thread
    # pool start-up): one more warm-up call is enough (W3 m11008, 6 candidates of 15-80 ms: 0.25 s saved)
    timings = MS.time_interleaved([lambda k=kernels[i]: k.call(inputs, out=out) for i in idx],
                                  budget_s=measure_s, deadline=deadline, warmup=1)
    for i, t in zip(idx, timings):
        STATS.measured += 1
        rows[i].status, rows[i].measured_s, rows[i].calls = "ok", t.median_s, t.calls
    contention = meter.stop()
    seconds["measure"] = time.perf_counter() - t2
    ok = [i for i, r in enumerate(rows) if r.status == "ok"]
    if not ok:
        raise TuningError("every tuned candidate failed:\n" + "\n".join(
            f"  sGraph {r.sgraph} [{r.label}]: {r.status}: {r.detail}" for r in rows))
    winner = min(ok, key=lambda i: (rows[i].measured_s, rows[i].model_rank))
    sp = spearman([rows[i].predicted_s for i in ok], [rows[i].measured_s for i in ok])
    fav = min(range(len(rows)), key=lambda i: rows[i].model_rank)
    top1 = rows[fav].measured_s / rows[winner].measured_s if rows[fav].status == "ok" else None
    seconds["total"] = time.perf_counter() - t0
    shapes = {k: [int(D.evaluate(d, env)) for d in n.shape] for k, n in program.inputs.items()}
    result = TuneResult(program.key, env, shapes, {"fingerprint": m.fingerprint, "threads": m.threads,
                                                    "describe": m.describe()},
                        [g.key for g in sgraphs], rows, winner, len(pool), per, sp, top1,
                        {k: round(v, 4) for k, v in seconds.items()},
                        None if contention is None else round(contention, 3))
    return Tuned(result, kernels, dict(enumerate(chosen)), seed, draw, inputs, ref)


def _builds(x: Instance) -> bool:
    try:
        x.graph.check()
    except PrismError:
        return False
    return True


def _no_instance_message(sgraphs: Sequence[Graph], insts: Sequence[Instantiation], env: Mapping[str, int],
                         m: Machine) -> str:
    shape = ", ".join(f"{k}={v}" for k, v in sorted(env.items()))
    lines = [f"no verified implementation can be instantiated at {shape}:"]
    for g, r in zip(sgraphs, insts):
        lines.append(f"  sGraph {r.sgraph}: {r.failure}")
        sizes = working_sizes(g, env, m)
        ok = {k: v for k, v in sizes.items() if v}
        if ok:
            lines.append("    sizes that work (others unchanged): " + "; ".join(
                f"{k} in {v}{'...' if len(v) >= 8 else ''}" for k, v in ok.items()))
    lines.append("pad the dims to one of those sizes, or search again with a larger space")
    return "\n".join(lines)
