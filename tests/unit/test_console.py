"""Tables stay readable when the output is piped or logged (rich would squeeze them to 80 columns)."""

from __future__ import annotations

import io

import pytest
from rich.table import Table

from prism.console import PIPE_WIDTH, console

pytestmark = pytest.mark.unit


def _wide_table() -> Table:
    t = Table()
    for k in range(12):
        t.add_column(f"column number {k}")
    t.add_row(*[f"value {k} of a long row" for k in range(12)])
    return t


def test_piped_console_renders_a_wide_table_whole(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("COLUMNS", raising=False)
    buf = io.StringIO()
    monkeypatch.setattr("sys.stdout", buf)
    c = console()
    assert c.width == PIPE_WIDTH
    c.print(_wide_table())
    text = buf.getvalue()
    assert "…" not in text and "value 11 of a long row" in text
    assert max(len(line) for line in text.splitlines()) < PIPE_WIDTH  # natural width, not padded


def test_columns_in_the_environment_win(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "100")
    monkeypatch.setattr("sys.stdout", io.StringIO())
    assert console().width == 100
