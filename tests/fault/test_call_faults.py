"""Broken compilers, bad calls and bad files for the CLI (issue 12, "Also")."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest
from fault_support import LIMITS, inputs, rms_linear

import prism
from prism.errors import CompileError, InputError, PrismError
from prism.runtime import cache


def _exp_program() -> prism.Graph:
    g = prism.Graph("fault_exp")
    X = g.input("X", (4, 16))
    g.output(g.exp(X), "Y")
    return g


def _fake_cc(tmp_path: Path, body: str) -> str:
    """A compiler that behaves like gcc except for kernel libraries (``-shared``), where it runs ``body``."""
    cc = tmp_path / "fake-cc"
    cc.write_text('#!/bin/sh\ncase " $* " in *" -shared "*) ' + body + ';; esac\nexec gcc "$@"\n')
    cc.chmod(0o755)
    return str(cc)


def _compile_and_call() -> np.ndarray:
    k = prism.compile(_exp_program())
    return k(X=np.ones((4, 16), np.float32))


def test_compiler_that_exits_0_without_writing_the_library(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PRISM_CC", _fake_cc(tmp_path, "exit 0"))
    with pytest.raises(CompileError, match="wrote no shared library"):
        _compile_and_call()


def test_library_without_the_entry_point(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    other = tmp_path / "other.c"
    other.write_text("int unrelated(void) { return 0; }\n")
    # compile another source to the requested output (the last argument after -o)
    body = ('out=""; prev=""; for a in "$@"; do [ "$prev" = "-o" ] && out="$a"; prev="$a"; done; '
            f'exec gcc -shared -fPIC {other} -o "$out"')
    monkeypatch.setenv("PRISM_CC", _fake_cc(tmp_path, body))
    with pytest.raises(CompileError, match="prism_entry"):
        _compile_and_call()


def test_hanging_compiler_is_stopped_at_PRISM_CC_TIMEOUT_with_progress(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch,
                                                                       caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setenv("PRISM_CC", _fake_cc(tmp_path, "exec sleep 60"))
    monkeypatch.setenv("PRISM_CC_TIMEOUT", "2")
    monkeypatch.setattr(cache, "COMPILE_PROGRESS_S", 0.5)
    with caplog.at_level(logging.WARNING, logger="prism"), \
            pytest.raises(CompileError, match=r"within 2 s(.|\n)*PRISM_CC_TIMEOUT"):
        _compile_and_call()
    assert any("still compiling" in r.getMessage() for r in caplog.records)


def test_bad_PRISM_CC_TIMEOUT(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PRISM_CC_TIMEOUT", "soon")
    with pytest.raises(CompileError, match="PRISM_CC_TIMEOUT must be a number"):
        cache.compile_timeout()


def test_superoptimize_with_a_broken_compiler_names_the_compile_error(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PRISM_CC", _fake_cc(tmp_path, "exit 0"))
    k = prism.superoptimize(rms_linear(), limits=LIMITS, measure_machine=False)
    with pytest.raises(PrismError, match="wrote no shared library"):
        k(**inputs(4))


def test_torch_input_that_records_grad_is_rejected() -> None:
    torch = pytest.importorskip("torch")
    k = prism.compile(_exp_program())
    x = torch.ones((4, 16), requires_grad=True)
    with pytest.raises(InputError, match=r"inference-only.*torch\.no_grad"):
        k(X=x)
    with torch.no_grad():
        y = k(X=x)
    assert torch.allclose(y, torch.exp(torch.ones(4, 16)))


@pytest.mark.parametrize("args", [("x", None), (None, None), (_exp_program(), "y"), (3, _exp_program())])
def test_verify_checks_its_arguments(args: tuple) -> None:
    with pytest.raises(InputError, match=r"must be a prism\.Graph"):
        prism.verify(*args)


# --- prism optimize FILE.py ------------------------------------------------------------------------------

BAD_FILES = {
    "syntax": ("def broken(:\n", "syntax error at line 1"),
    "inputs": ("import torch\nmodel = lambda x: x * 2\nexample_inputs = 'hello'\n", "example_inputs must be"),
    "inputs_items": ("import torch\nmodel = lambda x: x * 2\nexample_inputs = ('hello',)\n", "argument 0: str"),
    "raises": ("import torch\ndef model(x):\n    raise ValueError('boom')\nexample_inputs = (torch.ones(2),)\n",
               "raised ValueError on example_inputs: boom"),
    "import": ("import no_such_module_anywhere\n", "raised ModuleNotFoundError"),
    "missing": ("x = 1\n", "must define `model`"),
    "not_callable": ("import torch\nmodel = 3\nexample_inputs = (torch.ones(2),)\n", "must be an nn.Module"),
}


@pytest.mark.parametrize("case", sorted(BAD_FILES))
def test_prism_optimize_bad_file_exits_2_with_one_message(case: str, tmp_path: Path,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("torch")
    from prism.frontend.cli import optimize_main
    text, expected = BAD_FILES[case]
    f = tmp_path / f"{case}.py"
    f.write_text(text)
    assert optimize_main([str(f)]) == 2
    err = capsys.readouterr().err
    assert expected in err and "Traceback" not in err and err.startswith("prism optimize:")


def test_prism_optimize_missing_file_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("torch")
    from prism.frontend.cli import optimize_main
    assert optimize_main([str(tmp_path / "nope.py")]) == 2
    assert "no such file" in capsys.readouterr().err


def test_compile_of_a_zero_size_matmul_names_the_dim() -> None:
    g = prism.Graph("fault_empty_mm")
    A, B = g.input("A", (4, 0)), g.input("B", (0, 3))
    g.output(g.matmul(A, B), "Y")
    with pytest.raises(prism.errors.UnsupportedError, match="zero-size dim"):
        prism.compile(g)(A=np.ones((4, 0), np.float32), B=np.ones((0, 3), np.float32))


def test_compile_of_a_zero_size_elementwise_program_works() -> None:
    g = prism.Graph("fault_empty_exp")
    X = g.input("X", (0, 16))
    g.output(g.exp(X), "Y")
    y = prism.compile(g)(X=np.ones((0, 16), np.float32))
    assert y.shape == (0, 16)


def test_prism_cache_retune_lists_and_retunes(capsys: pytest.CaptureFixture[str]) -> None:
    from prism.frontend.cli import cache_main
    assert cache_main(["retune", "--list"]) == 0
    assert "0 tuning entries are marked" in capsys.readouterr().out
    assert cache_main(["retune"]) == 0


def test_a_compiler_that_rejects_templates_leaves_every_value_served(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """Templates (codegen/template.py) are an optimization: a compiler that fails on them costs the kernel its
    templates (each failure recorded, at most runtime.kernel.TEMPLATE_TRIES tries), never a value."""
    from prism.runtime import kernel as K
    body = ('for a in "$@"; do case "$a" in *.c) if grep -q "prism template" "$a"; then '
            'echo "template refused" >&2; exit 1; fi;; esac; done')
    monkeypatch.setenv("PRISM_CC", _fake_cc(tmp_path, body))
    g = prism.Graph("fault_template")
    X = g.input("X", (3, "n"))
    g.output(g.softmax(g.mul_scalar(X, 0.5), -1), "Y")
    k = prism.compile(g, templates=True)
    rng = np.random.default_rng(0)
    for n in range(40, 48):
        x = rng.standard_normal((3, n)).astype(np.float32)
        ref = g.evaluate({"X": x.astype(np.float64)}, dtype=np.float64)["Y"]
        assert np.max(np.abs(k(X=x) - ref)) <= 1e-6, n
        assert "pr_dim_n" not in k.specialize(n=n).source   # generated and compiled for this value
    assert len(k.template_failures) == K.TEMPLATE_TRIES and not k._templates
    assert all("CompileError" in f for f in k.template_failures), k.template_failures
