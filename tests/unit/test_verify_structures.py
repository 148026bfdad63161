"""Structures beyond the hand-written ones: split-K over either grid dim, 2-D grids, a two-kernel
split-K reduced at the kernel level, split-KV attention with the split as grid dim 0."""

from __future__ import annotations

import math

import pytest

from prism.ir.block import BlockBuilder
from prism.ir.dims import sym
from prism.ir.graph import Graph
from prism.verify import numeric_check, prove
from prism.workloads import WORKLOADS

pytestmark = pytest.mark.unit


def _mm_ref() -> Graph:
    g = Graph("ref")
    g.output(g.matmul(g.input("X", ("n", 256)), g.input("W", (256, 512))), "Y")
    return g


def _mm(grid: tuple, ximap: tuple, wimap: tuple, omap: tuple) -> Graph:
    g = Graph("candidate")
    X, W = g.input("X", ("n", 256)), g.input("W", (256, 512))
    bb = BlockBuilder(grid=grid, forloop="F", inputs=[X, W])
    acc = bb.accumulate("sum", bb.matmul(bb.iter(0, imap=ximap, fmap=1), bb.iter(1, imap=wimap, fmap=0)))
    bb.save(acc, omap=omap)
    (y,) = g.customized(bb.build(), [X, W])
    g.output(y, "Y")
    return g


@pytest.mark.parametrize(("name", "grid", "ximap", "wimap", "omap"), [
    ("split-k-grid1", ("G", "S"), (None, 1), (1, 0), (1, None)),
    ("split-k-grid0", ("S", "G"), (1, None), (0, 1), (None, 1)),
    ("rows-and-cols", ("R", "G"), (0, None), (None, 1), (0, 1)),
    ("rows-only", ("R",), (0,), (None,), (0,)),
])
def test_matmul_tilings_are_proved(name: str, grid: tuple, ximap: tuple, wimap: tuple, omap: tuple) -> None:
    cand, ref = _mm(grid, ximap, wimap, omap), _mm_ref()
    assert prove(cand, ref).proved
    assert numeric_check(cand, ref, n_instantiations=2, kinds=("normal",)).passed


def test_wrong_tiling_is_not_proved() -> None:
    """Partial sums over the column blocks instead of concatenation (and a matching shape): X @ W summed
    over column chunks of W has the shape of one chunk, so compare with that."""
    cand = _mm(("S", "G"), (1, None), (0, 1), (None, None))  # both grid dims summed: wrong
    ref = Graph("ref")
    X, W = ref.input("X", ("n", 256)), ref.input("W", (256, 512))
    ref.output(ref.matmul(X, ref.split(W, [256, 256], 1)[0]), "Y")
    assert not prove(cand, ref).proved


def test_two_kernel_split_k_reduced_at_kernel_level() -> None:
    g = Graph("two kernels")
    X, W = g.input("X", ("n", 256)), g.input("W", (256, 512))
    bb = BlockBuilder(grid=("S",), forloop="F", inputs=[X, W])
    acc = bb.accumulate("sum", bb.matmul(bb.iter(0, imap=(1,), fmap=1), bb.iter(1, imap=(0,), fmap=0)))
    bb.save(acc, omap=(0,))  # per-split partial products stacked along the rows: [S*n, 512]
    (p,) = g.customized(bb.build(), [X, W])
    S = p.shape[0] // sym("n")
    g.output(g.reshape(g.sum(g.reshape(p, (S, "n", 512)), 0), ("n", 512)), "Y")
    assert prove(g, _mm_ref()).proved
    assert numeric_check(g, _mm_ref(), n_instantiations=2, kinds=("normal",)).passed


def test_split_kv_attention_with_the_split_as_grid_dim_0() -> None:
    w = WORKLOADS["W4"]
    s = w.shapes[0]
    g = Graph("W4 split first")
    Q = g.input("Q", ("b", 8, 1, 128))
    K, V = g.input("K", ("b", 8, 1024, 128)), g.input("V", ("b", 8, 1024, 128))
    bb = BlockBuilder(grid=("P", "b", 8), forloop="F", inputs=[Q, K, V])
    qt = bb.iter(0, imap=(None, 0, 1))
    kt, vt = bb.iter(1, imap=(2, 0, 1), fmap=2), bb.iter(2, imap=(2, 0, 1), fmap=2)
    sc = bb.mul_scalar(bb.matmul(qt, bb.transpose(kt, -1, -2)), 1 / math.sqrt(128))
    for t in (bb.accumulate("max", sc), bb.accumulate("softmax_sum", sc), bb.accumulate("softmax_matmul", sc, vt)):
        bb.save(t, omap=(2, 0, 1))
    m_p, s_p, o_p = g.customized(bb.build(), [Q, K, V])
    P = m_p.shape[2]
    m5, s5, o5 = (g.reshape(t, ("b", 8, P, 1, last)) for t, last in ((m_p, 1), (s_p, 1), (o_p, 128)))
    wt = g.exp(g.sub(m5, g.max(m5, 2)))
    o = g.div(g.sum(g.mul(o5, wt), 2), g.sum(g.mul(s5, wt), 2))
    g.output(g.reshape(o, ("b", 8, 1, 128)), "O")
    assert prove(g, w.program(s)).proved


def test_inputs_must_have_the_same_shape_on_both_sides() -> None:
    g = Graph("other")
    g.output(g.matmul(g.input("X", ("m", 256)), g.input("W", (256, 512))), "Y")
    with pytest.raises(Exception, match="same shape"):
        prove(g, _mm_ref())
