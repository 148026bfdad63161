"""prism.optimize and torch.compile(backend="prism") end to end on small models: pieces run as Prism
kernels (asserted through reports and call counters), results match eager PyTorch, and everything
Prism cannot run — unsupported operators, graph breaks, non-contiguous inputs, float64,
autograd, a failed superoptimize — runs correctly in PyTorch with a log line."""

from __future__ import annotations

import logging
from typing import Any

import pytest

torch = pytest.importorskip("torch")
F = torch.nn.functional
nn = torch.nn

import prism  # noqa: E402
from prism.frontend import clear_reports, reports  # noqa: E402
from prism.tune import STATS  # noqa: E402

pytestmark = [pytest.mark.cpu, pytest.mark.usefixtures("fresh_dynamo")]

OPTS = {"top_k": 2, "time_limit": 60.0, "measure_machine": False}
TOL = 1e-4  # max |got - eager| / max |eager|, float32


def _close(got: Any, ref: Any, tol: float = TOL) -> None:
    got = got if isinstance(got, (tuple, list)) else (got,)
    ref = ref if isinstance(ref, (tuple, list)) else (ref,)
    assert len(got) == len(ref)
    for a, b in zip(got, ref):
        assert a.shape == b.shape and a.dtype == b.dtype
        a, b = a.detach().double(), b.detach().double()
        err = float((a - b).abs().max()) / max(float(b.abs().max()), 1e-30)
        assert err <= tol, err


class MLP(nn.Module):
    """x + down(silu(gate(n)) * up(n)), n = rms_norm(x) * w."""

    def __init__(self, d: int = 64, h: int = 128) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.w = nn.Parameter(torch.rand(d) + 0.5)
        self.gate, self.up, self.down = nn.Linear(d, h, bias=False), nn.Linear(d, h, bias=False), \
            nn.Linear(h, d, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * self.w
        return x + self.down(F.silu(self.gate(n)) * self.up(n))


def _x(n: int, d: int = 64, seed: int = 0) -> torch.Tensor:
    return torch.randn(n, d, generator=torch.Generator().manual_seed(seed))


def _mlp_pieces(rep: Any) -> list[Any]:
    return [p for p in rep.pieces if p.by_prism and p.label == "rms_norm+mul+linear+silu+linear+mul"]


def test_torch_compile_backend_two_batch_sizes_one_search() -> None:
    m = MLP()
    c = torch.compile(m, backend="prism", options=OPTS)
    with torch.no_grad():
        for n in (3, 5):
            x = _x(n, seed=n)
            torch._dynamo.mark_dynamic(x, 0)
            before = STATS.searches + STATS.search_cache_hits
            _close(c(x), m(x))
            if n == 5:  # the second batch size only tunes: no search, not even a cache read
                assert STATS.searches + STATS.search_cache_hits == before
    (rep,) = reports()
    (mlp,) = _mlp_pieces(rep)
    assert mlp.runner.prism_calls == 2 and mlp.runner.fallback_calls == 0
    down = [p for p in rep.pieces if p.label == "linear+add"]
    assert down and down[0].by_prism and down[0].runner.prism_calls == 2


class NormAttention(nn.Module):
    """A norm with its eps and an attention with its scale as Python float attributes: under dynamic=True
    Dynamo passes both as 0-d float64 inputs read with .item() (frontend.dynamo.fold_float_inputs)."""

    def __init__(self) -> None:
        super().__init__()
        self.eps, self.scaling = 1e-6, 0.25
        self.w = nn.Parameter(torch.rand(32, generator=torch.Generator().manual_seed(3)) + 0.5)

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        n = q * torch.rsqrt(q.pow(2).mean(-1, keepdim=True) + self.eps) * self.w
        return F.scaled_dot_product_attention(n, k, v, scale=self.scaling)


def test_dynamic_true_folds_float_attributes_and_guards_them(caplog: pytest.LogCaptureFixture) -> None:
    """torch.compile(..., dynamic=True): the module's float attributes (eps, the attention scale), which Dynamo
    makes graph inputs, are folded into the kernels as their values, so the norm and the attention run on Prism
    (they were left to PyTorch: "scale must be a constant number, got item (SymFloat)"). A call with a changed
    attribute runs the graph in PyTorch, correctly, with one log line; the old value runs on Prism again."""
    m = NormAttention()
    c = torch.compile(m, backend="prism", dynamic=True, options=OPTS)

    def args(n: int) -> tuple[torch.Tensor, ...]:
        g = torch.Generator().manual_seed(n)
        return tuple(torch.randn(1, 4, n, 32, generator=g) for _ in range(3))
    with torch.no_grad():
        for n in (7, 12):
            _close(c(*args(n)), m(*args(n)))
        (rep,) = reports()
        assert not any("SymFloat" in (f.reason or "") for f in rep.fallbacks), rep.table()
        prism_calls = sum(p.runner.prism_calls for p in rep.pieces if p.by_prism)
        assert prism_calls >= 2 and any("scaled_dot_product_attention" in p.label or "attention" in p.label
                                        for p in rep.pieces if p.by_prism), rep.table()
        m.eps, m.scaling = 0.5, 0.125   # Dynamo 2.13 compiles the graph again for new values: still correct
        _close(c(*args(9)), m(*args(9)))
    # where the graph is called with another value (Dynamo guarding no float), the guard runs it in PyTorch
    from prism.frontend.dynamo import prism_backend
    seen: list[tuple[Any, Any, list[Any]]] = []

    def keep(gm: Any, example_inputs: list[Any]) -> Any:
        fn = prism_backend(gm, example_inputs, OPTS)
        seen.append((fn, gm, list(example_inputs)))
        return fn
    torch._dynamo.reset()
    m.eps, m.scaling = 1e-6, 0.25
    with torch.no_grad():
        torch.compile(m, backend=keep, dynamic=True)(*args(7))
        fn, gm, ex = seen[-1]
        floats = [i for i, x in enumerate(ex) if isinstance(x, torch.Tensor) and x.dim() == 0
                  and x.dtype == torch.float64]
        assert len(floats) == 2
        rep = reports()[-1]
        calls = sum(p.runner.prism_calls for p in rep.pieces if p.by_prism)
        _close(fn(*ex), gm.forward(*ex))
        assert sum(p.runner.prism_calls for p in rep.pieces if p.by_prism) > calls
        calls = sum(p.runner.prism_calls for p in rep.pieces if p.by_prism)
        changed = [torch.tensor(0.5, dtype=torch.float64) if i == floats[0] else x for i, x in enumerate(ex)]
        with caplog.at_level(logging.WARNING, logger="prism"):
            _close(fn(*changed), gm.forward(*changed))
            _close(fn(*changed), gm.forward(*changed))
        assert sum("is now 0.5" in r.getMessage() for r in caplog.records) == 1
        assert sum(p.runner.prism_calls for p in rep.pieces if p.by_prism) == calls   # PyTorch ran them
        _close(fn(*ex), gm.forward(*ex))
        assert sum(p.runner.prism_calls for p in rep.pieces if p.by_prism) > calls


def test_a_dynamic_recompile_under_dynamos_default_names_dynamic_true_once(
        caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    """Under Dynamo's default (static first) a changed size makes it compile a dynamic graph, whose pieces Prism
    searches and tunes then: the backend says once that ``dynamic=True`` compiles that graph at the first call.
    Compiled with ``dynamic=True`` from the start, or with sizes marked dynamic at the first call, nothing is said."""
    import prism.frontend.dynamo as dyn
    m = NormAttention()

    def args(n: int) -> tuple[torch.Tensor, ...]:
        g = torch.Generator().manual_seed(n)
        return tuple(torch.randn(1, 4, n, 32, generator=g) for _ in range(3))
    for dynamic, hinted in ((True, 0), (None, 1)):
        monkeypatch.setattr(dyn, "_HINTED", False)
        torch._dynamo.reset()
        c = torch.compile(m, backend="prism", dynamic=dynamic, options=OPTS)
        caplog.clear()
        with torch.no_grad(), caplog.at_level(logging.WARNING, logger="prism"):
            for n in (7, 12, 9):
                _close(c(*args(n)), m(*args(n)))
        assert sum("dynamic=True" in r.getMessage() for r in caplog.records) == hinted, dynamic
    # a first graph made dynamic by torch._dynamo.mark_dynamic is no recompile: nothing said
    monkeypatch.setattr(dyn, "_HINTED", False)
    torch._dynamo.reset()
    c = torch.compile(m, backend="prism", options=OPTS)
    caplog.clear()
    q, k, v = args(10)
    torch._dynamo.mark_dynamic(q, 2)
    torch._dynamo.mark_dynamic(k, 2)
    torch._dynamo.mark_dynamic(v, 2)
    with torch.no_grad(), caplog.at_level(logging.WARNING, logger="prism"):
        _close(c(q, k, v), m(q, k, v))
    assert any(p.by_prism for p in reports()[-1].pieces)   # the hint's check ran: a graph with Prism pieces
    assert not any("dynamic=True" in r.getMessage() for r in caplog.records)


def test_linear_weights_are_read_as_stored_no_copies() -> None:
    """Every Linear weight reaches its piece's kernel as the module stores it ([out, in], contiguous): no
    transposed copy is made, cached or kept (memory overhead), and the pieces' programs say so."""
    from prism.frontend.runtime import PREPARED
    m = MLP()
    misses = PREPARED.misses
    opt = prism.optimize(m, (_x(3),), **OPTS)
    with torch.no_grad():
        _close(opt(_x(3, seed=1)), m(_x(3, seed=1)))
    assert PREPARED.misses == misses
    pieces = opt.prism_pieces()
    assert pieces and all(p.runner.prism_calls == 2 for p in pieces)  # the example run and ours
    for p in pieces:
        assert all(sp is None or sp.perm is None for sp in p.runner.specs)
        g = p.runner.kernel.program
        assert any(n.op == "permute" and n.src[0].op == "input" for n in g.nodes), g
    shapes = {s for p in pieces for s in p.inputs}
    assert "[128, 64]" in shapes and "[64, 128]" in shapes  # gate/up [h, d] and down [d, h] as stored


def test_optimize_a_function_with_attention() -> None:
    def attn(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return F.scaled_dot_product_attention(q, k, v, enable_gqa=True) * 2.0

    q, k, v = torch.randn(2, 4, 1, 32), torch.randn(2, 2, 16, 32), torch.randn(2, 2, 16, 32)
    opt = prism.optimize(attn, (q, k, v), dynamic={0: [0], 1: [0], 2: [0]}, **OPTS)
    with torch.no_grad():
        for b in (2, 3):
            args = (torch.randn(b, 4, 1, 32), torch.randn(b, 2, 16, 32), torch.randn(b, 2, 16, 32))
            _close(opt(*args), attn(*args))
    (p,) = opt.prism_pieces()
    assert p.label == "scaled_dot_product_attention+mul" and p.runner.prism_calls == 3  # priming + 2
    assert "acc." in p.structure or "softmax" in p.structure
    assert "piece 0 [prism]" in opt.explain()


def _decode_attention(q: torch.Tensor, kc: torch.Tensor, k: torch.Tensor, vc: torch.Tensor,
                      v: torch.Tensor) -> torch.Tensor:
    """One decode step over a KV cache: the cache lengths of keys and values are separate symbols."""
    return F.scaled_dot_product_attention(q, torch.cat((kc, k), 2), torch.cat((vc, v), 2), enable_gqa=True)


def _kv(length: int, kv_len: int | None = None, seed: int = 0) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=g)
    return (r(1, 8, 1, 32), r(1, 2, length, 32), r(1, 2, 1, 32), r(1, 2, kv_len or length, 32), r(1, 2, 1, 32))


def test_decode_attention_with_separately_named_cache_lengths() -> None:
    """Dynamo names the key and value cache lengths differently (nothing it traced compared them): the
    attention stays on Prism from the dynamic graph on, with the identification in the report."""
    cf = torch.compile(_decode_attention, backend="prism", options=OPTS)
    with torch.no_grad():
        for n in (8, 9, 10):
            args = _kv(n, seed=n)
            _close(cf(*args), _decode_attention(*args))
    rep = reports()[-1]
    (p,) = rep.pieces
    assert p.by_prism and p.runner.prism_calls == 2 and p.runner.fallback_calls == 0, rep.table()
    (a,) = rep.assumptions
    assert "scaled_dot_product_attention" in a and "checked on every call" in rep.table()
    g = p.runner.kernel.program  # keys and values read with one length symbol
    assert g.inputs["x1"].shape[2] is g.inputs["x2"].shape[2]


def _repeat_kv(x: torch.Tensor, n: int) -> torch.Tensor:
    """transformers' ``repeat_kv``: each KV head copied for its group of ``n`` query heads."""
    b, h, s, d = x.shape
    return x[:, :, None, :, :].expand(b, h, n, s, d).reshape(b, h * n, s, d)


def _masked_gqa_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """A masked attention over grouped KV heads as transformers writes it (a static cache's decode, a padded batch):
    the KV heads repeated, no ``enable_gqa``."""
    return F.scaled_dot_product_attention(q, _repeat_kv(k, 4), _repeat_kv(v, 4), attn_mask=mask)


@pytest.mark.parametrize("mask_dtype", ["float", "bool"])
def test_a_repeated_kv_head_is_read_as_a_grouped_head(mask_dtype: str) -> None:
    """``repeat_kv`` before a masked attention (an ``expand`` and a ``reshape``: the whole cache copied per call in
    PyTorch) becomes ``enable_gqa`` (capture.absorb_repeat_kv): the attention piece reads the 2 KV heads as they
    are, nothing of the repeat is left in the graph, and the results are eager's -- with a mask that hides some
    keys of every query and all keys of one (PyTorch gives that query 0)."""
    g = torch.Generator().manual_seed(3)
    q, k, v = torch.randn(1, 8, 3, 32, generator=g), torch.randn(1, 2, 20, 32, generator=g), \
        torch.randn(1, 2, 20, 32, generator=g)
    keep = torch.rand(1, 1, 3, 20, generator=g) > 0.3
    keep[..., 1, :] = False
    mask = keep if mask_dtype == "bool" else torch.where(keep, 0.0, float("-inf"))
    cf = torch.compile(_masked_gqa_attention, backend="prism", options=OPTS)
    with torch.no_grad():
        _close(cf(q, k, v, mask), _masked_gqa_attention(q, k, v, mask))
        _close(cf(q, k, v, mask), F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True))
    rep = reports()[-1]
    (p,) = [p for p in rep.pieces if p.by_prism]
    assert p.runner.prism_calls == 2 and p.runner.fallback_calls == 0, rep.table()
    assert "[1, 2, 20, 32]" in p.inputs and "[1, 8, 20, 32]" not in p.inputs, p.inputs
    assert rep.layout == 0, rep.table()   # no expand, reshape or indexing left around it


def test_identified_sizes_are_checked_on_every_call() -> None:
    """A call whose sizes break an identification never reaches the kernel: the piece runs in PyTorch and
    gives eager's result (PyTorch's CPU attention accepts keys and values of different lengths)."""
    gm = torch.fx.symbolic_trace(_decode_attention)
    opt = prism.optimize(gm, _kv(8), dynamic={1: [2], 3: [2]}, **OPTS)
    (p,) = opt.prism_pieces()
    assert len(opt.report[0].assumptions) == 1
    with torch.no_grad():
        args = _kv(12, seed=1)
        _close(opt(*args), _decode_attention(*args))
        assert (p.runner.prism_calls, p.runner.fallback_calls) == (2, 0)
        bad = _kv(12, kv_len=11, seed=2)
        _close(opt(*bad), _decode_attention(*bad), tol=0.0)
    assert (p.runner.prism_calls, p.runner.fallback_calls) == (2, 1)


def _causal(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)


def test_causal_attention_runs_on_prism() -> None:
    """is_causal=True (a prompt's prefill): the attention runs on Prism with the causal mask built in
    PyTorch, at a static and then a dynamic prompt length; top-left aligned like PyTorch (more keys than
    queries: the triangle starts at key 0)."""
    cf = torch.compile(_causal, backend="prism", options=OPTS)
    with torch.no_grad():
        for lq, lk in ((16, 16), (21, 21), (9, 13)):
            g = torch.Generator().manual_seed(lq)
            args = (torch.randn(1, 8, lq, 32, generator=g), torch.randn(1, 2, lk, 32, generator=g),
                    torch.randn(1, 2, lk, 32, generator=g))
            _close(cf(*args), _causal(*args))
    for rep in reports():
        (p,) = rep.pieces
        assert p.by_prism and p.runner.fallback_calls == 0, rep.table()
        assert [f.op for f in rep.fallbacks] == ["prism.frontend.ops.causal_bias"], rep.table()
        assert "causal mask" in rep.fallbacks[0].reason
    assert sum(p.runner.prism_calls for r in reports() for p in r.pieces) == 3


@pytest.mark.parametrize("heads", [1, 8])
def test_attention_with_a_float_mask(heads: int) -> None:
    """An additive float mask shared by the heads ([b, 1, L, S]) or per head ([b, hq, L, S]), grouped KV
    heads, -inf entries included."""
    def fn(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=m, enable_gqa=True)

    g = torch.Generator().manual_seed(heads)
    m = torch.randn(2, heads, 12, 20, generator=g)
    m[..., 3] = float("-inf")
    args = (torch.randn(2, 8, 12, 32, generator=g), torch.randn(2, 2, 20, 32, generator=g),
            torch.randn(2, 2, 20, 32, generator=g), m)
    opt = prism.optimize(fn, args, **OPTS)
    (p,) = opt.prism_pieces()
    assert not opt.report[0].fallbacks
    with torch.no_grad():
        _close(opt(*args), fn(*args))
    assert p.runner.prism_calls == 2  # priming + 1


def test_attention_with_a_bool_mask_from_pytorch_runs_on_prism() -> None:
    """The mask is an input of the attention piece, converted per call to the additive bias (its rows all
    False here and there: those queries get 0, as PyTorch gives)."""
    def fn(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=m) * 2.0

    g = torch.Generator().manual_seed(0)
    args = (torch.randn(1, 4, 8, 32, generator=g), torch.randn(1, 4, 8, 32, generator=g),
            torch.randn(1, 4, 8, 32, generator=g), torch.rand(1, 1, 8, 8, generator=g) > 0.3)
    args[3][0, 0, 5] = False
    opt = prism.optimize(fn, args, **OPTS)
    with torch.no_grad():
        got = opt(*args)
    _close(got, fn(*args))
    assert not got.isnan().any()
    assert [f.op for r in opt.report for f in r.fallbacks] == []
    (p,) = opt.prism_pieces()
    assert "scaled_dot_product_attention" in p.label and p.runner.prism_calls == 2 and p.runner.fallback_calls == 0


@pytest.mark.parametrize("capture, name", [("auto", "aten.cumsum.default"), ("dynamo", "torch.cumsum")])
def test_unsupported_operator_between_pieces(caplog: pytest.LogCaptureFixture, capture: str, name: str) -> None:
    def fn(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        y = torch.softmax(x @ w, -1)
        return torch.cumsum(y, -1) @ w.t() * 0.5

    x, w = _x(4, 64), torch.randn(64, 64)
    with caplog.at_level(logging.WARNING, logger="prism"):
        opt = prism.optimize(fn, (x, w), capture=capture, **OPTS)
    assert opt.capture == ("export" if capture == "auto" else capture)
    lines = [r.getMessage() for r in caplog.records if "cumsum" in r.getMessage()]
    assert len(lines) == 1 and "left to PyTorch" in lines[0]
    with torch.no_grad():
        _close(opt(x, w), fn(x, w))
    labels = [p.label for p in opt.prism_pieces()]
    assert "matmul+softmax" in labels, labels
    assert [f.op for r in opt.report for f in r.fallbacks] == [name]


def test_graph_break_gives_two_graphs_both_optimized() -> None:
    def fn(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        y = F.silu(x @ w) * 2.0
        torch._dynamo.graph_break()
        return torch.softmax(y @ w, -1)

    x, w = _x(4, 32), torch.randn(32, 32)
    opt = prism.optimize(fn, (x, w), capture="dynamo", **OPTS)  # (an export has no graph breaks)
    with torch.no_grad():
        _close(opt(x, w), fn(x, w))
    assert len(opt.report) == 2
    assert all(r.prism_pieces() for r in opt.report)
    assert all(p.runner.prism_calls == 2 for p in opt.prism_pieces())


def test_non_contiguous_inputs() -> None:
    def fn(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return F.silu(x @ w) * x.sum(-1, keepdim=True)

    w = torch.randn(32, 32)
    base = torch.randn(32, 6)
    x = base.t()  # a transposed view: strides (1, 6)
    assert not x.is_contiguous()
    opt = prism.optimize(fn, (x, w), **OPTS)
    with torch.no_grad():
        _close(opt(x, w), fn(x, w))
        x2 = torch.randn(6, 64)[:, ::2]  # a strided slice
        _close(opt(x2, w), fn(x2, w))
    ran = sum(p.runner.prism_calls for p in opt.prism_pieces())
    assert ran >= 2


# bfloat16 through a real model: test_frontend_transformers.py (the tiny Llama in bfloat16); here float16
@pytest.mark.parametrize("dtype", [torch.float16])
def test_low_precision_models_run_on_prism(dtype: torch.dtype) -> None:
    """A model moved to bfloat16/float16 runs on Prism (float32 arithmetic, values rounded where PyTorch stores
    them): within two roundings of the dtype of the float64 result of the same low-precision weights, as
    close as eager itself."""
    m = MLP().to(dtype)
    x = _x(3).to(dtype)
    with torch.no_grad():
        got = torch.compile(m, backend="prism", options=OPTS)(x)
        eager = m(x)
        exact = MLP().double()
        exact.load_state_dict({k: v.double() for k, v in m.state_dict().items()})
        ref = exact(x.double())
    assert got.dtype == dtype
    eps = {torch.bfloat16: 2.0 ** -8, torch.float16: 2.0 ** -11}[dtype]
    err = float((got.double() - ref).abs().max() / ref.abs().max())
    err_eager = float((eager.double() - ref).abs().max() / ref.abs().max())
    assert err <= max(4 * eps, 1.5 * err_eager), (err, err_eager)
    (rep,) = reports()
    assert _mlp_pieces(rep) and all(p.runner.prism_calls == 1 for p in rep.prism_pieces()), rep.table()


def test_int8_weight_only_models_run_on_prism() -> None:
    """prism.quantize_weights: Linear layers hold int8 weights [out, in] and per-channel scales; the piece reads
    the int8 weight as stored and scales after the product. Compared with the same quantized model in eager
    PyTorch (float32 arithmetic on the same int8 values: float32 tolerance)."""
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(64, 128, bias=False), nn.SiLU(), nn.Linear(128, 64, bias=False)).eval()
    prism.quantize_weights(m)
    assert all(isinstance(layer, prism.frontend.Int8Linear) for layer in (m[0], m[2]))
    assert m[0].qweight.dtype == torch.int8 and m[0].qweight.shape == (128, 64) and m[0].scale.shape == (128,)
    x = _x(3)
    with torch.no_grad():
        ref = m(x)
        full = x @ m[0].dequantized().t()
        torch.testing.assert_close(m[0](x), full, rtol=1e-5, atol=1e-5)   # the module computes q * s
        opt = prism.optimize(m, (x,), **OPTS)
        got = opt(x)
    _close(got, ref)
    (rep,) = reports()
    assert rep.prism_pieces() and all(p.runner.prism_calls >= 1 for p in rep.prism_pieces()), rep.table()
    assert sum(p.label.count("linear") for p in rep.prism_pieces()) == 2, rep.table()
    assert any(s.dtype == torch.int8 for p in rep.prism_pieces() for s in p.runner.specs if s is not None)


def test_int8_weight_only_on_a_bfloat16_model_reads_the_int8_weights() -> None:
    """``quantize_weights`` then ``.to(torch.bfloat16)`` (torchao's int8 weight-only on a bfloat16 model): the forward
    casts the int8 weight to bfloat16, which is exact, so each Linear is one piece whose product reads the int8
    weight as stored (before: the cast was a kernel of its own writing a bfloat16 copy of the weight per call,
    slower than eager). Checked against the float64 product of the same bfloat16 activations and int8 values,
    within bfloat16's tolerance."""
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(64, 128, bias=False), nn.SiLU(), nn.Linear(128, 64, bias=False)).eval()
    m = prism.quantize_weights(m).to(torch.bfloat16)
    assert m[0].qweight.dtype == torch.int8 and m[0].scale.dtype == torch.bfloat16
    x = _x(3).to(torch.bfloat16)
    with torch.no_grad():
        opt = prism.optimize(m, (x,), **OPTS)
        got = opt(x)
    h = x.double() @ m[0].dequantized().double().t()
    ref = (h * torch.sigmoid(h)).to(torch.bfloat16).double() @ m[2].dequantized().double().t()
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got.double(), ref, rtol=3e-2, atol=3e-2 * float(ref.abs().max()))
    (rep,) = reports()
    assert sum(p.label.count("linear") for p in rep.prism_pieces()) == 2, rep.table()
    for p in rep.prism_pieces():
        graph = p.runner.kernel.implementations[0].graph
        assert not any(n.op == "cast" and n.src[0].dtype.name == "int8" for n in graph.nodes), p.label
    assert any(s.dtype == torch.int8 for p in rep.prism_pieces() for s in p.runner.specs if s is not None)


def test_w8a8_models_quantize_each_row_and_run_on_prism() -> None:
    """``quantize_weights(activations="int8")``: each Linear an Int8DynLinear, whose input rows are quantized to int8
    at each call (per-row symmetric scale, round half to even, saturating) and multiplied as int8 x int8. Its
    forward equals the float64 product of the same quantized values (hostile rows: zeros, one huge value, a
    half-way value), and under prism.optimize every piece runs on Prism, one row included (the row scale at one
    row had no implementation in the search's space before the gridless blocks: it ran in PyTorch)."""
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(64, 128, bias=True), nn.SiLU(), nn.Linear(128, 64, bias=False)).eval()
    prism.quantize_weights(m, activations="int8")
    assert all(isinstance(layer, prism.frontend.Int8DynLinear) for layer in (m[0], m[2]))
    x = _x(4)
    x[1] = 0.0
    x[2, 3] = 1e6
    x[3, :2] = torch.tensor([127.0, 0.5])   # scale 1: 0.5 rounds to 0 (half to even)

    def reference(layer: prism.frontend.Int8DynLinear, v: torch.Tensor) -> torch.Tensor:
        sx = v.double().abs().amax(-1, keepdim=True).clamp(min=1e-5).float() * (1 / 127)
        xq = torch.round(v / sx).clamp(-127, 127)
        y = (xq.double() @ layer.qweight.double().t()) * sx.double() * layer.scale.double()
        return y + layer.bias.double() if layer.bias is not None else y

    assert float(torch.round(x[3, 1] / (x[3].abs().amax() * (1 / 127)))) == 0.0
    with torch.no_grad():
        h = reference(m[0], x).float()
        ref = reference(m[2], h * torch.sigmoid(h))
        _close(m(x).double(), ref)
        for rows in (x, x[:1]):
            clear_reports()
            opt = prism.optimize(m, (rows,), **OPTS)
            got = opt(rows)
            _close(got.double(), ref[: len(rows)])
            (rep,) = reports()
            assert not rep.fallbacks and rep.prism_pieces(), rep.table()
            assert all(p.runner.prism_calls >= 1 for p in rep.prism_pieces()), rep.table()
            assert any("amax" in p.label for p in rep.prism_pieces()), rep.table()
    with pytest.raises(ValueError, match="activations"):
        prism.quantize_weights(nn.Linear(4, 4), activations="int4")


def test_w8a8_on_a_bfloat16_model_quantizes_in_float32_on_prism() -> None:
    """``quantize_weights(activations="int8")`` then ``.to(torch.bfloat16)``: the layer quantizes its rows in float32
    (eager bfloat16 would round x / s to 8 significant bits before rounding to an integer, and the search's checks
    rejected every implementation of that form: its products ran in PyTorch) and returns bfloat16. Every product
    piece runs on Prism; the result is within bfloat16's rounding of the float64 product of the same quantized
    values."""
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(64, 128, bias=False), nn.SiLU(), nn.Linear(128, 64, bias=False)).eval()
    m = prism.quantize_weights(m, activations="int8").to(torch.bfloat16)
    x = _x(4).to(torch.bfloat16)

    def reference(layer: prism.frontend.Int8DynLinear, v: torch.Tensor) -> torch.Tensor:
        sx = v.float().abs().amax(-1, keepdim=True).clamp(min=1e-5) * (1 / 127)
        xq = torch.round(v.float() / sx).clamp(-127, 127)
        return (xq.double() @ layer.qweight.double().t()) * sx.double() * layer.scale.double()

    with torch.no_grad():
        opt = prism.optimize(m, (x,), **OPTS)
        got = opt(x)
        h = reference(m[0], x).to(torch.bfloat16)
        ref = reference(m[2], (h.float() * torch.sigmoid(h.float())).to(torch.bfloat16))
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got.double(), ref, rtol=3e-2, atol=3e-2 * float(ref.abs().max()))
    (rep,) = reports()
    assert not rep.fallbacks, rep.table()
    products = [p for p in rep.prism_pieces() if "matmul" in p.label]
    assert len(products) == 2 and all(p.runner.prism_calls >= 1 for p in products), rep.table()


def test_float64_runs_in_pytorch(caplog: pytest.LogCaptureFixture) -> None:
    m = MLP().double()
    x = _x(3).double()
    with caplog.at_level(logging.WARNING, logger="prism"), torch.no_grad():
        got = torch.compile(m, backend="prism", options=OPTS)(x)
        ref = m(x)
    assert got.dtype == torch.float64
    _close(got, ref, tol=0.0)  # the same PyTorch operators: identical results
    (rep,) = reports()
    assert not rep.prism_pieces()
    msgs = [r.getMessage() for r in caplog.records]
    assert any("dtype float64" in s and "bfloat16" in s for s in msgs), msgs


def test_failed_superoptimize_falls_back_loudly(monkeypatch: pytest.MonkeyPatch,
                                                caplog: pytest.LogCaptureFixture) -> None:
    import prism.api
    from prism.api import NoVerifiedKernelError

    def refuse(*a: Any, **k: Any) -> Any:
        raise NoVerifiedKernelError("the search found no verified implementation (stop reason: time_limit)")
    monkeypatch.setattr(prism.api, "superoptimize", refuse)
    m = MLP()
    with caplog.at_level(logging.WARNING, logger="prism"):
        opt = prism.optimize(m, (_x(3),), **OPTS)
    with torch.no_grad():
        _close(opt(_x(3, seed=1)), m(_x(3, seed=1)))
    assert not opt.prism_pieces()
    failed = [p for p in opt.pieces() if p.status == "failed"]
    assert failed and all("NoVerifiedKernelError" in p.reason for p in failed)
    msgs = [r.getMessage() for r in caplog.records if "superoptimize raised NoVerifiedKernelError" in r.getMessage()]
    assert len(msgs) == len(failed)
    # every piece reads a Linear weight as stored, so each is searched a second time in the transposed form
    retries = [r.getMessage() for r in caplog.records if "searching again" in r.getMessage()]
    assert len(retries) == len(failed)


def test_autograd_recording_runs_pytorch_and_gradients_match(caplog: pytest.LogCaptureFixture) -> None:
    from prism.frontend.runtime import reset_warnings
    m = MLP()
    opt = prism.optimize(m, (_x(3),), **OPTS)
    x = _x(3, seed=2).requires_grad_(True)
    reset_warnings()
    with caplog.at_level(logging.WARNING, logger="prism"):
        y = opt(x)
        opt(x)
    y.sum().backward()
    gx, gw = x.grad.clone(), m.w.grad.clone()
    x.grad = None
    m.zero_grad()
    m(x).sum().backward()
    _close(y, m(x))
    _close((gx, gw), (x.grad, m.w.grad))
    said = [r.getMessage() for r in caplog.records if "autograd" in r.getMessage()]
    assert len(said) == 1 and "torch.no_grad()" in said[0], said  # once for every piece and call, with the fix
    assert sum(p.runner.fallback_calls for p in opt.prism_pieces()) >= 2


def test_fx_symbolic_trace_and_export() -> None:
    m = MLP()
    gm = torch.fx.symbolic_trace(m)
    opt = prism.optimize(gm, (_x(3),), dynamic={0: [0]}, **OPTS)
    batch = torch.export.Dim("batch", min=2)
    ep = torch.export.export(m, (_x(3),), dynamic_shapes=({0: batch},))
    opt2 = prism.optimize(ep, (_x(3),), **OPTS)
    with torch.no_grad():
        for n in (3, 6):
            x = _x(n, seed=n)
            _close(opt(x), m(x))
            _close(opt2(x), m(x))
    for o, source in ((opt, "fx"), (opt2, "export")):
        (rep,) = o.report
        assert rep.source == source
        (mlp,) = _mlp_pieces(rep)
        assert mlp.runner.prism_calls == 3


def test_updated_weights_are_used() -> None:
    """The transposed copies of weights are cached; an in-place update or a new tensor invalidates them."""
    m = MLP()
    opt = prism.optimize(m, (_x(3),), **OPTS)
    x = _x(3, seed=4)
    with torch.no_grad():
        _close(opt(x), m(x))
        m.gate.weight.mul_(-1.5)
        _close(opt(x), m(x))
        m.up.weight.data = torch.randn_like(m.up.weight)
        _close(opt(x), m(x))
    (mlp,) = _mlp_pieces(opt.report[0])
    assert mlp.runner.prism_calls == 4


@pytest.mark.parametrize("capture, name", [("auto", "aten.add_.Tensor"), ("dynamo", "operator.iadd")])
def test_in_place_update_of_an_input_still_happens(capture: str, name: str) -> None:
    def fn(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        x += 1.0  # mutates the caller's tensor (Dynamo: operator.iadd; export: aten.add_), must stay PyTorch's
        return torch.softmax(x @ w, -1)

    w = torch.randn(32, 16)
    opt = prism.optimize(fn, (_x(4, 32), w), capture=capture, **OPTS)
    a, b = _x(4, 32, seed=9), _x(4, 32, seed=9)
    with torch.no_grad():
        _close(opt(a, w), fn(b, w))
    assert torch.equal(a, b)  # both mutated alike
    assert [f.op for r in opt.report for f in r.fallbacks] == [name]
    assert [p.label for p in opt.prism_pieces()] == ["matmul+softmax"]


def test_unused_size_arithmetic_is_dropped_but_unused_in_place_calls_stay() -> None:
    """The rewritten graph drops calls whose values nothing reads when they only compute sizes (Dynamo leaves
    ``torch.sym_sum`` and ``numel`` after a cache update), and keeps every other unused call: FX counts
    method calls as pure, and an in-place method's result is often unused (``buf.add_(1)``)."""
    from prism.frontend.compiler import Options, compile_graph

    def fn(x: torch.Tensor, w: torch.Tensor, seen: torch.Tensor) -> torch.Tensor:
        x.numel()          # unused: dropped
        seen.add_(1.0)     # unused result of an in-place method: kept
        return torch.softmax(x @ w, -1)

    gm = torch.fx.symbolic_trace(fn)
    assert [n.target for n in gm.graph.nodes if n.op == "call_method"] == ["numel", "add_"]
    x, w, seen = _x(4, 32), torch.randn(32, 16), torch.zeros(1)
    gm, rep = compile_graph(gm, [x, w, seen], options=Options.from_any(OPTS))
    assert [n.target for n in gm.graph.nodes if n.op == "call_method"] == ["add_"]
    with torch.no_grad():
        _close(gm(x, w, seen), torch.softmax(x @ w, -1))
        gm(x, w, seen)
    assert float(seen) == 2.0 and [p.label for p in rep.pieces if p.by_prism] == ["matmul+softmax"]


def test_casts_to_the_dtype_a_tensor_has_are_dropped() -> None:
    """``x.to(torch.float32)`` on a float32 ``x`` returns ``x`` itself: the rewritten graph drops it (model code
    is full of them: RMSNorm's upcast, RoPE's ``cos.to(x.dtype)``); casts that change the dtype, ``copy=True``
    and forms with a device stay, and the results agree with PyTorch's."""
    from prism.frontend.compiler import Options, compile_graph

    def fn(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, ...]:
        y = torch.softmax(x.to(torch.float32) @ w.to(dtype=torch.float32, device="cpu"), -1)
        return y.float(), b.to(torch.float32), x.to(torch.float32, copy=True)

    gm = torch.fx.symbolic_trace(fn)
    x, w, b = _x(4, 32), torch.randn(32, 16), torch.randn(4, 3).to(torch.bfloat16)
    gm, rep = compile_graph(gm, [x, w, b], options=Options.from_any(OPTS))
    left = [(n.target, n.args[0].name if hasattr(n.args[0], "name") else None, dict(n.kwargs))
            for n in gm.graph.nodes if n.op == "call_method"]
    assert left == [("to", "b", {}), ("to", "x", {"copy": True})], left
    with torch.no_grad():
        got, want = gm(x, w, b), fn(x, w, b)
    for g_, w_ in zip(got, want):
        assert g_.dtype == w_.dtype
        _close(g_, w_)
    assert got[2] is not x
    assert [p.label for p in rep.pieces if p.by_prism] == ["matmul+softmax"]



def test_repeated_layout_calls_are_computed_once_unless_mutated() -> None:
    """Each Llama layer calls ``cos.unsqueeze(1)`` on the same ``cos``: the rewritten graph keeps one call when
    no user of either result may mutate or return it; an in-place user keeps its own."""
    from prism.frontend.compiler import Options, compile_graph

    def fn(x: torch.Tensor, c: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, ...]:
        a = torch.softmax((x * c.unsqueeze(0)) @ w, -1)
        b = torch.softmax((x + c.unsqueeze(0)) @ w, -1)
        m = c.unsqueeze(0)
        m.mul_(2.0)                     # in place: this one is not shared
        return a, b, m

    gm = torch.fx.symbolic_trace(fn)
    x, c, w = _x(4, 32), torch.randn(32), torch.randn(32, 16)
    gm, rep = compile_graph(gm, [x, c, w], options=Options.from_any(OPTS))
    assert [n.target for n in gm.graph.nodes if n.op == "call_method" and n.target == "unsqueeze"] == ["unsqueeze"] * 2
    with torch.no_grad():
        for g_, w_ in zip(gm(x, c.clone(), w), fn(x, c.clone(), w)):
            _close(g_, w_)
    assert len([p for p in rep.pieces if p.by_prism]) == 2


def test_layout_chains_that_keep_the_element_order_become_one_reshape() -> None:
    """A decode step's ``q.view(1, 1, H, D).transpose(1, 2)`` (a size-1 dim moved) and the attention output's
    ``reshape, transpose, contiguous, reshape`` keep their input's row-major element order: each chain
    becomes one ``reshape``. A chain that reorders elements (a real transpose) stays, and so does one whose
    result the graph returns."""
    from prism.frontend.compiler import Options, compile_graph

    def fn(x: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, ...]:
        y = torch.softmax(x @ w, -1)                              # [1, 32]
        heads = y.view(1, 1, 4, 8).transpose(1, 2)               # [1, 4, 1, 8]: the same order
        back = heads.transpose(1, 2).contiguous().reshape(1, 32)
        mixed = y.view(4, 8).transpose(0, 1)                       # [8, 4]: reordered
        out = y.view(2, 16).transpose(0, 1).transpose(0, 1)        # the same order, but returned
        return torch.softmax(back @ w.t(), -1), torch.cumsum(mixed, 0), out   # cumsum: PyTorch's

    gm = torch.fx.symbolic_trace(fn)
    x, w = _x(1, 32), torch.randn(32, 32)
    gm, _ = compile_graph(gm, [x, w], options=Options.from_any(OPTS))
    calls = [(n.target, n.args[1:]) for n in gm.graph.nodes if n.op == "call_method"]
    assert ("reshape", ((1, 32),)) in calls
    assert [c for c, _ in calls].count("transpose") == 3, calls   # mixed's one, out's two
    with torch.no_grad():
        for g_, w_ in zip(gm(x, w), fn(x, w)):
            _close(g_, w_)


def test_a_piece_allocates_its_output_in_the_shape_of_its_one_reshape() -> None:
    """A piece whose output's one use is a reshape to a static shape allocates the output in that shape (the
    same elements in the same order) and the reshape leaves the graph; the PyTorch fallback of the piece
    reshapes its result alike; a piece output with another use keeps its reshape."""
    from prism.frontend.compiler import Options, compile_graph
    from prism.frontend.runtime import PieceRunner

    def fn(x: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, ...]:
        y = torch.softmax(x @ w, -1).reshape(2, 8, 16)             # one use: absorbed
        z = torch.softmax(x @ w.t(), -1)
        return y, z.reshape(16, 4, 4), z.sum()                     # z has two uses: kept

    gm = torch.fx.symbolic_trace(fn)
    x, w = _x(8, 32), torch.randn(32, 32)
    gm, _ = compile_graph(gm, [x, w], options=Options.from_any(OPTS))
    assert [n.args[1:] for n in gm.graph.nodes if n.op == "call_method" and n.target == "reshape"] == [(16, 4, 4)]
    runners = [m for m in gm.modules() if isinstance(m, PieceRunner)]
    assert [r.out_view for r in runners if r.out_view is not None] == [(2, 8, 16)]
    with torch.no_grad():
        for g_, w_ in zip(gm(x, w), fn(x, w)):
            assert g_.shape == w_.shape
            _close(g_, w_)
        r = next(r for r in runners if r.out_view is not None)
        assert r.fallback_calls == 0
        assert r._in_pytorch("a test", (x, w)).shape == (2, 8, 16)


def test_layout_chains_of_big_tensors_are_left_alone() -> None:
    """The chain test runs the chain on an arange of its input's size: above ``_CHAIN_MAX_ELEMENTS`` (a weight,
    say) the chain stays as written instead of allocating that much at compile time."""
    from prism.frontend.compiler import _CHAIN_MAX_ELEMENTS, _collapse_layout_chains

    def fn(a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return a.view(1, -1).transpose(0, 1).sum(), b.view(1, -1).transpose(0, 1).sum()

    class Record(torch.fx.Interpreter):   # the captured example values, as Dynamo leaves them in node.meta
        def run_node(self, n: torch.fx.Node) -> Any:
            out = super().run_node(n)
            n.meta["val"] = out
            return out

    gm = torch.fx.symbolic_trace(fn)
    Record(gm).run(torch.randn(4, 4), torch.randn(_CHAIN_MAX_ELEMENTS + 1))
    _collapse_layout_chains(gm.graph)
    gm.recompile()
    calls = [(n.target, n.args[0].name) for n in gm.graph.nodes if n.op == "call_method" and n.target != "sum"]
    assert calls == [("reshape", "a"), ("view", "b"), ("transpose", "view_1")], calls
    a, b = torch.randn(4, 4), torch.randn(_CHAIN_MAX_ELEMENTS + 1)
    for g_, w_ in zip(gm(a, b), fn(a, b)):
        torch.testing.assert_close(g_, w_)


def test_layout_calls_with_an_augmented_assignment_are_not_shared() -> None:
    """``m += 1`` on a view is ``operator.iadd`` in the graph, an in-place update of the view's memory like
    ``m.add_(1)``: the view is not shared with an identical one (``ops.mutates`` names both kinds)."""
    import operator

    from prism.frontend.compiler import _share_repeated_views

    g = torch.fx.Graph()   # as Dynamo records it (symbolic_trace would rebind m to a functional add)
    c = g.placeholder("c")
    a, m = g.call_method("unsqueeze", (c, 0)), g.call_method("unsqueeze", (c, 0))
    m2 = g.call_function(operator.iadd, (m, 1.0))
    g.output((g.call_method("sum", (a,)), g.call_method("sum", (m2,))))
    _share_repeated_views(g)
    assert [n.target for n in g.nodes if n.op == "call_method"].count("unsqueeze") == 2
    gm = torch.fx.GraphModule(torch.nn.Module(), g)
    x = torch.randn(4)
    a_sum, m_sum = gm(x.clone())       # both views see the update of c's memory
    assert torch.allclose(a_sum, x.sum() + 4.0) and torch.allclose(m_sum, x.sum() + 4.0)


def test_a_symbolic_piece_is_searched_ranked_at_its_example_size() -> None:
    """The search ranks a piece's symbolic dims at the size Dynamo compiled the graph at, rounded to a power of
    two (at least api.SEARCH_DIM), not at SEARCH_DIM for every dim: ranked at 8 rows the prefill attention's
    symbolic search kept only sGraphs that materialize the L x L scores (compiler.search_dims)."""
    from prism import api
    from prism.frontend.compiler import search_dims
    g = prism.Graph("p")
    g.output(g.exp(g.input("X", ("d0", "d1"))), "Y")
    assert search_dims(g, {"d0": 141, "d1": 3, "d9": 50}) == {"d0": 128, "d1": api.SEARCH_DIM}
    assert search_dims(g, {"d0": 1500}) == {"d0": 2048} and search_dims(g, {}) is None   # nearest in log scale
    before = set(map(id, api._KERNEL_MEMO.values()))
    m = MLP()
    c = torch.compile(m, backend="prism", options=OPTS)
    x = _x(100, seed=1)
    torch._dynamo.mark_dynamic(x, 0)
    with torch.no_grad():
        _close(c(x), m(x))
    envs = [k.search_result.env for k in api._KERNEL_MEMO.values() if k.program.symbols() and id(k) not in before]
    assert envs and all(e and set(e.values()) == {128} for e in envs), envs
