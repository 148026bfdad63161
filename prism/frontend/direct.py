"""``prism.optimize(..., capture="export")``: capture once through ``torch.export``, call the result directly.

Through Dynamo (the default capture), every call of an optimized function pays Dynamo's frame evaluation
and guards, ~25-35 µs on a 2-core EPYC: more than many small programs take in eager PyTorch, so no fused
kernel can make them faster (docs/frontend.md, "Per-call cost"). This capture is the ahead-of-time
contract of ``torch.export`` instead: the function is exported once (non-strict), the exported graph is
cut and superoptimized like any other (``compile_fx``), and a call runs the rewritten graph's code after
checking only what the export assumed of the inputs:

- the count, and per input: a CPU tensor of the example's dtype and rank with the example's sizes
  (a dynamic dim: any size the exported program's own range check accepts); a non-tensor argument
  equal to the example's;
- for a module, the ``training`` flag it had at export (``model.train()`` / ``model.eval()`` set every
  submodule's);
- anything else -- and a function whose export fails -- is not guessed at. Under ``capture="auto"`` (the
  default of ``prism.optimize``) a call that does not match goes through a Dynamo capture of the same
  function, made on the first such call (Dynamo re-captures per input signature and guards the Python
  state), and a function that does not export is captured by Dynamo from the start. Under
  ``capture="export"`` a mismatching call runs the original function in PyTorch and a failing export
  raises (``ExportError``) with the reason and the fix; both are said in the ``prism`` log.

Python control flow, globals and non-tensor attributes are fixed at export; parameters and buffers are
the module's own tensors (``ExportedProgram.module()`` shares them), so in-place updates are seen.
"""

from __future__ import annotations

import contextlib
import io
import logging
import sys
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from prism.errors import UnsupportedError
from prism.frontend.capture import dynamic_dims
from prism.frontend.report import GraphReport
from prism.runtime import fastcall

log = logging.getLogger("prism")


class ExportError(UnsupportedError):
    """``torch.export`` could not export the function (data-dependent control flow, unsupported Python...).
    ``capture="auto"`` then captures through Dynamo; ``capture="export"`` raises this. ``reason``: what
    torch.export said (its exception type and first line)."""

    def __init__(self, reason: str) -> None:
        super().__init__(f"prism.optimize(capture='export'): torch.export could not export the function: {reason}. "
                         "Use capture='auto' (the default) or 'dynamo', which handle graph breaks and Python state "
                         "through Dynamo")
        self.reason = reason


class _AsModule(torch.nn.Module):
    """A plain function as the module ``torch.export`` takes (its positional arguments as ``*args``)."""

    def __init__(self, fn: Any) -> None:
        super().__init__()
        self.fn = fn

    def forward(self, *args: Any) -> Any:
        return self.fn(*args)


class DirectCall:
    """The callable of an exported, rewritten graph (see the module docstring)."""

    def __init__(self, gm: Any, original: Any, example: tuple, dynamic: list[set[int]],
                 otherwise: Callable[[], Callable[..., Any]] | None = None) -> None:
        self.gm = gm
        self.original = original
        # what runs a call that does not match: None -> the original in PyTorch (capture="export"); else a
        # factory of the callable (capture="auto": a Dynamo capture), made on the first such call
        self._otherwise_factory = otherwise
        self._otherwise: Callable[..., Any] | None = None
        # a module's training flag at export (the exported graph has its dropout / batch-norm mode fixed)
        self._training = original.training if isinstance(original, torch.nn.Module) else None
        self.n = len(example)
        # per input: (dtype, rank, ((dim, size) of the static dims), the whole shape when every dim is
        # static: one comparison) for a tensor, else ("value", example)
        self.specs: list[tuple] = []
        for x, dyn in zip(example, dynamic):
            if isinstance(x, Tensor):
                static = tuple((d, s) for d, s in enumerate(x.shape) if d not in dyn)
                self.specs.append((x.dtype, x.dim(), static, None if dyn else tuple(x.shape)))
            else:
                self.specs.append(("value", x))
        self.dynamic = any(dynamic)
        guards = [n for n in gm.graph.nodes if n.op == "call_module" and n.target == "_guards_fn"]
        # the exported program's own input check: kept (called here, before the graph) where dims are dynamic
        # (their ranges and relations); where every size is static, the checks above are the whole of it
        self._guards = getattr(gm, "_guards_fn", None) if self.dynamic else None
        for n in guards:
            gm.graph.erase_node(n)
        self.out_spec = getattr(gm, "_out_spec", None)
        self.leaf = self.out_spec is not None and self.out_spec.is_leaf()
        gm.graph._codegen = torch.fx.graph.CodeGen()  # flat positional inputs, the flat output tuple
        gm.recompile()
        self.forward = gm.forward
        self._warned = False
        # the checks below in one C call (runtime/fastcall.py), where the extension is built: it answers
        # True (the call is the exported program's) or False (the Python checks decide, with their messages)
        guard = fastcall.guard_type()
        self._fast = None if guard is None else guard(
            tuple(s if s[0] == "value" else (s[0], s[1], s[3], s[2]) for s in self.specs), Tensor)
        self._piece = self._sole_piece()

    def _sole_piece(self) -> Any:
        """The C call of the graph's only piece when the graph is nothing else (its inputs are the graph's
        tensor inputs in order, its one output the graph's): a call it accepts skips the guard, the graph's
        forward and the module call (~0.5-1 µs of a small program's ~10). Sound because the piece accepts only
        input shapes it compiled, and it compiles only shapes of calls that passed the guard."""
        from prism.frontend.runtime import PieceRunner
        if not self.leaf or self._guards is not None or any(s[0] == "value" for s in self.specs):
            return None
        nodes = list(self.gm.graph.nodes)
        ph = [n for n in nodes if n.op == "placeholder"]
        calls = [n for n in nodes if n.op not in ("placeholder", "output")]
        out = nodes[-1]
        if len(calls) != 1 or calls[0].op != "call_module" or list(calls[0].args) != ph or calls[0].kwargs:
            return None
        runner = getattr(self.gm, str(calls[0].target), None)
        if (not isinstance(runner, PieceRunner) or runner.out_slots is not None or runner._fast is None
                or out.op != "output" or tuple(out.args[0]) != (calls[0],)):
            return None
        return runner._fast

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self._training is not None and self.original.training is not self._training:
            return self._uncovered(f"the module's training flag is {self.original.training} (exported with "
                               f"{self._training})", args, kwargs)
        piece = self._piece
        if piece is not None and not kwargs and len(args) == self.n:
            outs = piece(args)
            if outs is not None and len(outs) == 1:
                return outs[0]
        fast = self._fast
        if not kwargs and fast is not None and fast(args):
            if self._guards is None and self.leaf:  # the common case without another Python call
                return self.forward(*args)[0]
            return self._run(args, kwargs)
        return self._checked(args, kwargs)

    def _checked(self, args: tuple, kwargs: dict) -> Any:
        if kwargs or len(args) != self.n:
            return self._uncovered(f"called with {len(args)} positional and {len(kwargs)} keyword arguments "
                               f"(exported with {self.n} positional)", args, kwargs)
        for a, spec in zip(args, self.specs):
            if spec[0] == "value":
                if not (type(a) is type(spec[1]) and a == spec[1]):
                    return self._uncovered(f"a non-tensor argument is {a!r} (exported with {spec[1]!r})", args, kwargs)
                continue
            if not isinstance(a, Tensor) or a.dtype is not spec[0] or not a.is_cpu or a.dim() != spec[1]:
                return self._uncovered(self._why(args), args, kwargs)
            if spec[3] is not None:
                if a.shape != spec[3]:
                    return self._uncovered(self._why(args), args, kwargs)
                continue
            shape = a.shape
            for d, s in spec[2]:
                if shape[d] != s:
                    return self._uncovered(self._why(args), args, kwargs)
        return self._run(args, kwargs)

    def _run(self, args: tuple, kwargs: dict) -> Any:
        if self._guards is not None:
            try:
                self._guards(*args)
            except Exception as e:  # a dynamic size outside the exported range: not this program
                return self._uncovered(f"the exported program's input check failed: {type(e).__name__}: "
                                   f"{str(e).splitlines()[0] if str(e) else ''}", args, kwargs)
        out = self.forward(*args)
        if self.leaf:
            return out[0]
        if self.out_spec is None:
            return out
        return torch.utils._pytree.tree_unflatten(list(out), self.out_spec)

    def _why(self, args: tuple) -> str:
        for i, (a, spec) in enumerate(zip(args, self.specs)):
            if spec[0] == "value":
                continue
            if not isinstance(a, Tensor):
                return f"input {i} is a {type(a).__name__}, not a tensor"
            if a.dtype is not spec[0]:
                return f"input {i} has dtype {a.dtype} (exported with {spec[0]})"
            if not a.is_cpu:
                return f"input {i} is on {a.device} (Prism's kernels run on the CPU)"
            if a.dim() != spec[1]:
                return f"input {i} has rank {a.dim()} (exported with rank {spec[1]})"
            for d, s in spec[2]:
                if a.shape[d] != s:
                    return (f"input {i} has size {a.shape[d]} in dim {d}, exported as static {s} (make the dim "
                            f"dynamic: prism.optimize(..., dynamic={{{i}: [{d}]}}))")
        return "the inputs do not match the export"

    def _uncovered(self, why: str, args: tuple, kwargs: dict) -> Any:
        """Run a call the export does not cover: through the Dynamo capture (``capture="auto"``) or the
        original function in PyTorch (``capture="export"``); said once per optimized function."""
        if self._otherwise_factory is not None:
            if self._otherwise is None:
                log.warning("prism: this call does not match the export (%s): it goes through a Dynamo capture of "
                            "the function, made now, which re-captures per input signature at Dynamo's per-call "
                            "cost. For inputs of varying sizes pass dynamic=... to prism.optimize. Said once per "
                            "optimized function", why)
                self._otherwise = self._otherwise_factory()
            return self._otherwise(*args, **kwargs)
        if not self._warned:
            self._warned = True
            log.warning("prism: capture='export': this call runs the original function in PyTorch: %s. Export "
                        "again for these inputs, or use capture='auto' or 'dynamo' (re-capture on new inputs). "
                        "Said once per optimized function", why)
        return self.original(*args, **kwargs)


def export_and_compile(fn_or_module: Any, args: tuple, dynamic: Any, opts: Any,
                       otherwise: Callable[[], Callable[..., Any]] | None = None) -> tuple[DirectCall, GraphReport]:
    """Export ``fn_or_module`` on ``args`` (``dynamic``: as for ``prism.optimize``), rewrite the exported
    graph's supported pieces into Prism kernels, and return the direct callable and the graph's report.
    ``otherwise``: see :class:`DirectCall`. Raises :class:`ExportError` where ``torch.export`` fails."""
    from prism.frontend.api import compile_fx

    dyn = dynamic_dims(list(args), dynamic)
    module = fn_or_module if isinstance(fn_or_module, torch.nn.Module) else _AsModule(fn_or_module)
    shapes: Any = None
    if any(dyn):
        per_arg = tuple({d: torch.export.Dim.AUTO for d in sorted(ds)} if ds else None for ds in dyn)
        shapes = (per_arg,) if isinstance(module, _AsModule) else per_arg
    # where a failure is not the end (capture="auto" goes on through Dynamo), torch's dump of the partial
    # graph to stderr on a failed export is dropped; what else reached stderr during an export that
    # succeeded (the function's own prints) is passed on
    err = io.StringIO() if otherwise is not None else None
    try:
        with contextlib.redirect_stderr(err) if err is not None else contextlib.nullcontext():
            ep = torch.export.export(module, args, dynamic_shapes=shapes, strict=False)
        if err is not None and err.getvalue():
            sys.stderr.write(err.getvalue())
    except Exception as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        raise ExportError(f"{type(e).__name__}: {first}") from e
    gm, report = compile_fx(ep, args, options=opts)
    return DirectCall(gm, fn_or_module, args, dyn, otherwise), report
