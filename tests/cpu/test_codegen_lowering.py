"""Lowering features one at a time, each against the reference interpreters (float64): partial-sum
outputs, in-loop saves, every accumulator kind, tile operators and layouts that are views or copies,
the transposed and generic matmul paths, and the predefined kernel operators."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from cg_helpers import assert_close, split_k_graph, supported_isas

import prism
from prism.codegen import microkernels as mk
from prism.ir import BlockBuilder, MapVar
from prism.runtime.kernel import compile as compile_kernel

pytestmark = pytest.mark.cpu


def check(g: prism.Graph, rng: np.random.Generator, params: dict | None = None, isa: str | None = None,
          **dims: int) -> None:
    env = {**dims}
    x = {}
    for name, n in g.inputs.items():
        shape = tuple(d if isinstance(d, int) else env[str(d)] for d in n.shape)
        x[name] = rng.standard_normal(shape).astype(np.float32)
    ref = g.evaluate(x, dtype=np.float64, params=params)
    out = prism.compile(g, params=params, isa=isa)(**x)
    if len(ref) == 1:
        out = {next(iter(ref)): out}
    for k, r in ref.items():
        assert_close(out[k], r, k)


def test_split_k_partial_sums(rng: np.random.Generator) -> None:
    """Grid (column blocks, K splits): blocks of one column range add their partial products."""
    g = split_k_graph()
    for s in (1, 4):
        check(g, rng, params={"S": s})


def test_in_loop_save_with_fmap_and_partial_sum_over_grid(rng: np.random.Generator) -> None:
    g = prism.Graph()
    X = g.input("X", (8, 64))
    bb = BlockBuilder(grid=(2, 3), forloop=4, inputs=[X])
    x = bb.iter(0, imap=(0, None), fmap=1)
    bb.save(bb.exp(bb.mul_scalar(x, 0.5)), omap=(0, None), fmap=1)   # 3 blocks each add exp(x/2)
    bb.save(bb.accumulate("max", x), omap=(0, None))
    g_out = g.customized(bb.build(), [X])
    g.output(g_out[0], "E")
    g.output(g_out[1], "M")
    check(g, rng)


@pytest.mark.parametrize("kind", ["sum", "sum_last", "rms", "max"])
def test_accumulators_of_expressions(rng: np.random.Generator, kind: str) -> None:
    g = prism.Graph()
    X, Y = g.input("X", (2, 6, 96)), g.input("Y", (2, 6, 96))
    bb = BlockBuilder(grid=(2,), forloop=3, inputs=[X, Y])
    x = bb.iter(0, imap=(0,), fmap=2)
    y = bb.iter(1, imap=(0,), fmap=2)
    e = bb.sub(bb.tanh(x), bb.sigmoid(y))
    params = {"eps": 1e-5} if kind == "rms" else {}
    a = bb.accumulate(kind, e, **params)
    omap = (0,)
    if kind == "sum":
        bb.save(bb.add(a, bb.silu(bb.accumulate("sum", y))), omap=omap, fmap=None)
    else:
        bb.save(bb.relu(a), omap=omap)
    (r,) = g.customized(bb.build(), [X, Y])
    g.output(r, "R")
    check(g, rng)


def test_online_softmax_shares_one_running_max_and_keeps_max(rng: np.random.Generator) -> None:
    g = prism.Graph()
    Q, K, V = g.input("Q", (3, 5, 24)), g.input("K", (3, 40, 24)), g.input("V", (3, 40, 20))
    bb = BlockBuilder(grid=(3,), forloop=4, inputs=[Q, K, V])
    q = bb.iter(0, imap=(0,))
    s = bb.matmul(q, bb.transpose(bb.iter(1, imap=(0,), fmap=1), -1, -2))
    s = bb.mul_scalar(s, 7.0)  # large scores: the rescaling matters
    v = bb.iter(2, imap=(0,), fmap=1)
    bb.save(bb.div(bb.accumulate("softmax_matmul", s, v), bb.accumulate("softmax_sum", s)), omap=(0,))
    bb.save(bb.accumulate("max", s), omap=(0,))
    o, m = g.customized(bb.build(), [Q, K, V])
    g.output(o, "O")
    g.output(m, "M")
    for isa in prism.codegen.isa.ISAS:
        if all(f in prism.codegen.isa.cpu_flags() for f in prism.codegen.isa.ISAS[isa].required_flags):
            check(g, rng, isa=isa)


def test_tile_operators_and_layouts(rng: np.random.Generator) -> None:
    g = prism.Graph()
    X, W = g.input("X", (4, 32, 24)), g.input("W", (4, 24, 16))
    bb = BlockBuilder(grid=(2,), forloop=1, inputs=[X, W])
    x = bb.iter(0, imap=(0,))                                   # [2, 32, 24]
    w = bb.iter(1, imap=(0,))                                   # [2, 24, 16]
    h = bb.softmax(bb.rms_norm(x, eps=1e-5, dim=2), dim=1)     # softmax over a non-last dim
    a, b2 = bb.split(h, (10, 14), dim=2)
    h = bb.concat([bb.gelu(b2), bb.gelu(a, approximate="tanh")], dim=2)
    p = bb.permute(h, (0, 2, 1))                               # [2, 24, 32]: a strided view
    r = bb.reshape(p, (2, 24 * 32))                            # not contiguous: copied
    t = bb.reshape(r, (2, 24, 32))
    mm = bb.matmul(bb.permute(t, (0, 2, 1)), w)                # A with a column stride
    red = bb.add(bb.mean(mm, 1), bb.max(mm, 2))                # [2, 1, 16] + [2, 32, 1] -> broadcast
    bb.save(bb.sum(bb.maximum(red, bb.neg(red)), 0), omap=(None,))  # both blocks add: partial sums
    (y,) = g.customized(bb.build(), [X, W])
    g.output(y, "Y")
    check(g, rng)


@pytest.mark.parametrize("op", ["softmax", "rms_norm", "sum", "max", "mean"])
def test_a_reduction_or_row_operator_saved_once_writes_the_output_tile(rng: np.random.Generator, op: str) -> None:
    """BlockLowering.direct_target: the operator's result goes straight into the output (no scratch tile and
    no copy loop), for a post-loop save of a loop-invariant value and for a per-iteration save, with values
    as the reference's."""
    for forloop in (1, 3):
        g = prism.Graph()
        X = g.input("X", (8, 6 * forloop, 96))
        bb = BlockBuilder(grid=(2,), forloop=forloop, inputs=[X])
        fm = 1 if forloop > 1 else None
        x = bb.iter(0, imap=(0,), fmap=fm)                  # [4, 6, 96] per block and iteration
        if op == "softmax":
            y = bb.softmax(x, dim=2)
        elif op == "rms_norm":
            y = bb.rms_norm(x, eps=1e-6, dim=2)
        else:
            y = getattr(bb, op)(x, 1 if op == "mean" else 2)
        bb.save(y, omap=(0,), fmap=fm)
        (out,) = g.customized(bb.build(), [X])
        g.output(out, "Y")
        check(g, rng)
        src = prism.compile(g).specialize().source
        assert "(S + 0)" not in src.split("/* block graph")[1], src  # nothing in scratch


def test_generic_and_transposed_matmul_paths(rng: np.random.Generator) -> None:
    g = prism.Graph()
    A, B = g.input("A", (20, 33)), g.input("B", (45, 20))
    bb = BlockBuilder(grid=(1,), forloop=1, inputs=[A, B])
    a, b = bb.iter(0), bb.iter(1)
    at = bb.transpose(a, 0, 1)                                 # [33, 20], column stride 33
    bt = bb.transpose(b, 0, 1)                                 # [20, 45], B^T: the nt path needs A rows contiguous
    bb.save(bb.matmul(at, bt), omap=(None,))                   # generic loop
    bb.save(bb.matmul(bb.transpose(bt, 0, 1), a), omap=(None,))  # [45, 20] @ [20, 33]: nn with a strided A
    bb.save(bb.matmul(b, bb.transpose(b, 0, 1)), omap=(None,))  # [45, 45]: nt with row and key tails
    outs = g.customized(bb.build(), [A, B])
    for i, o in enumerate(outs):
        g.output(o, f"Y{i}")
    check(g, rng)


def _long_k_graphs() -> list[tuple[str, prism.Graph]]:
    """One graph per way a long contraction is cut into calls whose sums are added in groups."""
    out = []

    def plain(M: int, K: int, N: int, batch: tuple[int, ...] = ()) -> prism.Graph:
        g = prism.Graph()
        X, W = g.input("X", batch + (M, K)), g.input("W", batch + (K, N))
        g.output(g.matmul(X, W), "Y")
        return g
    out.append(("kernel-level K chunks", plain(5, 3000, 40)))          # one task: chunk calls, scratch P
    out.append(("kernel-level tasks over K", plain(64, 1500, 100)))    # blocked micro-kernel, column tail
    out.append(("kernel-level batch", plain(5, 3000, 40, (3,))))        # P per thread in the batch loop

    def fused(M: int, K: int, N: int, F: int, batch: tuple[int, ...] = ()) -> prism.Graph:
        g = prism.Graph()
        X, W = g.input("X", batch + (M, K)), g.input("W", batch + (K, N))
        nb = len(batch)
        bb = BlockBuilder(grid=(2,), forloop=F, inputs=[X, W])
        x = bb.iter(0, imap=(None,), fmap=nb + 1)
        w = bb.iter(1, imap=(nb + 1,), fmap=nb)
        bb.save(bb.accumulate("sum", bb.matmul(x, w)), omap=(nb + 1,))
        (y,) = g.customized(bb.build(), [X, W])
        g.output(y, "Y")
        return g
    out.append(("for-loop, 2 calls an iteration", fused(8, 4096, 64, 64)))
    out.append(("for-loop, one short call an iteration", fused(3, 2000, 32, 250)))
    out.append(("for-loop with a batch dim", fused(4, 4096, 32, 64, (2,))))

    g = prism.Graph()
    A, B, At = g.input("A", (9, 5001)), g.input("B", (37, 5001)), g.input("At", (5001, 9))
    A3 = g.input("A3", (3, 5001))
    bb = BlockBuilder(grid=(1,), forloop=1, inputs=[A, B, At, A3])
    a, b, at, a3 = bb.iter(0), bb.iter(1), bb.iter(2), bb.iter(3)
    bb.save(bb.matmul(a, bb.transpose(b, 0, 1)), omap=(None,))                     # nt, K tail
    bb.save(bb.matmul(bb.transpose(at, 0, 1), bb.transpose(b, 0, 1)), omap=(None,))  # generic loop
    bb.save(bb.matmul(a3, bb.transpose(b, 0, 1)), omap=(None,))  # nt, few rows: the whole K in a call
    bb.save(bb.matmul(b, bb.transpose(bb.iter(3, imap=(None,)), 0, 1)), omap=(None,))  # [37, 3]
    for i, o in enumerate(g.customized(bb.build(), [A, B, At, A3])):
        g.output(o, f"Y{i}")
    out.append(("tile nt and generic", g))
    return out


@pytest.mark.parametrize("isa", supported_isas())
def test_long_contractions_are_summed_in_groups(rng: np.random.Generator, isa: str) -> None:
    """Every path that cuts K into calls (and keeps group sums in scratch) is right, and its rms error is
    far below one running sum's (~0.3 K u measured; the groups give ~0.05 K u)."""
    for what, g in _long_k_graphs():
        x = {name: rng.standard_normal(tuple(n.shape)).astype(np.float32) for name, n in g.inputs.items()}
        ref = g.evaluate(x, dtype=np.float64)
        out = prism.compile(g, isa=isa)(**x)
        out = out if isinstance(out, dict) else {next(iter(ref)): out}
        for k, r in ref.items():
            assert_close(out[k], r, f"{what} {k}")
            K = next(iter(g.inputs.values())).shape[-1]
            rms = float(np.sqrt(np.mean((np.asarray(out[k], np.float64) - r) ** 2)))
            assert rms <= 0.15 * K * 2.0 ** -24, f"{what} {k}: rms error {rms:.3e} as of one running sum"

    g = prism.Graph()                                          # a non-fused sum accumulator over 100 iterations
    X, Y = g.input("X", (4, 2000)), g.input("Y", (4, 2000))
    bb = BlockBuilder(grid=(1,), forloop=100, inputs=[X, Y])
    bb.save(bb.accumulate("sum", bb.mul(bb.iter(0, imap=(None,), fmap=1), bb.iter(1, imap=(None,), fmap=1))),
            omap=(None,))
    (y,) = g.customized(bb.build(), [X, Y])
    g.output(y, "Y")
    check(g, rng, isa=isa)


@pytest.mark.parametrize("K", [100, 5001])
@pytest.mark.parametrize("dtype", ["float32", "int8"])
def test_matrix_vector_products_in_both_orders(rng: np.random.Generator, dtype: str, K: int) -> None:
    """W @ x (a column out: emitted transposed, the rows of W as keys) and x @ W^T (a row out), W stored
    [out, in] in float32 or int8, K within one accumulation chunk or over many."""
    g = prism.Graph()
    Wq, x = g.input("W", (37, K), dtype), g.input("x", (1, K))
    bb = BlockBuilder(grid=(1,), forloop=1, inputs=[Wq, x])
    w, xv = bb.iter(0), bb.iter(1)
    bb.save(bb.matmul(w, bb.transpose(xv, 0, 1)), omap=(None,))   # [37, 1]
    bb.save(bb.matmul(xv, bb.transpose(w, 0, 1)), omap=(None,))   # [1, 37]
    for i, o in enumerate(g.customized(bb.build(), [Wq, x])):
        g.output(o, f"Y{i}")
    wv = (rng.integers(-127, 128, (37, K)) if dtype == "int8" else rng.standard_normal((37, K))).astype(dtype)
    xs = rng.standard_normal((1, K)).astype(np.float32)
    out = prism.compile(g)(W=wv, x=xs)
    ref = wv.astype(np.float64) @ xs.astype(np.float64).T
    assert_close(out["Y0"], ref, f"W @ x {dtype} K={K}")
    assert_close(out["Y1"], ref.T, f"x @ W^T {dtype} K={K}")


def _x_wt(K: int, w_dtype: str, x_dtype: str = "float32") -> prism.Graph:
    """Y = x @ W^T for W [37, K] stored [out, in] and x [1, K], one block: the decode GEMV."""
    g = prism.Graph()
    Wq, x = g.input("W", (37, K), w_dtype), g.input("x", (1, K), x_dtype)
    bb = BlockBuilder(grid=(1,), forloop=1, inputs=[Wq, x])
    bb.save(bb.matmul(bb.iter(1), bb.transpose(bb.iter(0), 0, 1)), omap=(None,))
    (y,) = g.customized(bb.build(), [Wq, x])
    g.output(y, "Y")
    return g


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "int8"])
def test_whole_k_gemv_streams_one_key_at_a_time_where_its_row_fits_in_l1(
        dtype: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """x @ W^T over a whole long K (GEMV rows) on AVX-512: where the float32 row fits in half the L1 data
    cache, one key at a time with a prefetch along the keys PF_AHEAD bytes ahead, one per 64-byte line
    (microkernels.nt_row_stream: int8 keys from DRAM 31-37 -> 45-46 GB/s, about the read); a longer row keeps
    the key blocks of before: int8 keys prefetch the next block of 16 keys into L2, float32 and bfloat16 keys do
    not (in L3 the prefetches cost them a quarter of their speed). AVX2 as before. The L1 size is set here,
    so the test does not depend on the machine's."""
    monkeypatch.setattr(mk, "l1d_bytes", lambda: 48 << 10)
    g = _x_wt(5001, dtype)                         # a 20 KB row: fits in 24 KiB
    src = compile_kernel(g, isa="avx512").source
    assert "_1x1_" in src and "_pfa(" in src and "_1x16_" not in src and "_1x8_" not in src
    lines = 4 * 16 * {"float32": 4, "bfloat16": 2, "int8": 1}[dtype] // 64   # a loop: 4 steps of 16 keys
    assert all(f"__builtin_prefetch((const char*)(Bt + k) + {mk.PF_AHEAD + 64 * i}, 0, 1)" in src
               for i in range(lines))
    assert "__builtin_prefetch(Bt + 16 * sb0" not in src
    g = _x_wt(11008, dtype)                        # a 43 KB row: the key blocks
    src = compile_kernel(g, isa="avx512").source
    assert "_pfa(" not in src and "_1x16_" in src
    assert ("_npf" in src) == (dtype != "int8")
    assert ("__builtin_prefetch(Bt + 16 * sb0 + k, 0, 2)" in src) == (dtype == "int8")
    for K in (5001, 11008):
        src = compile_kernel(_x_wt(K, dtype), isa="avx2").source
        assert "__builtin_prefetch(Bt + 16 * sb0" not in src and "_pfa(" not in src
    monkeypatch.setenv("PRISM_ROW_STREAM", "0")   # off: the key blocks at every row length
    src = compile_kernel(_x_wt(5001, dtype), isa="avx512").source
    assert "_pfa(" not in src and "_1x16_" in src


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "int8"])
def test_a_one_key_kernel_adds_its_lanes_by_a_shuffle_tree(dtype: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The one-key kernel (GEMV rows one key at a time on AVX-512, tails on AVX2) adds each chunk's lanes by a
    shuffle tree, not a store and W dependent scalar adds (an int8-key GEMV from L3: paired 0.87 of the time);
    exact to float32's reassociation against float64, with a long K (several chunks) and large values."""
    monkeypatch.setattr(mk, "l1d_bytes", lambda: 48 << 10)
    rng = np.random.default_rng(5)
    K = 5001
    g = _x_wt(K, dtype)
    w = (rng.integers(-127, 128, (37, K)).astype(np.int8) if dtype == "int8" else
         rng.standard_normal((37, K)).astype(np.float32))
    if dtype == "bfloat16":
        w = w.astype(ml_dtypes.bfloat16)
    x = (rng.standard_normal((1, K)) * np.where(np.arange(K) % 97 == 0, 1e4, 1.0)).astype(np.float32)
    ref = x.astype(np.float64) @ np.asarray(w, np.float64).T
    isas = [i for i in supported_isas() if i in ("avx512", "avx2")]
    if not isas:
        pytest.skip("no AVX2 or AVX-512 on this machine")
    for isa in isas:
        src = compile_kernel(g, isa=isa).source
        one_key = any("_1x1_" in ln and "PR_INLINE void" in ln for ln in src.splitlines())
        # AVX-512: the row streams one key at a time; AVX2: the last keys of a block, where a tail takes them
        assert one_key or isa == "avx2", src
        assert "cs_ += t[i]" not in src
        if one_key:
            assert ("_mm512_reduce_add_ps(acc)" if isa == "avx512" else "_mm_movehdup_ps(cs__h)") in src
        got = np.asarray(prism.compile(g, isa=isa)(W=w, x=x), np.float64)
        assert_close(got, ref, f"{dtype} on {isa}", rtol=1e-5)


def test_a_bfloat16_row_against_int8_keys_keeps_the_key_blocks(monkeypatch: pytest.MonkeyPatch) -> None:
    """int8 weight-only on a bfloat16 model: one key at a time would widen the bfloat16 row for every key, so the
    16-key blocks (the row widened once per block) stay at every row length (microkernels.nt_row_stream:
    llama-1b int8w-bf16 decode 19.13 -> 16.58 ms per step on the Zen 4 VM); a float32 row against int8 keys
    streams one key at a time as before."""
    monkeypatch.setattr(mk, "l1d_bytes", lambda: 48 << 10)
    src = compile_kernel(_x_wt(2048, "int8", "bfloat16"), isa="avx512").source
    assert "_pfa(" not in src and "_1x16_bf16_i8" in src
    src = compile_kernel(_x_wt(2048, "int8", "float32"), isa="avx512").source
    assert "_1x1_" in src and "_pfa(" in src
    rng = np.random.default_rng(2)
    g = _x_wt(2048, "int8", "bfloat16")
    w = rng.integers(-127, 128, (37, 2048)).astype(np.int8)
    x = (rng.standard_normal((1, 2048)) * np.where(np.arange(2048) % 97 == 0, 300.0, 1.0)).astype(np.float32)
    x = x.astype(ml_dtypes.bfloat16)
    got = np.asarray(prism.compile(g, isa="avx512")(W=w, x=x), np.float64)
    ref = x.astype(np.float64) @ w.astype(np.float64).T
    # the output is bfloat16 (rounded once: half an ulp, at most 2^-8 relative) from float32 sums
    assert np.all(np.abs(got - ref) <= 2.0 ** -8 * np.abs(ref) + 1e-5 * np.max(np.abs(ref)))


def test_map_symbols_as_params(rng: np.random.Generator) -> None:
    g = prism.Graph()
    X = g.input("X", (16, 32))
    bb = BlockBuilder(grid=("G",), forloop=1, inputs=[X])
    x = bb.iter(0, imap=(MapVar("m"),))
    bb.save(bb.square(x), omap=(MapVar("m"),))
    (y,) = g.customized(bb.build(), [X])
    g.output(y, "Y")
    check(g, rng, params={"G": 4, "m": 0})
    check(g, rng, params={"G": 2, "m": 1})


def test_predefined_kernel_operators(rng: np.random.Generator) -> None:
    g = prism.Graph()
    X, Y, Z = g.input("X", ("B", 6, 64)), g.input("Y", (64, 40)), g.input("Z", (6, 1))
    p = g.permute(X, (1, 0, 2))                                          # [6, B, 64]
    s = g.softmax(p, 0)                                                  # over a non-last dim
    r = g.rms_norm(g.add(s, g.reshape(Z, (6, 1, 1))), eps=1e-4, dim=1)
    m = g.matmul(r, Y)                                                   # [6, B, 40]: batched, Y broadcast
    sq = g.square(m)
    u = g.concat([g.relu(m), g.sqrt(g.add_scalar(sq, 1.0)), g.rsqrt(g.add_scalar(sq, 2.0))], 2)  # [6, B, 120]
    a, b = g.split(u, (60, 60), dim=2)
    red = g.sub(g.sum(a, 1), g.mean(g.tanh(b), 1))                      # reductions over a middle dim
    g.output(g.div(g.max(red, 2), g.add_scalar(g.sigmoid(g.max(red, 0)), 0.5)), "O")
    g.output(g.maximum(m, g.neg(m)), "M")
    g.output(g.gelu(u), "U")
    check(g, rng, B=3)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_transposing_copies_run_over_tiles_with_cut_tails(rng: np.random.Generator, dtype: str) -> None:
    """A copy that reads its source with a large stride along the target's rows runs over TILE x TILE tiles
    (loops.TILE); 250 and 300 are not multiples of it, so the last tile of each dim is cut short. The
    program's own sGraph of a Linear (W^T materialized, then a matmul) took 340 ms per call for a 32000 x 2048
    weight without the tiles, 53 ms with them."""
    from prism.codegen import loops
    g = prism.Graph()
    X, Y = g.input("X", (3, 300, 250), dtype), g.input("Y", (3, 250, 1))
    g.output(g.add(g.permute(X, (0, 2, 1)), Y), "O")      # [3, 250, 300]: X's stride along the rows is 250
    src = prism.compile(g).specialize().source
    assert f"+= {loops.TILE})" in src and "#pragma omp simd" in src
    x = {"X": rng.standard_normal((3, 300, 250)).astype(np.float32), "Y": rng.standard_normal((3, 250, 1))}
    if dtype == "bfloat16":
        import ml_dtypes
        x["X"] = x["X"].astype(ml_dtypes.bfloat16)
    x["Y"] = x["Y"].astype(np.float32)
    ref = g.evaluate({k: np.asarray(v, np.float64) for k, v in x.items()}, dtype=np.float64)["O"]
    out = np.asarray(prism.compile(g)(**x), np.float64)
    assert out.shape == ref.shape
    np.testing.assert_allclose(out, ref, rtol=0, atol=1e-6 if dtype == "float32" else 1e-2)


def test_large_elementwise_kernel_runs_in_parallel_chunks(rng: np.random.Generator) -> None:
    g = prism.Graph()
    X, Y = g.input("X", (3, 40000)), g.input("Y", (1, 40000))
    g.output(g.mul(g.exp(g.mul_scalar(X, 0.1)), g.silu(Y)), "O")
    g.output(g.sum(g.mul(X, Y), 1), "S")
    check(g, rng)


@pytest.mark.parametrize("n", [64, 67, 1027])
@pytest.mark.parametrize("isa", supported_isas())
def test_long_rows_reduce_in_parts_with_nan_inf_and_tails(isa: str, n: int) -> None:
    """Rows of at least loops.SPLIT_MIN elements are reduced in SPLIT parts combined as a tree (sum_loop,
    max_loop): sum, max, softmax and rms_norm against float64, with NaN and infinities placed in each part,
    on a part boundary and in the tail of n % SPLIT elements, and rows of large values (no overflow in a
    part that the whole row would not have)."""
    from prism.codegen.loops import SPLIT, SPLIT_MIN
    assert n >= SPLIT_MIN
    q = n // SPLIT
    g = prism.Graph()
    X = g.input("X", (12, n))
    g.output(g.sum(X, 1), "T")
    g.output(g.max(X, 1), "M")
    g.output(g.softmax(X, 1), "S")
    g.output(g.rms_norm(X, 1e-6), "R")
    x = np.random.default_rng(n).standard_normal((12, n)).astype(np.float32)
    x[1, 0] = np.nan                      # the first part
    x[10, q + 5] = np.nan                 # the second part (max_loop's NaN flag compares the parts in pairs)
    x[11, 2 * q + 2] = np.nan             # the third part
    x[2, 3 * q] = np.nan                  # the first element of the last part
    x[3, n - 1] = np.nan                  # the tail (n % SPLIT > 0) or the last part's end
    x[4, q - 1] = np.inf                  # the end of the first part
    x[5, 2 * q + 1], x[5, q] = np.inf, -np.inf   # +inf and -inf in different parts: the sum is NaN
    x[6, :] = -np.inf
    x[7, :] = 3e4                         # large: the sum of squares needs float's range, not more
    x[8, 1::4] = -1e17                    # far below the others: the max ignores them, the sum is theirs
    with np.errstate(invalid="ignore", over="ignore"):
        ref = g.evaluate({"X": x}, dtype=np.float64)
        kernel = prism.compile(g, isa=isa)
        out = kernel(X=x)
    src = kernel.specialize().source
    assert "reduction(+:p" in src and "reduction(max:p" in src  # the split form ran
    for k in ("T", "M", "S", "R"):
        r, o = ref[k], out[k]
        assert np.array_equal(np.isnan(r), np.isnan(o)), (k, np.argwhere(np.isnan(r) != np.isnan(o)))
        fin = ~np.isnan(r)
        assert np.array_equal(r[fin] == np.inf, o[fin] == np.inf) and np.array_equal(r[fin] == -np.inf,
                                                                                   o[fin] == -np.inf), k
        finite = np.isfinite(r)
        scale = np.max(np.abs(r[finite]), initial=1.0)
        assert np.max(np.abs(o[finite] - r[finite])) <= 2e-6 * scale, k


@pytest.mark.parametrize("n", [5, 64, 67, 1027])
@pytest.mark.parametrize("isa", supported_isas())
def test_layer_norm_rows_against_float64_with_hostile_rows(isa: str, n: int) -> None:
    """The row-wise layer_norm loop (mean, centred variance, normalized row) against float64: rows whose
    mean is 1e4 times their spread (E[x^2] - mean^2 would cancel to noise or a negative variance), constant
    rows (variance 0: the output is 0, not NaN), NaN and +-inf rows, and short rows and tails of n % 4."""
    g = prism.Graph()
    X = g.input("X", (8, n))
    g.output(g.layer_norm(X, 1e-5), "L")
    x = np.random.default_rng(n).standard_normal((8, n)).astype(np.float32)
    x[1] = (1e4 + x[1]).astype(np.float32)          # |mean| >> std
    x[2] = (-3e5 + 8.0 * x[2]).astype(np.float32)
    x[3] = 2.5                                       # constant row
    x[4, n // 2] = np.nan
    x[5, n - 1] = np.inf
    x[6] = (x[6] * 1e-20).astype(np.float32)        # tiny: eps dominates
    with np.errstate(invalid="ignore", over="ignore"):
        ref = g.evaluate({"X": x}, dtype=np.float64)["L"]
        out = prism.compile(g, isa=isa)(X=x)
    assert np.isnan(out[4]).all() and np.isnan(out[5]).all() == np.isnan(ref[5]).all()
    ok = [0, 1, 2, 3, 6, 7]
    assert np.all(out[3] == 0.0)
    # float32 sums of n terms: the centred values carry the rounding of the mean (|mean| * 2^-24 relative
    # to the row's spread: 1e4 / 1 * 6e-8 = 6e-4 on row 1)
    err = np.abs(out[ok] - ref[ok])
    bound = np.array([2e-6, 2e-3, 2e-3, 0.0, 2e-6, 2e-6])[:, None] * np.sqrt(max(1, n / 64))
    assert np.all(err <= bound), (np.max(err, axis=1), bound[:, 0])


@pytest.mark.parametrize("isa", supported_isas())
def test_long_row_max_when_its_nan_check_sum_overflows(isa: str) -> None:
    """Rows whose sums overflow to +inf in one part and -inf in another (no NaN anywhere; max_loop once flagged
    NaN by a running sum, which such rows made NaN) keep their finite maximum, a NaN behind such values is
    found, and -inf/+inf rows are ordinary."""
    n = 256
    g = prism.Graph()
    X = g.input("X", (5, n))
    g.output(g.max(X, 1), "M")
    x = np.random.default_rng(5).standard_normal((5, n)).astype(np.float32)
    x[0, : n // 4], x[0, n // 4: n // 2] = 3e38, -3e38        # part sums +inf and -inf: no NaN
    x[1, : n // 4], x[1, n // 4: n // 2] = 3e38, -3e38
    x[1, n - 1] = np.nan                                        # ... and a NaN in the last part
    x[2, :] = np.inf
    x[3, ::2] = -np.inf
    x[4, 7], x[4, 200] = -np.inf, np.inf
    out = prism.compile(g, isa=isa)(X=x)[:, 0]
    assert out[0] == np.float32(3e38) and np.isnan(out[1]) and out[2] == np.inf
    assert out[3] == x[3, 1::2].max() and out[4] == np.inf


@pytest.mark.parametrize("isa", supported_isas())
def test_row_max_and_softmax_propagate_nan_and_keep_infinities(isa: str) -> None:
    """The vectorized max (a compare-and-blend reduction with a NaN flag beside it, loops.max_loop): a NaN
    anywhere in a row makes the row's max NaN, -inf and +inf are ordinary values, at every position of a
    vector and of the tail."""
    g = prism.Graph()
    X = g.input("X", (8, 37))
    g.output(g.max(X, 1), "M")
    g.output(g.softmax(X, 1), "S")
    x = np.random.default_rng(3).standard_normal((8, 37)).astype(np.float32)
    x[1, 0] = np.nan           # first lane
    x[2, 36] = np.nan          # the tail
    x[3, :] = -np.inf          # every element -inf: max -inf, softmax NaN (as NumPy: -inf - -inf)
    x[4, 17] = np.inf
    x[5, 5], x[5, 20] = np.nan, np.inf
    x[6, 16] = -np.inf
    with np.errstate(invalid="ignore"):
        ref = g.evaluate({"X": x}, dtype=np.float64)
        out = prism.compile(g, isa=isa)(X=x)
    for k in ("M", "S"):
        r, o = ref[k], out[k]
        assert np.array_equal(np.isnan(r), np.isnan(o)), (k, np.argwhere(np.isnan(r) != np.isnan(o)))
        fin = ~np.isnan(r)
        assert np.array_equal(r[fin] == np.inf, o[fin] == np.inf) and np.array_equal(r[fin] == -np.inf,
                                                                                   o[fin] == -np.inf)
        finite = np.isfinite(r)
        assert np.max(np.abs(o[finite] - r[finite])) <= 1e-6


def test_a_cheap_value_of_several_consumers_is_recomputed(rng: np.random.Generator,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """log_softmax's ``x - max`` (1 flop per element) read by the exp-sum and by the output is computed in
    each instead of stored in a scratch tile and read back; with recomputation off it is stored. Both exact
    against float64."""
    from prism.codegen import block

    g = prism.Graph()
    X = g.input("X", (32, 96))
    bb = BlockBuilder(grid=(4,), forloop=1, inputs=[X])
    x = bb.iter(0, imap=(0,))
    d = bb.sub(x, bb.max(x, 1))
    bb.save(bb.sub(d, bb.log(bb.sum(bb.exp(d), 1))), omap=(0,))
    (y,) = g.customized(bb.build(), [X])
    g.output(y, "Y")

    def scratch() -> int:
        return prism.compile(g).specialize().gen.scratch_floats
    recomputed = scratch()
    check(g, rng)
    monkeypatch.setattr(block, "RECOMPUTE_FLOPS", 0)
    stored = scratch()
    check(g, rng)
    assert stored >= recomputed + 8 * 96, (stored, recomputed)   # the [8, 96] tile of x - max


@pytest.mark.parametrize("n", [37, 1027])
@pytest.mark.parametrize("isa", supported_isas())
def test_max_of_a_negation_is_a_min_reduction(isa: str, n: int) -> None:
    """``max(-x)`` (how amin/min are captured) is reduced as ``-min(x)``: no negation per element, the same
    values (negation is exact), NaN and infinities as the max."""
    g = prism.Graph()
    X = g.input("X", (6, n))
    g.output(g.neg(g.max(g.neg(X), 1)), "M")
    x = np.random.default_rng(n).standard_normal((6, n)).astype(np.float32)
    x[1, n // 3] = np.nan
    x[2, n - 1] = np.nan
    x[3, :] = np.inf
    x[4, 5] = -np.inf
    kernel = prism.compile(g, isa=isa)
    out = kernel(X=x)[:, 0]
    src = kernel.specialize().source
    assert "reduction(min:" in src
    loop = src.split("reduction(min:")[1].split("}")[0]   # the min loop's body: x read as it is
    assert "(-" not in loop, loop
    with np.errstate(invalid="ignore"):
        ref = np.min(x, axis=1)
    assert np.array_equal(np.isnan(out), np.isnan(ref)) and np.array_equal(out[~np.isnan(ref)], ref[~np.isnan(ref)])


@pytest.mark.parametrize("form", ["min", "min_of_neg", "min_along_rows"])
@pytest.mark.parametrize("n", [37, 1027])
@pytest.mark.parametrize("isa", supported_isas())
def test_min_reduction(isa: str, n: int, form: str) -> None:
    """The ``min`` reduction (its monoid in prism.ir.reductions): along the innermost axis as a vectorized
    compare reduction with a NaN flag, ``min(-x)`` as ``-max(x)`` (no negation per element), and along an
    outer axis as an in-order sweep (``pr_min``); NaN and infinities as NumPy's."""
    g = prism.Graph()
    rows = form == "min_along_rows"
    X = g.input("X", (n, 6) if rows else (6, n))
    if form == "min_of_neg":
        g.output(g.min(g.neg(X), 1), "M")
    else:
        g.output(g.min(X, 0 if rows else 1), "M")
    x = np.random.default_rng(n).standard_normal((6, n)).astype(np.float32)
    x[1, n // 3] = np.nan
    x[2, n - 1] = np.nan
    x[3, :] = np.inf
    x[4, 5] = -np.inf
    x = np.ascontiguousarray(x.T) if rows else x
    kernel = prism.compile(g, isa=isa)
    out = kernel(X=x).reshape(-1)
    src = kernel.specialize().source
    with np.errstate(invalid="ignore"):
        ref = np.min(-x if form == "min_of_neg" else x, axis=0 if rows else 1)
    if form == "min_of_neg":
        loop = src.split("reduction(max:")[1].split("}")[0]
        assert "(-" not in loop, loop
    elif form == "min":
        assert "reduction(min:" in src
    else:
        assert "pr_min(" in src.split("end of prelude")[1]
    assert np.array_equal(np.isnan(out), np.isnan(ref)) and np.array_equal(out[~np.isnan(ref)], ref[~np.isnan(ref)])


@pytest.mark.parametrize("isa", supported_isas())
@pytest.mark.parametrize("dim", [2, 1])
def test_rotate_half_on_tiles_and_as_a_kernel_operator(rng: np.random.Generator, isa: str, dim: int) -> None:
    """``rotate_half`` (RoPE's rotation) as a tile operator over whole rows of a grid's blocks, along the
    contiguous dim and along a strided one, and as a predefined kernel operator; every ISA path."""
    g = prism.Graph()
    X = g.input("X", (8, 6, 64))
    bb = BlockBuilder(grid=(2,), forloop=1, inputs=[X])
    x = bb.iter(0, imap=(0,))                              # [4, 6, 64] per block
    bb.save(bb.mul(bb.rotate_half(x, dim), x), omap=(0,))
    (out,) = g.customized(bb.build(), [X])
    g.output(out, "Y")
    check(g, rng, isa=isa)
    p = prism.Graph()
    Z = p.input("Z", (3, 10, 64))
    p.output(p.rotate_half(Z, dim), "Y")
    check(p, rng, isa=isa)


@pytest.mark.parametrize("M, N, K", [(64, 16, 16), (67, 37, 19), (128, 130, 200), (96, 256, 64)])
def test_short_k_nt_product_runs_as_nn_on_a_transposed_copy(rng: np.random.Generator, M: int, N: int, K: int) -> None:
    """A @ B^T with a short K and many rows (a Gram matrix, attention scores): on AVX-512 B's block is copied
    transposed into scratch (16 x 16 register tiles, loops for the edges) and the nn kernel runs on it; as a
    block operator, inside a for-loop whose products add up (split K), and as a kernel-level matmul."""
    g = prism.Graph()
    A, B = g.input("A", (M, K)), g.input("B", (N, K))
    bb = BlockBuilder(grid=(1,), forloop=1, inputs=[A, B])
    bb.save(bb.matmul(bb.iter(0), bb.transpose(bb.iter(1), 0, 1)), omap=(None,))
    (y,) = g.customized(bb.build(), [A, B])
    g.output(y, "Y")
    src = compile_kernel(g, isa="avx512").source
    assert "pr_tr16(" in src and "pr_nn_avx512" in src and "pr_nt_avx512" not in src
    if "avx512" in supported_isas():
        check(g, rng, isa="avx512")
    check(g, rng)                                     # this machine's best ISA (AVX2: the nt kernels)

    g = prism.Graph()                                 # K split over a for-loop: each iteration packs its block
    A, B = g.input("A", (M, 2 * K)), g.input("B", (N, 2 * K))
    bb = BlockBuilder(grid=(1,), forloop=2, inputs=[A, B])
    prod = bb.matmul(bb.iter(0, imap=(None,), fmap=1), bb.transpose(bb.iter(1, imap=(None,), fmap=1), 0, 1))
    bb.save(bb.accumulate("sum", prod), omap=(None,))
    (y,) = g.customized(bb.build(), [A, B])
    g.output(y, "Y")
    assert "pr_tr16(" in compile_kernel(g, isa="avx512").source
    check(g, rng)

    g = prism.Graph()                                 # kernel level, batched: a copy per product
    A, B = g.input("A", (3, M, K)), g.input("B", (3, N, K))
    g.output(g.matmul(A, g.permute(B, (0, 2, 1))), "Y")
    check(g, rng)


@pytest.mark.parametrize("x_dtype, w_dtype", [("bfloat16", "bfloat16"), ("float16", "float16"),
                                              ("float32", "float16")])
def test_a_16_bit_gemv_streams_its_keys_as_measured(x_dtype: str, w_dtype: str,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """x @ W^T with 16-bit keys W over a whole long K (decode), on AVX-512 (microkernels.nt_single_keys): bfloat16
    against a bfloat16 row takes 8 keys per block, two accumulators per key on alternate steps, and prefetches
    the keys ahead (a decode step's GEMVs 0.875 of the 16-key kernel's time); float16 keys take one key at a time
    with four accumulators and no prefetch (llama-1b float16's decode pieces 0.80-0.87x the 8-key kernel's
    time). That is where the row does not fit in half the L1 (here set to 4 KiB); where it does, every pair
    takes one key at a time with a prefetch along the keys (microkernels.nt_row_stream). Every K tail and key
    count (37) against float64, and the kernel run where it can."""
    import torch
    for K, l1 in ((5001, 4 << 10), (2048, 4 << 10), (1056, 4 << 10), (5001, 48 << 10), (1056, 48 << 10)):
        monkeypatch.setattr(mk, "l1d_bytes", lambda l1=l1: l1)
        g = _x_wt(K, w_dtype, x_dtype)
        src = compile_kernel(g, isa="avx512").source
        if l1 > 4 << 10:
            assert "_1x1_" in src and "_pfa(" in src and "_1x8_" not in src and "_1x16_" not in src
        elif w_dtype == "bfloat16":
            assert "_1x8_" in src and "__builtin_prefetch(Bt + 16 * sb0 + k, 0, 2)" in src and "_1x16_" not in src
        else:
            assert "_1x1_" in src and "__builtin_prefetch" not in src and "_1x8_" not in src and "_1x16_" not in src
            assert "acc3 = _mm512_fmadd_ps" in src   # four accumulators taken in turn
        assert "__builtin_prefetch(Bt + 16 * sb0" not in compile_kernel(g, isa="avx2").source   # AVX2: as before
        if "avx512" not in supported_isas():
            continue
        w = torch.randn(37, K, generator=torch.Generator().manual_seed(K)).to(getattr(torch, w_dtype))
        xs = torch.randn(1, K, generator=torch.Generator().manual_seed(K + 1)).to(getattr(torch, x_dtype))
        out = prism.compile(g, isa="avx512")(W=w, x=xs)
        ref = xs.double().numpy() @ w.double().numpy().T
        assert_close(np.asarray(torch.as_tensor(out).float()), ref, f"x @ W^T {x_dtype} x {w_dtype} K={K}", rtol=1e-2)


def _batch_loops(src: str) -> list[str]:
    import re
    return re.findall(r"for \(long bi\d+ = 0; bi\d+ < \d+", src)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_a_weight_shared_by_the_batch_is_one_product_of_all_rows(dtype: str) -> None:
    """x [B, S, K] @ W^T (a Linear under a rank-3 input: batch decode, batch prefill): the batch's rows are one
    product's rows, so W streams once (matmul._fold_shared_b; llama-1b bf16 batch-8 decode's LM head 24.5 ->
    4.6 ms); at kernel level and in a block gridded over W's rows; against float64. Not folded where A's rows do
    not run on across the batch (a block of half of each sequence's rows) or where B differs per product."""
    import torch
    isas = [i for i in ("avx512", None) if i is None or i in supported_isas()]
    gen = torch.Generator().manual_seed(7)
    for B, S, K in ((8, 1, 2048), (3, 5, 160), (2, 9, 64)):
        kernel_level = prism.Graph()
        x, w = kernel_level.input("x", (B, S, K), dtype), kernel_level.input("W", (48, K), dtype)
        kernel_level.output(kernel_level.matmul(x, kernel_level.permute(w, (1, 0))), "Y")
        blocked = prism.Graph()
        x2, w2 = blocked.input("x", (B, S, K), dtype), blocked.input("W", (48, K), dtype)
        bb = BlockBuilder(grid=(2,), forloop=1, inputs=[x2, w2])
        bb.save(bb.matmul(bb.iter(0), bb.transpose(bb.iter(1, imap=(0,)), 0, 1)), omap=(2,))
        (y,) = blocked.customized(bb.build(), [x2, w2])
        blocked.output(y, "Y")
        tdt = getattr(torch, dtype)
        xs = torch.randn(B, S, K, generator=gen).to(tdt)
        ws = torch.randn(48, K, generator=gen).to(tdt)
        ref = xs.double().numpy() @ ws.double().numpy().T
        for g in (kernel_level, blocked):
            assert _batch_loops(compile_kernel(g, isa="avx512").source) == []
            for isa in isas:
                out = prism.compile(g, isa=isa)(x=xs, W=ws)
                assert_close(np.asarray(torch.as_tensor(out).float()), ref, f"{dtype} [{B}, {S}, {K}] {isa}",
                             rtol=1e-2 if dtype != "float32" else 1e-4)

    g = prism.Graph()                        # a block of half the rows of each sequence: a product per batch
    x, w = g.input("x", (3, 4, 64), dtype), g.input("W", (48, 64), dtype)
    bb = BlockBuilder(grid=(2,), forloop=1, inputs=[x, w])
    bb.save(bb.matmul(bb.iter(0, imap=(1,)), bb.transpose(bb.iter(1), 0, 1)), omap=(1,))
    (y,) = g.customized(bb.build(), [x, w])
    g.output(y, "Y")
    assert _batch_loops(compile_kernel(g, isa="avx512").source) != []
    xs, ws = torch.randn(3, 4, 64, generator=gen), torch.randn(48, 64, generator=gen)
    xs, ws = xs.to(getattr(torch, dtype)), ws.to(getattr(torch, dtype))
    out = prism.compile(g)(x=xs, W=ws)
    assert_close(np.asarray(torch.as_tensor(out).float()), xs.double().numpy() @ ws.double().numpy().T,
                 f"{dtype} half rows per block", rtol=1e-2)

    g = prism.Graph()                        # a weight per product: the batch loop stays
    x, w = g.input("x", (3, 1, 64), dtype), g.input("W", (3, 48, 64), dtype)
    g.output(g.matmul(x, g.permute(w, (0, 2, 1))), "Y")
    assert _batch_loops(compile_kernel(g, isa="avx512").source) != []


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_only_the_first_row_group_of_a_key_block_prefetches_the_next_keys(dtype: str,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """An nt product over K chunks with several row groups: the first group of each run prefetches the next
    keys, the others (which find this block's keys in L1) call the kernel without prefetches (matmul.emit_nt;
    bf16 [1024, 2048] x [5632, 2048]^T 687 -> 857 GFLOP/s). Every row count's runs -- groups of 4, then 2, then 1
    row, and the keys left over -- against float64, per value and through one template of the row count."""
    monkeypatch.setenv("PRISM_AMX", "0")   # the AVX-512 kernels' text (the tiles: tests/cpu/test_amx.py)
    import torch
    isas = [i for i in ("avx512", None) if i is None or i in supported_isas()]
    gen = torch.Generator().manual_seed(3)
    K, N = 2048, 50                               # K chunks (more than 8 rows); 2 keys left over
    g = prism.Graph()                              # W read in its stored [N, K] layout: the nt kernels
    x, w = g.input("x", ("m", K), dtype), g.input("W", (N, K), dtype)
    bb = BlockBuilder(grid=(1,), forloop=1, inputs=[x, w])
    bb.save(bb.matmul(bb.iter(0, imap=(None,)), bb.transpose(bb.iter(1, imap=(None,)), 0, 1)), omap=(None,))
    (y,) = g.customized(bb.build(), [x, w])
    g.output(y, "Y")
    src = compile_kernel(g.instantiate({"m": 23}), isa="avx512").source
    kern = "pr_nt_avx512_4x4"
    calls = [ln.strip() for ln in src.splitlines() if f"{kern}" in ln and ln.rstrip().endswith(");")]
    prefetching = [c for c in calls if "_npf(" not in c]
    assert len(prefetching) == 1 and len(calls) == 2, calls    # the first group, then the loop over the rest
    body = src.split("PR_INLINE void " + prefetching[0].split("(")[0] + "(")[1].split("\n}\n")[0]
    assert "__builtin_prefetch" in body
    tdt = getattr(torch, dtype)
    ws = torch.randn(N, K, generator=gen).to(tdt)
    for isa in isas:
        per_value = prism.compile(g, isa=isa)
        one_template = prism.compile(g, isa=isa, templates=True)
        for m in (9, 10, 11, 12, 23):              # runs of 4 rows, then of 2 and of 1 taken or not
            xs = torch.randn(m, K, generator=gen).to(tdt)
            ref = xs.double().numpy() @ ws.double().numpy().T
            for name, k in (("per value", per_value), ("template", one_template)):
                out = np.asarray(torch.as_tensor(k(x=xs, W=ws)).float())
                assert_close(out, ref, f"{dtype} m={m} {isa} {name}", rtol=1e-2 if dtype != "float32" else 1e-4)
        assert one_template.specialize(m=23).template is not None, one_template.template_failures


# per storage: (the rows' and keys' hostile scales (within float16's range for float16), rtol against float64)
_TN_CASES = {"bfloat16": (-3e3, 1e4, 1e-2), "float32": (-3e3, 1e4, 1e-5), "float16": (-8.0, 10.0, 2e-3),
             "float32/float16": (-3e3, 10.0, 1e-5),   # rows (a block's float32 values) against float16 keys
             "bfloat16/int8": (-3e3, 1.0, 1e-2)}      # int8 weight-only on a bfloat16 model: the keys' integers


@pytest.mark.parametrize("dtype", sorted(_TN_CASES))
def test_a_product_of_many_rows_against_stored_keys_runs_transposed_on_packed_rows(
        dtype: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """X [m, K] @ W [N, K]^T from matmul.TN_MIN_ROWS rows and K >= TN_MIN_K: C^T = W @ X^T on X's rows packed in
    the thread's scratch (matmul.emit_tn): bfloat16 in k pairs with vdpbf16ps (a Linear's prefill 1.16 -> 0.99x
    oneDNN's time); float32 and float16 (and float32 rows against float16 keys: a fused MLP's normalized rows)
    with FMA on rows packed in float32, a float16 weight's keys converted a block at a time (float16 [128, 2048]
    x [5632, 2048]^T 374 -> 440 GFLOP/s, float32 364 -> 429), and bfloat16 rows against int8 keys (converted a
    block at a time into bfloat16 pairs, exact; 16.6 -> 7.5 ms at [128, 2048] x [5632, 2048]^T). Row counts that
    are not a multiple of the kernel's
    64 rows nor of its 256-row chunks, key counts not a multiple of its 6 keys, K with and without a partial group
    of 512, one scaled-up row and key; against float64, per value and through one template of m. Short K
    (attention's scores) and few rows keep the nt kernels; a for-loop over K adds each iteration's part into C."""
    monkeypatch.setenv("PRISM_AMX", "0")   # the AVX-512 kernels' text (the tiles: tests/cpu/test_amx.py)
    import torch

    from prism.codegen.isa import bf16_dot, detect
    xdt, wdt = (dtype.split("/") * 2)[:2]
    if xdt == "bfloat16" and not bf16_dot(detect()):
        pytest.skip("the machine has no AVX512_BF16 (vdpbf16ps): the bfloat16 tn path is not generated for it")
    if detect().name != "avx512":
        pytest.skip("the tn path is generated for AVX-512 only and this machine cannot run it")
    row_scale, key_scale, rtol = _TN_CASES[dtype]
    txdt, twdt = getattr(torch, xdt), getattr(torch, wdt)
    gen = torch.Generator().manual_seed(5)

    def product(K: int, N: int) -> prism.Graph:
        g = prism.Graph()
        x, w = g.input("x", ("m", K), xdt), g.input("W", (N, K), wdt)
        bb = BlockBuilder(grid=(1,), forloop=1, inputs=[x, w])
        bb.save(bb.matmul(bb.iter(0, imap=(None,)), bb.transpose(bb.iter(1, imap=(None,)), 0, 1)), omap=(None,))
        (y,) = g.customized(bb.build(), [x, w])
        g.output(y, "Y")
        return g

    def keys(N: int, K: int) -> torch.Tensor:
        if wdt == "int8":
            return torch.randint(-127, 128, (N, K), generator=gen, dtype=torch.int8)
        ws = torch.randn(N, K, generator=gen)
        ws[N // 2] *= key_scale                              # one key of large weights
        return ws.to(twdt)

    src = compile_kernel(product(512, 48).instantiate({"m": 64}), isa="avx512").source
    assert "pr_tn_" in src and ("pr_i8_bf16_panel" in src) == (wdt == "int8")
    assert "pr_tn_" not in compile_kernel(product(128, 48).instantiate({"m": 256}), isa="avx512").source
    # int8 keys take it from 9 rows (matmul.TN_MIN_ROWS_I8; 12 keys against one vector of rows, mk.tn_shape), the
    # GEMV rows below keep nt; other storage from 64 rows
    few = "pr_tn_" in compile_kernel(product(512, 48).instantiate({"m": 32}), isa="avx512").source
    assert few == (wdt == "int8")
    assert "pr_tn_" not in compile_kernel(product(512, 48).instantiate({"m": 8}), isa="avx512").source
    # 70, 90, 111: a last block of rows that fills 1, 2, 3 of its 4 vectors (the kernel of that many vectors)
    rows = (9, 16, 17, 33, 49, 64, 70, 130) if wdt == "int8" else (64, 70, 90, 111, 127, 130, 300)
    for K, N in ((512, 48), (600, 53), (1030, 13), (2048, 50)):
        g = product(K, N)
        ws = keys(N, K)
        per_value, one_template = prism.compile(g, isa="avx512"), prism.compile(g, isa="avx512", templates=True)
        for m in rows:
            xs = torch.randn(m, K, generator=gen)
            xs[m // 3] *= row_scale                          # one row of large activations
            xs = xs.to(txdt)
            ref = xs.double().numpy() @ ws.double().numpy().T
            for name, k in (("per value", per_value), ("template", one_template)):
                out = np.asarray(torch.as_tensor(k(x=xs, W=ws)).float())
                assert_close(out, ref, f"{dtype} K={K} N={N} m={m} {name}", rtol=rtol)
        assert one_template.specialize(m=rows[-1]).template is not None, one_template.template_failures
        if wdt == "int8":   # one text for every row count from 9 on (mk.tn_shape): one template region
            t9 = one_template.specialize(m=9).template
            assert t9 is not None and all(one_template.specialize(m=m).template is t9 for m in rows)

    g = prism.Graph()                 # a for-loop over K's halves accumulating the product: C += Ct^T from it = 1
    x, w = g.input("x", ("m", 1100), xdt), g.input("W", (50, 1100), wdt)
    bb = BlockBuilder(grid=(1,), forloop=2, inputs=[x, w])
    xi, wi = bb.iter(0, imap=(None,), fmap=1), bb.iter(1, imap=(None,), fmap=1)
    bb.save(bb.accumulate("sum", bb.matmul(xi, bb.transpose(wi, 0, 1))), omap=(None,))
    (y,) = g.customized(bb.build(), [x, w])
    g.output(y, "Y")
    assert "pr_tr16_add" in compile_kernel(g.instantiate({"m": 70}), isa="avx512").source
    ws = keys(50, 1100)
    for m in (64, 70, 130):
        xs = torch.randn(m, 1100, generator=gen).to(txdt)
        out = np.asarray(torch.as_tensor(prism.compile(g, isa="avx512")(x=xs, W=ws)).float())
        assert_close(out, xs.double().numpy() @ ws.double().numpy().T, f"{dtype} for-loop m={m}", rtol=rtol)


def _rows_ahead(row_bytes: int) -> int:
    """microkernels.nn_prefetch_rows's C expression evaluated at ``row_bytes`` (C's ?: and integer division)."""
    import re
    m = re.fullmatch(r"\((.*) \? (.*) : (.*)\)", mk.nn_prefetch_rows(str(row_bytes)))
    assert m is not None
    cond, yes, no = (p.replace("&&", "and").replace("/", "//") for p in m.groups())
    return int(eval(yes if eval(cond) else no))


def test_attention_streams_are_prefetched_by_distance_in_bytes() -> None:
    """Short rows are one stream: nn prefetches PF_AHEAD bytes ahead where B's rows are short (attention's V:
    256 B of bfloat16 -> 16 rows, 512 B of float32 -> 8), PF_ROWS rows where each row is a new page or tiny;
    nt over K chunks of short keys stored back to back (attention's K) does not prefetch, a weight's long or
    strided keys do. W6's hand-written split-KV decode, compiled: the scores' nt kernel without prefetch, the
    PV product's nn kernel with the distance."""
    assert [_rows_ahead(rb) for rb in (64, 128, 256, 512, 1024, 2048, 16384)] == [32, 32, 16, 8, 4, 32, 32]
    assert not mk.nt_chunk_prefetch(128, 128, "bf16") and not mk.nt_chunk_prefetch(128, 128, "f32")
    assert mk.nt_chunk_prefetch(4096, 4096, "bf16")      # a weight's keys: 8 KiB each
    assert mk.nt_chunk_prefetch(256, 128, "f32")         # keys not back to back
    assert mk.nt_chunk_prefetch("sk", 128, "f32")        # a stride only known at run time
    from prism.workloads import WORKLOADS
    w = WORKLOADS["W6"]
    s = w.shapes[0]
    src = compile_kernel(w.hand_written(s).instantiate({**w.params(s)}), isa="avx512").specialize(b=s["b"]).source
    assert "pr_nt_avx512_4x4_npf(" in src and "pr_nt_avx512_4x4(" not in src
    assert f"const long pfo = {mk.nn_prefetch_rows('sb0 * 4')} * sb0;" in src and "Bk + pfo + 0" in src


@pytest.mark.parametrize("n", [4096 * 9, 4096 * 9 + 1, 33 * 1001])
def test_a_long_element_wise_loop_runs_in_chunks_with_a_short_last_one(n: int) -> None:
    """A 1-D element-wise loop of at least loops.PAR_MIN elements is parallel over chunks of loops.CHUNK, the last
    one cut short: lengths that 4096 does not divide are chunked too (one template for every length; before, only
    a divided length was, and an odd one ran on one thread). Every element against float64, through every ISA path
    the machine runs, with a different thread count than the chunks (PRISM_NUM_THREADS=3)."""
    from prism.codegen.loops import CHUNK, PAR_MIN
    assert n >= PAR_MIN
    g = prism.Graph("chunks")
    x = g.input("X", (n,))
    g.output(g.add(g.exp(x), x), "Y")
    rng = np.random.default_rng(n)
    for isa in supported_isas():
        k = prism.compile(g, isa=isa)
        assert "pr_minl" in k.source and f"* {CHUNK}" in k.source
        xv = rng.standard_normal(n).astype(np.float32)
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv("PRISM_NUM_THREADS", "3")
            y = k(X=xv)
        ref = np.exp(xv.astype(np.float64)) + xv
        assert np.all(np.abs(y - ref) <= 1e-6 * np.maximum(1.0, np.abs(ref))), isa
