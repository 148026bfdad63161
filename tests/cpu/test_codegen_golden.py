"""Golden tests of the generated C: the text for two small graphs must not change by accident.

After an intended change to code generation, regenerate the expected files and review the diff:

    PRISM_REGEN_GOLDEN=1 .venv/bin/pytest tests/cpu/test_codegen_golden.py
    git diff tests/cpu/golden/

Generation is pure Python and pinned to the AVX-512 path, so the text does not depend on the machine;
the same graphs are then compiled for this machine and checked against the reference interpreter.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
from cg_helpers import assert_close, online_softmax_attention

import prism
from prism.codegen import generate
from prism.ir import BlockBuilder

pytestmark = pytest.mark.cpu

GOLDEN = Path(__file__).parent / "golden"


def rms_linear() -> prism.Graph:
    """Y = rms_norm(X) @ W as one kernel: grid over columns, loop over the contraction."""
    g = prism.Graph("golden rms_linear")
    X, W = g.input("X", (4, 64)), g.input("W", (64, 32))
    bb = BlockBuilder(grid=(2,), forloop=2, inputs=[X, W])
    x = bb.iter(0, imap=(None,), fmap=1)
    acc = bb.accumulate("sum", bb.matmul(x, bb.iter(1, imap=(1,), fmap=0)))
    bb.save(bb.div(acc, bb.accumulate("rms", x, eps=1e-6)), omap=(1,))
    (y,) = g.customized(bb.build(), [X, W])
    g.output(y, "Y")
    return g


def online_softmax() -> prism.Graph:
    """O = softmax(Q K^T / sqrt(D)) V for 2 heads: grid over heads, loop over key chunks."""
    return online_softmax_attention("golden online_softmax", (2, 4, 16), (2, 32, 16), (2,), 2)


@pytest.mark.parametrize("make", [rms_linear, online_softmax], ids=["rms_linear", "online_softmax"])
def test_generated_c_matches_golden(make) -> None:
    body = generate(make(), isa="avx512").body
    path = GOLDEN / f"{make.__name__}_avx512.c"
    if os.environ.get("PRISM_REGEN_GOLDEN") == "1":
        path.write_text(body)
    assert path.exists(), f"missing {path}; regenerate with PRISM_REGEN_GOLDEN=1"
    assert body == path.read_text(), (f"generated C for {make.__name__} changed; if intended, regenerate with "
                                      "PRISM_REGEN_GOLDEN=1 and review the diff")


@pytest.mark.parametrize("make", [rms_linear, online_softmax], ids=["rms_linear", "online_softmax"])
def test_golden_graph_runs_correctly(make, rng: np.random.Generator) -> None:
    g = make()
    x = {name: rng.standard_normal(tuple(n.shape)).astype(np.float32) for name, n in g.inputs.items()}
    (ref,) = g.evaluate(x, dtype=np.float64).values()
    assert_close(prism.compile(g)(**x), ref, make.__name__)
