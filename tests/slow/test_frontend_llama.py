"""A Llama-style decoder layer (prism/frontend/examples/llama.py: RMSNorm with weight, Q/K/V projections,
rotary embeddings, grouped-query attention over a KV cache, SwiGLU MLP, residuals; hidden 256, 8 heads /
2 KV heads, head dim 32, MLP 512) under prism.optimize and torch.compile(backend="prism"): the same
outputs as eager PyTorch at two batch sizes (float32; max |got - eager| <= 1e-4 * max |eager| for each
output), the second batch size without a new search (search counters), and the MLP and the attention
core run by Prism kernels (reports and call counters), so that a total fallback cannot pass."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

torch = pytest.importorskip("torch")

import prism  # noqa: E402
from prism.api import clear_memory_caches  # noqa: E402
from prism.frontend import clear_reports, reports  # noqa: E402
from prism.frontend.examples.llama import make_inputs, make_layer  # noqa: E402
from prism.tune import STATS  # noqa: E402

pytestmark = pytest.mark.slow

TOL = 1e-4
BATCHES = (3, 5)
DYNAMIC = {0: [0], 3: [0], 4: [0]}  # batch dims of x, k_cache, v_cache
OPTS = {"top_k": 3, "time_limit": 120.0}
MLP = "rms_norm+mul+linear+silu+linear+mul"
ATTENTION = "scaled_dot_product_attention"


@pytest.fixture(scope="module", autouse=True)
def _own_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PRISM_CACHE_DIR", str(tmp_path_factory.mktemp("frontend-llama")))
        clear_memory_caches()
        torch._dynamo.reset()
        yield
    clear_memory_caches()
    torch._dynamo.reset()


def _check(got: Any, ref: Any) -> None:
    assert len(got) == len(ref) == 3
    for a, b in zip(got, ref):
        assert a.shape == b.shape and a.dtype == b.dtype == torch.float32
        err = float((a - b).abs().max()) / float(b.abs().max())
        assert err <= TOL, err


def _run_two_batches(fn: Any, layer: Any) -> None:
    with torch.no_grad():
        for i, b in enumerate(BATCHES):
            args = make_inputs(layer, b, seed=b)
            if i:
                searched = STATS.searches + STATS.search_cache_hits
                tuned = STATS.tunings + STATS.tune_cache_hits + STATS.tune_derived + STATS.tune_memory_hits
            _check(fn(*args), layer(*args))
            if i:  # a new batch size: pieces specialized again (tuned, derived from the nearby tuned batch size,
                # or served by the kernel object the other test's equal pieces share), nothing searched
                assert STATS.searches + STATS.search_cache_hits == searched
                assert STATS.tunings + STATS.tune_cache_hits + STATS.tune_derived + STATS.tune_memory_hits > tuned


def _assert_prism_ran(rep: Any, calls: int) -> None:
    by_label = {}
    for p in rep.pieces:
        by_label.setdefault(p.label, []).append(p)
    for label in (MLP, ATTENTION):
        (p,) = by_label[label]
        assert p.by_prism, (label, p.status, p.reason)
        assert p.runner.prism_calls == calls and p.runner.fallback_calls == 0, p.runner
    assert not rep.fallbacks  # every operator of the layer is supported
    assert len(rep.prism_pieces()) >= 8, rep.table()


def test_llama_layer_prism_optimize() -> None:
    clear_reports()
    layer = make_layer()
    opt = prism.optimize(layer, make_inputs(layer, BATCHES[0]), dynamic=DYNAMIC, **OPTS)
    _run_two_batches(opt, layer)
    (rep,) = opt.report
    _assert_prism_ran(rep, calls=3)  # priming call + two batch sizes


def test_llama_layer_torch_compile() -> None:
    clear_reports()
    torch._dynamo.reset()
    layer = make_layer()
    compiled = torch.compile(layer, backend="prism", options=OPTS)

    def call(*args: torch.Tensor) -> Any:
        for i in DYNAMIC:
            torch._dynamo.mark_dynamic(args[i], 0)
        return compiled(*args)
    _run_two_batches(call, layer)
    (rep,) = reports()
    assert rep.source == "dynamo"
    _assert_prism_ran(rep, calls=2)
