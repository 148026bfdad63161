"""int8 weights with a scale per group of G input features (``prism.quantize_weights(group_size=G)``): the grouped
product's lowering (``matmul.emit_grouped``: per-row grouped dot products, R rows sharing each dequantized key,
dequantized key blocks for many rows) on every ISA path the machine runs, against float64 with hostile values; the
capture's reading of the dequantized-weight form as one piece; the quantizer."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch
from cg_helpers import assert_close, supported_isas
from torch import nn

import prism
from prism.codegen import microkernels as mk
from prism.codegen.isa import ISAS
from prism.frontend.quantize import Int8Linear
from prism.ir import BlockBuilder
from prism.ir.dtypes import bfloat16, quantize_int8
from prism.runtime.kernel import compile as compile_kernel

pytestmark = pytest.mark.cpu


def _grouped(M: int, N: int, Gn: int, G: int, acc: bool = False, blocks: int = 2, s_dtype: str = "float32",
             x_dtype: str = "float32") -> prism.Graph:
    """y [1, M, N] = sum_g s[n, g] * sum_k x[m, g, k] q[n, g, k]: the block the search finds for a grouped Linear
    (``blocks`` blocks of keys; ``acc``: a sum accumulator over a loop of one iteration between the product and
    its scale, a form the search also returns; ``s_dtype`` float16: the scales as Int8Linear stores them, promoted
    by the product)."""
    g = prism.Graph()
    x = g.input("x", (M, Gn * G), x_dtype)
    q = g.input("q", (N, Gn * G), "int8")
    s = g.input("s", (N, Gn), s_dtype)
    x3, q3, s3 = g.reshape(x, (M, Gn, G)), g.reshape(q, (N, Gn, G)), g.reshape(s, (N, Gn, 1))
    bb = BlockBuilder(grid=(blocks,), forloop=1, inputs=[x3, q3, s3])
    xt = bb.permute(bb.iter(0, imap=(None,)), (1, 0, 2))           # [Gn, M, G]
    qt = bb.permute(bb.iter(1, imap=(0,)), (1, 2, 0))              # [Gn, G, N / blocks]
    st = bb.permute(bb.iter(2, imap=(0,)), (1, 2, 0))              # [Gn, 1, N / blocks]
    p = bb.matmul(xt, qt)
    if acc:
        p = bb.accumulate("sum", p)
    bb.save(bb.sum(bb.mul(p, st), 0), omap=(2,))
    (y,) = g.customized(bb.build(), [x3, q3, s3])
    g.output(y, "y")
    return g


def _values(rng: np.random.Generator, M: int, N: int, Gn: int, G: int) -> dict[str, np.ndarray]:
    """Hostile: rows with outliers of 1e4, a key group of zeros, scales from 1e-4 to 1e3."""
    x = rng.standard_normal((M, Gn * G)) * np.where(rng.random((M, Gn * G)) < 0.01, 1e4, 1.0)
    q = rng.integers(-127, 128, (N, Gn * G)).astype(np.int8)
    q[N // 3, :G] = 0
    s = 10.0 ** rng.uniform(-4, 3, (N, Gn))
    return {"x": x.astype(np.float32), "q": q, "s": s.astype(np.float32)}


def _reference(v: dict[str, np.ndarray], Gn: int, G: int) -> np.ndarray:
    M, N = v["x"].shape[0], v["q"].shape[0]
    x = v["x"].astype(np.float64).reshape(M, Gn, G)
    q = v["q"].astype(np.float64).reshape(N, Gn, G)
    return np.einsum("mgk,ngk,ng->mn", x, q, v["s"].astype(np.float64))[None]


@pytest.mark.parametrize("M", [1, 3, 8, 13, 40])
def test_grouped_products_on_every_isa_against_float64(M: int) -> None:
    """Rows 1-8: grouped dot products (from 4 rows tiles of 8 rows x 2 keys (32 registers) and 4 x 4 over chunks of
    K, the rest one at a time; without vector tiles 8, 4 and 2 rows sharing each dequantized key);
    13 and 40 rows: on AVX-512 the tn form where G divides ACC_ROWS, the keys a float32 panel, each group's sum scaled
    (mk.tn_kernel_grouped; float32 scales) or the keys times their scales in the panel (float16 scales: exact);
    elsewhere blocks of keys dequantized into scratch, then the plain product. Groups of
    32 (vectors on AVX-512 and AVX2) and of 24 (the scalar form on AVX-512, vectors on AVX2); Gn = 37 (chunks and an
    odd group); float32 and float16 scales (float16 from 6e-5 up: its normal range)."""
    rng = np.random.default_rng(M)
    for G, s_dtype in ((32, "float32"), (24, "float32"), (32, "float16")):
        Gn, N = 37, 70
        g = _grouped(M, N, Gn, G, s_dtype=s_dtype)
        v = _values(rng, M, N, Gn, G)
        v["s"] = v["s"].astype(s_dtype)
        ref = _reference(v, Gn, G)
        for isa in supported_isas():
            src = compile_kernel(g, isa=isa).source
            if M <= 8:
                assert "pr_gdot_" in src, (isa, G)
            else:   # the tn form on AVX-512 where G divides ACC_ROWS, else dequantized blocks
                assert "pr_gdot_" not in src, (isa, G)
                tn = isa == "avx512" and mk.ACC_ROWS % G == 0
                # float32 scales: each group's sum scaled; float16 ones: a panel of q * s (exact), the plain kernel
                assert (f"_f32_g{G}_f" in src) == (tn and s_dtype == "float32"), (isa, G, s_dtype)
                assert (f"pr_i8_f32_panel_g{G}_sf16" in src) == (tn and s_dtype == "float16"), (isa, G, s_dtype)
            if M == 8:
                if G % ISAS[isa].width == 0 and isa != "portable":   # tiles, in chunks of K
                    assert f"_g{G}_4x4_" in src and (f"_g{G}_8x2_" in src) == (ISAS[isa].nregs >= 32), (isa, G)
                else:   # runs of 8 rows sharing each key
                    assert f"_g{G}_r8_" in src and "_4x4_" not in src, (isa, G)
            assert "pr_nt_" not in src or M > 8, "the per-group products were lowered one by one"
            out = prism.compile(g, isa=isa)(**v)
            assert_close(out, ref, f"grouped M={M} G={G} {isa}")


@pytest.mark.parametrize("amx", ["0", "1"], ids=["avx512", "amx"])
@pytest.mark.parametrize("M", [9, 40, 70])
def test_bfloat16_rows_against_grouped_int8_keys_take_vdpbf16ps_groups(M: int, amx: str,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """More rows than GROUPED_DOT_ROWS, bfloat16 rows and scales (a bfloat16 model's grouped Linear): the tn form
    with each group's vdpbf16ps sum scaled by its key's scale (mk.tn_kernel_grouped) where the machine has
    AVX512_BF16, float32 FMAs on dequantized key blocks elsewhere -- both the exact grouped sum, against float64 of
    the same bfloat16 inputs with hostile rows (outliers 1e4, scales 1e-4..1e3, a zero key group). K of 288 (one
    call shorter than a group of ACC_ROWS) and 1184 (two whole ACC_ROWS groups and a remainder); groups of 64 with
    float32 scales and of 32 with float16 ones (as stored, each read as a float per group); 70 keys (blocks
    of 6 and a tail of 4); rows 9 and 40 (one block of 64 rows, partly filled: the kernels of 1 and 3 vectors of
    16) and 70 (a whole block and 6 rows). With the AMX tiles (``amx``): each group's ``tdpbf16ps`` steps summed in
    four C tiles from zero, then scaled into the sum (mk.tn_kernel_amx_grouped), on AVX-512 only."""
    from prism.codegen.isa import tile_bf16
    monkeypatch.setenv("PRISM_AMX", amx)
    if amx == "1" and not tile_bf16(ISAS["avx512"]):
        pytest.skip("this machine has no AMX tiles for bfloat16 (or no grant from the kernel)")
    rng = np.random.default_rng(M)
    for Gn, G, s_dtype in ((9, 32, "bfloat16"), (37, 32, "bfloat16"), (5, 64, "float32"), (9, 32, "float16")):
        N = 70
        g = _grouped(M, N, Gn, G, s_dtype=s_dtype, x_dtype="bfloat16")
        v = _values(rng, M, N, Gn, G)
        v["x"], v["s"] = v["x"].astype(bfloat16.np), v["s"].astype(s_dtype)   # (rounded: the reference's too)
        ref = _reference(v, Gn, G)
        fel = {"bfloat16": "bf16", "float32": "f32", "float16": "f16"}[s_dtype]
        for isa in supported_isas():
            src = compile_kernel(g, isa=isa).source
            paired = mk.nt_dot(ISAS[isa], ("bf16", "bf16"))
            tiles = amx == "1" and isa == "avx512"
            split = tiles and s_dtype == "bfloat16"   # q * s as two bfloat16 panels (mk.tn_kernel_amx_split)
            assert (f"pr_tn_amx_bf16_i8_g{G}_f{fel}" in src) == (tiles and not split), (isa, Gn)
            assert (f"pr_tn_amx_bf16_i8_g{G}_split" in src) == split, (isa, Gn)
            assert (f"_bf16_dp_g{G}_f{fel}" in src) == (paired and not tiles), (isa, Gn)
            assert ("pr_gdot_" in src) == (M <= 8)
            out = prism.compile(g, isa=isa)(**v)
            # bfloat16 scales: stored in bfloat16, within one rounding of it (2^-8 of the value); others promote
            low = s_dtype == "bfloat16"
            assert out.dtype == (bfloat16.np if low else np.float32)
            assert_close(np.asarray(out, dtype=np.float64), ref, f"bf16 grouped M={M} Gn={Gn} G={G} {s_dtype} {isa}",
                         **({"rtol": 2.0 ** -8} if low else {}))


@pytest.mark.parametrize("M", [1, 5, 8])
def test_bfloat16_decode_rows_are_widened_once_for_the_grouped_dot_kernels(M: int) -> None:
    """Up to GROUPED_DOT_ROWS bfloat16 rows (decode) against grouped int8 keys: the rows are widened to float32 once
    into scratch (matmul.emit_grouped, ``widened``) and the float32-row dot kernels run against every key, which is
    exact (every bfloat16 is a float32): the result equals, bit for bit, the same block with the widened rows given
    as float32 inputs, rounded to bfloat16 once. Every ISA path; hostile rows and scales (_values)."""
    rng = np.random.default_rng(40 + M)
    Gn, G, N = 37, 32, 70
    v = _values(rng, M, N, Gn, G)
    xb = v["x"].astype(bfloat16.np)
    v16 = {"x": xb, "q": v["q"], "s": v["s"].astype(bfloat16.np)}
    v32 = {"x": xb.astype(np.float32), "q": v["q"], "s": v16["s"].astype(np.float32)}
    g16 = _grouped(M, N, Gn, G, s_dtype="bfloat16", x_dtype="bfloat16")
    g32 = _grouped(M, N, Gn, G, s_dtype="float32", x_dtype="float32")
    for isa in supported_isas():
        src = compile_kernel(g16, isa=isa).source
        names = set(re.findall(r"pr_gdot_\w+", src))
        assert names and all("_f32_i8_" in n for n in names), (isa, names)
        got = np.asarray(prism.compile(g16, isa=isa)(**v16), np.float64)
        want = np.asarray(np.asarray(prism.compile(g32, isa=isa)(**v32)).astype(bfloat16.np), np.float64)
        assert np.array_equal(got, want), (isa, float(np.abs(got - want).max()))
        assert_close(got, _reference(v32, Gn, G), f"bf16 grouped decode M={M} {isa}", rtol=2.0 ** -8)


@pytest.mark.parametrize("s_dtype", ["bfloat16", "float16"])
def test_half_scales_of_a_decode_row_are_widened_per_chunk_in_either_layout(s_dtype: str) -> None:
    """One row against grouped int8 keys with bfloat16 / float16 scales: the dot kernel widens each chunk's scales
    into a float32 array (16 at a time where the groups' scales are adjacent, one by one where they are not: the
    scales stored [Gn, N], each key's a column), exact. Gn = 37 (a chunk of 32 groups and one of 5: a masked load);
    against float64 of the same inputs, and the two layouts agree bit for bit."""
    rng = np.random.default_rng(7)
    M, N, Gn, G = 1, 70, 37, 32
    v = _values(rng, M, N, Gn, G)
    v["x"], v["s"] = v["x"].astype(bfloat16.np), (v["s"] / 1e2 if s_dtype == "float16" else v["s"]).astype(s_dtype)
    ref = _reference(v, Gn, G)
    g = prism.Graph()
    x, q, st = g.input("x", (M, Gn * G), "bfloat16"), g.input("q", (N, Gn * G), "int8"), g.input("s", (Gn, N), s_dtype)
    x3, q3, s3 = g.reshape(x, (M, Gn, G)), g.reshape(q, (N, Gn, G)), g.reshape(st, (Gn, 1, N))
    bb = BlockBuilder(grid=(2,), forloop=1, inputs=[x3, q3, s3])
    p = bb.matmul(bb.permute(bb.iter(0, imap=(None,)), (1, 0, 2)), bb.permute(bb.iter(1, imap=(0,)), (1, 2, 0)))
    bb.save(bb.sum(bb.mul(p, bb.iter(2, imap=(2,))), 0), omap=(2,))
    (y,) = g.customized(bb.build(), [x3, q3, s3])
    g.output(y, "y")
    for isa in supported_isas():
        src = compile_kernel(g, isa=isa).source
        assert "pr_gdot_" in src and (("fw[" in src) == (isa == "avx512")), isa
        by_column = np.asarray(prism.compile(g, isa=isa)(x=v["x"], q=v["q"], s=np.ascontiguousarray(v["s"].T)),
                               np.float64)
        by_row = np.asarray(prism.compile(_grouped(M, N, Gn, G, s_dtype=s_dtype, x_dtype="bfloat16"), isa=isa)(**v),
                            np.float64)
        assert np.array_equal(by_column, by_row), isa
        assert_close(by_row, ref, f"half scales {s_dtype} {isa}", **({"rtol": 2.0 ** -8} if s_dtype == "bfloat16"
                                                                      else {}))


def test_the_split_amx_kernel_is_the_exact_grouped_sum_on_exact_values(monkeypatch: pytest.MonkeyPatch) -> None:
    """mk.tn_kernel_amx_split: q * s staged as two bfloat16 panels whose sum is q * s exactly. On values whose every
    partial sum is exact in float32 (rows in {-1, 0, 1}, K = 256, scales of 8 significant bits times 2^-7..2^0, q
    over all of int8) the result is the float64 grouped sum rounded once to bfloat16, bit for bit -- a kernel that
    kept only the rounded q * s (one bfloat16 panel) is not (checked: the same values with the lo part dropped
    differ). Rows 9-70 over one block of 64 and whole / part blocks of 32 keys."""
    from prism.codegen.isa import tile_bf16
    monkeypatch.setenv("PRISM_AMX", "1")
    if not tile_bf16(ISAS["avx512"]):
        pytest.skip("this machine has no AMX tiles for bfloat16 (or no grant from the kernel)")
    rng = np.random.default_rng(11)
    G, Gn, N = 32, 8, 70
    for M in (9, 40, 70):
        g = _grouped(M, N, Gn, G, s_dtype="bfloat16", x_dtype="bfloat16")
        assert f"pr_tn_amx_bf16_i8_g{G}_split" in compile_kernel(g, isa="avx512").source
        x = rng.integers(-1, 2, (M, Gn * G)).astype(bfloat16.np)
        q = rng.integers(-128, 128, (N, Gn * G)).astype(np.int8)
        s = (rng.integers(129, 256, (N, Gn)) * 2.0 ** rng.integers(-14, -7, (N, Gn))).astype(bfloat16.np)
        v = {"x": x, "q": q, "s": s}
        ref = _reference(v, Gn, G)
        got = np.asarray(prism.compile(g, isa="avx512")(**v), np.float64)
        assert np.array_equal(got, ref.astype(bfloat16.np).astype(np.float64)), M
        hi = (q.astype(np.float32).reshape(N, Gn, G) * s.astype(np.float32)[..., None]).astype(bfloat16.np)
        hi_only = np.einsum("mk,nk->mn", x.astype(np.float64), hi.reshape(N, Gn * G).astype(np.float64))[None]
        assert not np.array_equal(hi_only.astype(bfloat16.np).astype(np.float64), got), M


def test_the_grouped_tn_kernel_scales_each_group_once_per_key() -> None:
    """Per group of 32 k: 16 vdpbf16ps steps per accumulator from zero, then one FMA (the first group: a product)
    by the key's broadcast scale into the call's sum -- the scale is never folded into the bfloat16 keys."""
    text = mk.tn_kernel_grouped(ISAS["avx512"], 6, 4, 32, "bf16")
    assert text.count("_mm512_dpbf16_ps(") == 24 and "c1 = c0 + 32;" in text
    assert text.count("_mm512_fmadd_ps(a") == 24 and text.count("_mm512_mul_ps(a") == 24
    assert text.count("_mm512_set1_ps(") == 6 and "S[" in text


def test_the_cost_model_runs_bfloat16_grouped_products_over_many_rows_at_the_pair_rate() -> None:
    """Where the code generator takes the vdpbf16ps groups (bfloat16 rows, more than GROUPED_DOT_ROWS, a machine with
    vdpbf16ps) the cost model's compute term is PAIR_TN times shorter than on a machine without; at 8 rows (the
    grouped dot products) and for float32 rows (FMAs) the two machines cost alike."""
    import dataclasses

    from prism.tune.cost import PAIR_TN, estimate
    from prism.tune.machine import detect
    base = detect(False)
    yes, no = dataclasses.replace(base, pair_dot=True), dataclasses.replace(base, pair_dot=False)

    def compute(M: int, x_dtype: str, m: object) -> float:
        g = _grouped(M, 512, 64, 32, s_dtype="bfloat16" if x_dtype == "bfloat16" else "float32", x_dtype=x_dtype)
        return estimate(g, m).ops[-1].compute_s

    ratio = compute(128, "bfloat16", no) / compute(128, "bfloat16", yes)
    assert ratio == pytest.approx(PAIR_TN, rel=0.25), ratio   # (the dequantization's flops are not paired)
    assert compute(8, "bfloat16", no) == pytest.approx(compute(8, "bfloat16", yes))
    assert compute(128, "float32", no) == pytest.approx(compute(128, "float32", yes))


def test_a_one_iteration_accumulator_between_product_and_scale_is_the_same_grouped_product() -> None:
    rng = np.random.default_rng(3)
    M, N, Gn, G = 2, 40, 12, 32
    g = _grouped(M, N, Gn, G, acc=True)
    src = compile_kernel(g).source
    assert "pr_gdot_" in src
    v = _values(rng, M, N, Gn, G)
    assert_close(prism.compile(g)(**v), _reference(v, Gn, G), "grouped with a sum accumulator")


def test_grouped_dot_kernel_text_scales_once_per_group() -> None:
    """One row: each group's dot product is scaled into one of two accumulators; several rows: each key vector is
    dequantized once (widened, times the group's factor) for all of them; a float16 factor read as stored, one
    conversion per group."""
    isa = ISAS["avx512"]
    one = mk.gdot_kernel(isa, 32, ("f32", "i8"), ("f32",))
    assert one.count("_mm512_fmadd_ps(d, _mm512_set1_ps(") == 3   # two groups per step, one tail group
    rows = mk.gdot_kernel(isa, 32, ("f32", "i8"), ("f16",), rows=8)
    assert rows.count("_mm512_mul_ps(pr_v16_i8(") == 2           # two key vectors per group, each once
    assert rows.count("_mm512_fmadd_ps(_mm512_loadu_ps(A + ") == 16
    assert rows.count("pr_ld1_f16(f0[") == 1 and "const uint16_t* restrict f0" in rows


def test_quantize_int8_groups() -> None:
    rng = np.random.default_rng(0)
    w = rng.standard_normal((6, 96)).astype(np.float32)
    w[2, 32:64] = 0.0
    q, s = quantize_int8(w, 32)
    assert q.dtype == np.int8 and q.shape == (6, 96) and s.shape == (6, 3) and s.dtype == np.float32
    assert s[2, 1] == 1.0 and not q[2, 32:64].any()
    deq = (q.reshape(6, 3, 32).astype(np.float32) * s[:, :, None]).reshape(6, 96)
    assert np.max(np.abs(deq - w) / s.repeat(32, axis=1)) <= 0.5 + 1e-6   # half a step of its own group
    with pytest.raises(ValueError, match="does not divide"):
        quantize_int8(w, 40)


def test_quantize_weights_group_size_errors() -> None:
    model = nn.Sequential(nn.Linear(64, 32), nn.Linear(32, 48))
    with pytest.raises(ValueError, match="does not divide"):
        prism.quantize_weights(model, group_size=64)
    with pytest.raises(ValueError, match="W8A8"):
        prism.quantize_weights(model, activations="int8", group_size=32)
    prism.quantize_weights(model, group_size=32)
    assert isinstance(model[0], Int8Linear) and model[0].group_size == 32 and model[1].scale.shape == (48, 1)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("bias", [False, True])
def test_a_grouped_int8_linear_is_one_piece_over_the_int8_weight(bias: bool, dtype: str) -> None:
    """The dequantized-weight form Int8Linear(group_size) writes runs as one Prism piece that reads the int8
    weight as stored (no float weight made, no layout operator left to PyTorch), correct against float64 at
    every row count a model calls it with (decode, a batch, a prompt; a 3-D input), hostile rows included. In a
    bfloat16 model (scales and bias moved to bfloat16 with it) it is computed in float32 and rounded to bfloat16
    once: within bfloat16's tolerance of the float64 product of the same bfloat16 inputs."""
    torch.manual_seed(0)
    lin = nn.Linear(256, 96, bias=bias)
    m = Int8Linear.from_linear(lin, 32)
    if dtype == "bfloat16":
        m = m.to(torch.bfloat16)   # (.to(float32) would widen the float16 scales the float32 model keeps)
    assert m.qweight.dtype == torch.int8 and m.scale.dtype == (torch.float16 if dtype == "float32" else torch.bfloat16)
    deq = (m.qweight.double().view(96, 8, 32) * m.scale.double()[:, :, None]).view(96, 256)
    for shape in ((1, 256), (5, 256), (2, 7, 256)):
        x = (torch.randn(*shape) * torch.where(torch.rand(*shape) < 0.01, 1e3, 1.0)).to(getattr(torch, dtype))
        with torch.no_grad():
            o = prism.optimize(m, (x,))
            y = o(x)
        (rep,) = o.report
        assert rep.layout == 0 and not rep.fallbacks, o.explain()
        (piece,) = rep.pieces
        assert piece.by_prism and "[96, 256]" in piece.inputs and "[96, 8]" in piece.inputs, o.explain()
        assert y.dtype == x.dtype
        ref = x.double() @ deq.t() + (m.bias.double() if bias else 0.0)
        assert_close(y.double().numpy(), ref.numpy(), f"{dtype} grouped Linear {shape}",
                     **({"rtol": 1e-2} if dtype == "bfloat16" else {}))


def test_a_grouped_product_whose_rows_are_not_contiguous_is_lowered_node_by_node() -> None:
    """x stored [Gn, M, G] (a row's groups M * G apart): not the layout emit_grouped takes, so its nodes are lowered
    one by one as before -- still correct."""
    rng = np.random.default_rng(9)
    M, N, Gn, G = 3, 40, 6, 32
    g = prism.Graph()
    x = g.input("x", (Gn, M, G))
    q = g.input("q", (N, Gn * G), "int8")
    s = g.input("s", (N, Gn))
    q3, s3 = g.reshape(q, (N, Gn, G)), g.reshape(s, (N, Gn, 1))
    bb = BlockBuilder(grid=(2,), forloop=1, inputs=[x, q3, s3])
    p = bb.matmul(bb.iter(0, imap=(None,)), bb.permute(bb.iter(1, imap=(0,)), (1, 2, 0)))
    bb.save(bb.sum(bb.mul(p, bb.permute(bb.iter(2, imap=(0,)), (1, 2, 0))), 0), omap=(2,))
    (y,) = g.customized(bb.build(), [x, q3, s3])
    g.output(y, "y")
    assert "pr_gdot_" not in compile_kernel(g).source
    v = _values(rng, M, N, Gn, G)
    xs = np.ascontiguousarray(v["x"].reshape(M, Gn, G).transpose(1, 0, 2))
    out = prism.compile(g)(x=xs, q=v["q"], s=v["s"])
    assert_close(out, _reference(v, Gn, G), "grouped, rows not contiguous")


@pytest.mark.parametrize(("dtype", "k", "n"), [("float32", 128, 80), ("float32", 256, 96), ("bfloat16", 256, 96)])
def test_a_grouped_int8_linear_over_a_dynamic_row_count_is_correct_at_every_count(dtype: str, k: int, n: int) -> None:
    """Rows symbolic (a prompt's length): one search serves every row count, each tuned, derived or served by a
    template whose text chooses the grouped dot products or the many-row form at run time (K < TN_MIN_K: dequantized
    blocks; from TN_MIN_K on AVX-512 the tn form's scaled groups, FMAs or vdpbf16ps, its last block of rows by its
    vectors); correct against float64 at counts on both sides of GROUPED_DOT_ROWS, every call by Prism."""
    torch.manual_seed(2)
    lin = nn.Linear(k, n, bias=False)
    m = Int8Linear.from_linear(lin, 32)
    if dtype == "bfloat16":
        m = m.to(torch.bfloat16)
    deq = (m.qweight.double().view(n, k // 32, 32) * m.scale.double()[:, :, None]).view(n, k)
    dt = getattr(torch, dtype)
    with torch.no_grad():
        o = prism.optimize(m, (torch.randn(6, k).to(dt),), dynamic={0: [0]})
        for rows in (1, 5, 8, 9, 40, 64, 3, 83):
            x = torch.randn(rows, k).to(dt)
            y = o(x)
            assert y.dtype == dt
            assert_close(y.double().numpy(), (x.double() @ deq.t()).numpy(), f"grouped Linear {dtype}, {rows} rows",
                         **({"rtol": 2.0 ** -8} if dtype == "bfloat16" else {}))
    (piece,) = o.prism_pieces()
    assert piece.runner.prism_calls == 9 and piece.runner.fallback_calls == 0, o.explain()   # (+ the example call)


def test_the_cost_model_counts_what_a_many_row_grouped_product_keeps_resident() -> None:
    """Over GROUPED_DOT_ROWS rows the product [Gn, rows, keys] is never made and the rows are read in chunks of K:
    a block of all 128 rows against 256 keys keeps about the rows' chunk, a dequantized key block and its output
    (under 1 MiB, so the L2 filter keeps it), not its 8 MiB product tile or its 1 MiB rows. Measured need: with
    them counted the tuner only measured forms that split the rows, each dequantizing every key again (0.68-0.97
    of the time on five shapes outside the model, docs/tune.md)."""
    from prism.codegen.matmul import GROUPED_BLOCK_BYTES, GROUPED_DOT_ROWS
    from prism.tune.cost import GROUPED_RESIDENT_K, estimate
    from prism.tune.machine import detect
    M, N, Gn, G = 128, 512, 64, 32
    assert M > GROUPED_DOT_ROWS
    g = _grouped(M, N, Gn, G, blocks=2)
    ws = estimate(g, detect(False)).ops[-1].working_set
    rows_chunk, out_tile = M * GROUPED_RESIDENT_K * 4, M * (N // 2) * 4
    assert ws == pytest.approx(rows_chunk + GROUPED_BLOCK_BYTES + out_tile, rel=0.1), ws
    assert ws < 1 << 20
    # up to GROUPED_DOT_ROWS rows the rows are resident as a whole (the grouped dot products read them per key)
    small = estimate(_grouped(8, N, Gn, G, blocks=2), detect(False)).ops[-1].working_set
    assert small >= 8 * Gn * G * 4
