"""prism.superoptimize on the benchmark workloads whose search fits a small budget (W1, W3 one kernel
operator; W7 two): every returned kernel is verified, matches the float64 reference on normal and hostile
inputs at several batch sizes, and a new batch size only re-tunes."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest

import prism
from prism.api import clear_memory_caches
from prism.search import Limits
from prism.tune import STATS, reset_stats
from prism.verify.numeric import make_inputs, reduction_length, tolerance
from prism.workloads import WORKLOADS

pytestmark = pytest.mark.slow

CASES = {"W1": 1, "W3": 1, "W7": 2}   # workload -> max kernel operators of the search


@pytest.fixture(scope="module", autouse=True)
def _own_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PRISM_CACHE_DIR", str(tmp_path_factory.mktemp("superopt-slow")))
        clear_memory_caches()
        yield
    clear_memory_caches()


@pytest.mark.parametrize("wid", sorted(CASES))
def test_workload_superoptimized_and_correct(wid: str) -> None:
    w = WORKLOADS[wid]
    s = w.shapes[0]
    prog = w.program(s)
    reset_stats()
    k = prism.superoptimize(prog, limits=Limits(max_kernel_ops=CASES[wid], time_limit=120, max_results=3))
    assert k.implementations
    (batch,) = sorted(prog.symbols())
    for value in (w.env(s)[batch], 3):
        env = {batch: value}
        for kind in ("normal", "hostile"):
            x64 = make_inputs(prog, env, kind, seed=value)
            ref = prog.evaluate(x64, dtype=np.float64)
            got = k(**{n: a.astype(np.float32) for n, a in x64.items()})
            got = got if isinstance(got, dict) else {prog.output_names[0]: got}
            tol = tolerance(reduction_length(prog, env))
            for name, r in ref.items():
                scale = float(np.sqrt(np.mean(r ** 2)))
                assert np.max(np.abs(got[name] - r) / (np.abs(r) + scale)) <= tol, (wid, env, kind)
        spec = k.specialize(**env)
        assert spec.check.passed and spec.implementation.how == "formal+numeric"
    assert STATS.tunings == 2 and STATS.searches + STATS.search_cache_hits == 1
    assert "tuning table" in k.explain()
