"""The C launcher (prism/runtime/fastcall.py): the per-call path of the pieces in one C call. Same outputs
as the Python launcher, fresh outputs of the kernel's dtypes whatever torch's default dtype, the
thread-count rule of PRISM_NUM_THREADS (invalid values raise the usual error), the workspace (poisoned
with NaN under PRISM_POISON_WS=1, grown with the thread count, one for every launcher), concurrent callers,
wrong arguments raise, and the Python launcher where the extension cannot be built."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import numpy as np
import pytest
from cg_helpers import split_k_graph

torch = pytest.importorskip("torch")

import prism  # noqa: E402
from prism.errors import InputError  # noqa: E402
from prism.runtime import fastcall  # noqa: E402

pytestmark = pytest.mark.cpu


@pytest.fixture
def fresh() -> Iterator[None]:
    fastcall.reset()
    yield
    fastcall.reset()


def _split_k() -> prism.Kernel:
    """A block graph whose kernel uses a workspace and per-thread scratch (the K splits' partial sums)."""
    k = prism.compile(split_k_graph(row_sums=True), params={"S": 4})
    v = k.specialize()
    assert v.gen.ws_floats > 0 and v.gen.scratch_floats > 0
    return k


def _inputs() -> list:
    gen = torch.Generator().manual_seed(0)
    return [torch.randn(6, 128, generator=gen), torch.randn(128, 96, generator=gen)]


def _expected(ins: list) -> tuple[np.ndarray, np.ndarray]:
    y = ins[0].double().numpy() @ ins[1].double().numpy()
    return y, y.sum(1, keepdims=True)


def test_c_launcher_is_built_here(fresh: None) -> None:
    """On this machine (Python headers present, as CI's) the launcher is the C one: a regression that made
    it fail to build would otherwise only show as a slower call."""
    t = fastcall.launcher_type()
    assert t is not None, fastcall.WHY_NOT
    k = _split_k()
    launch = k.torch_launcher(((6, 128), (128, 96)))
    assert type(launch) is t


def test_c_and_python_launchers_agree(fresh: None, monkeypatch: pytest.MonkeyPatch) -> None:
    ins = _inputs()
    k = _split_k()
    c_out = k.torch_launcher(((6, 128), (128, 96)))(list(ins))
    monkeypatch.setenv("PRISM_C_LAUNCHER", "0")
    fastcall.reset()
    k2 = _split_k()
    py_launch = k2.torch_launcher(((6, 128), (128, 96)))
    assert type(py_launch).__name__ == "function" and fastcall.WHY_NOT == ["PRISM_C_LAUNCHER=0"]
    py_out = py_launch(list(ins))
    y, t = _expected(ins)
    for c, p, r in zip(c_out, py_out, (y, t)):
        assert c.dtype == torch.float32 and tuple(c.shape) == r.shape
        assert torch.equal(c, p)
        np.testing.assert_allclose(c.numpy(), r, rtol=1e-5, atol=1e-4)


def test_fresh_outputs_of_the_kernel_dtype_whatever_the_default(fresh: None) -> None:
    ins = _inputs()
    launch = _split_k().torch_launcher(((6, 128), (128, 96)))
    a = launch(list(ins))
    b = launch(list(ins))
    assert a[0].data_ptr() != b[0].data_ptr() and torch.equal(a[0], b[0])
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        c = launch(list(ins))
    finally:
        torch.set_default_dtype(old)
    assert [o.dtype for o in c] == [torch.float32, torch.float32]
    assert torch.equal(c[0], a[0]) and torch.equal(c[1], a[1])


def test_thread_count_rule_and_poisoned_workspace(fresh: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every thread count computes the same result from a workspace that starts as NaN (the scratch grows
    with the count); a PRISM_NUM_THREADS that is not a positive integer raises the Python rule's error,
    and whitespace around a number is accepted as there."""
    monkeypatch.setenv("PRISM_POISON_WS", "1")
    ins = _inputs()
    launch = _split_k().torch_launcher(((6, 128), (128, 96)))
    y, t = _expected(ins)
    for nth in ("1", "3", " 2 ", "", "8", "1"):
        monkeypatch.setenv("PRISM_NUM_THREADS", nth)
        out = launch(list(ins))
        np.testing.assert_allclose(out[0].numpy(), y, rtol=1e-5, atol=1e-4, err_msg=repr(nth))
        np.testing.assert_allclose(out[1].numpy(), t, rtol=1e-5, atol=1e-3, err_msg=repr(nth))
    for bad in ("0", "-2", "two"):
        monkeypatch.setenv("PRISM_NUM_THREADS", bad)
        with pytest.raises(InputError, match="PRISM_NUM_THREADS"):
            launch(list(ins))


def test_concurrent_callers(fresh: None) -> None:
    launch = _split_k().torch_launcher(((6, 128), (128, 96)))
    gens = [torch.Generator().manual_seed(i) for i in range(4)]
    inputs = [[torch.randn(6, 128, generator=g), torch.randn(128, 96, generator=g)] for g in gens]
    errors: list[str] = []

    def work(ins: list) -> None:
        y, _ = _expected(ins)
        for _ in range(200):
            out = launch(list(ins))
            if not np.allclose(out[0].numpy(), y, rtol=1e-5, atol=1e-4):
                errors.append("wrong result")
                return
    threads = [threading.Thread(target=work, args=(ins,)) for ins in inputs]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert errors == []


def test_one_workspace_for_every_launcher(fresh: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every C launcher of the process uses one launcher's workspace and lock (kernel.ARENA): two kernels of
    different workspace needs, called in turn at several thread counts over a NaN-poisoned workspace that
    grows to the largest need, each give their own right result."""
    monkeypatch.setenv("PRISM_POISON_WS", "1")
    ins = _inputs()
    y, t = _expected(ins)
    kernels = [_split_k(), prism.compile(split_k_graph(row_sums=True), params={"S": 2})]
    launches = [k.torch_launcher(((6, 128), (128, 96))) for k in kernels]
    owners = {id(la.workspace[1] or la) for la in launches}
    assert len(owners) == 1, "two launchers with workspaces of their own"
    needs = [(k.specialize().gen.ws_floats, k.specialize().gen.scratch_floats) for k in kernels]
    assert needs[0] != needs[1]
    most = 0
    for nth in ("1", "3", "2", "4"):
        monkeypatch.setenv("PRISM_NUM_THREADS", nth)
        for la in launches + launches[::-1]:
            out = la(list(ins))
            np.testing.assert_allclose(out[0].numpy(), y, rtol=1e-5, atol=1e-4, err_msg=nth)
            np.testing.assert_allclose(out[1].numpy(), t, rtol=1e-5, atol=1e-3, err_msg=nth)
        most = max([most] + [w + int(nth) * s for w, s in needs])
        assert launches[0].workspace[0] == launches[1].workspace[0] >= most


def test_wrong_arguments_raise(fresh: None) -> None:
    launch = _split_k().torch_launcher(((6, 128), (128, 96)))
    with pytest.raises(TypeError, match="list"):
        launch(tuple(_inputs()))
    with pytest.raises(AttributeError, match="data_ptr"):
        launch([object(), object()])
    with pytest.raises(TypeError):
        launch()


def test_python_launcher_where_the_extension_cannot_be_built(fresh: None, monkeypatch: pytest.MonkeyPatch,
                                                               tmp_path) -> None:
    monkeypatch.setattr(fastcall.sysconfig, "get_paths", lambda: {"include": str(tmp_path / "nowhere")})
    assert fastcall.launcher_type() is None
    assert "Python.h" in fastcall.WHY_NOT[0]
    ins = _inputs()
    out = _split_k().torch_launcher(((6, 128), (128, 96)))(list(ins))
    np.testing.assert_allclose(out[0].numpy(), _expected(ins)[0], rtol=1e-5, atol=1e-4)


# --- the piece runner's checked fast path (fastcall.Piece) --------------------------------------------

class _Kernel:
    """What a PieceRunner uses of a SuperKernel (program.bind, specialize(...).kernel), over a real compiled
    kernel with a symbolic batch dim."""

    def __init__(self) -> None:
        g = prism.Graph()
        g.output(g.relu(g.matmul(g.input("x0", ("n", 8)), g.input("x1", (8, 4)))), "y")
        self.program = g
        self.compiled = prism.compile(g)

    def specialize(self, **env: int) -> object:
        return type("Spec", (), {"kernel": self.compiled})()


class _Fallback(torch.nn.Module):
    def forward(self, x0: torch.Tensor, x1: torch.Tensor) -> torch.Tensor:
        return torch.relu(x0 @ x1) - 1000.0  # recognizably not the kernel's result


def test_piece_fast_path_checks_like_the_python_path(fresh: None) -> None:
    from prism.frontend.runtime import InputSpec, PieceRunner
    r = PieceRunner("0 (mm)", _Kernel(), [InputSpec("x0", None, False), InputSpec("x1", None, True)], _Fallback())
    assert r._fast is not None
    slow_calls: list[int] = []
    checked = r._checked

    def counting(args: tuple) -> object:
        slow_calls.append(1)
        return checked(args)
    r._checked = counting  # type: ignore[method-assign]
    gen = torch.Generator().manual_seed(1)
    x0, x1 = torch.randn(5, 8, generator=gen), torch.randn(8, 4, generator=gen)
    ref = torch.relu(x0 @ x1)
    with torch.no_grad():
        a = r(x0, x1)                         # a new shape: planned on the Python path
        b = r(x0, x1)                         # then the C path
        assert len(slow_calls) == 1 and r.prism_calls == 2 and r.fallback_calls == 0
        torch.testing.assert_close(a, ref)
        assert torch.equal(a, b) and a.data_ptr() != b.data_ptr()
        c = r(torch.randn(8, 5, generator=gen).t(), x1)  # not contiguous: the Python path copies it
        assert len(slow_calls) == 2 and r.prism_calls == 3 and c.shape == (5, 4)
        d = r(x0.double(), x1.double())       # another dtype: PyTorch
        assert len(slow_calls) == 3 and r.fallback_calls == 1 and d.dtype == torch.float64
        r(torch.randn(3, 8, generator=gen), x1)  # another batch: planned, then fast
        r(torch.randn(3, 8, generator=gen), x1)
        assert len(slow_calls) == 4 and r.prism_calls == 5
        r(x0, x1)
        assert len(slow_calls) == 4 and r.prism_calls == 6
    w = x1.clone().requires_grad_()
    with torch.enable_grad():
        e = r(x0, w)                          # autograd records: PyTorch
    assert len(slow_calls) == 5 and r.fallback_calls == 2 and e.requires_grad
    torch.testing.assert_close(e.detach(), ref - 1000.0)
    with torch.no_grad():
        f = r(x0, w)                          # the same tensor without grad mode: Prism, on the C path
    assert len(slow_calls) == 5 and r.prism_calls == 7
    torch.testing.assert_close(f, ref)


@pytest.mark.parametrize("c_launcher", [True, False])
def test_time_accounting_counts_kernels_and_piece_calls_only_while_on(fresh: None, monkeypatch: pytest.MonkeyPatch,
                                                                     c_launcher: bool) -> None:
    """``set_profiling``: kernel time and piece-call time (checks, allocation, launch, kernel) are counted on
    the C path and on the Python path alike, a kernel inside its piece call, and nothing while it is off."""
    from prism.frontend.runtime import InputSpec, PieceRunner
    if not c_launcher:
        monkeypatch.setenv("PRISM_C_LAUNCHER", "0")
    r = PieceRunner("0 (mm)", _Kernel(), [InputSpec("x0", None, False), InputSpec("x1", None, True)], _Fallback())
    assert (r._fast is not None) is c_launcher
    gen = torch.Generator().manual_seed(1)
    x0, x1 = torch.randn(5, 8, generator=gen), torch.randn(8, 4, generator=gen)
    with torch.no_grad():
        r(x0, x1)                              # planned and compiled: not counted
        p0 = fastcall.profile_totals()
        r(x0, x1)
        assert fastcall.profile_totals() == p0  # off: nothing counted
        fastcall.set_profiling(True)
        try:
            for _ in range(5):
                r(x0, x1)
            r(torch.randn(8, 5, generator=gen).t(), x1)   # the Python path (a copy first) on either launcher
        finally:
            fastcall.set_profiling(False)
        r(x0, x1)
    d = fastcall.profile_totals() - p0
    assert d.kernels == 6 and d.pieces == 6, d
    assert 0 < d.kernel_s < d.piece_s < 1.0, d


def test_transposed_inputs_take_the_python_path(fresh: None) -> None:
    from prism.frontend.runtime import InputSpec, PieceRunner
    r = PieceRunner("0 (mm)", _Kernel(), [InputSpec("x0", None, False), InputSpec("x1", (1, 0), True)],
                    _Fallback())
    assert r._fast is None


# --- capture="export"'s input check (fastcall.Guard) ----------------------------------------------------

def test_guard_accepts_exactly_the_exported_inputs(fresh: None) -> None:
    guard = fastcall.guard_type()((
        (torch.float32, 2, (4, 8), ()),                  # every dim static: the whole shape
        (torch.float32, 3, None, ((0, 2), (2, 5))),       # dim 1 dynamic
        ("value", 0.5),
    ), torch.Tensor)
    x, y = torch.randn(4, 8), torch.randn(2, 7, 5)
    assert guard((x, y, 0.5)) is True
    assert guard((x, torch.randn(2, 1, 5), 0.5)) is True       # any size in the dynamic dim
    assert guard((torch.nn.Parameter(x), y, 0.5)) is True      # a Tensor subclass
    for bad in [(x, y), (x, y, 0.5, 1), (x, y, 0.25), (x, y, 1), (x, y, "0.5"),
                (x.double(), y, 0.5), (torch.randn(4, 9), y, 0.5), (torch.randn(4, 8, 1), y, 0.5),
                (x, torch.randn(3, 7, 5), 0.5), (x, torch.randn(2, 7, 4), 0.5), (x, torch.randn(2, 7), 0.5),
                (x.numpy(), y, 0.5), (x.to(torch.bfloat16), y, 0.5), (x, y.to("meta"), 0.5)]:
        assert guard(bad) is False, bad
    with pytest.raises(TypeError):
        guard([x, y, 0.5])


def test_export_capture_takes_the_c_check_and_falls_back_with_a_reason(fresh: None,
                                                                        caplog: pytest.LogCaptureFixture) -> None:
    import logging

    def fn(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.relu(a @ b + 1.0)
    a, b = torch.randn(6, 8), torch.randn(8, 4)
    opt = prism.optimize(fn, (a, b), capture="export")
    direct = opt._fn
    assert direct._fast is not None
    with torch.no_grad():
        torch.testing.assert_close(opt(a, b), fn(a, b))
        b5 = torch.randn(8, 5)
        with caplog.at_level(logging.WARNING, logger="prism"):
            torch.testing.assert_close(opt(a, b5), fn(a, b5))   # another shape: the original function
    assert "exported as static" in caplog.text
