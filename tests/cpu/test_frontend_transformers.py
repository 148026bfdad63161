"""Hugging Face decoders end to end: tiny Llama, Qwen2 (bias in Q/K/V), Qwen3 (QK-norm) and Mistral configs
from ``transformers`` (random weights, seeded, no downloads), ``model.forward`` compiled with
``backend="prism"``, ``generate()`` greedy: the same token ids as eager, and every matmul, attention
(causal prefill, decode over the KV cache with its dynamic length, grouped KV heads), norm and activation
on Prism. What stays in PyTorch must be one of the operators kept there by design (the embedding gather,
cache bookkeeping, integer positions, the causal mask), each with its reason in the report."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers", reason="transformers is an optional extra: pip install -e '.[test]'")

import prism  # noqa: E402
from prism.frontend import reports  # noqa: E402

pytestmark = [pytest.mark.cpu, pytest.mark.usefixtures("fresh_dynamo")]

# default options, as a user writes it (and as prism bench --models compiles: the two share the caches)
LAYERS = 2
KEPT = {  # operator -> a word its reason must contain
    "torch.nn.functional.embedding": "ids",
    "torch.tensor": "bookkeeping",
    "prism.frontend.ops.causal_bias": "causal",
    "operator.getitem": "int64",   # the integer positions of the rotary embedding
    "Tensor.float": "int64",
}


def _model(kind: str) -> Any:
    common = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=LAYERS, num_attention_heads=4,
                  num_key_value_heads=2, vocab_size=128, max_position_embeddings=128)
    if kind == "llama":
        return transformers.LlamaForCausalLM(transformers.LlamaConfig(**common))
    if kind == "qwen2":
        return transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**common))
    if kind == "qwen3":
        return transformers.Qwen3ForCausalLM(transformers.Qwen3Config(head_dim=16, **common))
    return transformers.MistralForCausalLM(transformers.MistralConfig(sliding_window=None, **common))


@pytest.mark.parametrize("kind,dtype", [("llama", "float32"), ("qwen2", "float32"), ("qwen3", "float32"),
                                        ("mistral", "float32"), ("llama", "bfloat16"), ("llama", "int8w-g32-bf16")])
def test_generate_matches_eager_with_the_decoder_on_prism(kind: str, dtype: str) -> None:
    """(bfloat16: ``model.to(torch.bfloat16)``; Prism computes in float32 and rounds where PyTorch stores a
    bfloat16 tensor, eager rounds every operator: the greedy tokens agree here. int8w-g32-bf16: every Linear
    int8 with a scale per group of 32 inputs, then the model moved to bfloat16: each Linear one piece over the
    int8 weight.)"""
    torch.manual_seed(0)
    if dtype == "int8w-g32-bf16":
        m = prism.quantize_weights(_model(kind).eval(), group_size=32).to(torch.bfloat16)
    else:
        m = _model(kind).eval().to(getattr(torch, dtype))
    ids = torch.randint(0, 128, (1, 7))
    with torch.no_grad():
        ref = m.generate(ids, max_new_tokens=6, do_sample=False)
        m.forward = torch.compile(m.forward, backend="prism")
        got = m.generate(ids, max_new_tokens=6, do_sample=False)
    assert torch.equal(got, ref)
    reps = reports()
    assert len(reps) >= 2  # the prompt, then decode steps
    for r in reps:
        table = r.table()
        assert not r.error, table
        for f in r.fallbacks:
            assert f.op in KEPT and KEPT[f.op] in f.reason, table
        assert all(p.status != "failed" for p in r.pieces), table
        on = [p for p in r.pieces if p.by_prism]
        assert all(p.runner.fallback_calls == 0 for p in on), table
        labels = [p.label for p in on]
        assert sum("scaled_dot_product_attention" in x for x in labels) == LAYERS, table
        # q, k, v, o, gate and up (one piece), down per layer, and the LM head
        assert sum(x.count("linear") for x in labels) == 7 * LAYERS + 1, table
        if dtype.startswith("int8"):   # each Linear reads its int8 weight as stored (no dequantized copy)
            assert all(any(s is not None and s.dtype == torch.int8 for s in p.runner.specs)
                       for p in on if "linear" in p.label), table
        assert sum("rms_norm" in x for x in labels) >= 2 * LAYERS + 1, table
        assert sum(x.count("silu") for x in labels) == LAYERS, table
        # RoPE: q's and k's rotation on Prism, inside their pieces (no lone neg left to PyTorch)
        assert sum(x.count("rotate_half") for x in labels) == 2 * LAYERS, table
        assert not any("neg" in p.label.split("+") for p in r.pieces), table
    decode = reps[-1]  # the dynamic decode graph serves every step after the first two
    attn = [p for p in decode.pieces if "scaled_dot_product_attention" in p.label]
    assert all(p.runner.prism_calls >= 1 for p in attn), decode.table()
    # the decode graph's layers (pieces, the cache's cat, the attention of dynamic KV length) are one chain,
    # called from C after the first call bound it (frontend/chain.py)
    chained = [c for c in decode.chains if sum("scaled_dot_product_attention" in m.label for m in c.members)]
    assert len(chained) == 1 and sum("scaled_dot_product_attention" in m.label
                                     for m in chained[0].members) == LAYERS, decode.table()
    assert chained[0]._fast is not None and chained[0].prism_calls >= 1, decode.table()
    # and nothing else: the RoPE table's pieces (past nn.Module's telemetry call) and the LM head (past the
    # whole-tensor slice h[:, -1:, :]) are members too -- one call per decode step
    members = {id(m) for m in chained[0].members}
    assert len(decode.chains) == 1 and all(id(p.runner) in members for p in decode.pieces if p.by_prism), \
        decode.table()


def test_models_bench_on_the_tiny_llama(tmp_path: Any, capsys: pytest.CaptureFixture[str]) -> None:
    """``prism bench --models`` on the tiny Llama (kept in this file, after the Llama test above: same worker
    and process, so the searches and tunings of those shapes serve here from memory rather than being
    repeated, concurrently, on another worker -- 150-196 s of the suite when it had a file of its own).
    The report has every system, equal token ids, the Prism share and what stays in PyTorch."""
    from prism.bench.cli import main
    out = tmp_path / "m.json"
    rc = main(["--models", "llama-tiny", "--rounds", "1", "--prompt", "7", "--new-tokens", "6", "--new-lengths", "none",
               "--first-token", "--json", str(out)])
    assert rc == 0
    text = capsys.readouterr().out
    assert "| prism |" in text and "| compile |" in text and "compute operators on Prism" in text
    data = json.loads(out.read_text())
    (m,) = data["models"]
    assert set(m["systems"]) == {"eager", "compile", "prism"}
    for s in m["systems"].values():
        assert s["status"] == "ok" and len(s["ttft_ms"]) == len(s["two_ms"]) == len(s["total_ms"]) == 1
        assert s["fresh_tps"] is not None and s["fresh_tps"] > 0   # decode past the KV lengths seen
    assert "new KV lengths" in text
    assert re.search(r"prism over the whole run: \d+ shapes derived from a tuned one, \d+ of them served by a "
                     r"compiled template", text), text
    p = m["systems"]["prism"]
    assert 0.5 < p["share"] <= 1.0 and p["prism_pieces"] > 0
    assert any("embedding" in k for k in p["kept"])
    assert not any(k.startswith("neg:") for k in p["kept"]), p["kept"]   # RoPE's negation is on Prism
    # where a decode step goes: kernels inside piece calls inside the step, every step the same calls
    b = p["breakdown"]
    assert 0 < b["kernel_ms"] < b["piece_ms"] < b["step_ms"], b
    assert b["piece_calls"] == int(b["piece_calls"]) > 0 and b["kernel_calls"] >= b["piece_calls"], b
    assert "Prism's decode step" in text and all(not s["breakdown"] for k, s in m["systems"].items() if k != "prism")
    # a new process's first token on the caches the run filled (its token checked against eager's there)
    assert m["systems"]["eager"]["first_token_s"] is None, m["notes"]
    assert all(m["systems"][k]["first_token_s"] > 0 for k in ("compile", "prism")), m["notes"]
    assert "first token s, new process" in text


def test_models_bench_at_a_batch_of_sequences(tmp_path: Any, capsys: pytest.CaptureFixture[str]) -> None:
    """``prism bench --models --batch 3``: every system generates for 3 prompts at once with eager's tokens; the
    report counts every sequence's tokens, and llama.cpp (one sequence) is left out with the reason."""
    from prism.bench.cli import main
    out = tmp_path / "m.json"
    assert main(["--models", "llama-tiny", "--batch", "3", "--rounds", "1", "--prompt", "7", "--new-tokens", "4",
                 "--new-lengths", "none", "--fresh-tokens", "0", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    (m,) = json.loads(out.read_text())["models"]
    assert m["batch"] == 3 and "batch of 3 sequences" in text
    assert all(s["status"] == "ok" and len(s["step_ms"]) == 1 for s in m["systems"].values()), m["systems"]
    assert "llama.cpp" not in m["systems"] or "not run at batch 3" in " ".join(m["notes"])
    assert main(["--models", "llama-tiny", "--batch", "0"]) == 2


def test_models_bench_runs_every_model_of_a_list_on_prism(tmp_path: Any) -> None:
    """Two models in one ``prism bench --models`` call: transformers wraps every model's forward in one
    function, whose compiled variants count against Dynamo's recompile limit; without a reset between models
    the second one's compile and prism systems ran eager PyTorch. Each must have run pieces on Prism."""
    from prism.bench.cli import main
    out = tmp_path / "m.json"
    assert main(["--models", "llama-tiny,llama-tiny", "--rounds", "1", "--prompt", "7", "--new-tokens", "4",
                 "--new-lengths", "none", "--fresh-tokens", "0", "--json", str(out)]) == 0
    models = json.loads(out.read_text())["models"]
    assert len(models) == 2
    for m in models:
        p = m["systems"]["prism"]
        assert p["status"] == "ok" and p["prism_pieces"] > 0 and p["breakdown"]["piece_calls"] > 0, p


def test_batch_of_eight_with_left_padding() -> None:
    """Batch decode as users run it: 8 prompts, half of them left-padded (``attention_mask`` zeros). The
    padding mask ``transformers`` builds in PyTorch enters the attention pieces as an input (converted to an
    additive bias per call), the padded queries' all-masked rows give 0 as in PyTorch, and ``generate()``
    gives eager's tokens with every attention on Prism."""
    torch.manual_seed(0)
    m = _model("llama").eval()
    ids = torch.randint(0, 128, (8, 7))
    mask = torch.ones_like(ids)
    mask[:4, :2] = 0
    with torch.no_grad():
        ref = m.generate(ids, attention_mask=mask, max_new_tokens=5, do_sample=False, pad_token_id=0)
        m.forward = torch.compile(m.forward, backend="prism")
        got = m.generate(ids, attention_mask=mask, max_new_tokens=5, do_sample=False, pad_token_id=0)
    assert torch.equal(got, ref)
    reps = reports()
    assert len(reps) >= 2
    for r in reps:
        table = r.table()
        assert not r.error and all(p.status != "failed" for p in r.pieces), table
        attn = [p for p in r.pieces if "scaled_dot_product_attention" in p.label]
        assert len(attn) == LAYERS and all(p.by_prism and p.runner.fallback_calls == 0 for p in attn), table
        assert not any("scaled_dot_product_attention" in f.op for f in r.fallbacks), table
