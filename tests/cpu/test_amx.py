"""The tn form on the AMX tiles (microkernels.tn_kernel_amx, matmul.emit_tn): bfloat16 rows against bfloat16 or int8
keys with ``tdpbf16ps``, against the float64 reference on ordinary, hostile and tiny inputs, and exact on integer
values; int8 rows against int8 keys (W8A8) with ``tdpbssd`` (microkernels.tn_kernel_amx_i8), exact for every int8
value; ``PRISM_AMX=0`` takes the AVX-512 kernels on the same programs."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import prism
from prism.codegen.isa import cpu_flags, detect, tile_bf16, tile_int8
from prism.codegen.matmul import TN_MIN_K
from prism.ir import BlockBuilder
from prism.runtime.kernel import compile as compile_graph

# (rows, K, keys, for-loop): rows in whole and half blocks of 32 and a last vector of 16 part full; K one group of
# ACC_ROWS, a group and a last call of 32, four groups, and over a block for-loop (each iteration's calls added);
# keys in whole blocks of 32, a tail of under 16, one of 16-31
CASES = [(33, 1024, 40, 1), (64, 544, 50, 1), (100, 2048, 70, 1), (80, 288, 32, 1), (48, 1024, 45, 2),
         (20, 544, 50, 1), (9, 1024, 33, 1)]   # (up to 32 rows: bfloat16 key tiles read in place, not staged)


def _product(m: int, k: int, n: int, keys: str, f: int = 1) -> prism.Graph:
    """Y = X[m, k] @ W[n, k]^T, X bfloat16, W ``keys``, in one block (K over a for-loop of ``f``: the beta path)."""
    g = prism.Graph(f"tn {keys} {m}x{k}x{n} f{f}")
    X, W = g.input("X", (m, k), "bfloat16"), g.input("W", (n, k), keys)
    bb = BlockBuilder(grid=(1,), forloop=f, inputs=[X, W])
    fm = 1 if f > 1 else None
    x, w = bb.iter(0, imap=(None,), fmap=fm), bb.iter(1, imap=(None,), fmap=fm)
    p = bb.matmul(x, bb.transpose(w, -1, -2))
    bb.save(bb.accumulate("sum", p) if f > 1 else p, omap=(None,))
    (y,) = g.customized(bb.build(), [X, W])
    g.output(y, "Y")
    return g


def _keys(rng: np.random.Generator, n: int, k: int, keys: str, low: int | None = None) -> np.ndarray:
    if keys == "int8":
        w = rng.integers(-128 if low is None else -low, 128 if low is None else low + 1, (n, k)).astype(np.int8)
        if low is None:
            w[0, :9], w[-1, 9:20] = -128, 127
        return w
    if low is not None:
        return rng.integers(-low, low + 1, (n, k)).astype(ml_dtypes.bfloat16)
    return rng.standard_normal((n, k)).astype(np.float32).astype(ml_dtypes.bfloat16)


@pytest.mark.parametrize("amx", ["1", "0"], ids=["amx", "avx512"])
@pytest.mark.parametrize("keys", ["bfloat16", "int8"])
def test_bfloat16_products_on_the_amx_tiles(amx: str, keys: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PRISM_AMX", amx)
    if amx == "1" and not tile_bf16(detect()):
        have = sorted({"amx_tile", "amx_bf16"} & cpu_flags())
        pytest.skip(f"this machine has no AMX tiles for bfloat16 (flags: {have or 'none'}, or no grant from the "
                    "kernel)")
    if "avx512_bf16" not in cpu_flags():
        pytest.skip("this machine has no AVX512_BF16: bfloat16 rows against keys take no tn form here")
    rng = np.random.default_rng(7)
    for m, k, n, f in CASES:
        g = _product(m, k, n, keys, f)
        kern = compile_graph(g)
        src = kern.source_at({})
        assert ("_tile_dpbf16ps" in src) == (amx == "1"), (m, k, n)
        # exact: small integers, every product and partial sum an integer below 2^24 in float32
        xi = rng.integers(-8, 9, (m, k)).astype(ml_dtypes.bfloat16)
        wi = _keys(rng, n, k, keys, low=8)
        ref = xi.astype(np.float64) @ wi.astype(np.float64).T
        got = np.asarray(kern(X=xi, W=wi), np.float64)
        assert np.array_equal(got, ref.astype(ml_dtypes.bfloat16).astype(np.float64)), (m, k, n, f)
        # ordinary, hostile (large) and tiny rows against the float64 reference: bfloat16's output rounding and
        # float32 sums (relative to the largest output of the row)
        w = _keys(rng, n, k, keys)
        for scale in (1.0, 30.0, 1e-3):
            x = (rng.standard_normal((m, k)) * scale).astype(np.float32).astype(ml_dtypes.bfloat16)
            ref = x.astype(np.float64) @ w.astype(np.float64).T
            got = np.asarray(kern(X=x, W=w), np.float64)
            err = np.abs(got - ref).max(axis=1) / np.abs(ref).max(axis=1)
            assert float(err.max()) <= 2 ** -8 + 1e-5, (m, k, n, f, scale, float(err.max()))


def _i8_product(m: int, k: int, n: int, f: int = 1) -> prism.Graph:
    """Y = (X[m, k] @ W[n, k]^T) * 0.5 for int8 X and W (W8A8's quantized rows and keys) in one block, K over a
    for-loop of ``f`` where f > 1 (each iteration's product added into the sum: the beta path)."""
    g = prism.Graph(f"tn int8 x int8 {m}x{k}x{n} f{f}")
    X, W = g.input("X", (m, k), "int8"), g.input("W", (n, k), "int8")
    bb = BlockBuilder(grid=(1,), forloop=f, inputs=[X, W])
    fm = 1 if f > 1 else None
    x, w = bb.iter(0, imap=(None,), fmap=fm), bb.iter(1, imap=(None,), fmap=fm)
    p = bb.matmul(x, bb.transpose(w, -1, -2))
    bb.save(bb.mul_scalar(bb.accumulate("sum", p) if f > 1 else p, 0.5), omap=(None,))
    (y,) = g.customized(bb.build(), [X, W])
    g.output(y, "Y")
    return g


# (rows, K, keys, for-loop): from the tiles' smallest row count (up to 32 rows: the keys read in place, not staged),
# rows in whole and part blocks of 32 and chunks; K the tn form's least, one call of TN_AMX_I8_KMAX, over calls (a last
# one part full), over a block for-loop; keys in whole blocks of 32, a tail under 16, one of 16-31; and K not whole
# steps of 64 (the vpdpbusd kernels)
I8_CASES = [(8, 1024, 40), (20, TN_MIN_K, 33), (33, 1024, 40), (64, 2048, 50), (100, 3136, 70), (80, 576, 32),
            (48, 2048, 45, 2), (300, 1024, 17), (1100, 256, 40), (96, 1100, 40)]


@pytest.mark.parametrize("amx", ["1", "0"], ids=["amx", "avx512"])
def test_int8_by_int8_products_on_the_amx_tiles_are_exact(amx: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """W8A8's product over many rows with ``tdpbssd``: every int8 value (-128 and 127 on both sides, rows and keys at
    the extremes all along) summed exactly in int32 and converted once per call of up to TN_AMX_I8_KMAX of K (an
    integer below 2^24: exact in float32), so the result is the float64 product's, times the block's 0.5. With
    ``PRISM_AMX=0``, and for a K that is not whole steps of 64, the vpdpbusd / nt kernels (exact too)."""
    from prism.codegen.matmul import tn_min_rows
    monkeypatch.setenv("PRISM_AMX", amx)
    tiles = tile_int8(detect())
    if amx == "1" and not tiles:
        have = sorted({"amx_tile", "amx_int8"} & cpu_flags())
        pytest.skip(f"this machine has no AMX tiles for int8 (flags: {have or 'none'}, or no grant from the kernel)")
    rng = np.random.default_rng(3)
    for m, k, n, *f in I8_CASES:
        f = f[0] if f else 1
        a = rng.integers(-128, 128, (m, k)).astype(np.int8)
        b = rng.integers(-128, 128, (n, k)).astype(np.int8)
        a[0, :9], b[:, :9] = -128, -128
        a[-1, 9:13], b[-1, 9:13] = 127, -128
        a[1 % m], b[2] = 127, 127
        a[2 % m], b[3] = -128, -128
        kern = compile_graph(_i8_product(m, k, n, f))
        on_tiles = "_tile_dpbssd" in kern.source_at({})
        assert on_tiles == (tiles and (k // f) % 64 == 0 and m >= tn_min_rows(("i8", "i8"), True)), (m, k, n, f)
        ref = (a.astype(np.float64) @ b.astype(np.float64).T) * 0.5
        got = np.asarray(kern(X=a, W=b), np.float64)
        assert np.array_equal(got, ref), (m, k, n, f, float(np.abs(got - ref).max()))


def test_without_the_grant_or_the_flags_no_tile_code(monkeypatch: pytest.MonkeyPatch) -> None:
    """``PRISM_AMX=0`` and a path other than AVX-512 never take the tiles (a tile instruction without the kernel's
    grant is SIGILL)."""
    from prism.codegen.isa import AVX2
    monkeypatch.setenv("PRISM_AMX", "0")
    assert not tile_bf16(detect()) and not tile_int8(detect())
    monkeypatch.delenv("PRISM_AMX")
    assert not tile_bf16(AVX2) and not tile_int8(AVX2)


def test_the_cost_model_counts_products_on_the_tiles_by_their_rows_and_streams_their_outputs() -> None:
    """On a machine with the tiles (``Machine.tile_dot``) a bfloat16 tn product's rate over the FMA peak grows with
    its rows (cost.TILE_TN at TILE_TN_ROWS, at most TILE_TN_MAX) and its output, streamed through Ct, is not in the
    block's working set (the cache filter); without the tiles the pair rate and the output counted, as before."""
    import dataclasses

    from prism.codegen.matmul import TN_MIN_ROWS
    from prism.tune.cost import PAIR_NT, PAIR_TN, TILE_TN, TILE_TN_MAX, TILE_TN_ROWS, estimate
    from prism.tune.machine import detect as machine
    base = dataclasses.replace(machine(False), pair_dot=True)
    tiles, no = dataclasses.replace(base, tile_dot=True), dataclasses.replace(base, tile_dot=False)

    def est(m: int, mach: object) -> object:
        return estimate(_product(m, 2048, 512, "bfloat16"), mach).ops[-1]

    for rows in (32, TILE_TN_ROWS, 1024):
        ratio = est(rows, no).compute_s / est(rows, tiles).compute_s
        # (without the tiles 32 rows take the nt kernels: PAIR_NT)
        want = min(TILE_TN_MAX, TILE_TN * (rows / TILE_TN_ROWS) ** 0.5) / (PAIR_TN if rows >= TN_MIN_ROWS else PAIR_NT)
        assert ratio == pytest.approx(want, rel=0.05), (rows, ratio, want)
    out = 1024 * 512 * 4   # the product's float32 output
    assert est(1024, no).working_set - est(1024, tiles).working_set == out


def test_the_cost_model_counts_int8_products_on_the_tiles() -> None:
    """With int8 tiles (``Machine.tile_idot``) a W8A8 tn product of K whole steps of 64 runs at TILE_I8 times the
    bfloat16 tiles' rate for its rows, from TN_MIN_ROWS_I8_AMX rows (cost._product_form); without them at the
    vpdpbusd rates (QUAD_TN from TN_MIN_ROWS_I8_I8 rows, QUAD_NT below), as before."""
    import dataclasses

    from prism.codegen.matmul import TN_MIN_ROWS_I8_AMX, TN_MIN_ROWS_I8_I8
    from prism.tune.cost import QUAD_NT, QUAD_TN, TILE_I8, TILE_TN, TILE_TN_MAX, TILE_TN_ROWS, estimate
    from prism.tune.machine import detect as machine
    base = dataclasses.replace(machine(False), quad_dot=True)
    tiles, no = dataclasses.replace(base, tile_idot=True), dataclasses.replace(base, tile_idot=False)

    def est(m: int, mach: object) -> object:
        return estimate(_i8_product(m, 2048, 512), mach).ops[-1]

    for rows in (TN_MIN_ROWS_I8_AMX, 32, TILE_TN_ROWS, 1024):
        ratio = est(rows, no).compute_s / est(rows, tiles).compute_s
        want = (TILE_I8 * min(TILE_TN_MAX, TILE_TN * (rows / TILE_TN_ROWS) ** 0.5)
                / (QUAD_TN if rows >= TN_MIN_ROWS_I8_I8 else QUAD_NT))
        assert ratio == pytest.approx(want, rel=0.05), (rows, ratio, want)
