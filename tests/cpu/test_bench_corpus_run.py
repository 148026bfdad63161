"""`prism bench --corpus` end to end on two programs: the report has every system's time, error and status,
and Prism's result is checked against float64 (structure and correctness only, never timings)."""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")

from prism.bench.cli import main  # noqa: E402

pytestmark = pytest.mark.cpu


def test_corpus_quick_run(tmp_path, capsys) -> None:
    out = tmp_path / "corpus.json"
    rc = main(["--corpus", "--quick", "--rounds", "1", "--corpus-filter", "softsign", "--json", str(out)])
    assert rc == 0
    doc = json.loads(out.read_text())
    (row,) = doc["rows"]
    assert row["name"] == "softsign"
    assert row["status"]["eager"] == "ok" and row["status"]["prism"] == "ok"
    assert row["status"]["prism-dynamo"] == "ok" and row["err"]["prism-dynamo"] <= row["tol"]
    assert row["err"]["prism"] <= row["tol"] and row["fallbacks"] == [] and row["capture"] == "export"
    assert row["us"]["prism"] > 0 and row["us"]["eager"] > 0 and row["us"]["prism-dynamo"] > 0
    assert "| softsign | elementwise |" in capsys.readouterr().out
    assert main(["--corpus", "--corpus-filter", "no-such-program"]) == 2
