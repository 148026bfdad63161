"""Compiling candidates in parallel and timing them.

Compilation (code generation + the C compiler, through the runtime's disk cache) runs in a thread pool:
the compiler is a subprocess, so threads overlap it on every core. Timing runs one candidate at a time
(never concurrently with another), on 64-byte-aligned inputs into a reused output buffer: warm-up
calls, then interleaved rounds (every candidate runs a ~2 ms block of calls per round, the order
rotating, for a fixed budget) so that load from other processes on a shared machine falls on all of
them alike; the median over all calls is the score. Each candidate's output is first compared with the float64
reference (the numeric verifier's tolerance); a compile error or a wrong result scores +inf.
The runtime reads ``PRISM_NUM_THREADS`` at every call, so timings use the same thread count as users.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from prism.ir.graph import Graph
from prism.runtime.kernel import Kernel, _aligned_empty
from prism.runtime.kernel import compile as compile_graph
from prism.tune import ahead
from prism.verify.numeric import reduction_length, rounding_allowance, to_dtype, tolerance

# Samples per candidate after which a measurement may stop early (see time_interleaved). Not a measured
# optimum: a round number far above the three rounds slow kernels get, reached in ~0.1 s by microsecond ones.
ENOUGH_SAMPLES = 1000
# A measurement may also stop early (DECIDED_AFTER_S below), each candidate having DECIDE_SAMPLES samples, when
# its outcome is settled: every other median is either within TIE_MARGIN of the fastest (a tie: whichever
# is picked costs at most 3%, less than this VM's bandwidth drifts between runs) or the fastest is at most
# DECIDED_MARGIN of it (clearly slower). Measured need: llama-small's 28 tunings at start-up spent
# 6.7 s measuring (of 37 s), most on 4 candidates of >0.1 ms within 0.3-3% of each other.
DECIDED_MARGIN = 0.85
# ... and the stop on ENOUGH_SAMPLES comes after ENOUGH_AFTER_S (at least ``min_rounds`` interleaved rounds) instead
# of a quarter of the budget: microsecond kernels have their 1000 samples after the first rounds (~25 ms for
# four candidates) and then waited until 0.1 s. Measured need: llama-1b bf16's start-up, 28 tunings, 22 of them
# of microsecond pieces at 0.10-0.11 s of timing each.
ENOUGH_AFTER_S = 0.025
# ... and the stop on a settled outcome after DECIDED_AFTER_S instead of a quarter of the budget (0.1 s): the rounds
# interleave the candidates, so a burst of load falls on all of them alike, and a measurement under contention is
# marked as such (tuner.contended). Measured need: the same start-up, 11 tunings of 20-50 µs kernels at 0.10 s each.
DECIDED_AFTER_S = 0.05
TIE_MARGIN = 1.03
DECIDE_SAMPLES = 10
# A candidate whose warm-up call took more than HOPELESS times the fastest one's, and more than HOPELESS_MIN_S, is
# not measured further: its warm-up is its one sample. Contention slows a good candidate by 2-3x, not 8x. Measured
# need: llama-1b bf16's LM head (32000 x 2048) tuned 4 candidates, three of 2.9-3.2 ms and a one-block one of 324 ms
# per call, whose rounds took most of the tuning's 3.2 s of measuring (5.8 s of the model's start-up in one run).
HOPELESS = 8.0
HOPELESS_MIN_S = 5e-3


@dataclass(frozen=True)
class Timing:
    median_s: float
    calls: int


def compile_all(graphs: Sequence[Graph], workers: int) -> list[Kernel | BaseException]:
    """``prism.compile`` of every concrete graph, ``workers`` at a time; a failure is returned, not raised."""
    def one(g: Graph) -> Kernel | BaseException:
        try:
            return compile_graph(g)
        except Exception as e:  # any failure disqualifies this candidate only
            return e
    early = [ahead.take(g) for g in graphs]   # compiled (or compiling) ahead: SuperKernel.compile_ahead
    rest = [g for g, f in zip(graphs, early) if f is None]
    if workers <= 1 or len(rest) <= 1:
        done = [one(g) for g in rest]
    else:
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="prism-tune-cc") as pool:
            done = list(pool.map(one, rest))
    it = iter(done)
    return [f.result() if f is not None else next(it) for f in early]


def typed_inputs(program: Graph, draw: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The numeric verifier's float64 draw in each input's dtype, 64-byte aligned (as the benchmark harness
    gives inputs), for the candidates."""
    dts = {k: n.dtype for k, n in program.inputs.items()}
    return {k: to_dtype(v, dts[k], out=_aligned_empty(v.shape, dts[k].np)) for k, v in draw.items()}


def output_buffers(kernel: Kernel, env: Mapping[str, int]) -> dict[str, np.ndarray]:
    v = kernel.specialize(**{k: v for k, v in env.items() if k in kernel._dims})
    return {n: _aligned_empty(s, dt.np) for n, s, dt in zip(kernel.output_names, v.gen.output_shapes,
                                                           kernel.output_dtypes)}


def reference_tolerance(program: Graph, env: Mapping[str, int]) -> float:
    """The numeric verifier's tolerance at ``env`` (with the low-precision rounding allowance of the output
    that allows the most)."""
    rounding = max((rounding_allowance(program, o) for o in program.output_names), default=0.0)
    return tolerance(reduction_length(program, env), rounding=rounding)


def time_interleaved(fns: Sequence[Callable[[], object]], *, budget_s: float = 0.4, block_s: float = 0.002,
                     min_rounds: int = 3, warmup: int = 2, deadline: float = math.inf,
                     enough: int = ENOUGH_SAMPLES) -> list[Timing]:
    """Median time of each function. Calls are made in rounds -- every function runs a block of about
    ``block_s`` per round, the order rotating -- until ``budget_s`` has passed (at least ``min_rounds``), so
    every candidate's samples spread over the whole measurement and load from other processes falls on all
    of them alike. (No candidate is dropped early: under contention a good one can look slow for a while.)
    Once every function has ``enough`` samples (and ENOUGH_AFTER_S, or a quarter of a shorter budget, has
    passed), the rounds stop: microsecond kernels reach that in a few rounds (a tiny Llama's 25 tunings spent
    10 s here at the full budget, 4.6-4.9 s with the early stop); after DECIDED_AFTER_S (or a quarter of a shorter
    budget) they also stop when the outcome is settled (``_decided``: each other
    median within TIE_MARGIN of the fastest or at least 1 / DECIDED_MARGIN of it; DECIDE_SAMPLES samples
    each). Kernels of more than ~0.1 ms within 3-15% of each other use the whole budget. A candidate whose
    warm-up took more than HOPELESS times the fastest's (and HOPELESS_MIN_S) is not called again: that warm-up
    is its one sample."""
    samples: list[list[float]] = [[] for _ in fns]
    per_call = []
    for f in fns:
        t0 = time.perf_counter()
        for _ in range(warmup):
            f()
        per_call.append((time.perf_counter() - t0) / max(1, warmup))
    calls = [max(1, int(block_s / max(t, 1e-7))) for t in per_call]
    fastest = min(per_call, default=0.0)
    live = [i for i, t in enumerate(per_call) if not (t > HOPELESS * fastest and t > HOPELESS_MIN_S)]
    for i in set(range(len(fns))) - set(live):   # hopeless: its warm-up is its sample
        samples[i].append(per_call[i])
    start = time.perf_counter()
    end = min(start + budget_s, deadline)
    early = start + min(budget_s / 4, DECIDED_AFTER_S)
    early_enough = start + min(budget_s / 4, ENOUGH_AFTER_S)
    r = 0
    while live:
        order = live[r % len(live):] + live[:r % len(live)]
        for i in order:
            f, si = fns[i], samples[i]
            b0 = time.perf_counter()
            for _ in range(calls[i]):
                t0 = time.perf_counter()
                f()
                si.append(time.perf_counter() - t0)
            # the block size follows the calls as measured (the warm-up's first calls are often the slowest:
            # a tiny kernel sized from them ran a few calls per block)
            calls[i] = max(1, int(block_s * calls[i] / max(time.perf_counter() - b0, 1e-7)))
        r += 1
        if r >= min_rounds:
            now = time.perf_counter()
            if now >= end:
                break
            if now >= early_enough:
                least = min(len(samples[i]) for i in live)
                if least >= enough or (now >= early and least >= DECIDE_SAMPLES and _decided(samples)):
                    break
    return [Timing(statistics.median(s), len(s)) for s in samples]


def _decided(samples: list[list[float]]) -> bool:
    """Whether the outcome is settled: every candidate is either tied with the fastest (within TIE_MARGIN:
    picking it would cost at most 3%) or clearly slower (the fastest at most DECIDED_MARGIN of it)."""
    med = sorted(statistics.median(s) for s in samples if s)
    return all(m <= TIE_MARGIN * med[0] or med[0] <= DECIDED_MARGIN * m for m in med[1:])
