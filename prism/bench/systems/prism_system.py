"""Prism's columns.

``prism``: Prism's own pipeline on the program as written: search (symbolic, from scratch or from the
disk cache) -> verify -> tune for the shape -> compile. This is the column compared with the baselines.

``hand``: the workload's HAND-WRITTEN known-good structure compiled by Prism's code generator, kept as a
labelled reference column (kind "reference": never counted as a baseline nor as Prism's result).

A column whose stage cannot run here reads "unavailable" with the reason; it is never filled with the
NumPy reference or any other system's numbers.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping

import numpy as np

from prism.bench.systems.base import Prepared, System, Unavailable
from prism.workloads import Workload
from prism.workloads.base import Shape

LABEL = "Prism (search -> verify -> tune -> compile, on the program as written)"
HAND_LABEL = "hand-written structure compiled by Prism's code generator (reference column, not a search result)"

# One budget for every workload (no per-workload tuning of the search space): up to two kernel operators
# (a fused kernel plus one more, e.g. the combine of a split reduction), up to 8 block operators per block
# graph, 60 s of generation. Results are cached on disk by program and limits.
BENCH_LIMITS = {"max_kernel_ops": 2, "max_block_ops": 8, "time_limit": 60.0}


def _compile_fn() -> Callable:
    import prism
    fn = getattr(prism, "compile", None)
    if fn is None:
        raise Unavailable("prism.compile is not importable yet (the code generator and runtime are not built)")
    return fn


def prism_runner(w: Workload, shape: Shape) -> Callable[[Mapping[str, np.ndarray]], Prepared]:
    """Compile the hand-written structure of ``w`` at ``shape`` (its grid/for-loop symbols bound by
    ``w.params(shape)``); returns a function that binds inputs and gives the timed call."""
    compile_ = _compile_fn()
    hand = w.hand_written(shape)
    names = hand.output_names
    t0 = time.perf_counter()
    kernel = compile_(hand.instantiate({**w.params(shape)}))
    compile_s = time.perf_counter() - t0

    def named(res: object) -> dict[str, object]:
        # prism's call returns the array itself for a one-output kernel, a dict otherwise
        return dict(res) if isinstance(res, Mapping) else {names[0]: res}

    def bind(inputs: Mapping[str, np.ndarray]) -> Prepared:
        feeds = {k: inputs[k] for k in w.input_shapes(shape)}
        t1 = time.perf_counter()
        out = named(kernel.call(feeds))  # the first call specializes and allocates; later calls reuse `out`
        first_s = time.perf_counter() - t1

        def call() -> object:
            kernel.call(feeds, out)
            return out

        def fetch(res: object) -> dict[str, np.ndarray]:
            return {k: np.array(v) for k, v in named(res).items()}

        return Prepared(call, fetch, {"compile_s": compile_s, "first_call_s": first_s,
                                      "params": dict(w.params(shape))})
    return bind


def prepare_hand(w: Workload, shape: Shape, inputs: Mapping[str, np.ndarray], threads: int) -> Prepared:
    os.environ["PRISM_NUM_THREADS"] = str(threads)
    return prism_runner(w, shape)(inputs)


def prepare_pipeline(w: Workload, shape: Shape, inputs: Mapping[str, np.ndarray], threads: int) -> Prepared:
    """superoptimize(program) then one call at this shape (tunes and compiles); times later calls."""
    os.environ["PRISM_NUM_THREADS"] = str(threads)
    import prism
    from prism.api import STATS
    try:
        from prism.search import Limits
    except ImportError as e:  # pragma: no cover
        raise Unavailable(f"the search is not importable ({e})") from None
    prog = w.program(shape)
    searches0 = STATS.searches
    t0 = time.perf_counter()
    sk = prism.superoptimize(prog, limits=Limits(**BENCH_LIMITS))  # NoVerifiedKernelError -> "failed"
    search_s = time.perf_counter() - t0
    feeds = {k: inputs[k] for k in w.input_shapes(shape)}
    names = prog.output_names

    def named(res: object) -> dict[str, object]:
        return dict(res) if isinstance(res, Mapping) else {names[0]: res}

    t1 = time.perf_counter()
    out = named(sk.call(feeds))  # tunes + compiles this shape (or loads the tuning cache), verified
    tune_s = time.perf_counter() - t1
    spec = sk.specialize(**prog.bind({k: v.shape for k, v in feeds.items()}))

    def call() -> object:
        sk.call(feeds, out)
        return out

    def fetch(res: object) -> dict[str, np.ndarray]:
        return {k: np.array(v) for k, v in named(res).items()}

    return Prepared(call, fetch, {"search_s": round(search_s, 2), "searched": STATS.searches > searches0,
                                  "tune_and_compile_s": round(tune_s, 2), "stop_reason": sk.stop_reason,
                                  "params": {k: v for k, v in getattr(spec, "params", {}).items()}})


def float32_inputs_of(w: Workload, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The float32 workload's inputs holding a precision variant's values: bfloat16 values widened, an int8
    weight dequantized back to its [in, out] float32 form (prism.workloads.precision)."""
    from prism.bench.data import aligned
    from prism.workloads.precision import INT8W, SCALE, precision_of
    base = getattr(w, "base", None)
    if base is None:
        raise Unavailable(f"{w.id} is a float32 case: the prism column is Prism's float32 pipeline")
    out = {}
    for name, v in inputs.items():
        if name.endswith(SCALE):
            continue
        if precision_of(w) in INT8W and name + SCALE in inputs:
            out[name] = aligned((v.astype(np.float32) * inputs[name + SCALE].astype(np.float32)).T)
        else:
            out[name] = aligned(v.astype(np.float32))
    return out


def prepare_pipeline_f32(w: Workload, shape: Shape, inputs: Mapping[str, np.ndarray], threads: int) -> Prepared:
    """Prism's pipeline on the float32 program of a low-precision case, on the same values: what the precision
    buys over Prism's own float32 kernel, in the same interleaved run."""
    return prepare_pipeline(w.base, shape, float32_inputs_of(w, inputs), threads)  # type: ignore[attr-defined]


SYSTEMS = (System("prism", LABEL, "prism", prepare_pipeline),
           System("prism-f32", "Prism's float32 pipeline on the same values (reference column of --dtype runs)",
                  "reference", prepare_pipeline_f32,
                  applies=lambda w: w.extra.get("precision", "float32") != "float32"),
           System("hand", HAND_LABEL, "reference", prepare_hand,
                  applies=lambda w: w.extra.get("precision", "float32") == "float32"))  # written in float32
