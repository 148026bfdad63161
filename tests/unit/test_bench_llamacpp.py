"""The llama.cpp baseline of the model benchmark: its set-up says why it is absent, its output is read by
test (prompt vs generation), and a system measured by llama-bench reports its tokens/s as measured."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from prism.bench import llamacpp
from prism.bench.models import SystemResult


def _test(n_prompt: int, n_gen: int, ts: float) -> dict:
    return {"n_prompt": n_prompt, "n_gen": n_gen, "n_depth": 128 if n_gen else 0, "avg_ts": ts,
            "model_type": "llama ?B BF16", "n_threads": 2}


def test_llama_bench_output_is_read_by_test() -> None:
    out = json.dumps([_test(128, 0, 441.55), _test(0, 32, 34.64)])
    assert llamacpp.parse(out) == {"pp": 441.55, "tg": 34.64}
    assert llamacpp.parse(json.dumps([_test(16, 4, 99.0)])) == {}   # a combined test is neither


def test_absent_or_incomplete_tree_says_why(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("PRISM_LLAMA_CPP", raising=False)
    tree, why = llamacpp.find()
    assert tree is None and "PRISM_LLAMA_CPP" in why
    monkeypatch.setenv("PRISM_LLAMA_CPP", str(tmp_path))
    tree, why = llamacpp.find()
    assert tree is None and "llama-bench" in why and "convert_hf_to_gguf.py" in why


def test_precisions_map_to_gguf_types() -> None:
    assert llamacpp.OUTTYPE == {"float32": "f32", "bfloat16": "bf16", "float16": "f16", "int8w": "q8_0",
                                "int8w-bf16": "q8_0", "w8a8": "q8_0", "int8w-g32": "q8_0", "int8w-g32-bf16": "q8_0"}
    from prism.bench.models import DTYPES
    assert set(llamacpp.OUTTYPE) == set(DTYPES)   # every --models precision has its GGUF type


def test_a_directly_measured_decode_rate_is_reported_as_measured() -> None:
    r = SystemResult(tps=[30.0, 34.0, 32.0])
    assert r.decode_tps(32) == 32.0
    timed = SystemResult(two_ms=[100.0], total_ms=[400.0])
    assert timed.decode_tps(32) == pytest.approx(1e3 / (300.0 / 30))
    stamped = SystemResult(two_ms=[100.0], total_ms=[400.0], step_ms=[12.0, 8.0, 10.0])   # steps timed inside
    assert stamped.decode_tps(32) == pytest.approx(100.0) and stamped.round_tps(32) == pytest.approx([83.33, 125, 100],
                                                                                                     rel=1e-3)


def test_prism_against_llama_cpp_is_also_reported_round_by_round() -> None:
    """The host's bandwidth moves between rounds: the report gives the per-round ratios and their median beside
    the medians (last case: medians 200 over 150, 1.33x; round by round 1.00, 0.50, 1.33, median 1.00)."""
    from prism.bench.models import ModelResult, markdown
    spec = {"arch": "llama", "layers": 1, "hidden": 8, "mlp": 8, "heads": 1, "kv_heads": 1, "vocab": 8}
    m = ModelResult("m", spec, 8, 32, 1000, systems={
        "prism": SystemResult(two_ms=[10.0, 10.0, 10.0], total_ms=[310.0, 160.0, 160.0]),   # 100, 200, 200 tok/s
        "llama.cpp": SystemResult(tps=[100.0, 400.0, 400.0])})
    ratios, med = m.paired("prism", "llama.cpp")
    assert ratios == pytest.approx([1.0, 0.5, 0.5]) and med == pytest.approx(0.5)
    m.systems["llama.cpp"].tps = [100.0, 200.0, 400.0]
    assert m.paired("prism", "llama.cpp")[1] == pytest.approx(1.0)   # medians: 200 over 200 as well
    m.systems["llama.cpp"].tps = [100.0, 200.0]
    assert m.paired("prism", "llama.cpp") is None                      # rounds differ: no pairing
    m.systems["llama.cpp"].tps = [100.0, 400.0, 150.0]
    assert m.systems["prism"].decode_tps(32) / m.systems["llama.cpp"].decode_tps(32) == pytest.approx(200 / 150)
    text = markdown([m], {"threads": 2, "rounds": 3})
    assert "round by round: 1.00, 0.50, 1.33 (paired median **1.000**" in text


def test_a_batch_counts_every_sequences_tokens_and_reads_the_weights_once_per_step() -> None:
    from prism.bench.models import ModelResult, markdown
    spec = {"arch": "llama", "layers": 1, "hidden": 8, "mlp": 8, "heads": 1, "kv_heads": 1, "vocab": 8}
    steps = SystemResult(ttft_ms=[50.0], two_ms=[10.0], total_ms=[310.0])   # 100 steps/s; prefill 50 ms
    one = ModelResult("m", spec, 8, 32, 1000, bandwidth=[1e6], systems={"eager": steps})
    four = ModelResult("m", spec, 8, 32, 1000, bandwidth=[1e6], systems={"eager": steps}, batch=4)
    assert one.decode_tps("eager") == pytest.approx(100.0) and four.decode_tps("eager") == pytest.approx(400.0)
    assert four.prefill_tps("eager") == pytest.approx(4 * 8 / 0.05)
    assert four.roofline("eager") == one.roofline("eager") == pytest.approx(0.1)
    assert "| 400.00 |" in markdown([four], {"threads": 2, "rounds": 1}) and "batch of 4" in markdown([four], {})
