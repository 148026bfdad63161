"""The literal block-graph simulator (prism.reference.simulate) on small hand-built block graphs, against
the kernel-level reference (NumPy / Graph.evaluate). Covers partial-sum outputs, in-loop saves, chunk
ordering, every accumulator, online softmax on hostile inputs, and symbolic maps -- including a wrong
instantiation whose result must differ (the comparison can fail)."""

from __future__ import annotations

import numpy as np
import pytest

from prism.ir import BlockBuilder, BlockGraph, Graph, MapVar
from prism.ir.dims import sel, structurally_equal
from prism.reference import simulate

pytestmark = pytest.mark.unit

F64 = dict(rtol=1e-12, atol=1e-12)


def f64(bg: BlockGraph, *arrays: np.ndarray) -> list[np.ndarray]:
    return simulate(bg, list(arrays), np.float64)


def spec(name: str, *shape: int) -> tuple:
    return (shape, "float32", name)


# --- partial sums (omap None with grid > 1) -----------------------------------------------------------------

@pytest.mark.parametrize("G,F", [(2, 1), (2, 2), (4, 2), (1, 4), (8, 1)])
def test_split_k_matmul_partial_sums(rng, G: int, F: int) -> None:
    """Grid dim splits the contraction K: each block's tile is a partial product; the saver adds them."""
    X, W = rng.standard_normal((4, 16)), rng.standard_normal((16, 6))
    bb = BlockBuilder(grid=(G,), forloop=F, inputs=[spec("X", 4, 16), spec("W", 16, 6)])
    x = bb.iter(0, imap=(1,), fmap=1)
    w = bb.iter(1, imap=(0,), fmap=0)
    bb.save(bb.accumulate("sum", bb.matmul(x, w)), omap=(None,))
    bg = bb.build()
    assert bg.output_shapes == ((4, 6),)
    (y,) = f64(bg, X, W)
    np.testing.assert_allclose(y, X @ W, **F64)


def test_split_k_and_split_n_on_two_grid_dims(rng) -> None:
    X, W = rng.standard_normal((3, 8)), rng.standard_normal((8, 6))
    bb = BlockBuilder(grid=(2, 3), forloop=2, inputs=[spec("X", 3, 8), spec("W", 8, 6)])
    x = bb.iter(0, imap=(1, None), fmap=1)
    w = bb.iter(1, imap=(0, 1), fmap=0)
    bb.save(bb.accumulate("sum", bb.matmul(x, w)), omap=(None, 1))
    (y,) = f64(bb.build(), X, W)
    np.testing.assert_allclose(y, X @ W, **F64)


def test_partial_sum_of_a_reduction(rng) -> None:
    X = rng.standard_normal((8, 5))
    bb = BlockBuilder(grid=(4,), inputs=[spec("X", 8, 5)])
    bb.save(bb.sum(bb.iter(0, imap=(0,)), 0), omap=(None,))
    (y,) = f64(bb.build(), X)
    np.testing.assert_allclose(y, X.sum(0, keepdims=True), **F64)


def test_replicated_output_saved_as_partial_sum_is_multiplied(rng) -> None:
    """omap None means 'add the blocks' tiles': a replicated tile saved that way is counted G times."""
    X = rng.standard_normal((4, 4))
    bb = BlockBuilder(grid=(3,), inputs=[spec("X", 4, 4)])
    bb.save(bb.iter(0, imap=(None,)), omap=(None,))
    (y,) = f64(bb.build(), X)
    np.testing.assert_allclose(y, 3 * X, **F64)


# --- in-loop saves and chunk ordering ---------------------------------------------------------------------

@pytest.mark.parametrize("G,F", [(1, 4), (2, 2), (2, 4), (4, 1)])
def test_in_loop_save_with_fmap(rng, G: int, F: int) -> None:
    X = rng.standard_normal((4, 8))
    bb = BlockBuilder(grid=(G,), forloop=F, inputs=[spec("X", 4, 8)])
    x = bb.iter(0, imap=(0,), fmap=1)
    bb.save(bb.silu(x), omap=(0,), fmap=1)
    bg = bb.build()
    assert bg.phase[bg.outputs[0]] == "loop"
    (y,) = f64(bg, X)
    np.testing.assert_allclose(y, X / (1 + np.exp(-X)), **F64)


def test_grid_then_loop_chunk_order() -> None:
    """A grid dim and the for-loop split the same dim: block b, iteration i sees chunk b*F + i (grid outer).

    The input is read in that order and written to a [G, D/G] output (grid along rows, loop along
    columns), so the result is X.reshape(G, D/G); the opposite order (i*G + b) would give a different
    matrix."""
    X = np.arange(16, dtype=np.float64).reshape(1, 16)
    bb = BlockBuilder(grid=(2,), forloop=4, inputs=[spec("X", 1, 16)])
    x = bb.iter(0, imap=(1,), fmap=1)                       # tile [1, 2]
    bb.save(x, omap=(0,), fmap=1)                           # out [2, 8]
    (y,) = f64(bb.build(), X)
    np.testing.assert_array_equal(y, X.reshape(2, 8))
    wrong = X.reshape(4, 2, 2).transpose(1, 0, 2).reshape(2, 8)  # chunk i*G + b
    assert not np.array_equal(y, wrong)


def test_two_grid_dims_split_the_same_dim_lower_grid_dim_outermost() -> None:
    X = np.arange(12, dtype=np.float64).reshape(1, 12)
    bb = BlockBuilder(grid=(2, 3), inputs=[spec("X", 1, 12)])
    x = bb.iter(0, imap=(1, 1))                             # chunk b0*3 + b1 of 6, tile [1, 2]
    bb.save(x, omap=(0, 1))                                 # out[b0, 2*b1:2*b1+2]
    (y,) = f64(bb.build(), X)
    np.testing.assert_array_equal(y, X.reshape(2, 6))


def test_two_grid_dims_and_loop_on_one_dim() -> None:
    X = np.arange(16, dtype=np.float64).reshape(1, 16)
    bb = BlockBuilder(grid=(2, 2), forloop=2, inputs=[spec("X", 1, 16)])
    x = bb.iter(0, imap=(1, 1), fmap=1)                     # chunk (b0*2 + b1)*2 + i, tile [1, 2]
    bb.save(x, omap=(0, 1), fmap=1)                         # out [2, 8]
    (y,) = f64(bb.build(), X)
    np.testing.assert_array_equal(y, X.reshape(2, 8))


def test_chunk_order_seen_by_an_accumulator() -> None:
    """Per-block row max over the chunks a block sees: block 0 sees chunks 0,1 (values 0..3)."""
    X = np.arange(8, dtype=np.float64).reshape(1, 8)
    bb = BlockBuilder(grid=(2,), forloop=2, inputs=[spec("X", 1, 8)])
    bb.save(bb.accumulate("max", bb.iter(0, imap=(1,), fmap=1)), omap=(1,))
    (y,) = f64(bb.build(), X)
    np.testing.assert_array_equal(y, [[3.0, 7.0]])


def test_identity_copies_for_every_split(rng) -> None:
    """Read and write with the same maps: a copy, whatever the split (grid dim 1 has size 1, so it may
    replicate; the others must split, or their tiles would be added as partial sums)."""
    X = rng.standard_normal((4, 6, 8))
    for imap, fmap in [((0, 1, 2), None), ((2, None, 0), 1), ((2, 0, 2), 2), ((1, 1, 0), 2), ((0, None, 1), 0)]:
        bb = BlockBuilder(grid=(2, 1, 2), forloop=2, inputs=[spec("X", 4, 6, 8)])
        x = bb.iter(0, imap=imap, fmap=fmap)
        if fmap is None:
            bb.save(bb.neg(x), omap=imap)
        else:
            bb.save(bb.neg(x), omap=imap, fmap=fmap)
        (y,) = f64(bb.build(), X)
        np.testing.assert_array_equal(y, -X)


# --- accumulators -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("G,F", [(1, 1), (2, 2), (4, 4), (1, 8)])
def test_row_accumulators(rng, G: int, F: int) -> None:
    X = rng.standard_normal((8, 16))
    eps = 1e-3
    bb = BlockBuilder(grid=(G,), forloop=F, inputs=[spec("X", 8, 16)])
    x = bb.iter(0, imap=(0,), fmap=1)
    for kind, params in (("sum_last", {}), ("max", {}), ("rms", {"eps": eps}), ("softmax_sum", {})):
        bb.save(bb.accumulate(kind, x, **params), omap=(0,))
    bb.save(bb.accumulate("sum", x), omap=(0,))
    s, m, r, ss, acc = f64(bb.build(), X)
    np.testing.assert_allclose(s, X.sum(-1, keepdims=True), **F64)
    np.testing.assert_array_equal(m, X.max(-1, keepdims=True))
    np.testing.assert_allclose(r, np.sqrt((X * X).mean(-1, keepdims=True) + eps), **F64)
    np.testing.assert_allclose(ss, np.exp(X - X.max(-1, keepdims=True)).sum(-1, keepdims=True), **F64)
    np.testing.assert_allclose(acc, X.reshape(8, F, 16 // F).sum(1), **F64)


def test_rms_accumulator_implements_rms_norm_fusion(rng) -> None:
    """W1's move: matmul(x / rms(x), W) == matmul(x, W) / rms(x), against the kernel-graph reference."""
    X, W = rng.standard_normal((4, 32)), rng.standard_normal((32, 8)) / 6
    g = Graph()
    xi, wi = g.input("X", (4, 32)), g.input("W", (32, 8))
    g.output(g.matmul(g.rms_norm(xi, eps=1e-6), wi), "Y")
    ref = g.evaluate({"X": X, "W": W}, dtype=np.float64)["Y"]
    bb = BlockBuilder(grid=(2,), forloop=4, inputs=[spec("X", 4, 32), spec("W", 32, 8)])
    x = bb.iter(0, imap=(None,), fmap=1)
    w = bb.iter(1, imap=(1,), fmap=0)
    bb.save(bb.div(bb.accumulate("sum", bb.matmul(x, w)), bb.accumulate("rms", x, eps=1e-6)), omap=(1,))
    (y,) = f64(bb.build(), X, W)
    np.testing.assert_allclose(y, ref, **F64)


def attention_ref(Q: np.ndarray, K: np.ndarray, V: np.ndarray) -> np.ndarray:
    s = Q @ K.T
    p = np.exp(s - s.max(-1, keepdims=True))
    return (p / p.sum(-1, keepdims=True)) @ V


def online_softmax_block(F: int, rows: int, kv: int, D: int) -> BlockGraph:
    bb = BlockBuilder(grid=(1,), forloop=F, inputs=[spec("Q", rows, D), spec("K", kv, D), spec("V", kv, D)])
    q = bb.iter(0)
    k = bb.iter(1, fmap=0)
    v = bb.iter(2, fmap=0)
    s = bb.matmul(q, bb.transpose(k))
    bb.save(bb.div(bb.accumulate("softmax_matmul", s, v), bb.accumulate("softmax_sum", s)), omap=(None,))
    return bb.build()


@pytest.mark.parametrize("F", [1, 2, 8])
def test_online_softmax_matches_attention(rng, F: int) -> None:
    Q, K, V = rng.standard_normal((4, 8)), rng.standard_normal((32, 8)), rng.standard_normal((32, 8))
    (o,) = f64(online_softmax_block(F, 4, 32, 8), Q, K, V)
    np.testing.assert_allclose(o, attention_ref(Q, K, V), **F64)


@pytest.mark.parametrize("F", [2, 8])
def test_online_softmax_hostile_inputs_stay_finite_in_float32(rng, F: int) -> None:
    """Scores ~1e3 overflow exp() in float32 unless every chunk is rescaled by the running max. The row
    maxima are placed in late chunks so that the running max really changes across iterations."""
    Q = (rng.standard_normal((4, 8)) * 30).astype(np.float32)
    K = (rng.standard_normal((32, 8)) * 30).astype(np.float32)
    V = rng.standard_normal((32, 8)).astype(np.float32)
    K[-1] = Q.sum(0) / 4  # the last key aligns with the queries: the max arrives in the last iteration
    scores = Q.astype(np.float64) @ K.T.astype(np.float64)
    assert np.abs(scores).max() > 100  # hostile: exp(scores) overflows float32
    with np.errstate(over="ignore"):
        assert not np.all(np.isfinite(np.exp(scores.astype(np.float32))))
    (o,) = simulate(online_softmax_block(F, 4, 32, 8), [Q, K, V])
    assert o.dtype == np.float32
    assert np.all(np.isfinite(o))
    ref = attention_ref(Q.astype(np.float64), K.astype(np.float64), V.astype(np.float64))
    np.testing.assert_allclose(o, ref, rtol=1e-4, atol=1e-4)


def test_split_kv_partials_combine_to_attention(rng) -> None:
    """Flash-decoding: P splits save (max, rescaled sum, unnormalized output); the kernel-level combine
    of the saved partials equals attention."""
    P, F, kv = 4, 2, 32
    Q, K, V = rng.standard_normal((2, 8)), rng.standard_normal((kv, 8)) * 3, rng.standard_normal((kv, 8))
    bb = BlockBuilder(grid=(P,), forloop=F, inputs=[spec("Q", 2, 8), spec("K", kv, 8), spec("V", kv, 8)])
    q, k, v = bb.iter(0), bb.iter(1, imap=(0,), fmap=0), bb.iter(2, imap=(0,), fmap=0)
    s = bb.matmul(q, bb.transpose(k))
    for t in (bb.accumulate("max", s), bb.accumulate("softmax_sum", s), bb.accumulate("softmax_matmul", s, v)):
        bb.save(t, omap=(0,))  # per split, concatenated along rows: [P*2, .]
    m, ssum, o = (a.reshape(P, 2, -1) for a in f64(bb.build(), Q, K, V))
    w = np.exp(m - m.max(0, keepdims=True))
    out = (o * w).sum(0) / (ssum * w).sum(0)
    np.testing.assert_allclose(out, attention_ref(Q, K, V), **F64)


# --- symbolic maps and parameters ----------------------------------------------------------------------------

def mapvar_elementwise() -> BlockGraph:
    """y = 2x + z with one map symbol m for x, z and y: m = 0 splits rows, m = 1 columns, None replicates."""
    m = MapVar("m")
    bb = BlockBuilder(grid=("G",), inputs=[spec("X", 8, 6), spec("Z", 8, 6)])
    x, z = bb.iter(0, imap=(m,)), bb.iter(1, imap=(m,))
    bb.save(bb.add(bb.mul_scalar(x, 2.0), z), omap=(m,))
    return bb.build()


def test_mapvar_graph_is_symbolic() -> None:
    bg = mapvar_elementwise()
    assert bg.map_symbols() == {"m"}
    assert bg.symbols() == {"m", "G"}
    assert not bg.is_concrete()
    tile = bg.outputs[0].shape
    assert structurally_equal(tile[0] * sel("m", 0, "G"), 8)
    assert bg.output_shapes == ((8, 6),)
    assert {str(c) for c in bg.constraints} >= {"[m==0?G] | 8  (input 0 (X [8, 6]) dim 0)"}


@pytest.mark.parametrize("env", [{"G": 2, "m": 0}, {"G": 2, "m": 1}, {"G": 4, "m": 0}, {"G": 3, "m": 1},
                                 {"G": 8, "m": 0}, {"G": 1, "m": None}])
def test_mapvar_correct_instantiations_match_reference(rng, env: dict) -> None:
    X, Z = rng.standard_normal((8, 6)), rng.standard_normal((8, 6))
    bg = mapvar_elementwise().instantiate(env)
    assert bg.is_concrete()
    (y,) = f64(bg, X, Z)
    np.testing.assert_allclose(y, 2 * X + Z, **F64)


def test_mapvar_wrong_instantiation_differs_from_reference(rng) -> None:
    """Replicating (m = None) over G = 2 blocks saves every block's full result as a partial sum: the
    result is doubled. The comparison must notice."""
    X, Z = rng.standard_normal((8, 6)), rng.standard_normal((8, 6))
    bg = mapvar_elementwise().instantiate({"G": 2, "m": None})
    assert bg.is_concrete() and bg.output_shapes == ((8, 6),)
    (y,) = f64(bg, X, Z)
    ref = 2 * X + Z
    assert not np.allclose(y, ref, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(y, 2 * ref, **F64)


def test_mapvar_through_a_kernel_graph(rng) -> None:
    """Graph.evaluate instantiates map symbols from params; a wrong choice is visible end to end."""
    g = Graph()
    x, z = g.input("X", (8, 6)), g.input("Z", (8, 6))
    (y,) = g.customized(mapvar_elementwise(), [x, z])
    g.output(y, "Y")
    X, Z = rng.standard_normal((8, 6)), rng.standard_normal((8, 6))
    ref = 2 * X + Z
    for m in (0, 1):
        got = g.evaluate({"X": X, "Z": Z}, dtype=np.float64, params={"G": 2, "m": m})["Y"]
        np.testing.assert_allclose(got, ref, **F64)
    bad = g.evaluate({"X": X, "Z": Z}, dtype=np.float64, params={"G": 2, "m": None})["Y"]
    assert not np.allclose(bad, ref, rtol=1e-4, atol=1e-4)


def test_symbolic_grid_and_loop_instantiations(rng) -> None:
    """One sGraph (grid G, loop F symbolic) at several instantiations, each against the reference."""
    X, W = rng.standard_normal((4, 32)), rng.standard_normal((32, 16))
    bb = BlockBuilder(grid=("G",), forloop="F", inputs=[spec("X", 4, 32), spec("W", 32, 16)])
    x = bb.iter(0, imap=(None,), fmap=1)
    w = bb.iter(1, imap=(1,), fmap=0)
    bb.save(bb.relu(bb.accumulate("sum", bb.matmul(x, w))), omap=(1,))
    bg = bb.build()
    assert bg.symbols() == {"G", "F"}
    for env in ({"G": 1, "F": 1}, {"G": 2, "F": 4}, {"G": 16, "F": 32}, {"G": 4, "F": 2}):
        (y,) = f64(bg.instantiate(env), X, W)
        np.testing.assert_allclose(y, np.maximum(X @ W, 0), **F64)


def test_wrong_map_on_weights_differs_from_reference(rng) -> None:
    """Replicating W instead of splitting its columns over G = 2 blocks, with the output concatenated
    along columns, computes a [4, 2*m] output of repeated halves: shape and values differ from X @ W."""
    X, W = rng.standard_normal((4, 8)), rng.standard_normal((8, 6))
    bb = BlockBuilder(grid=(2,), forloop=2, inputs=[spec("X", 4, 8), spec("W", 8, 6)])
    x = bb.iter(0, imap=(None,), fmap=1)
    w = bb.iter(1, imap=(None,), fmap=0)
    bb.save(bb.accumulate("sum", bb.matmul(x, w)), omap=(1,))
    (y,) = f64(bb.build(), X, W)
    assert y.shape != (X @ W).shape
    np.testing.assert_allclose(y, np.concatenate([X @ W, X @ W], 1), **F64)


def test_float32_simulation_matches_float64_reference(rng) -> None:
    X = rng.standard_normal((8, 64)).astype(np.float32)
    W = (rng.standard_normal((64, 16)) / 8).astype(np.float32)
    bb = BlockBuilder(grid=(2, 2), forloop=4, inputs=[spec("X", 8, 64), spec("W", 64, 16)])
    x = bb.iter(0, imap=(0, None), fmap=1)
    w = bb.iter(1, imap=(None, 1), fmap=0)
    bb.save(bb.div(bb.accumulate("sum", bb.matmul(x, w)), bb.accumulate("rms", x, eps=1e-6)), omap=(0, 1))
    (y,) = simulate(bb.build(), [X, W])
    assert y.dtype == np.float32
    X64 = X.astype(np.float64)
    ref = (X64 / np.sqrt((X64 * X64).mean(-1, keepdims=True) + 1e-6)) @ W.astype(np.float64)
    np.testing.assert_allclose(y, ref, rtol=1e-4, atol=1e-5)


def _product(forloop: object, exp: bool = False) -> Graph:
    """Y[n, 64] = X[n, 256] @ W[64, 256]^T over a grid of W's rows: without a loop (forloop 1), or with the loop
    walking K (a sum accumulator over its iterations)."""
    g = Graph("product")
    x, w = g.input("X", (16, 256)), g.input("W", (64, 256))
    bb = BlockBuilder(grid=("g0",), forloop=forloop, inputs=[x, w])
    fm = None if forloop == 1 else 1
    xi, wi = bb.iter(0, imap=(None,), fmap=fm), bb.iter(1, imap=(0,), fmap=fm)
    t = bb.matmul(xi, bb.transpose(wi, 0, 1))
    if exp:
        t = bb.exp(t)
    bb.save(t if forloop == 1 else bb.accumulate("sum", t), omap=(1,))
    (y,) = g.customized(bb.build(), [x, w])
    g.output(y, "Y")
    return g


def test_one_trip_key_equates_a_loop_of_range_one_with_no_loop() -> None:
    """BlockGraph.one_trip_key (api._one_trip): a for-loop over K of symbolic range F, run once, has the structure
    of the same product written without a loop (the sum over one iteration is its operand; loop maps, phases and
    tile shapes left out), with F the range to set to 1; a constant range above 1 has no such key; another
    operator changes the key."""
    from prism.api import _one_trip
    plain, looped, two = _product(1), _product("F"), _product(2)
    assert plain.key != looped.key
    (kp, lp), (kl, ll) = _one_trip(plain), _one_trip(looped)
    assert kp == kl and lp == () and ll == ("F",)
    assert _one_trip(two) is None
    other = _one_trip(_product("F", exp=False).instantiate({"F": 4}))   # F = 4 written in: a loop of four trips
    assert other is None
    assert _one_trip(_product(1, exp=True))[0] != kp
