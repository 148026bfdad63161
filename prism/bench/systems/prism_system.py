"""Prism's column: the workload's HAND-WRITTEN known-good structure compiled by Prism's code generator.

Until the search lands, this is what Prism's numbers mean (the report says so). When ``prism.compile``
does not exist yet the column is "unavailable"; it is never filled with the NumPy reference or any other
system's numbers.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping

import numpy as np

from prism.bench.systems.base import Prepared, System, Unavailable
from prism.workloads import Workload
from prism.workloads.base import Shape

LABEL = "Prism (hand-written structure, compiled by Prism's code generator; not a search result)"


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


def prepare_prism(w: Workload, shape: Shape, inputs: Mapping[str, np.ndarray], threads: int) -> Prepared:
    os.environ["PRISM_NUM_THREADS"] = str(threads)
    return prism_runner(w, shape)(inputs)


SYSTEMS = (System("prism", LABEL, "prism", prepare_prism),)
