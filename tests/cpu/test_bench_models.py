"""``prism bench --models``' parts on the tiny Llama: bytes per token, the plot, CLI errors (the run itself,
every system on the tiny Llama, is in test_frontend_transformers.py, beside the tests whose tunings it
reuses). Nothing here asserts on a timing."""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers", reason="transformers is an optional extra: pip install -e '.[test]'")

from prism.bench.cli import main  # noqa: E402
from prism.bench.models import MODELS, build, decode_bytes  # noqa: E402

pytestmark = pytest.mark.cpu


def test_decode_bytes_leave_out_the_embedding_table() -> None:
    m = build(MODELS["llama-tiny"])
    total = sum(p.numel() * 4 for p in m.parameters())
    assert decode_bytes(m) == total - m.get_input_embeddings().weight.numel() * 4


@pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="reads /proc/self/maps (Linux)")
def test_float_models_are_loaded_from_their_checkpoint_as_a_users_model_is() -> None:
    """build() saves and loads the model back (transformers keeps the weights in the checkpoint's mmap, as
    from_pretrained does for users); copy_model gives each system its own modules on the same file."""
    from prism.bench.models import copy_model
    m = build(MODELS["llama-tiny"], dtype="bfloat16")
    m.generation_config.eos_token_id = None
    c = copy_model(m)
    w, cw = m.model.layers[0].mlp.up_proj.weight, c.model.layers[0].mlp.up_proj.weight
    assert w is not cw and torch.equal(w, cw) and w.dtype == torch.bfloat16
    assert c.generation_config.eos_token_id is None

    def mapping(t: torch.Tensor) -> str:
        a = t.data_ptr()
        for line in Path("/proc/self/maps").read_text().splitlines():
            lo, hi = (int(x, 16) for x in line.split()[0].split("-"))
            if lo <= a < hi:
                return line.split()[-1]
        return ""
    assert mapping(w).endswith(".safetensors") and mapping(w) == mapping(cw)
    ref = build(MODELS["llama-tiny"], dtype="bfloat16", from_checkpoint=False)
    assert torch.equal(ref.model.layers[0].mlp.up_proj.weight, w)   # the same seeded weights


def test_int8w_models_quantize_every_linear_and_count_int8_bytes() -> None:
    from prism.frontend.quantize import Int8Linear
    m = build(MODELS["llama-tiny"], dtype="int8w")
    assert not [n for n, x in m.named_modules() if isinstance(x, torch.nn.Linear)]
    q = [x for x in m.modules() if isinstance(x, Int8Linear)]
    assert q and m.get_output_embeddings() in q       # the LM head too, as llama.cpp's q8_0
    linear = sum(x.qweight.numel() + x.scale.numel() * 4 for x in q)
    others = sum(p.numel() * 4 for p in m.parameters()) - m.get_input_embeddings().weight.numel() * 4
    assert decode_bytes(m) == linear + others


def test_int8w_bf16_models_keep_int8_weights_in_a_bfloat16_model() -> None:
    """``--dtype int8w-bf16``: quantize_weights, then the model moved to bfloat16 (torchao's int8 weight-only on a
    bfloat16 checkpoint): the weights stay int8, the scales and every other parameter are bfloat16."""
    from prism.frontend.quantize import Int8Linear
    m = build(MODELS["llama-tiny"], dtype="int8w-bf16")
    q = [x for x in m.modules() if isinstance(x, Int8Linear)]
    assert q and not [n for n, x in m.named_modules() if isinstance(x, torch.nn.Linear)]
    assert {x.qweight.dtype for x in q} == {torch.int8} and {x.scale.dtype for x in q} == {torch.bfloat16}
    assert {p.dtype for p in m.parameters()} == {torch.bfloat16}
    linear = sum(x.qweight.numel() + x.scale.numel() * 2 for x in q)
    others = sum(p.numel() * 2 for p in m.parameters()) - m.get_input_embeddings().weight.numel() * 2
    assert decode_bytes(m) == linear + others


def test_w8a8_models_quantize_activations_too() -> None:
    """``--dtype w8a8``: the int8 weights of int8w in a float32 model, each Linear an Int8DynLinear (its input rows
    quantized at each call); llama.cpp's GGUF for it is q8_0."""
    from prism.bench.llamacpp import OUTTYPE
    from prism.frontend.quantize import Int8DynLinear
    m = build(MODELS["llama-tiny"], dtype="w8a8")
    q = [x for x in m.modules() if isinstance(x, Int8DynLinear)]
    assert q and m.get_output_embeddings() in q and not [x for x in m.modules() if isinstance(x, torch.nn.Linear)]
    assert {x.qweight.dtype for x in q} == {torch.int8} and {p.dtype for p in m.parameters()} == {torch.float32}
    assert OUTTYPE["w8a8"] == "q8_0"


def test_int8w_g32_models_have_a_scale_per_group_of_32() -> None:
    """``--dtype int8w-g32``: every Linear int8 weight-only with a float32 scale per group of 32 input features (the
    weights of llama.cpp's q8_0, whose GGUF it is compared with: float16 scales), float32 activations; the bytes a
    decode step reads count the group scales."""
    from prism.bench.llamacpp import OUTTYPE
    from prism.frontend.quantize import Int8Linear
    m = build(MODELS["llama-tiny"], dtype="int8w-g32")
    q = [x for x in m.modules() if isinstance(x, Int8Linear)]
    assert q and m.get_output_embeddings() in q and not [x for x in m.modules() if isinstance(x, torch.nn.Linear)]
    assert {x.group_size for x in q} == {32} and all(x.scale.shape == (x.out_features, x.in_features // 32) for x in q)
    assert {p.dtype for p in m.parameters()} == {torch.float32} and OUTTYPE["int8w-g32"] == "q8_0"
    assert {x.scale.dtype for x in q} == {torch.float16}   # as q8_0 stores its block scales
    linear = sum(x.qweight.numel() + x.scale.numel() * 2 for x in q)
    others = sum(p.numel() * 4 for p in m.parameters()) - m.get_input_embeddings().weight.numel() * 4
    assert decode_bytes(m) == linear + others


def test_int8w_g32_bf16_models_keep_the_int8_weights_in_a_bfloat16_model() -> None:
    """``--dtype int8w-g32-bf16``: the weights of int8w-g32 in the model moved to bfloat16 afterwards: int8 weights,
    bfloat16 group scales and everything else bfloat16; compared with llama.cpp's q8_0 too."""
    from prism.bench.llamacpp import OUTTYPE
    from prism.frontend.quantize import Int8Linear
    m = build(MODELS["llama-tiny"], dtype="int8w-g32-bf16")
    q = [x for x in m.modules() if isinstance(x, Int8Linear)]
    assert q and {x.group_size for x in q} == {32} and {x.qweight.dtype for x in q} == {torch.int8}
    assert {x.scale.dtype for x in q} == {torch.bfloat16} and {p.dtype for p in m.parameters()} == {torch.bfloat16}
    assert OUTTYPE["int8w-g32-bf16"] == "q8_0"


def test_plot(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib", reason="matplotlib is in the bench extra: pip install -e '.[bench]'")
    from prism.bench.models import ModelResult, SystemResult, plot
    m = ModelResult("llama-tiny", {}, 8, 6, 1000, systems={
        "eager": SystemResult(ttft_ms=[2.0], two_ms=[3.0], total_ms=[7.0]),
        "prism": SystemResult(ttft_ms=[1.5], two_ms=[2.5], total_ms=[5.0])})
    png = tmp_path / "m.png"
    plot([m], str(png))
    assert png.stat().st_size > 0


def test_plot_without_matplotlib_is_refused_before_the_run(monkeypatch: pytest.MonkeyPatch,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    import sys
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib raises ImportError
    assert main(["--models", "llama-tiny", "--plot", "x.png"]) == 2
    assert "matplotlib" in capsys.readouterr().err


def test_unknown_model_is_an_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--models", "gpt-17"]) == 2
    assert "unknown model" in capsys.readouterr().err


def test_w8a8_is_a_models_precision_only(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--workloads", "W1", "--dtype", "w8a8", "--quick"]) == 2
    assert "--models only" in capsys.readouterr().err


def test_a_refused_recompile_is_counted() -> None:
    """Past Dynamo's recompile limit a frame runs in eager PyTorch: the models bench counts those refusals
    (recompile_limit_hits) and says so in its notes, instead of reporting eager's time as a compiler's."""
    from prism.bench.models import recompile_limit_hits
    # config.patch, not monkeypatch: monkeypatch's undo left Dynamo's config without the key for later tests
    limit = torch._dynamo.config.recompile_limit
    with torch._dynamo.config.patch(recompile_limit=1):
        before = recompile_limit_hits()
        f = torch.compile(lambda x: x * 2, dynamic=False)
        f(torch.ones(2))
        assert recompile_limit_hits() == before   # the first graph: no refusal
        f(torch.ones(3))
        f(torch.ones(4))
        assert recompile_limit_hits() > before
    assert torch._dynamo.config.recompile_limit == limit
