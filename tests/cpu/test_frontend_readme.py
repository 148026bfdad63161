"""The three ways in (README.md and docs/frontend.md, "Three ways in": the builder API, prism.optimize,
torch.compile(backend="prism")) run as written, and `prism optimize FILE.py` works on a file that
follows the documented convention."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from prism.frontend import clear_reports, reports  # noqa: E402
from prism.frontend.cli import optimize_main  # noqa: E402

pytestmark = pytest.mark.cpu
ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", ROOT / "docs" / "frontend.md"]


def _blocks(doc: Path = DOCS[1]) -> list[str]:
    text = doc.read_text()
    section = text.split("## Three ways in", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```python\n(.*?)```", section, re.S)


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_three_blocks_are_documented(doc: Path) -> None:
    blocks = _blocks(doc)
    assert len(blocks) == 3
    assert "prism.superoptimize" in blocks[0] and "prism.optimize" in blocks[1] and 'backend="prism"' in blocks[2]


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
@pytest.mark.parametrize("index", [0, 1, 2])
def test_block_runs(doc: Path, index: int) -> None:
    torch._dynamo.reset()
    clear_reports()
    exec(compile(_blocks(doc)[index], f"{doc.name} block {index}", "exec"), {"__name__": "doc_example"})
    if index:  # the PyTorch blocks: Prism really ran a piece
        assert any(p.by_prism and p.runner.prism_calls > 0 for r in reports() for p in r.pieces)


def test_prism_optimize_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    torch._dynamo.reset()
    f = tmp_path / "model.py"
    f.write_text(
        "import torch\n"
        "import torch.nn.functional as F\n"
        "def model(x, w):\n"
        "    return F.silu(x @ w) * 2.0\n"
        "example_inputs = (torch.randn(4, 64), torch.randn(64, 32))\n"
        "dynamic = {0: [0]}\n"
        "options = {'top_k': 2}\n")
    assert optimize_main([str(f), "--time-limit", "60", "--bench", "--reps", "3"]) == 0
    out = capsys.readouterr().out
    assert "[prism] matmul+silu+mul" in out and "(ok, tolerance" in out and "median per call" in out
    assert optimize_main([str(f), "--time-limit", "60", "--capture", "export"]) == 0  # the same pieces, cached
    out = capsys.readouterr().out
    assert "(export, " in out and "[prism] matmul+silu+mul" in out and "(ok, tolerance" in out
    branchy = tmp_path / "branchy.py"
    branchy.write_text("import torch\n"
                       "def model(x):\n"
                       "    return x * 2 if x.sum() > 0 else x - 1\n"
                       "example_inputs = (torch.ones(4, 8),)\n")
    assert optimize_main([str(branchy), "--capture", "export"]) == 2
    assert "capture='auto' (the default) or 'dynamo'" in capsys.readouterr().err
    assert optimize_main([str(branchy), "--time-limit", "60"]) == 0  # the default: through Dynamo
    assert "(dynamo, " in capsys.readouterr().out
    bad = tmp_path / "bad.py"
    bad.write_text("x = 1\n")
    assert optimize_main([str(bad)]) == 2
