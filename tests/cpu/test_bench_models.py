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


def test_int8w_models_quantize_every_linear_and_count_int8_bytes() -> None:
    from prism.frontend.quantize import Int8Linear
    m = build(MODELS["llama-tiny"], dtype="int8w")
    assert not [n for n, x in m.named_modules() if isinstance(x, torch.nn.Linear)]
    q = [x for x in m.modules() if isinstance(x, Int8Linear)]
    assert q and m.get_output_embeddings() in q       # the LM head too, as llama.cpp's q8_0
    linear = sum(x.qweight.numel() + x.scale.numel() * 4 for x in q)
    others = sum(p.numel() * 4 for p in m.parameters()) - m.get_input_embeddings().weight.numel() * 4
    assert decode_bytes(m) == linear + others


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
