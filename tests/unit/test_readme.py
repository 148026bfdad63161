"""The README's two opening commands exist and CI runs the README's test command verbatim."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit
ROOT = Path(__file__).resolve().parents[2]


def _commands() -> list[str]:
    text = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```(?:bash|sh)\n(.*?)```", text, re.S)
    return [line.strip() for b in blocks[:2] for line in b.splitlines() if line.strip() and not line.startswith("#")]


def test_readme_starts_with_two_commands() -> None:
    cmds = _commands()
    assert len(cmds) == 2, cmds
    assert "pip install" in cmds[0] and "prism " in cmds[0]
    assert "pip install" in cmds[1] and "pytest" in cmds[1]


def test_ci_runs_the_readme_test_command() -> None:
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    assert _commands()[1] in [line.strip() for line in ci]


def test_readme_python_examples_run() -> None:
    """The pure-IR examples; the "Three ways in" blocks search and compile, so tests/cpu runs them."""
    text = (ROOT / "README.md").read_text()
    head, _, rest = text.partition("## Three ways in")
    text = head + (rest.split("\n## ", 1)[1] if "\n## " in rest else "")
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    assert blocks
    for b in blocks:
        exec(compile(b, "README.md", "exec"), {"__name__": "readme_example"})
