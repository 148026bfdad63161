"""Chains (prism/frontend/chain.py): consecutive small static-shape pieces called as one. Results equal the
pieces called one by one (float32 against float64), every piece's kernel runs (call counters), the internal
buffers are never shared between concurrent calls, and whatever the C path does not take (another dtype, a
non-contiguous input, autograd) runs the pieces one by one with their own checks."""

from __future__ import annotations

import threading
from typing import Any

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn

import prism  # noqa: E402
from prism.frontend.chain import MAX_ELEMENTS, Cat, PieceChain  # noqa: E402
from prism.runtime import fastcall  # noqa: E402

pytestmark = [pytest.mark.cpu, pytest.mark.usefixtures("fresh_dynamo"),
              pytest.mark.skipif(fastcall.chain_type() is None, reason="no C launcher: chains are not formed")]

OPTS = {"top_k": 2, "time_limit": 60.0, "measure_machine": False}


class Stack(nn.Module):
    """Four Linears with residuals: more contractions than one piece may hold, so several pieces in a row."""

    def __init__(self, d: int = 64) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.ls = nn.ModuleList(nn.Linear(d, d) for _ in range(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for lin in self.ls:
            x = torch.relu(lin(x)) * 0.5 + x
        return x


def _x(*shape: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def _err(got: torch.Tensor, ref: torch.Tensor) -> float:
    return float((got.double() - ref.double()).abs().max()) / max(float(ref.double().abs().max()), 1e-30)


def _f64(m: nn.Module, x: torch.Tensor) -> torch.Tensor:
    import copy
    with torch.no_grad():
        return copy.deepcopy(m).double()(x.double())


def _chains(opt: Any) -> list[PieceChain]:
    return [c for r in opt.report for c in r.chains]


@pytest.mark.parametrize("capture", ["export", "dynamo"])
def test_consecutive_pieces_run_as_one_chain_with_the_same_results(capture: str) -> None:
    m = Stack()
    opt = prism.optimize(m, (_x(1, 64),), capture=capture, **OPTS)
    rep = opt.report[-1]
    pieces = opt.prism_pieces()
    assert len(pieces) >= 2 and len(rep.chains) == 1, rep.table()
    assert "chain(s) of pieces called as one" in rep.summary()
    with torch.no_grad():  # as prism.optimize ran the example (under Dynamo another grad mode recompiles)
        for seed in range(1, 4):
            before = [p.runner.prism_calls for p in pieces]
            x = _x(1, 64, seed=seed)
            assert _err(opt(x), _f64(m, x)) <= 1e-5
            assert [p.runner.prism_calls for p in pieces] == [b + 1 for b in before]


def test_the_chain_binds_its_c_path_and_counts_its_calls() -> None:
    m = Stack()
    opt = prism.optimize(m, (_x(1, 64),), capture="export", **OPTS)
    (chain,) = _chains(opt)
    with torch.inference_mode():
        opt(_x(1, 64, seed=1))
        assert chain._fast is not None, chain._why_not
        n = chain.prism_calls
        x = _x(1, 64, seed=2)
        assert _err(opt(x), _f64(m, x)) <= 1e-5
        assert chain.prism_calls == n + 1


def test_a_call_the_c_path_does_not_take_runs_the_pieces_one_by_one() -> None:
    m = Stack()
    opt = prism.optimize(m, (_x(1, 64),), capture="export", **OPTS)
    (chain,) = _chains(opt)
    seen: list[tuple] = []
    x = _x(1, 64, seed=1)
    with torch.inference_mode():
        opt(x)  # binds the C path
        fast = chain._fast
        assert fast is not None, chain._why_not
        chain._fast = lambda a: (seen.append(a), fast(a))[1]
        opt(x)
        chain._fast = fast
    (args,) = seen
    j = next(k for k, a in enumerate(args) if a is x)
    # a non-contiguous input of the same shape, another dtype, another shape: "not mine", nothing has run
    odd = _x(1, 128, seed=5)[:, ::2]
    assert not odd.is_contiguous()
    with torch.inference_mode():
        for bad in (odd, x.double(), _x(2, 64)):
            assert fast(args[:j] + (bad,) + args[j + 1:]) is None
        before = chain.prism_calls
        out = chain(*(args[:j] + (odd,) + args[j + 1:]))  # one by one, through the pieces' own checks
        assert chain.prism_calls == before
        ref = _f64(m, odd)
        assert _err(out[-1] if isinstance(out, tuple) else out, ref) <= 1e-5
    with torch.enable_grad():  # autograd recording: not the C path either
        w = args[j].clone().requires_grad_(True)
        assert fast(args[:j] + (w,) + args[j + 1:]) is None


def test_concurrent_calls_never_share_the_internal_buffers() -> None:
    m = Stack()
    opt = prism.optimize(m, (_x(1, 64),), capture="export", **OPTS)
    (chain,) = _chains(opt)
    xs = [_x(1, 64, seed=s) for s in range(8)]
    refs = [_f64(m, x) for x in xs]
    bad: list[float] = []

    def work(k: int) -> None:
        with torch.inference_mode():
            for _ in range(60):
                i = (k * 3 + _) % len(xs)
                e = _err(opt(xs[i]), refs[i])
                if e > 1e-5:
                    bad.append(e)

    with torch.inference_mode():
        opt(xs[0])
    assert chain._fast is not None
    ts = [threading.Thread(target=work, args=(k,)) for k in range(3)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert not bad


def test_options_turn_chains_off_and_large_outputs_do_not_chain() -> None:
    m = Stack()
    off = prism.optimize(m, (_x(1, 64),), capture="export", chains=False, **OPTS)
    assert off.report[-1].chains == [] and not _chains(off)
    rows = MAX_ELEMENTS // 64 + 1
    big = prism.optimize(m, (_x(rows, 64),), capture="export", **OPTS)
    assert big.report[-1].chains == [] and not _chains(big)
    x = _x(rows, 64, seed=3)
    with torch.inference_mode():
        assert _err(big(x), _f64(m, x)) <= 1e-5


class Residuals(nn.Module):
    """A residual stream whose adds the pieces around them cannot absorb (with ``Budget(max_ops=3)`` a Linear
    with its bias and ReLU fills a piece): each add but the last reads a piece's value and feeds the next Linear
    and the next add (two users: no consumer piece takes it)."""

    def __init__(self, d: int = 64) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.ls = nn.ModuleList(nn.Linear(d, d) for _ in range(3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for lin in self.ls:
            x = x + torch.relu(lin(x))
        return x


def test_a_lone_add_between_pieces_is_searched_so_the_chain_runs_through_it() -> None:
    from prism.frontend.partition import Budget
    m = Residuals()
    opt = prism.optimize(m, (_x(1, 64),), capture="export", budget=Budget(max_ops=3), **OPTS)
    rep = opt.report[-1]
    adds = [p for p in rep.pieces if p.ops == ["add"]]
    # the first two between pieces; the last one's value leaves the graph: no piece after it, nothing to join
    assert [p.status for p in adds] == ["prism", "prism", "small"], rep.table()
    assert len(rep.chains) == 1, rep.table()
    (chain,) = rep.chains
    assert len(chain.runners) == len(opt.prism_pieces()) == 5
    with torch.inference_mode():
        for seed in range(1, 4):
            x = _x(1, 64, seed=seed)
            assert _err(opt(x), _f64(m, x)) <= 1e-5
        assert chain._fast is not None, chain._why_not
    assert all(p.runner.prism_calls >= 3 for p in adds[:2])
    # without chains, or above a chain's sizes, a lone add is not worth a search: it stays in PyTorch
    off = prism.optimize(m, (_x(1, 64),), capture="export", budget=Budget(max_ops=3), chains=False, **OPTS)
    rows = MAX_ELEMENTS // 64 + 1
    big = prism.optimize(m, (_x(rows, 64),), capture="export", budget=Budget(max_ops=3), **OPTS)
    for o in (off, big):
        lone = [p for p in o.report[-1].pieces if p.ops == ["add"]]
        assert [p.status for p in lone] == ["small"] * 3, o.report[-1].table()


def test_a_lone_operator_of_values_from_outside_the_pieces_stays_in_pytorch() -> None:
    class Scaled(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            torch.manual_seed(0)
            self.a, self.b = nn.Linear(64, 64), nn.Linear(64, 64)

        def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            z = x * y   # two pieces read it, no piece's value goes in
            return torch.relu(self.a(z)) * torch.sigmoid(self.b(z))

    m = Scaled()
    opt = prism.optimize(m, (_x(1, 64), _x(1, 64, seed=1)), capture="export", **OPTS)
    (mul,) = [p for p in opt.report[-1].pieces if p.ops == ["mul"]]
    assert mul.status == "small", opt.report[-1].table()


class DecodeAttention(nn.Module):
    """One decode step of attention with a KV cache, as transformers writes it: the cache's cat and the
    attention (dynamic KV length) between Linears (static shapes)."""

    def __init__(self, d: int = 64, heads: int = 4) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.h, self.hd = heads, d // heads
        self.q, self.k, self.v, self.o = (nn.Linear(d, d) for _ in range(4))

    def forward(self, x: torch.Tensor, kc: torch.Tensor, vc: torch.Tensor) -> tuple:
        b, s, d = x.shape
        q = self.q(x).view(b, s, self.h, self.hd).transpose(1, 2)
        k = self.k(x).view(b, s, self.h, self.hd).transpose(1, 2)
        v = self.v(x).view(b, s, self.h, self.hd).transpose(1, 2)
        keys, values = torch.cat([kc, k], dim=-2), torch.cat([vc, v], dim=2)
        a = torch.nn.functional.scaled_dot_product_attention(q, keys, values)
        return self.o(a.transpose(1, 2).reshape(b, s, d)) + x, keys, values


def _compiled_decode_attention() -> tuple[Any, nn.Module, int]:
    """DecodeAttention under torch.compile(backend="prism"), its float64 copy, and the count of graph reports before
    its first call."""
    from prism.frontend import reports
    m = DecodeAttention()
    f = torch.compile(m, backend="prism", options=OPTS)
    ref = DecodeAttention().double()
    ref.load_state_dict(m.state_dict())
    return f, ref, len(reports())


def _decode_step(f: Any, ref: nn.Module, kv: int, seed: int) -> None:
    """One call at KV length ``kv``: every output as float64 computes it."""
    x, kc, vc = _x(1, 1, 64, seed=seed), _x(1, 4, kv, 16, seed=10 + seed), _x(1, 4, kv, 16, seed=20 + seed)
    for g, w in zip(f(x, kc, vc), ref(x.double(), kc.double(), vc.double())):
        assert g.shape == w.shape and _err(g, w) <= 1e-5


def _attention_lengths(first: int) -> list[int]:
    """The KV lengths the attention piece's runner has launchers for (its inputs' third dim), in the reports
    from ``first`` on."""
    from prism.frontend import reports
    (att,) = [r for g in reports()[first:] for c in g.chains for r in c.runners if r.kernel.symbols()]
    return sorted({max(s[2] for s in key if len(s) == 4) for key in att._compiled})


def test_a_decode_step_chains_the_cache_cat_and_the_dynamic_attention() -> None:
    from prism.frontend import reports
    f, ref, first = _compiled_decode_attention()
    with torch.no_grad():
        for n, kv in enumerate((8, 9, 10, 11, 12, 11)):
            _decode_step(f, ref, kv, n)
    chains = [c for r in reports()[first:] for c in r.chains]
    dyn = [c for c in chains if any(c.dynamic) and any(isinstance(m, Cat) for m in c.members)]
    assert dyn, [c.label for c in chains]
    (c,) = dyn
    assert c._fast is not None, c._why_not
    # Dynamo's dynamic graph came with length 9 (the members one by one, binding the C path); 10, 11 and 12,
    # new lengths for the attention's launcher (planned from the C path), and 11 again ran as one C call each
    assert c.prism_calls == 4, c.prism_calls
    assert [r.prism_calls for r in c.runners] == [5] * len(c.runners)


@pytest.mark.parametrize("ahead", [3, 0])
def test_a_decode_plans_the_next_kv_lengths_ahead(ahead: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """A KV length one past the last planned one plans the next PLAN_AHEAD lengths with it (the attention's template
    covers them): the calls there find their launcher and plan nothing, and compute what float64 does."""
    from prism.frontend import runtime as rt
    monkeypatch.setattr(rt, "PLAN_AHEAD", ahead)
    f, ref, first = _compiled_decode_attention()
    with torch.no_grad():
        for kv in (8, 9, 10):   # 8: Dynamo's static graph; 9: its dynamic one, the attention's first length
            _decode_step(f, ref, kv, kv)
        # the attention reads the cache and the new row: 11 is one past 10, and with it the next `ahead` lengths
        assert _attention_lengths(first) == list(range(10, 12 + ahead))
        for kv in range(11, 11 + ahead):   # found planned: nothing new
            _decode_step(f, ref, kv, kv)
        assert _attention_lengths(first) == list(range(10, 12 + ahead))
        _decode_step(f, ref, 11 + ahead, 0)   # one past the last planned: the next ones again
        assert _attention_lengths(first) == list(range(10, 13 + 2 * ahead))


def test_planning_ahead_runs_no_numeric_check_on_speculation(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    """A template that has not had its checks (here: never enough) checks each length at its own call: planning
    ahead leaves those lengths alone, and every call still computes what float64 does. (An empty cache and fresh
    kernels: the other tests' checks of the same program would otherwise be adopted.)"""
    from prism import api
    from prism.frontend import runtime as rt
    monkeypatch.setenv("PRISM_CACHE_DIR", str(tmp_path))
    api.clear_memory_caches()
    monkeypatch.setattr(rt, "PLAN_AHEAD", 3)
    monkeypatch.setattr(api, "TEMPLATE_CHECKS", 10 ** 6)
    checked: list[dict[str, int]] = []
    check = api.SuperKernel._check

    def counted(self: Any, impl: Any, env: Any, *a: Any, **k: Any) -> Any:
        if self.symbols():
            checked.append(dict(env))
        return check(self, impl, env, *a, **k)
    monkeypatch.setattr(api.SuperKernel, "_check", counted)
    f, ref, first = _compiled_decode_attention()
    with torch.no_grad():
        for kv in (8, 9, 10, 11):
            _decode_step(f, ref, kv, kv)
    # the attention reads KV lengths 10, 11, 12; its checks ran there (and at the pre-build's lengths past its tuned
    # one, 11-13), never at the lengths planning ahead would have reached (13-15 from 12)
    assert checked and max(v for env in checked for v in env.values()) <= 13, checked
    planned = _attention_lengths(first)
    assert planned[:3] == [10, 11, 12] and max(planned) <= 13, planned


class CacheUpdate(nn.Module):
    """A projection appended to a long cache: the chain's cat copies 256 KB, split between the threads."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.k = nn.Linear(64, 64)

    def forward(self, x: torch.Tensor, kc: torch.Tensor) -> torch.Tensor:
        k = self.k(x).view(1, 1, 4, 16).transpose(1, 2)
        return torch.cat([kc, k], dim=2)


def test_a_long_cache_copy_is_exact() -> None:
    m = CacheUpdate()
    kc = _x(1, 4, 1024, 16, seed=1)
    # through Dynamo: its view/transpose of the projection is one reshape the piece absorbs, so the piece and
    # the cat are consecutive (an exported graph keeps aten views there, which end a chain)
    opt = prism.optimize(m, (_x(1, 1, 64), kc), capture="dynamo", **OPTS)
    (chain,) = _chains(opt)
    assert any(isinstance(c, Cat) for c in chain.members)
    with torch.no_grad():
        for seed in range(2, 5):
            x, kc = _x(1, 1, 64, seed=seed), _x(1, 4, 1024, 16, seed=seed + 10)
            got = opt(x, kc)
            k = m.k(x).view(1, 1, 4, 16).transpose(1, 2)
            assert got.shape == (1, 4, 1025, 16) and got.is_contiguous()
            assert torch.equal(got[:, :, :1024], kc)   # the copy is exact
            assert _err(got[:, :, 1024:], k) <= 1e-5
    # prism.optimize's run of the example bound the C path; the three calls above took it
    assert chain._fast is not None and chain.prism_calls == 3
