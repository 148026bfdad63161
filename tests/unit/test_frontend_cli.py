"""`prism cache ls|clear` on a cache directory laid out like the real one (no compiler, no torch)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from prism.frontend.cli import CATEGORIES, cache_main

pytestmark = pytest.mark.unit


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("PRISM_CACHE_DIR", str(tmp_path))
    for rel, size in (("so/ab/ab12.so", 300), ("so/ab/ab12.c", 100), ("so/ab/ab12.json", 50),
                      ("search/0123.json", 70), ("tune/results/key/1.json", 20), ("tune/results/key/2.json", 20),
                      ("tune/machine/fp-t2.json", 10)):
        p = tmp_path / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(b"x" * size)
    return tmp_path


def _ls(capsys: pytest.CaptureFixture[str]) -> dict[str, dict]:
    assert cache_main(["ls", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    return {r["category"]: r for r in doc["categories"]}


def test_ls_counts_every_category(cache: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rows = _ls(capsys)
    assert set(rows) == set(CATEGORIES)
    assert (rows["kernels"]["files"], rows["kernels"]["bytes"]) == (3, 450)
    assert (rows["search"]["files"], rows["tuning"]["files"], rows["machine"]["files"]) == (1, 2, 1)
    assert cache_main(["ls", "-v"]) == 0
    out = capsys.readouterr().out
    assert "ab12.so" in out and "kernels" in out


def test_clear_one_category_then_all(cache: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cache_main(["clear", "kernels"]) == 0
    assert "cleared kernels: 3 files" in capsys.readouterr().out
    rows = _ls(capsys)
    assert rows["kernels"]["files"] == 0 and rows["search"]["files"] == 1
    assert cache_main(["clear"]) == 0
    capsys.readouterr()
    assert all(r["files"] == 0 for r in _ls(capsys).values())
    assert cache.exists()  # the root itself stays


def test_unknown_category_is_a_usage_error(cache: Path) -> None:
    with pytest.raises(SystemExit) as e:
        cache_main(["clear", "everything"])
    assert e.value.code == 2
