"""``prism.optimize(..., capture="export")``: exported once, called without Dynamo. Results match eager
(float32 vs float64 where stated), the Prism kernel runs (call counters), and every call the export did not
assume -- another static size, another non-tensor argument, a size outside the exported range -- runs the
original function with one log line, never a wrong result."""

from __future__ import annotations

import logging
from typing import Any

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn

import prism  # noqa: E402
from prism.frontend.direct import DirectCall  # noqa: E402

pytestmark = [pytest.mark.cpu, pytest.mark.usefixtures("fresh_dynamo")]

OPTS = {"top_k": 2, "time_limit": 60.0, "measure_machine": False}


def _err(got: torch.Tensor, ref: torch.Tensor) -> float:
    return float((got.double() - ref.double()).abs().max()) / max(float(ref.double().abs().max()), 1e-30)


class LinearGelu(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.lin = nn.Linear(32, 24)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.gelu(self.lin(x)) * 0.5


def _x(*shape: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def _calls(opt: Any) -> int:
    return sum(p.runner.prism_calls for p in opt.prism_pieces())


def _f64(m: nn.Module, x: torch.Tensor) -> torch.Tensor:
    import copy
    with torch.no_grad():
        return copy.deepcopy(m).double()(x.double())


def test_a_module_runs_on_prism_without_dynamo_and_sees_weight_updates() -> None:
    m = LinearGelu()
    opt = prism.optimize(m, (_x(4, 32),), capture="export", **OPTS)
    assert isinstance(opt._fn, DirectCall) and opt.report[0].source == "export"
    assert [p.label for p in opt.prism_pieces()] == ["linear+gelu+mul"]
    x = _x(4, 32, seed=1)
    with torch.inference_mode():
        before = _calls(opt)
        assert _err(opt(x), _f64(m, x)) <= 1e-5
        with torch.no_grad():
            m.lin.weight.mul_(-2.0)  # parameters are the module's own: the next call sees the update
        assert _err(opt(x), _f64(m, x)) <= 1e-5
        assert _calls(opt) == before + 2


def test_other_static_sizes_and_values_run_the_original_with_one_log_line(
        caplog: pytest.LogCaptureFixture) -> None:
    def fn(x: torch.Tensor, s: float) -> torch.Tensor:
        return torch.softmax(x * s, -1)

    opt = prism.optimize(fn, (_x(8, 16), 2.0), capture="export", **OPTS)
    with torch.inference_mode():
        calls = _calls(opt)
        assert _err(opt(_x(8, 16, seed=3), 2.0), torch.softmax(_x(8, 16, seed=3).double() * 2, -1)) <= 1e-5
        assert _calls(opt) == calls + 1
        with caplog.at_level(logging.WARNING, logger="prism"):
            for args in ((_x(9, 16), 2.0), (_x(8, 16), 3.0), (_x(8, 16).double(), 2.0)):
                got = opt(*args)
                assert got.dtype == args[0].dtype and torch.allclose(got, fn(*args))
            with pytest.raises(TypeError, match="missing 1 required positional argument"):
                opt(_x(8, 16))  # the original's own error
    assert _calls(opt) == calls + 1  # none of the four mismatching calls reached the kernel
    said = [r.getMessage() for r in caplog.records if "capture='export'" in r.getMessage()]
    assert len(said) == 1 and "size 9 in dim 0, exported as static 8" in said[0] and "dynamic={0: [0]}" in said[0]


def test_dynamic_dims_serve_other_sizes_and_the_exported_range_is_checked(
        caplog: pytest.LogCaptureFixture) -> None:
    m = LinearGelu()
    opt = prism.optimize(m, (_x(4, 32),), dynamic={0: [0]}, capture="export", **OPTS)
    with torch.inference_mode():
        calls = _calls(opt)
        for n in (3, 7):
            x = _x(n, 32, seed=n)
            assert _err(opt(x), _f64(m, x)) <= 1e-5
        assert _calls(opt) == calls + 2
        with caplog.at_level(logging.WARNING, logger="prism"):
            x = _x(4, 31)  # the static dim differs: the original function (which raises, like PyTorch)
            with pytest.raises(RuntimeError):
                opt(x)
    assert any("size 31 in dim 1, exported as static 32" in r.getMessage() for r in caplog.records)


def test_tuple_outputs_keep_their_structure() -> None:
    def fn(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return x.sum(-1), x.amax(-1)

    opt = prism.optimize(fn, (_x(8, 64),), capture="export", **OPTS)
    x = _x(8, 64, seed=5)
    with torch.inference_mode():
        s, mx = opt(x)
    assert _err(s, x.double().sum(-1)) <= 1e-5 and torch.equal(mx, x.amax(-1))


def test_a_function_that_does_not_export_says_so_and_names_the_fix() -> None:
    def fn(x: torch.Tensor) -> torch.Tensor:
        if x.sum() > 0:  # data-dependent control flow: no single graph
            return x * 2
        return x - 1

    with pytest.raises(prism.UnsupportedError, match="capture='auto'"):
        prism.optimize(fn, (_x(4, 8),), capture="export", **OPTS)
    with pytest.raises(ValueError, match="capture must be one of"):
        prism.optimize(fn, (_x(4, 8),), capture="aot", **OPTS)


def test_exported_transposes_and_unused_indices_stay_on_prism() -> None:
    """``w.T`` is ``aten.numpy_T`` in an exported graph, and ``torch.max(x, dim).values`` keeps the unused
    indices item: both run on Prism (no operator left to PyTorch), as through Dynamo."""
    w = _x(24, 32, seed=7)

    def linear_t(x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x @ w.T)

    def row_max(x: torch.Tensor) -> torch.Tensor:
        return torch.max(x, dim=-1).values

    x = _x(6, 32, seed=8)
    for fn, ref in ((linear_t, torch.relu(x.double() @ w.double().T)), (row_max, x.double().amax(-1))):
        opt = prism.optimize(fn, (x,), capture="export", **OPTS)
        assert [f.op for r in opt.report for f in r.fallbacks] == []
        with torch.inference_mode():
            calls = _calls(opt)
            assert _err(opt(x), ref) <= 1e-5
            assert _calls(opt) == calls + 1


@pytest.mark.parametrize("name", ["normalize", "mse_loss", "expand_mul"])
def test_exported_expands_run_in_one_piece(name: str) -> None:
    """An exported F.normalize (``x / norm.expand_as(x)``) and F.mse_loss (``broadcast_tensors`` first) are
    one Prism piece each, nothing left to PyTorch: the expand is read unexpanded by its broadcasting user."""
    fns = {"normalize": lambda x, y: torch.nn.functional.normalize(x, dim=-1),
           "mse_loss": lambda x, y: torch.nn.functional.mse_loss(x, y),
           "expand_mul": lambda x, y: x.amax(-1, keepdim=True).expand(16, 64) * y}
    fn = fns[name]
    x, y = _x(16, 64), _x(16, 64, seed=1)
    opt = prism.optimize(fn, (x, y), capture="export", **OPTS)
    assert [f.op for r in opt.report for f in r.fallbacks] == []
    assert len(opt.pieces()) == 1 and len(opt.prism_pieces()) == 1
    with torch.no_grad():
        got = opt(x, y)
    assert _calls(opt) >= 2
    assert _err(got, fn(x.double(), y.double())) <= 1e-5


@pytest.mark.parametrize("mask_kind", ["bool", "float"])
def test_attention_masks_from_pytorch_with_fully_masked_queries(mask_kind: str) -> None:
    """A mask PyTorch computes enters the attention piece as an input (a bool one converted per call to the
    additive bias); a query whose keys are all masked (a padded position) gets 0, as PyTorch's attention
    gives, not softmax's NaN; grouped KV heads and a mask shared by the heads."""
    q, k, v = _x(2, 4, 6, 16), _x(2, 2, 9, 16, seed=1), _x(2, 2, 9, 16, seed=2)
    m = _x(2, 1, 6, 9, seed=3) > 0
    m[0, 0, 2] = False
    m[1, 0, 5] = False
    mask = m if mask_kind == "bool" else torch.zeros(m.shape).masked_fill(~m, float("-inf"))

    def fn(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
    opt = prism.optimize(fn, (q, k, v, mask), capture="export", **OPTS)
    assert [f.op for r in opt.report for f in r.fallbacks] == [] and len(opt.prism_pieces()) == 1
    with torch.no_grad():
        got = opt(q, k, v, mask)
    ref = fn(q.double(), k.double(), v.double(), mask if mask_kind == "bool" else mask.double())
    assert _calls(opt) >= 2 and not got.isnan().any()
    assert torch.equal(got[0, :, 2], torch.zeros_like(got[0, :, 2])) and _err(got, ref) <= 1e-5


def test_a_graph_that_is_one_piece_is_called_through_the_piece(caplog: pytest.LogCaptureFixture) -> None:
    """A graph that is nothing but one piece over its inputs is called through the piece's C call (no guard, no
    graph forward); whatever that call does not take -- another size, an extra argument, another dtype, an input
    that records autograd -- goes the guarded way and runs the original, as for any exported graph."""
    def fn(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return (x * y).softmax(-1)

    args = (_x(8, 16), _x(8, 16, seed=1))
    opt = prism.optimize(fn, args, capture="export", **OPTS)
    assert isinstance(opt._fn, DirectCall) and opt._fn._piece is not None
    a, b = _x(8, 16, seed=5), _x(8, 16, seed=6)
    with torch.inference_mode():
        calls = _calls(opt)
        assert _err(opt(a, b), fn(a.double(), b.double())) <= 1e-5
        assert _calls(opt) == calls + 1
    with caplog.at_level(logging.WARNING, logger="prism"):
        with torch.inference_mode():
            for other in ((_x(9, 16), _x(9, 16)), (a.double(), b.double())):
                got = opt(*other)
                assert got.dtype == other[0].dtype and torch.allclose(got, fn(*other))
            with pytest.raises(TypeError):
                opt(a, b, a)  # the original's own error
        (runner,) = [p.runner for p in opt.prism_pieces()]
        assert runner.fallback.module is None    # the piece's PyTorch code is made at its first use
        g = a.clone().requires_grad_()
        got = opt(g, b)
        assert got.requires_grad and torch.allclose(got, fn(g, b))
        assert runner.fallback.module is not None and runner.fallback_calls == 1
    assert _calls(opt) == calls + 1  # none of the mismatching calls reached the kernel


# --- capture="auto" (the default): the export, and Dynamo for what it does not cover ---------------------------


def test_auto_is_the_default_and_exports() -> None:
    m = LinearGelu()
    opt = prism.optimize(m, (_x(4, 32),), **OPTS)
    assert opt.capture == "export" and isinstance(opt._fn, DirectCall) and not opt.note
    x = _x(4, 32, seed=3)
    with torch.inference_mode():
        before = _calls(opt)
        assert _err(opt(x), _f64(m, x)) <= 1e-5
        assert _calls(opt) == before + 1


def test_auto_sends_a_call_the_export_does_not_cover_through_dynamo(caplog: pytest.LogCaptureFixture) -> None:
    """Another static size: not the original in PyTorch (as capture="export") but a Dynamo capture, made on
    the first such call and said once, whose own Prism piece runs it."""
    m = LinearGelu()
    opt = prism.optimize(m, (_x(4, 32),), **OPTS)
    with caplog.at_level(logging.WARNING, logger="prism"), torch.inference_mode():
        for seed in (5, 6):
            x = _x(6, 32, seed=seed)
            assert _err(opt(x), _f64(m, x)) <= 1e-5
    said = [r.getMessage() for r in caplog.records if "does not match the export" in r.getMessage()]
    assert len(said) == 1 and "size 6 in dim 0" in said[0]
    assert [r.source for r in opt.report] == ["export", "dynamo"]
    dyn = opt.report[1].prism_pieces()
    assert dyn and all(p.runner.prism_calls == 2 for p in dyn)


def test_auto_sees_a_change_of_the_training_flag() -> None:
    """The export fixed dropout's mode: a module switched to training goes through Dynamo (dropout in PyTorch,
    in training mode), switched back it takes the export again."""
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(32, 32), nn.Dropout(0.5)).eval()
    opt = prism.optimize(m, (_x(8, 32),), **OPTS)
    x = _x(8, 32, seed=2)
    with torch.no_grad():
        assert _err(opt(x), _f64(m, x)) <= 1e-5
        m.train()
        y = opt(x)
        zeros = float((y == 0).float().mean())
        assert 0.3 < zeros < 0.7, zeros  # dropout ran (p = 0.5), as m(x) in training mode
        m.eval()
        calls = _calls(opt)
        assert _err(opt(x), _f64(m, x)) <= 1e-5
    assert opt.report[0].source == "export" and _calls(opt) > calls


def test_auto_captures_through_dynamo_what_does_not_export() -> None:
    def fn(x: torch.Tensor) -> torch.Tensor:
        if x.sum() > 0:  # data-dependent control flow: no single graph
            return torch.softmax(x * 2, -1)
        return torch.softmax(x - 1, -1)

    x = _x(4, 8)
    opt = prism.optimize(fn, (x,), **OPTS)
    assert opt.capture == "dynamo" and "could not export" in opt.note and "could not export" in opt.explain()
    with torch.no_grad():
        for v in (x, -x.abs() - 1):
            assert _err(opt(v), fn(v.double())) <= 1e-5
    assert opt.prism_pieces()


def test_units_computing_the_same_expression_count_their_operators_as_the_whole_graph_rule(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """W8A8's q, k and v projections each quantize the same rows: interned Prism nodes met again. The
    capture's walk (``capture._new_ops``, bounded by when each node was first met) gives every unit the
    operators the whole-graph rule gives: reachable from its result, not from its operands."""
    from prism.frontend import capture as cap_mod
    from prism.frontend.quantize import quantize_weights
    from prism.ir.node import toposort

    class QKV(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            torch.manual_seed(0)
            self.q, self.k, self.v = nn.Linear(64, 64), nn.Linear(64, 32), nn.Linear(64, 32)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            h = torch.rms_norm(x, (64,))
            return self.q(h)[..., :32] * self.k(h) + self.v(h)

    m = quantize_weights(QKV(), activations="int8")
    walked, checked = cap_mod._new_ops, []

    def both(b: Any, result: Any, operands: list[Any]) -> list[Any]:
        res = result if isinstance(result, tuple) else (result,)
        roots = [r.node for r in res if isinstance(r, cap_mod.Tensor)]
        stop = {o.node for o in operands if isinstance(o, cap_mod.Tensor)}
        before = set(toposort(list(stop)))
        want = {n for n in toposort(roots) if n not in before and n.op not in ("input", "output")}
        got = walked(b, result, operands)
        checked.append((set(got) == want, len(want), len(got) == len(set(got))))
        return got

    monkeypatch.setattr(cap_mod, "_new_ops", both)
    opt = prism.optimize(m, (_x(2, 64),), capture="export", **OPTS)
    assert checked and all(same and unique for same, _, unique in checked), checked
    assert sum(n for _, n, _ in checked) > 0
    x = _x(2, 64, seed=1)
    with torch.inference_mode():
        want = m(x)
        assert _err(opt(x), want) <= 1e-5
