"""Low-precision storage end to end: bfloat16 / float16 programs, float32 programs with bfloat16 or int8 weights.

The rule (prism/ir/dtypes.py): values are computed in float32 whatever their storage, matmuls and reductions
accumulate in float32, a value is rounded only by an explicit cast or when stored as a low-precision output.
Every kernel here is compared with the float64 reference of the *same* low-precision inputs, with the
tolerance the numeric verifier states per dtype (``tolerance(K) + rounding_allowance``: two roundings of the
output's dtype, 2 * 2^-8 for bfloat16), on every ISA path this machine runs, on ordinary and hostile inputs.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from cg_helpers import supported_isas

import prism
from prism.codegen.isa import cpu_flags
from prism.errors import InputError
from prism.ir import BlockBuilder
from prism.ir.dtypes import bfloat16, round_to
from prism.runtime.kernel import compile as compile_graph
from prism.verify.numeric import (
    Runner,
    compiled_runner,
    numeric_check,
    reduction_length,
    rounding_allowance,
    tolerance,
)

pytestmark = pytest.mark.cpu
BF16 = np.dtype(ml_dtypes.bfloat16)


def _np(dt: str) -> np.dtype:
    return BF16 if dt == "bfloat16" else np.dtype(dt)


def _draw(rng: np.random.Generator, shape: tuple[int, ...], dt: str, scale: float = 1.0) -> np.ndarray:
    if dt == "int8":
        return rng.integers(-127, 128, shape).astype(np.int8)
    return (rng.standard_normal(shape) * scale).astype(np.float32).astype(_np(dt))


def _check(g: prism.Graph, inputs: dict[str, np.ndarray], isa: str) -> None:
    """Compile ``g`` for ``isa`` and compare every output with the float64 reference of the same inputs."""
    k = compile_graph(g, isa=isa)
    got = k(**inputs)
    got = got if isinstance(got, dict) else {g.output_names[0]: got}
    ref = g.evaluate(inputs, dtype=np.float64)
    env = g.bind({n: a.shape for n, a in inputs.items()})
    for name, r in ref.items():
        out = got[name]
        want = next(o.dtype for o in g.outputs if o.arg[0] == name)
        assert out.dtype == want.np, f"{name}: dtype {out.dtype}, expected {want}"
        o = np.asarray(out, np.float64)
        assert np.array_equal(np.isnan(o), np.isnan(r)) and np.array_equal(np.isinf(o), np.isinf(r)), name
        fin = np.isfinite(r)
        scale = np.abs(r[fin]) + np.sqrt(np.mean(np.square(r[fin]))) if fin.any() else 1.0
        err = float(np.max(np.abs(o[fin] - r[fin]) / scale)) if fin.any() else 0.0
        tol = tolerance(reduction_length(g, env)) + rounding_allowance(g, name)
        assert err <= tol, f"{g.name} [{isa}] {name}: error {err:.3g} > tolerance {tol:.3g}"


# --- the reference's semantics --------------------------------------------------------------------------

def test_reference_rounds_at_casts_and_outputs_only() -> None:
    g = prism.Graph()
    x = g.input("x", (4, 64), "bfloat16")
    w = g.input("w", (64, 8), "bfloat16")
    y = g.matmul(x, w)
    g.output(y)
    g.output(g.cast(y, "float32"), "y32")
    g.output(g.cast(g.cast(x, "float32"), "bfloat16"), "same")
    rng = np.random.default_rng(0)
    xv, wv = _draw(rng, (4, 64), "bfloat16"), _draw(rng, (64, 8), "bfloat16")
    out = g.evaluate({"x": xv, "w": wv})
    assert out["out0"].dtype == BF16 and out["y32"].dtype == np.float32
    exact = xv.astype(np.float64) @ wv.astype(np.float64)
    # float32 accumulation, one rounding at the bfloat16 output: exactly the rounded float32 product
    assert np.array_equal(out["out0"], (xv.astype(np.float32) @ wv.astype(np.float32)).astype(BF16))
    assert np.max(np.abs(out["y32"] - exact)) <= 1e-5 * np.max(np.abs(exact))   # no rounding before the cast
    assert np.array_equal(out["same"], xv)                                        # widening is exact
    ref = g.evaluate({"x": xv, "w": wv}, dtype=np.float64)
    assert ref["out0"].dtype == np.float64 and np.allclose(ref["out0"], exact, rtol=0, atol=1e-12)
    assert np.array_equal(round_to(np.array([1 + 2 ** -8, 1 + 3 * 2 ** -8, 1 + 3 * 2 ** -9, 3.4e38]), bfloat16),
                          [1.0, 1 + 2 ** -6, 1 + 2 ** -7, np.inf])    # ties to even, to nearest, overflow


def test_bfloat16_store_matches_ml_dtypes_bit_for_bit() -> None:
    """The generated float32 -> bfloat16 store (round to nearest even) on every bit class: normal,
    subnormal, ties, the overflow boundary, infinities and NaN."""
    rng = np.random.default_rng(1)
    bits = np.concatenate([rng.integers(0, 2 ** 32, 20000, dtype=np.uint64).astype(np.uint32),
                           np.array([0, 0x80000000, 0x00000001, 0x007fffff, 0x3f808000, 0x3f818000, 0x3f80ffff,
                                     0x7f7fffff, 0x7f7f7fff, 0x7f800000, 0xff800000, 0x7fc00000, 0x7f800001,
                                     0xffc00001], dtype=np.uint32)])
    x = bits.view(np.float32).reshape(1, -1)
    g = prism.Graph()
    g.output(g.cast(g.input("x", x.shape, "float32"), "bfloat16"))
    for isa in supported_isas():
        got = compile_graph(g, isa=isa)(x=x)
        with np.errstate(invalid="ignore"):
            want = x.astype(BF16)
        nan = np.isnan(want.astype(np.float32))
        assert np.array_equal(np.isnan(got.astype(np.float32)), nan), isa
        assert np.array_equal(got.view(np.uint16)[~nan], want.view(np.uint16)[~nan]), isa


def test_float16_loads_and_stores_match_numpy_bit_for_bit() -> None:
    """The generated float16 conversions (prelude: bit operations on uint16_t, so that gcc vectorizes them; the
    `_Float16` casts they replaced stayed scalar) against NumPy: every one of the 65536 float16 bit patterns
    widened to float32, and float32 -> float16 (round to nearest even) on random bits and every class: zeros,
    float16 subnormals and their ties, the smallest normal, ties to even, 65504, the overflow boundary 65520,
    float32 subnormals, infinities and NaN (its position; payloads are not compared). A one-element-per-row
    program whose loops run the vector body and its tail."""
    every = np.arange(2 ** 16, dtype=np.uint32).astype(np.uint16).view(np.float16).reshape(1, -1)
    g = prism.Graph()
    g.output(g.cast(g.input("h", every.shape, "float16"), "float32"))
    rng = np.random.default_rng(2)
    bits = np.concatenate([rng.integers(0, 2 ** 32, 40000, dtype=np.uint64).astype(np.uint32),
                           np.array([0, 0x80000000, 0x00000001, 0x007fffff, 0x33000000, 0x33000001, 0x33800000,
                                     0x337fffff, 0x33c00000, 0x34400000, 0x387fc000, 0x387fe000, 0x38800000,
                                     0x3f801000, 0x3f803000, 0x3f800fff, 0x477fe000, 0x477fefff, 0x477ff000,
                                     0x47800000, 0x7f7fffff, 0x7f800000, 0xff800000, 0x7fc00000, 0x7f800001,
                                     0xffc00001, 0xc77ff000, 0xb3000001], dtype=np.uint32)])
    x = bits.view(np.float32).reshape(1, -1)
    g2 = prism.Graph()
    g2.output(g2.cast(g2.input("x", x.shape, "float32"), "float16"))
    for isa in supported_isas():
        got = compile_graph(g, isa=isa)(h=every)
        want = every.astype(np.float32)
        nan = np.isnan(want)
        assert np.array_equal(np.isnan(got), nan), isa
        assert np.array_equal(got.view(np.uint32)[~nan], want.view(np.uint32)[~nan]), isa
        got = compile_graph(g2, isa=isa)(x=x)
        with np.errstate(invalid="ignore", over="ignore"):
            want = x.astype(np.float16)
        nan = np.isnan(want)
        assert np.array_equal(np.isnan(got), nan), isa
        assert np.array_equal(got.view(np.uint16)[~nan], want.view(np.uint16)[~nan]), isa


# --- the verifier's tolerance per dtype -----------------------------------------------------------------

def _bf16_accumulating(graph: prism.Graph, inputs: dict, params: dict) -> dict:
    """A kernel that keeps its running sum in bfloat16 (what the mixed-precision rule forbids)."""
    x, w = inputs["x"].astype(np.float32), inputs["w"].astype(np.float32)
    acc = np.zeros((x.shape[0], w.shape[1]), np.float32)
    for k in range(x.shape[1]):
        acc = (acc + np.outer(x[:, k], w[k])).astype(BF16).astype(np.float32)
    return {"out0": acc.astype(BF16)}


@pytest.mark.parametrize("K", [64, 256, 4096])
def test_a_kernel_accumulating_in_bfloat16_is_rejected(K: int) -> None:
    g = prism.Graph()
    g.output(g.matmul(g.input("x", ("n", K), "bfloat16"), g.input("w", (K, 32), "bfloat16")))
    bad = numeric_check(g, g, instantiations=[{"n": 3}], runners=[Runner("bf16-acc", _bf16_accumulating)])
    assert not bad.passed, str(bad)
    good = numeric_check(g, g, instantiations=[{"n": 3}])        # the float32-accumulating interpreter
    assert good.passed, str(good)
    assert good.checks[0].tolerance == pytest.approx(tolerance(K) + 2 * 2.0 ** -8)


def test_float32_programs_keep_their_tolerance() -> None:
    g = prism.Graph()
    g.output(g.matmul(g.input("x", ("n", 64), "float32"), g.cast(g.input("w", (64, 8), "bfloat16"), "float32")))
    assert rounding_allowance(g, "out0") == 0.0     # a cast that widens rounds nothing
    g2 = prism.Graph()
    g2.output(g2.cast(g2.silu(g2.cast(g2.input("x", (4, 8), "float32"), "bfloat16")), "float32"))
    assert rounding_allowance(g2, "out0") == 2 * 2.0 ** -8   # a narrowing cast inside the program


# --- generated code on every ISA path -------------------------------------------------------------------

def _programs() -> list[tuple[str, prism.Graph, dict[str, tuple]]]:
    out = []

    def prog(name: str) -> prism.Graph:
        g = prism.Graph(name)
        out.append((name, g))
        return g
    for dt in ("bfloat16", "float16"):
        g = prog(f"nn-{dt}")                      # B row-major: the nn micro-kernels, odd sizes (tails)
        g.output(g.matmul(g.input("x", (5, 67), dt), g.input("w", (67, 45), dt)))
        g = prog(f"nt-{dt}")                      # a Linear weight [out, in] read as stored
        g.output(g.matmul(g.input("x", (5, 67), dt), g.permute(g.input("w", (45, 67), dt), (1, 0))))
    g = prog("gemv-nt-long-k")                    # K cut into chunks, bfloat16 weight, float32 activations
    w = g.cast(g.input("w", (37, 2100), "bfloat16"), "float32")
    g.output(g.matmul(g.input("x", (1, 2100), "float32"), g.permute(w, (1, 0))))
    g = prog("generic")                           # neither operand contiguous along K: the plain loop
    g.output(g.matmul(g.permute(g.input("a", (40, 6), "bfloat16"), (1, 0)),
                      g.permute(g.input("b", (9, 40), "bfloat16"), (1, 0))))
    g = prog("elementwise-reductions")
    x = g.input("x", (6, 67), "bfloat16")
    y = g.silu(x)
    g.output(y)
    g.output(g.sum(g.cast(y, "float32"), -1), "rowsum")
    g.output(g.max(x, 0), "colmax")
    g.output(g.mean(x, 0), "colmean")
    g = prog("norm-softmax")
    x = g.input("x", (6, 67), "bfloat16")
    g.output(g.mul(g.rms_norm(x), g.input("gamma", (67,), "bfloat16")))
    g.output(g.softmax(x), "p")
    g = prog("int8-weight-only")                   # w = q * scale (per output channel), read as stored
    q, s = g.input("q", (45, 67), "int8"), g.input("s", (45, 1), "float32")
    g.output(g.matmul(g.input("x", (3, 67), "float32"), g.permute(g.mul(g.cast(q, "float32"), s), (1, 0))))
    return [(n, g, {k: tuple(int(d) for d in v.shape) for k, v in g.inputs.items()}) for n, g in out]


@pytest.mark.parametrize("isa", supported_isas())
@pytest.mark.parametrize("case", [c[0] for c in _programs()])
def test_generated_code_against_float64(isa: str, case: str) -> None:
    _, g, shapes = next(c for c in _programs() if c[0] == case)
    rng = np.random.default_rng(abs(hash(case)) % 2 ** 31)
    for scale in (1.0, 30.0, 1e-3):              # normal, hostile, tiny
        inputs = {k: _draw(rng, s, g.inputs[k].dtype.name, scale if k in ("x", "a") else 1.0)
                  for k, s in shapes.items()}
        if "s" in inputs:
            inputs["s"] = (np.abs(inputs["s"].astype(np.float32)) / 100).astype(np.float32)
        _check(g, inputs, isa)


@pytest.mark.skipif("avx512_bf16" not in cpu_flags(), reason="this machine has no AVX512_BF16 (vdpbf16ps)")
@pytest.mark.parametrize("dot", ["1", "0"], ids=["vdpbf16ps", "widening"])
@pytest.mark.parametrize("shape", [(1, 2100, 37), (5, 67, 45), (9, 1100, 40)], ids=["gemv-long-k", "tails", "rows"])
def test_bfloat16_dot_product_kernels(monkeypatch: pytest.MonkeyPatch, dot: str,
                                      shape: tuple[int, int, int]) -> None:
    """x @ W^T with both operands bfloat16: with AVX512_BF16 the nt kernels sum with ``vdpbf16ps`` (pairs of
    products into float32 lanes), ``PRISM_BF16_DOT=0`` keeps the widening loads; both against float64 on
    ordinary, hostile and tiny inputs, K across chunk boundaries and with tails of every kind. (Not on the AMX
    tiles, which take 9 rows in the tn form: tests/cpu/test_amx.py.)"""
    monkeypatch.setenv("PRISM_BF16_DOT", dot)
    monkeypatch.setenv("PRISM_AMX", "0")
    M, K, N = shape
    g = prism.Graph(f"nt-bf16-{M}x{K}x{N}-dot{dot}")
    X, W = g.input("x", (M, K), "bfloat16"), g.input("w", (N, K), "bfloat16")
    bb = BlockBuilder(grid=(1,), forloop=1, inputs=[X, W])      # W read as stored: the nt kernels
    xv, wv = bb.iter(0), bb.iter(1)
    bb.save(bb.matmul(xv, bb.transpose(wv, 0, 1)), omap=(None,))
    (y,) = g.customized(bb.build(), [X, W])
    g.output(g.cast(y, "bfloat16"))
    src = compile_graph(g, isa="avx512").source
    assert "pr_nt_avx512" in src
    assert ("_mm512_dpbf16_ps" in src) == (dot == "1")
    rng = np.random.default_rng(K)
    for scale in (1.0, 30.0, 1e-3):
        _check(g, {"x": _draw(rng, (M, K), "bfloat16", scale), "w": _draw(rng, (N, K), "bfloat16")}, "avx512")


@pytest.mark.skipif("avx512_bf16" not in cpu_flags(), reason="this machine has no AVX512_BF16 (vdpbf16ps)")
@pytest.mark.parametrize("dot", ["1", "0"], ids=["vdpbf16ps", "widening"])
@pytest.mark.parametrize("shape", [(1, 2100, 37), (5, 67, 45), (3, 131, 50), (9, 1100, 40)],
                         ids=["gemv-long-k", "odd-k-tails", "tail-in-a-pair", "rows-blocked"])
def test_bfloat16_row_pair_kernels(monkeypatch: pytest.MonkeyPatch, dot: str, shape: tuple[int, int, int]) -> None:
    """x @ W with W [K, N] row-major, both bfloat16: with AVX512_BF16 the nn kernels take W's rows two at a time
    (interleaved in registers, ``vdpbf16ps``, the sums put back in column order), ``PRISM_BF16_DOT=0`` keeps the
    widening loads; both against float64 on ordinary, hostile and tiny inputs: an odd K (the last row paired
    with zeros), column tails in a 32-column group and in a lone 16-column one, several rows, and K walked
    whole by the blocked kernel (the 9-row case runs one task per panel)."""
    monkeypatch.setenv("PRISM_BF16_DOT", dot)
    M, K, N = shape
    g = prism.Graph(f"nn-bf16-{M}x{K}x{N}-dot{dot}")
    X, W = g.input("x", (M, K), "bfloat16"), g.input("w", (K, N), "bfloat16")
    if M == 9:   # a kernel-level matmul: one task per (row group, panel) over the whole K (the blocked kernel)
        y = g.matmul(X, W)
    else:        # in a block: K-chunk calls across the panels
        bb = BlockBuilder(grid=(1,), forloop=1, inputs=[X, W])
        bb.save(bb.matmul(bb.iter(0), bb.iter(1)), omap=(None,))
        (y,) = g.customized(bb.build(), [X, W])
    g.output(g.cast(y, "bfloat16"))
    src = compile_graph(g, isa="avx512").source
    assert "pr_nn_avx512" in src and ("_kb_bf16_bf16" in src) == (M == 9)
    assert ("_bf16_bf16_dp(" in src) == (dot == "1") and ("_mm512_dpbf16_ps" in src) == (dot == "1")
    rng = np.random.default_rng(K + N)
    for scale in (1.0, 30.0, 1e-3):
        _check(g, {"x": _draw(rng, (M, K), "bfloat16", scale), "w": _draw(rng, (K, N), "bfloat16")}, "avx512")


def _llama_mlp(M: int = 48, D: int = 256, F: int = 96) -> tuple[prism.Graph, prism.Graph]:
    """Llama's bfloat16 MLP gate as the program (``h = bf16(rms_norm(x)) * w``, ``silu(h @ Wg^T) * (h @ Wu^T)``)
    and as one block: h computed in the block, read by both products."""
    def ins(g: prism.Graph) -> list:
        return [g.input("x", (M, D), "bfloat16"), g.input("w", (D,), "bfloat16"),
                g.input("wg", (F, D), "bfloat16"), g.input("wu", (F, D), "bfloat16")]
    ref = prism.Graph("llama_mlp_bf16")
    x, w, wg, wu = ins(ref)
    h = ref.mul(ref.cast(ref.rms_norm(ref.cast(x, "float32")), "bfloat16"), w)
    ref.output(ref.mul(ref.silu(ref.matmul(h, ref.permute(wg, (1, 0)))), ref.matmul(h, ref.permute(wu, (1, 0)))))
    cand = prism.Graph("llama_mlp_bf16_block")
    X = ins(cand)
    bb = BlockBuilder(grid=(1,), forloop=1, inputs=X)
    x, w, wg, wu = (bb.iter(i) for i in range(4))
    h = bb.mul(bb.cast(bb.rms_norm(x), "bfloat16"), w)
    bb.save(bb.mul(bb.silu(bb.matmul(h, bb.transpose(wg, 0, 1))), bb.matmul(h, bb.transpose(wu, 0, 1))),
            omap=(None,))
    (o,) = cand.customized(bb.build(), X)
    cand.output(o)
    return ref, cand


def test_rounding_allowance_follows_the_programs_roundings() -> None:
    """The allowance is at least two roundings of the output's dtype and at least the rounding error of the
    program run as PyTorch runs it (every bfloat16 value stored): 8 eps for Llama's MLP (cast 1, h 2, each
    product 3, silu 4, the output 4 + 3 + 1); a plain matmul keeps 2 eps."""
    ref, _ = _llama_mlp()
    assert rounding_allowance(ref, "out0") == 8 * 2.0 ** -8
    g = prism.Graph()
    g.output(g.matmul(g.input("x", (4, 64), "bfloat16"), g.input("w", (64, 8), "bfloat16")))
    assert rounding_allowance(g, "out0") == 2 * 2.0 ** -8
    # an exact cast rounds nothing (int8 -> bfloat16); a narrowing one is a rounding (float32 -> bfloat16)
    for src, want in (("int8", 0.0), ("float32", 2 * 2.0 ** -8)):
        g = prism.Graph()
        w = g.permute(g.cast(g.input("q", (8, 64), src), "bfloat16"), (1, 0))
        g.output(g.matmul(g.input("x", (4, 64), "float32"), w))
        assert g.outputs[0].dtype.name == "float32"
        assert rounding_allowance(g, "out0") == want, src


@pytest.mark.skipif("avx512_bf16" not in cpu_flags(), reason="this machine has no AVX512_BF16 (vdpbf16ps)")
def test_a_bfloat16_matmul_operand_computed_in_the_kernel_is_stored_as_bfloat16(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """With vdpbf16ps, h (computed in the block, read by two products) is stored as bfloat16 and both
    products take the bfloat16 pair instruction; the kernel passes the numeric check of the program (its
    error, ~0.015 at K = 256, is eager PyTorch's), and without the instruction h stays float32."""
    monkeypatch.setenv("PRISM_AMX", "0")   # the AVX-512 kernels' text (the tiles: tests/cpu/test_amx.py)
    ref, cand = _llama_mlp()
    src = compile_graph(cand, isa="avx512").source
    assert "pr_nt_avx512_4x4_bf16_bf16_dp" in src and "_f32_bf16" not in src   # (_npf: keys back to back)
    r = numeric_check(cand, ref, runners=[compiled_runner(lambda g, p: compile_graph(g, isa="avx512"))])
    assert r.passed, str(r)


def test_without_the_pair_instruction_a_bfloat16_operand_stays_float32(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PRISM_BF16_DOT", "0")
    ref, cand = _llama_mlp()
    isa = "avx512" if "avx512" in supported_isas() else supported_isas()[0]
    src = compile_graph(cand, isa=isa).source
    assert "_dp(" not in src and "uint16_t*)(S +" not in src
    r = numeric_check(cand, ref, runners=[compiled_runner(lambda g, p: compile_graph(g, isa=isa))])
    assert r.passed, str(r)


@pytest.mark.parametrize("isa", supported_isas())
def test_nonfinite_values_propagate_through_low_precision(isa: str) -> None:
    g = prism.Graph()
    x = g.input("x", (2, 40), "bfloat16")
    g.output(g.add_scalar(x, 1.0))
    g.output(g.sum(x, -1), "s")
    xv = np.ones((2, 40), np.float32)
    xv[0, 3], xv[1, 7] = np.nan, np.inf
    k = compile_graph(g, isa=isa)
    out = k(x=xv.astype(BF16))
    assert np.isnan(out["out0"].astype(np.float32)[0, 3]) and np.isinf(out["out0"].astype(np.float32)[1, 7])
    assert np.isnan(float(out["s"][0, 0])) and np.isinf(float(out["s"][1, 0]))


def test_calls_check_the_dtype_of_every_buffer() -> None:
    g = prism.Graph()
    g.output(g.cast(g.input("x", (2, 4), "bfloat16"), "float32"))
    k = compile_graph(g)
    with pytest.raises(InputError) as e:
        k(x=np.ones((2, 4), np.float32))
    assert "bfloat16" in str(e.value) and "ml_dtypes.bfloat16" in str(e.value)
    with pytest.raises(InputError) as e:
        k.call({"x": np.ones((2, 4), BF16)}, out=np.ones((2, 4), BF16))
    assert "float32" in str(e.value)
    torch = pytest.importorskip("torch")
    t = k(x=torch.ones(2, 4, dtype=torch.bfloat16))
    assert t.dtype == torch.float32 and bool((t == 1).all())
    with pytest.raises(InputError) as e:
        k(x=torch.ones(2, 4))
    assert "torch.bfloat16" in str(e.value)


# --- the search and the tuner on low-precision programs -------------------------------------------------

def _w1(dt: str) -> prism.Graph:
    g = prism.Graph(f"rmsnorm_linear_{dt}")
    x, w = g.input("X", ("n", 256), dt), g.input("W", (256, 192), dt)
    g.output(g.matmul(g.rms_norm(x), w))
    return g


def _swiglu_weight_only() -> prism.Graph:
    """Llama's MLP gate with bfloat16 weights [out, in] and float32 activations."""
    g = prism.Graph("swiglu_bf16_weights")
    x = g.input("X", ("n", 256), "float32")
    wg, wu = (g.permute(g.cast(g.input(k, (192, 256), "bfloat16"), "float32"), (1, 0)) for k in ("Wg", "Wu"))
    g.output(g.mul(g.silu(g.matmul(x, wg)), g.matmul(x, wu)))
    return g


def _int8_weight_bf16_model() -> prism.Graph:
    """int8 weight-only on a bfloat16 model: ``(x @ cast(q, bfloat16)^T) * s^T`` with x and s bfloat16."""
    g = prism.Graph("int8w_bf16_linear")
    x = g.input("X", ("n", 256), "bfloat16")
    q = g.permute(g.cast(g.input("Q", (192, 256), "int8"), "bfloat16"), (1, 0))
    g.output(g.mul(g.matmul(x, q), g.permute(g.input("S", (192, 1), "bfloat16"), (1, 0))))
    return g


@pytest.mark.parametrize("build", [lambda: _w1("bfloat16"), _swiglu_weight_only, _int8_weight_bf16_model],
                         ids=["w1-bf16", "swiglu-w-bf16", "int8w-bf16"])
def test_superoptimize_low_precision_programs(build) -> None:  # type: ignore[no-untyped-def]
    g = build()
    k = prism.superoptimize(g)
    assert k.implementations, "no verified sGraph"
    rng = np.random.default_rng(3)
    for n in (1, 5):
        inputs = {name: _draw(rng, tuple(n if not isinstance(d, int) else d for d in node.shape),
                              node.dtype.name, 0.1 if name != "X" else 1.0)
                  for name, node in g.inputs.items()}
        out = k(**inputs)
        spec = k.specialize(n=n)
        assert spec.check.passed, str(spec.check)       # the compiled check at this shape
        r = numeric_check(spec.implementation.graph, g, instantiations=[{"n": n, **spec.params}],
                          runners=[compiled_runner(lambda _g, _p, kk=spec.kernel: kk)])
        assert r.passed, str(r)
        want = g.outputs[0].dtype
        assert out.dtype == want.np
    # an exact cast (int8 -> bfloat16: dtypes.exact_cast) is dropped like a cast to float32: the kernel reads the int8
    # weight; kept, it was a kernel of its own writing a bfloat16 copy of the weight
    for impl in k.implementations:
        assert not any(n.op == "cast" and n.src[0].dtype.name == "int8" for n in impl.graph.nodes), impl.graph


# --- int8 values of a program: a quantizer's cast (2026-11-29) ---------------------------------------------------

def _quantizer(n: int = 64, k: int = 256) -> prism.Graph:
    """q = int8(clamp(round(x / s), -127, 127)) with s = max |x_row| / 127, and its dequantization q * s."""
    g = prism.Graph("dynamic int8 quantizer")
    x = g.input("x", (n, k))
    s = g.mul_scalar(g.max(g.abs(x), dim=-1), 1 / 127)
    q = g.cast(g.clamp(g.round(g.div(x, s)), -127.0, 127.0), "int8")
    g.output(q, "q")
    g.output(g.mul(g.cast(q, "float32"), s), "y")
    return g


def test_a_cast_to_int8_truncates_saturates_and_takes_nan_to_zero() -> None:
    """The IR's cast to int8 (ir/elementwise.py): PyTorch's ``.to(torch.int8)`` truncates toward zero; out of range
    and NaN (undefined in PyTorch) saturate and give 0. The reference and the C lowering (``pr_round_i8``, stored
    with ``pr_st_i8``) agree on every path this machine runs."""
    vals = np.array([0.99, -0.99, 127.5, 128.0, -128.7, -129.0, 1e30, -1e30, np.inf, -np.inf, np.nan, 3.0, -3.5],
                    np.float32)
    want = np.array([0, 0, 127, 127, -128, -128, 127, -128, 127, -128, 0, 3, -3], np.int8)
    g = prism.Graph("cast to int8")
    x = g.input("x", (1, vals.size))
    g.output(g.cast(x, "int8"), "q")
    g.output(g.cast(g.cast(x, "int8"), "float32"), "f")
    ref = g.evaluate({"x": vals[None]})
    assert np.array_equal(ref["q"].astype(np.int8)[0], want) and np.array_equal(ref["f"][0], want.astype(np.float32))
    for isa in supported_isas():
        got = prism.compile(g, isa=isa)(x=vals[None])
        assert got["q"].dtype == np.int8 and np.array_equal(got["q"][0], want), isa
        assert np.array_equal(got["f"][0], want.astype(np.float32)), isa


def test_a_dynamic_quantizer_compiles_and_superoptimizes_to_pytorchs_values() -> None:
    """The quantizer of int8 dynamic activations, as a program: compiled (every ISA path) and through the search,
    its int8 output equal to the reference's and to PyTorch's, its dequantization within float32 of it."""
    torch = pytest.importorskip("torch")
    g = _quantizer()
    xx = np.random.default_rng(0).standard_normal((64, 256)).astype(np.float32)
    ref = g.evaluate({"x": xx})
    xt = torch.from_numpy(xx)
    s = xt.abs().amax(-1, keepdim=True) * (1 / 127)
    tq = torch.round(xt / s).clamp(-127, 127).to(torch.int8).numpy()
    assert np.array_equal(ref["q"].astype(np.int8), tq)
    for isa in supported_isas():
        got = prism.compile(_quantizer(), isa=isa)(x=xx)
        assert np.array_equal(got["q"], tq) and np.allclose(got["y"], ref["y"], rtol=1e-6, atol=0), isa
    k = prism.superoptimize(_quantizer(), measure_machine=False, time_limit=60)
    got = k(x=xx)
    assert np.array_equal(np.asarray(got["q"]), tq) and np.allclose(np.asarray(got["y"]), ref["y"], rtol=1e-6)


def test_a_linear_with_int8_dynamic_activations_runs_on_prism() -> None:
    """The W8A8 form as PyTorch code (torchao's int8 dynamic activation, int8 weight, written out): the row scale,
    the quantizer's round and ``.to(torch.int8)``, and the product of the two int8 operands cast to float (the
    search drops those casts as exact: an int8 x int8 matmul sums in float32). Two pieces, both on Prism -- the
    row scale, then the quantizer with the product and its scales, the quantized row stored as int8 in the kernel
    and multiplied with ``vpdpbusd`` where the machine has it -- and the result matches eager (the quantized values
    are the same: same float32 ops). Before capture.drop_metadata_asserts the export's ``_assert_tensor_metadata``
    after each ``.to`` ended pieces (a lone ``.to(torch.int8)`` ran in PyTorch)."""
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    x, w = torch.randn(4, 512), torch.randn(256, 512) * 0.05
    sw = w.abs().amax(-1) / 127
    wq = torch.round(w / sw[:, None]).clamp(-127, 127).to(torch.int8)

    def lin(x: torch.Tensor, wq: torch.Tensor, sw: torch.Tensor) -> torch.Tensor:
        s = x.abs().amax(-1, keepdim=True).clamp(min=1e-5) / 127
        xq = torch.round(x / s).clamp(-127, 127).to(torch.int8)
        return (xq.to(torch.float32) @ wq.to(torch.float32).t()) * s * sw

    opt = prism.optimize(lin, (x, wq, sw), measure_machine=False, time_limit=60)
    assert not [f for r in opt.report for f in r.fallbacks]
    with torch.no_grad():
        got, ref = opt(x, wq, sw), lin(x, wq, sw)
    assert float((got - ref).abs().max()) <= 1e-5 * float(ref.abs().max())
    pieces = opt.prism_pieces()
    assert len(pieces) == 2 and all(p.runner.prism_calls for p in pieces), opt.explain()
    assert "[small]" not in opt.explain() and "matmul" in pieces[1].label
    from prism.codegen.isa import get as get_isa
    from prism.codegen.isa import i8_dot
    if i8_dot(get_isa(None)):
        assert "_i8_i8_vnni" in opt.explain(kernels=True)


def _i8_product(m: int, k: int, n: int = 40) -> prism.Graph:
    """Y = X[m, k] @ W[n, k]^T * 0.5 for int8 X and W (quantized activations and weights) in one block (nt)."""
    g = prism.Graph("int8 x int8")
    X, W = g.input("X", (m, k), "int8"), g.input("W", (n, k), "int8")
    bb = BlockBuilder(grid=(1,), forloop=1, inputs=[X, W])
    x, w = bb.iter(0, imap=(None,)), bb.iter(1, imap=(None,))
    bb.save(bb.mul_scalar(bb.matmul(x, bb.transpose(w, -1, -2)), 0.5), omap=(None,))
    (y,) = g.customized(bb.build(), [X, W])
    g.output(y, "Y")
    return g


def _i8_looped_product(m: int, k: int, f: int, n: int = 40) -> prism.Graph:
    """_i8_product with K split over a block for-loop of ``f`` iterations (each one's product added into the sum:
    the tn form's beta path)."""
    g = prism.Graph("int8 x int8 looped")
    X, W = g.input("X", (m, k), "int8"), g.input("W", (n, k), "int8")
    bb = BlockBuilder(grid=(1,), forloop=f, inputs=[X, W])
    x, w = bb.iter(0, imap=(None,), fmap=1), bb.iter(1, imap=(None,), fmap=1)
    bb.save(bb.mul_scalar(bb.accumulate("sum", bb.matmul(x, bb.transpose(w, -1, -2))), 0.5), omap=(None,))
    (y,) = g.customized(bb.build(), [X, W])
    g.output(y, "Y")
    return g


def test_int8_by_int8_products_over_many_rows_take_the_tn_form_exactly(monkeypatch: pytest.MonkeyPatch) -> None:
    """matmul.emit_tn for int8 x int8 (mk.tn_kernel_i8): from TN_MIN_ROWS_I8_I8 rows the rows are packed in k quads
    with their sign bits flipped (a + 128) and the keys broadcast against them with ``vpdpbusd``, each key's sum
    subtracted once per call. Exact for every int8 value (-128 and 127 on both sides), at row counts below, at and
    past one block of 64 packed rows, K within one group, over groups (the later ones added into the sum) and with
    a block for-loop over K (beta); a K that is not a multiple of 4 stays nt. (Without the AMX tiles, which take the
    same products where they have them: tests/cpu/test_amx.py.)"""
    monkeypatch.setenv("PRISM_AMX", "0")
    from prism.codegen.isa import get as get_isa
    from prism.codegen.isa import i8_dot
    from prism.codegen.matmul import TN_MIN_ROWS_I8_I8
    if not i8_dot(get_isa(None)):
        pytest.skip("this machine has no AVX512_VNNI (or no AVX-512)")
    rng = np.random.default_rng(1)
    cases = ([(m, k, 1) for m in (TN_MIN_ROWS_I8_I8, 64, 96, 100) for k in (256, 1100, 2052)]
             + [(70, 1024, 2), (80, 516, 1), (33, 774, 1)])   # 70, 80, 96: a last block of rows half full or less
    for m, k, f in cases:
        a = rng.integers(-128, 128, (m, k)).astype(np.int8)
        b = rng.integers(-128, 128, (40, k)).astype(np.int8)
        a[0, :9], b[:, :9] = -128, -128
        a[-1, 9:13], b[-1, 9:13] = 127, -128
        a[1], b[2] = 127, 127   # a row and a key at the extreme all along
        kern = compile_graph(_i8_product(m, k) if f == 1 else _i8_looped_product(m, k, f))
        assert ("i8_dp" in kern.source_at({})) == (k % 4 == 0), (m, k)
        ref = (a.astype(np.float64) @ b.astype(np.float64).T) * 0.5
        got = kern(X=a, W=b)
        assert np.allclose(got, ref, rtol=2 ** -23, atol=0), (m, k, f, float(np.abs(got - ref).max()))
    assert "i8_dp" not in compile_graph(_i8_product(TN_MIN_ROWS_I8_I8 - 1, 1024)).source_at({})
    # over a varying row count (a prompt's length) the text holds both last-block kernels, chosen at run time
    g = prism.Graph("int8 x int8 over m rows")
    X, W = g.input("X", ("m", 1024), "int8"), g.input("W", (40, 1024), "int8")
    bb = BlockBuilder(grid=(1,), forloop=1, inputs=[X, W])
    bb.save(bb.matmul(bb.iter(0, imap=(None,)), bb.transpose(bb.iter(1, imap=(None,)), -1, -2)), omap=(None,))
    (y,) = g.customized(bb.build(), [X, W])
    g.output(y, "Y")
    kern = compile_graph(g)
    b = rng.integers(-128, 128, (40, 1024)).astype(np.int8)
    for m in (48, 70, 96, 100, 128, 150):
        a = rng.integers(-128, 128, (m, 1024)).astype(np.int8)
        assert np.allclose(kern(X=a, W=b), a.astype(np.float64) @ b.astype(np.float64).T, rtol=2 ** -23, atol=0), m


@pytest.mark.parametrize("vnni", ["1", "0"])
def test_int8_by_int8_products_are_exact_with_and_without_vpdpbusd(vnni: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """microkernels._nt_kernel_idot: rows read as a + 128 against the keys with ``vpdpbusd`` and each key's sum
    beside them (sum (a + 128) b - 128 sum b), every int8 value included (-128 on both sides), at row counts that
    take the single-key, 2 x 8, 4 x 4 and tail kernels and K with and without a masked tail and over a chunk;
    ``PRISM_I8_DOT=0`` takes the widening kernels. The sums are integers: within float32's rounding of the
    result of the float64 product."""
    from prism.codegen.isa import get as get_isa
    from prism.codegen.isa import i8_dot
    monkeypatch.setenv("PRISM_I8_DOT", vnni)
    if vnni == "1" and not i8_dot(get_isa(None)):
        pytest.skip("this machine has no AVX512_VNNI (or no AVX-512)")
    rng = np.random.default_rng(0)
    for m in (1, 2, 3, 5, 8, 16, 17):
        for k in (64, 130, 1100, 2100):
            a = rng.integers(-128, 128, (m, k)).astype(np.int8)
            b = rng.integers(-128, 128, (40, k)).astype(np.int8)
            a[0, :7], b[:, :7] = -128, -128
            a[-1, 7:11], b[-1, 7:11] = 127, -128
            kern = compile_graph(_i8_product(m, k))
            assert ("_vnni" in kern.source_at({})) == (vnni == "1"), (m, k)
            ref = (a.astype(np.float64) @ b.astype(np.float64).T) * 0.5
            got = kern(X=a, W=b)
            assert np.allclose(got, ref, rtol=2 ** -23, atol=0), (m, k, float(np.abs(got - ref).max()))
