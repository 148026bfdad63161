"""``prism search``: loading targets and reporting errors (no search runs here)."""

from __future__ import annotations

from pathlib import Path

import pytest

from prism.errors import PrismError
from prism.search.cli import _load, main
from prism.search.program import peel
from prism.workloads import WORKLOADS

pytestmark = pytest.mark.unit

PROGRAM = """
import prism

def build():
    g = prism.Graph("user")
    x = g.input("X", ("B", 32))
    w = g.input("W", (32, 16))
    g.output(g.relu(g.matmul(x, w)), "Y")
    return g
"""


def test_load_workload_and_file(tmp_path: Path) -> None:
    g, env, label = _load("W1", 0)
    assert env == {"n": 8} and "W1" in label and g.outputs
    f = tmp_path / "prog.py"
    f.write_text(PROGRAM)
    g, env, label = _load(str(f), 0)
    assert env == {} and label == "prog.py" and g.name == "user"
    f.write_text("x = 1\n")
    with pytest.raises(PrismError, match="must define `graph`"):
        _load(str(f), 0)
    with pytest.raises(PrismError, match="shape"):
        _load("W1", 99)


def test_unsupported_program_is_reported_by_name(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    f = tmp_path / "cat.py"
    f.write_text("import prism\ng = prism.Graph('cat')\na = g.input('A', (4, 8))\n"
                 "g.output(g.concat([a, a], 1), 'Y')\ngraph = g\n")
    assert main([str(f), "--no-cache"]) == 2
    out = capsys.readouterr().out
    assert "concat" in out and "error" in out


def test_peel_keeps_reshapes_outside_the_core() -> None:
    w = WORKLOADS["W6"]
    prog = peel(w.program(w.shapes[0]))
    ops = [n.op for n in prog.core.nodes]
    assert "reshape" not in ops  # the head regrouping of Q and of the output are views, outside the search
    assert prog.prologue["Q"][0][0] == "reshape" and prog.epilogue[0][0][0] == "reshape"
    w4 = WORKLOADS["W4"]
    p4 = peel(w4.program(w4.shapes[0]))
    # K is read only transposed: the core reads K^T, the block graphs read K with the transposed maps
    assert "permute" not in [n.op for n in p4.core.nodes] and p4.views["K"].perm == (0, 1, 3, 2)
    assert p4.core.inputs["K"].shape == tuple(p4.program.inputs["K"].shape[i] for i in (0, 1, 3, 2))
