"""Kernel.call_tensors, the pieces' lean call path: same results as Kernel.call, a new shape binds (and
compiles) its variant, a shape the program does not accept raises the same error."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import prism  # noqa: E402
from prism.errors import PrismError  # noqa: E402

pytestmark = pytest.mark.cpu


def test_call_tensors_matches_call() -> None:
    g = prism.Graph()
    x, w = g.input("x", ("n", 16)), g.input("w", (16, 8))
    y = g.relu(g.matmul(x, w))
    g.output(y, "y")
    g.output(g.sum(y, -1), "s")
    k = prism.compile(g)
    wt = torch.randn(16, 8)
    for n in (3, 5, 3):
        xt = torch.randn(n, 16)
        got = k.call_tensors([xt, wt])
        ref = k.call({"x": xt, "w": wt})
        assert [tuple(o.shape) for o in got] == [(n, 8), (n, 1)]
        assert torch.equal(got[0], ref["y"]) and torch.equal(got[1], ref["s"])
        assert got[0].data_ptr() % 64 == 0
        np.testing.assert_allclose(got[0].numpy(), np.maximum(xt.numpy() @ wt.numpy(), 0), rtol=1e-5, atol=1e-5)
    with pytest.raises(PrismError):
        k.call_tensors([torch.randn(3, 15), wt])
