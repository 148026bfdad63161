"""Templates (prism/codegen/template.py): one compiled source per guard region of a graph's symbolic dims.

The traced text must be what plain code generation prints at *every* value of its guard region (checked
here over whole ranges, not only at the validation points the runtime uses), and a kernel served from a
template must compute what the per-value kernel computes."""

from __future__ import annotations

import numpy as np
import pytest
from cg_helpers import assert_close, online_softmax_attention, supported_isas

import prism
from prism.codegen import generate
from prism.codegen.isa import get as get_isa
from prism.codegen.template import TemplateError, check_points, plain_source, trace
from prism.ir import BlockBuilder
from prism.ir.dtypes import as_dtype
from prism.ir.traced import Trace, lin_const, lin_eval
from prism.runtime import cache

pytestmark = pytest.mark.cpu


def decode_attention(dtype: str = "float32") -> prism.Graph:
    """O = softmax(q K^T / 8) V for 4 KV heads of 4 query rows each at KV length n: a grid over heads
    (``g``), a loop over ``F`` KV chunks with online-softmax accumulators."""
    return online_softmax_attention("decode attention", (4, 4, 64), (4, "n", 64), ("g",), "F", dtype)


def kernel_level() -> prism.Graph:
    """Predefined operators only: a softmax over n and a matmul contracting n (loops and micro-kernels)."""
    g = prism.Graph("softmax then matmul over n")
    X, W = g.input("X", (3, "n")), g.input("W", ("n", 40))
    g.output(g.matmul(g.softmax(g.mul_scalar(X, 0.5), -1), W), "Y")
    return g


CASES = [(decode_attention, {"g": 2, "F": 1}), (kernel_level, {})]
ISAS = [i for i in ("avx512", "avx2", "portable") if i in supported_isas()]


def _inputs(g: prism.Graph, n: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    out = {}
    for name, node in g.inputs.items():
        shape = tuple(n if str(d) == "n" else int(d) for d in node.shape)
        out[name] = rng.standard_normal(shape).astype(as_dtype(node.dtype).np)
    return out


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("make,params", CASES, ids=["block_graph", "kernel_level"])
def test_the_traced_text_is_plain_generation_over_its_whole_region(make, params, isa: str) -> None:
    g, ia = make(), get_isa(isa)
    covered = 0
    for n0 in (70, 129):
        t = trace(g, params, {"n": n0}, ia)
        for n in range(1, 300):
            if t.holds({"n": n}):
                covered += 1
                assert t.render({"n": n}) == plain_source(g, params, {"n": n}, ia), (n0, n)
    assert covered > 150   # a template serves many lengths, not one


def test_a_size_that_escaped_the_trace_fails_validation() -> None:
    g, ia = decode_attention(), get_isa(None)
    t = trace(g, {"g": 2, "F": 1}, {"n": 70}, ia)
    t.validate(g, {"g": 2, "F": 1}, ia)   # the real trace is valid
    h = t.trace.holes[0]   # as if one size had been printed with %d: a literal, its value at 70
    t.trace.holes[0] = lin_const(lin_eval(h, {"n": 70}))
    with pytest.raises(TemplateError, match="escaped the trace"):
        t.validate(g, {"g": 2, "F": 1}, ia)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_one_compile_serves_many_lengths_with_the_per_length_results(dtype: str,
                                                                     rng: np.random.Generator) -> None:
    g = decode_attention(dtype)
    templ = prism.compile(g, {"g": 2, "F": 1}, templates=True)
    plain = prism.compile(g, {"g": 2, "F": 1})
    lengths = [33, 35, 37, 38, 39, 41, 43, 101, 102, 103, 250]
    for n in lengths:
        x = _inputs(g, n, rng)
        if dtype == "float32":
            x["K"][0, n // 2] = 1e4   # hostile: one score dominates its row
        (ref,) = g.evaluate(x, dtype=np.float64, params={"g": 2, "F": 1}).values()
        got = templ(**x)
        assert_close(got, ref, f"template at n={n}", rtol=1e-4 if dtype == "float32" else 2e-2)
        # the same C text with the sizes at run time; not bitwise: gcc may vectorize an `omp simd` reduction of
        # a known trip count in another order than one of a run-time count (measured: 1 ulp at n=101)
        assert_close(got, np.asarray(plain(**x), dtype=np.float64), f"template vs plain at n={n}", rtol=1e-5)
    assert not templ.template_failures
    assert 1 <= len(templ._templates) <= 3   # regions (ranges of n), not one per length
    srcs = {templ.specialize(n=n).source for n in lengths}
    assert len(srcs) == len(templ._templates) and all("pr_dim_n" in s for s in srcs)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("make,params", CASES, ids=["block_graph", "kernel_level"])
def test_a_remainder_loop_is_written_always_so_one_template_serves_every_residue(make, params, isa: str,
                                                                               rng: np.random.Generator) -> None:
    """Under loops.rows_vary the left-over keys of an nt product (blocks of 16, 8, 4) and a softmax row's last
    n % 4 elements get their loop at every n, zero trips where nothing is left: no guard on n's residue. Before,
    a template traced at n = 100 served only n = 0 mod 4 (one template per residue class modulo 16 for llama-1b's
    prefill attention, a gcc run and its checks each); the same compiled code gives every residue's result."""
    g, ia = make(), get_isa(isa)
    t = trace(g, params, {"n": 100}, ia)
    t.validate(g, params, ia)
    served = {n for n in range(1, 600) if t.holds({"n": n})}
    assert set(range(64, 500)) <= served, sorted(served)[:8]
    k = prism.compile(g, params, isa=isa, templates=True)
    for n in (100, 101, 102, 103, 111, 112, 113):   # every remainder of 4, a full and a partial block of 16
        assert k.specialize(n=n).source == k.specialize(n=100).source
        x = _inputs(g, n, rng)
        (ref,) = g.evaluate(x, dtype=np.float64, params=params).values()
        assert_close(k(**x), ref, f"n={n}", rtol=1e-4)
    assert len(k._templates) == 1, k.template_failures


def test_check_points_fill_a_short_region_with_its_next_smallest_values() -> None:
    """template.check_points below a value far above a short region (the pre-build checks a tail template below a
    whole tile): the region's smallest, nothing from a quarter or half of that value, then its next smallest --
    three checks at cheap values, where it found one and the template was left for its first served length."""
    tr = Trace({"n": 5})   # a short region, as a trace's guards make it (its codegen boundaries move)
    n = tr.dims()["n"]
    assert n >= 2 and n < 64
    region = [n for n in range(1, 1000) if tr.holds({"n": n})]
    assert region == list(range(2, 64))
    top = {"n": 4 * (max(region) + 1)}   # a quarter and a half of it lie above the region
    got = [p["n"] for p in check_points(tr, top, 3, [])]
    assert got == region[:3], (got, region)
    assert [p["n"] for p in check_points(tr, top, 3, [{"n": region[1]}])] == [region[0], *region[2:4]]


def test_the_launcher_passes_the_dims_and_lengths_share_a_workspace(rng: np.random.Generator) -> None:
    """The launchers (C where it builds) pass each value's dims; the values of one template share its first
    variant's workspace and lock (one buffer, grown to the largest value, not one per value), also when
    lengths alternate."""
    torch = pytest.importorskip("torch")
    g = decode_attention()
    k = prism.compile(g, {"g": 2, "F": 1}, templates=True)
    for n in (50, 51, 53, 50, 101, 51, 53):   # 101: a larger workspace, then smaller values again
        x = _inputs(g, n, rng)
        (ref,) = g.evaluate(x, dtype=np.float64, params={"g": 2, "F": 1}).values()
        ins = [torch.from_numpy(x[name]) for name in k.input_names]
        (out,) = k.torch_launcher(tuple(tuple(t.shape) for t in ins))(ins)
        assert_close(out.numpy(), ref, f"launcher at n={n}")
        assert_close(k(**x), ref, f"ctypes path at n={n}")
    vs = [k.specialize(n=n) for n in (50, 51, 53, 101)]
    assert all(v.template.first is v or (v.ws_owner is v.template.first and v.lock is v.template.first.lock)
               for v in vs)
    assert sum(v.ws_owner is not None for v in vs) >= 4 - len(k._templates) > 0


def test_templates_can_be_turned_off(monkeypatch: pytest.MonkeyPatch, rng: np.random.Generator) -> None:
    monkeypatch.setenv("PRISM_TEMPLATES", "0")
    g = decode_attention()
    k = prism.compile(g, {"g": 2, "F": 1}, templates=True)
    x = _inputs(g, 45, rng)
    (ref,) = g.evaluate(x, dtype=np.float64, params={"g": 2, "F": 1}).values()
    assert_close(k(**x), ref, "no template")
    assert not k._templates and "pr_dim_n" not in k.specialize(n=45).source


def test_a_program_of_fixed_shape_compiles_as_before() -> None:
    g = prism.Graph()
    X = g.input("X", (4, 8))
    g.output(g.exp(X), "Y")
    k = prism.compile(g, templates=True)
    assert not k.templates and "pr_dim_" not in k.source
    assert cache.cache_key(k.source)   # a plain source


def test_two_dims_are_traced_and_validated_together() -> None:
    """A program with two symbolic dims (rows b, length n): each region's text is plain generation's at every
    (b, n) of a grid where its guards hold, and validation varied each dim (region_points)."""
    g = prism.Graph("two dims")
    X, W = g.input("X", ("b", "n")), g.input("W", ("n", 24))
    g.output(g.matmul(g.softmax(X, -1), W), "Y")
    ia = get_isa(None)
    t = trace(g, {}, {"b": 3, "n": 37}, ia)
    compared = t.validate(g, {}, ia)
    assert any(e["n"] != 37 for e in compared)
    if all(e["b"] == 3 for e in compared):   # b (the rows: they choose the micro-kernels) was not varied:
        assert not t.holds({"b": 300, "n": 37})   # pinned by validation, not served unshown
    served = 0
    for b in range(1, 9):
        for n in range(1, 90, 3):
            if t.holds({"b": b, "n": n}):
                served += 1
                assert t.render({"b": b, "n": n}) == plain_source(g, {}, {"b": b, "n": n}, ia), (b, n)
    assert served > 1


def test_a_transposed_weight_product_is_one_template_for_every_residue_of_its_rows() -> None:
    """The nt micro-kernels' row groups are counted by division and every group shape has its loop from
    matmul.NT_ALL_RUNS rows on (matmul.nt_row_runs), so a prefill's X @ W^T is one template for every residue
    of m modulo the widest group (choosing the runs by count made one per residue). With a short K (64) and at
    least 64 rows, AVX-512 runs the product as nn on a transposed copy of the keys, its nn row groups taking the
    remainder by its bits (matmul.rows_vary); in a template whose rows vary that choice is a run-time branch with
    both forms in the text (the row count's bound was a region boundary), so one template serves from 2 rows."""
    for k_dim, kernel in ((512, "pr_nt_"), (64, "pr_tr16")):
        g = prism.Graph("q @ k.T")
        Q, K = g.input("Q", (4, "m", k_dim)), g.input("K", (4, 40, k_dim))
        bb = BlockBuilder(grid=(2,), forloop=1, inputs=[Q, K])
        q, k = bb.iter(0, imap=(0,)), bb.iter(1, imap=(0,))
        bb.save(bb.matmul(q, bb.transpose(k, -1, -2)), omap=(0,))
        (y,) = g.customized(bb.build(), [Q, K])
        g.output(y, "Y")
        for name in ISAS if k_dim == 512 else ("avx512",):
            ia = get_isa(name)
            assert kernel in generate(g.instantiate({"m": 141}), ia).source
            t = trace(g, {}, {"m": 141}, ia)
            t.validate(g, {}, ia)
            served = [m for m in range(1, 400) if t.holds({"m": m})]
            assert set(range(64, 400)) <= set(served), (name, served[:3])   # every residue of m
            assert min(served) <= 2, served[:3]   # below 64 rows the nt kernels, at run time
            assert k_dim == 512 or ("pr_nt_" in t.marked.source and "pr_tr16" in t.marked.source)
            for m in served[:: max(1, len(served) // 12)] + [142, 143, 144]:
                assert t.render({"m": m}) == plain_source(g, {}, {"m": m}, ia), (name, m)
            if k_dim == 512:   # a short prompt's few rows: one template from NT_ALL_RUNS = 2 rows (was one per m)
                t3 = trace(g, {}, {"m": 3}, ia)
                t3.validate(g, {}, ia)
                assert all(t3.holds({"m": m}) for m in range(2, 9)), name
                for m in range(2, 9):
                    assert t3.render({"m": m}) == plain_source(g, {}, {"m": m}, ia), (name, m)


def _row_product(dtype: str = "float32") -> prism.Graph:
    """Y[m, 40] = X[m, 96] @ W[96, 40] in row blocks: the nn micro-kernels over m rows."""
    return _blocked_product(prism.Graph("rows @ w"), ("m", 96), (96, 40), dtype)


def _blocked_product(g: prism.Graph, xs: tuple, ws: tuple, dtype: str, block: bool = True) -> prism.Graph:
    """``g`` with Y = X @ W for X of shape ``xs``, W of ``ws``: in row blocks of a block graph (grid g0), or the
    kernel-level product (``block`` False)."""
    X, W = g.input("X", xs, dtype), g.input("W", ws, dtype)
    if not block:
        g.output(g.matmul(X, W), "Y")
        return g
    bb = BlockBuilder(grid=("g0",), forloop=1, inputs=[X, W])
    x, w = bb.iter(0, imap=(0,)), bb.iter(1, imap=(None,))
    bb.save(bb.matmul(x, w), omap=(0,))
    (y,) = g.customized(bb.build(), [X, W])
    g.output(y, "Y")
    return g


@pytest.mark.parametrize("isa", ISAS)
def test_a_products_row_groups_do_not_pin_its_row_count_in_a_template(isa: str) -> None:
    """Plain generation balances an nn product's row groups (ceil(m / ceil(m / MR)) rows, + a remainder), so
    the micro-kernels' row counts change with m; a template's products (matmul.rows_vary) take groups of MR rows
    and the remainder in runs of 4, 2 and 1 by its bits at run time: one text for every row count from 2 * MR."""
    g, ia = _row_product(), get_isa(isa)
    t = trace(g, {"g0": 1}, {"m": 141}, ia)
    t.validate(g, {"g0": 1}, ia)
    served = [m for m in range(1, 600) if t.holds({"m": m})]
    assert set(range(32, 600)) <= set(served), served[:3]   # (below: whether the product runs in parallel)
    for m in list(range(32, 41)) + [141, 333, 599]:
        assert t.render({"m": m}) == plain_source(g, {"g0": 1}, {"m": m}, ia), m
    k = prism.compile(g, {"g0": 1}, isa=isa, templates=True)
    rng = np.random.default_rng(1)
    for m in (33, 38, 39, 141):   # remainders 1, 6, 7, 5: every run of the remainder taken or skipped
        assert k.specialize(m=m).template is not None, k.template_failures
        x, w = rng.standard_normal((m, 96)).astype(np.float32), rng.standard_normal((96, 40)).astype(np.float32)
        assert_close(k(X=x, W=w), x.astype(np.float64) @ w.astype(np.float64), f"m={m}")


@pytest.mark.parametrize("isa", ISAS)
def test_a_product_with_a_small_b_takes_its_row_remainder_by_bits_at_any_row_count(isa: str,
                                                                                 rng: np.random.Generator) -> None:
    """matmul.SMALL_B: an nn product whose B fits in L2 (here 96 x 40) takes the bits plan in a template at any row
    count, so a few rows (a short prompt's causal attention, P @ V) are one template, not a kernel per count; the
    values agree with float64 at every remainder. Before, below 2 * MR rows each m was pinned (no template)."""
    g, ia = _row_product(), get_isa(isa)
    t = trace(g, {"g0": 1}, {"m": 5}, ia)
    t.validate(g, {"g0": 1}, ia)
    assert all(t.holds({"m": m}) for m in range(2, 16)), [m for m in range(1, 40) if t.holds({"m": m})]
    for m in range(2, 16):
        assert t.render({"m": m}) == plain_source(g, {"g0": 1}, {"m": m}, ia), m
    k = prism.compile(g, {"g0": 1}, isa=isa, templates=True)
    for m in (2, 3, 5, 7, 13):
        assert k.specialize(m=m).template is not None, k.template_failures
        x, w = rng.standard_normal((m, 96)).astype(np.float32), rng.standard_normal((96, 40)).astype(np.float32)
        assert_close(k(X=x, W=w), x.astype(np.float64) @ w.astype(np.float64), f"m={m}")


def _col_product(dtype: str = "float32", block: bool = True) -> prism.Graph:
    """Y[48, n] = X[48, 96] @ W[96, n]: the nn micro-kernels over n columns (``block``: in row blocks of a block
    graph, else the kernel-level product, one task per row group and panel)."""
    return _blocked_product(prism.Graph("x @ cols"), (48, 96), (96, "n"), dtype, block)


COL_CASES = [(isa, "float32", block) for isa in ISAS for block in (True, False)] + (
    [("avx512", "bfloat16", True)] if "avx512" in ISAS else [])


@pytest.mark.parametrize("isa,dtype,block", COL_CASES)
def test_a_product_whose_columns_vary_takes_its_last_panel_at_run_time(isa: str, dtype: str, block: bool,
                                                                      rng: np.random.Generator) -> None:
    """matmul ``cols_vary``: in a template the last panel of an nn product (rc = N mod the panel width) runs as runs
    of 2^i full vectors and one vector whose lane count is an argument of its micro-kernel (microkernels.RT_TAIL),
    so one text serves every N; before, the last panel's vector count and tail lanes were part of the text and a
    template held for one N ("no other value nearby": llama-1b float32's prefill attention, Q @ K^T packed as nn
    with N the prompt length, compiled and checked a kernel per new length). Every run taken or skipped, a full
    panel and none, against float64."""
    g, ia = _col_product(dtype, block), get_isa(isa)
    params = {"g0": 2} if block else {}
    t = trace(g, params, {"n": 100}, ia)
    t.validate(g, params, ia)
    served = [n for n in range(1, 400) if t.holds({"n": n})]
    assert set(range(64, 300)) <= set(served), served[:8]
    for n in (64, 65, 79, 80, 95, 96, 97, 143, 299):
        assert t.render({"n": n}) == plain_source(g, params, {"n": n}, ia), n
    k = prism.compile(g, params, isa=isa, templates=True)
    tol = 1e-5 if dtype == "float32" else 8e-3   # bfloat16: the same inputs, the output rounded to bfloat16
    for n in (17, 33, 47, 48, 49, 64, 80, 95, 96, 111, 143, 144):
        x = _inputs(g, n, rng)
        if dtype == "float32":
            x["W"][:, -1] = 1e4   # hostile: the last column (a tail lane) dominates
        (ref,) = g.evaluate(x, dtype=np.float64, params=params).values()
        assert_close(k(**x), ref, f"n={n}", rtol=tol)
    assert len({id(k.specialize(n=n).template) for n in (64, 80, 96, 143)}) == 1, k.template_failures


@pytest.mark.parametrize("isa", ISAS)
def test_a_transposing_copy_is_tiled_by_its_layout_alone_in_a_template(isa: str, rng: np.random.Generator) -> None:
    """loops._transposed_dim under rows_vary: a transposing copy takes the tiled loops at any size, every tile's
    bound cut short at run time, so its sizes draw no region boundary. Before, ``TILE_MIN`` (65536 elements) and
    the tiles' own size conditions were guards: Y = 2 X^T of X [n, 256] had a template for 128-256 and another
    from 257 (llama-1b float32's fused MLP and prefill attention: a new region, gcc run and checks at 188 and 182
    tokens)."""
    g = prism.Graph("scaled transpose")
    X = g.input("X", ("n", 256))
    g.output(g.mul_scalar(g.permute(X, (1, 0)), 2.0), "Y")
    ia = get_isa(isa)
    t = trace(g, {}, {"n": 150}, ia)
    t.validate(g, {}, ia)
    assert all(t.holds({"n": n}) for n in range(128, 600)), [n for n in range(100, 600) if not t.holds({"n": n})][:5]
    for n in (128, 131, 160, 255, 256, 257, 300, 599):
        assert t.render({"n": n}) == plain_source(g, {}, {"n": n}, ia), n
    k = prism.compile(g, {}, isa=isa, templates=True)
    for n in (130, 161, 256, 300, 333):
        x = rng.standard_normal((n, 256)).astype(np.float32)
        assert k.specialize(n=n).template is not None, k.template_failures
        assert_close(k(X=x), 2.0 * x.T.astype(np.float64), f"n={n}", rtol=0.0)


def test_a_grid_that_follows_a_dim_is_one_template_for_every_value() -> None:
    """``Follows("m")``: one block per row at every m (a tuned winner whose grid equalled the prompt length).
    As a constant the grid divides only multiples of itself; following the dim, one template serves every m,
    and its results are the per-value kernel's."""
    from prism.ir.dims import Follows
    g = prism.Graph("row norm")
    X, Wt = g.input("X", ("m", 64)), g.input("Wt", (64,))
    bb = BlockBuilder(grid=("g0",), forloop=1, inputs=[X, Wt])
    x, w = bb.iter(0, imap=(0,)), bb.iter(1, imap=(None,))
    bb.save(bb.mul(bb.rms_norm(x), w), omap=(0,))
    (y,) = g.customized(bb.build(), [X, Wt])
    g.output(y, "Y")
    k = prism.compile(g, {"g0": Follows("m")}, templates=True)
    rng = np.random.default_rng(0)
    used = set()
    for m in (9, 10, 17, 141, 157):
        v = k.specialize(m=m)
        assert v.template is not None, k.template_failures
        used.add(id(v.template))
        x, w = rng.standard_normal((m, 64)).astype(np.float32), rng.standard_normal(64).astype(np.float32)
        ref = prism.compile(g, {"g0": m})(X=x, Wt=w)   # the per-value kernel
        assert_close(k(X=x, Wt=w), np.asarray(ref, dtype=np.float64), f"m={m}", 1e-6)
    assert len(used) == 1
    with pytest.raises(prism.PrismError, match="follow dims the graph does not have"):
        prism.compile(g, {"g0": Follows("n")})


def test_covers_says_whether_a_value_runs_compiled_code_without_compiling() -> None:
    """Kernel.covers: True at a value compiled before or inside a compiled template's guard region, False where a
    call would trace and compile a new template (api.SuperKernel._derived then prefers a split); asking compiles
    nothing."""
    g = decode_attention()
    k = prism.compile(g, {"g": 2, "F": 1}, templates=True)
    assert not k.covers(n=101)
    k.specialize(n=101)
    misses = cache.STATS.misses
    inside = [n for n in range(1, 300) if k._templates[0][0].holds({"n": n})]
    outside = [n for n in range(1, 300) if not any(t.holds({"n": n}) for t, *_ in k._templates)]   # (n = 1)
    assert 101 in inside and outside
    assert k.covers(n=101) and all(k.covers(n=n) for n in inside) and not any(k.covers(n=n) for n in outside)
    assert cache.STATS.misses == misses and len(k._templates) == 1
    plain = prism.compile(g, {"g": 2, "F": 1})
    plain.specialize(n=40)
    assert plain.covers(n=40) and not plain.covers(n=41)


def prefill_attention(dtype: str = "float32") -> prism.Graph:
    """O = softmax(Q K^T / sqrt(128)) V for 2 heads of n query rows over n keys (a prompt of length n): Q @ K^T has n
    rows and n keys, P @ V n rows and K = n."""
    return online_softmax_attention("prefill attention", (2, "n", 128), (2, "n", 128), ("g",), "F", dtype)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_a_prefill_attention_is_one_template_for_every_prompt_length(dtype: str, rng: np.random.Generator) -> None:
    """Boundaries that were region ends for a prompt's length n, each a new template (gcc and checks) when a prompt
    crossed it: the softmax rows' split at loops.SPLIT_MIN (64), P @ V's bits plan (``M >= 16 or K * N <= 65536``:
    one guard, traced.any_of) and its K-chunk groups (K > 512), float32's packing of K^T for Q @ K^T (64 rows, 497
    keys: a run-time branch). Traced at 24, the template holds at every length from 2 to 3000, prints what
    generation prints at lengths on both sides of each former boundary, and its compiled code agrees with float64
    on both sides (one template for all)."""
    g, ia, params = prefill_attention(dtype), get_isa(None), {"g": 2, "F": 1}
    t = trace(g, params, {"n": 24}, ia)
    assert all(t.holds({"n": n}) for n in range(2, 3001)), [n for n in range(2, 3001) if not t.holds({"n": n})][:5]
    for n in (3, 63, 64, 100, 496, 497, 513, 700):
        assert t.render({"n": n}) == plain_source(g, params, {"n": n}, ia), n
    k = prism.compile(g, params, templates=True)
    for n in (20, 70, 530):
        x = _inputs(g, n, rng)
        if dtype == "float32":
            x["K"][1, n // 3] = 1e3   # hostile: one key dominates every row's scores
        (ref,) = g.evaluate(x, dtype=np.float64, params=params).values()
        assert k.specialize(n=n).template is not None, k.template_failures
        assert_close(k(**x), ref, f"n={n}", rtol=1e-4 if dtype == "float32" else 2e-2)
    assert len(k._templates) == 1 and not k.template_failures


def test_a_softmax_row_is_split_at_any_length_in_a_template(rng: np.random.Generator) -> None:
    """loops.SPLIT_MIN: a row reduction whose length varies (traced.varies) takes the split form at any length in a
    template (rows of 2-3 elements: no quarters, only the remainder loop), so rows shorter and longer than 64 are
    one template."""
    g = prism.Graph("softmax over n")
    X = g.input("X", (5, "n"))
    g.output(g.softmax(X, -1), "Y")
    k = prism.compile(g, {}, templates=True)
    for n in (2, 3, 5, 63, 64, 65, 200):
        x = {"X": rng.standard_normal((5, n)).astype(np.float32) * 4}
        (ref,) = g.evaluate(x, dtype=np.float64).values()
        assert k.specialize(n=n).template is not None, (n, k.template_failures)
        assert_close(k(**x), ref, f"n={n}")
    assert len(k._templates) == 1, [t.trace.guards for t, *_ in k._templates]
