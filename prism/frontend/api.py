"""``prism.optimize``: superoptimize the supported parts of a PyTorch function or module.

Importing this module does not import torch (``prism.optimize`` is part of ``import prism``).
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Sequence
from typing import Any

from prism.frontend.report import GraphReport, PieceReport


class Optimized:
    """What ``prism.optimize`` returns: call it like the original. ``report`` lists the captured graphs
    (one per Dynamo graph break), ``pieces()`` the pieces, ``explain()`` says what runs where."""

    def __init__(self, fn: Callable[..., Any], original: Any, reports: list[GraphReport], capture: str,
                 note: str = "") -> None:
        self._fn = fn
        self.original = original
        self.report = reports
        self.capture = capture  # how it was captured: "export", "dynamo" or "graph" (a GraphModule / export given)
        self.note = note        # why capture="auto" went through Dynamo, if it did

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._fn(*args, **kwargs)

    def pieces(self) -> list[PieceReport]:
        return [p for r in self.report for p in r.pieces]

    def prism_pieces(self) -> list[PieceReport]:
        return [p for p in self.pieces() if p.by_prism]

    def explain(self, kernels: bool = False) -> str:
        """The report of every captured graph; ``kernels=True`` adds each Prism kernel's own explain
        (chosen sGraph, proof, tuning table, generated C)."""
        parts = ([f"captured through Dynamo: {self.note}"] if self.note else []) + \
            ([r.table() for r in self.report] or ["nothing captured yet"])
        if kernels:
            for p in self.prism_pieces():
                k = getattr(p.runner, "kernel", None)
                if k is not None:
                    parts += ["", f"=== piece {p.index} ({p.label})", k.explain()]
        return "\n".join(parts)

    def __repr__(self) -> str:
        n = len(self.prism_pieces())
        return f"<prism.Optimized {getattr(self.original, '__name__', type(self.original).__name__)}: " \
               f"{len(self.report)} graph(s), {n} Prism piece(s)>"


def _as_args(example_inputs: Any) -> tuple:
    import torch
    if isinstance(example_inputs, torch.Tensor):
        return (example_inputs,)
    if isinstance(example_inputs, (list, tuple)):
        return tuple(example_inputs)
    raise TypeError(f"example_inputs must be a tensor or a tuple of positional arguments, got "
                    f"{type(example_inputs).__name__}")


def _options(options: Any, kwargs: dict[str, Any]) -> Any:
    import dataclasses

    from prism.frontend.compiler import Options
    opts = Options.from_any(options)
    if kwargs:
        unknown = sorted(set(kwargs) - set(Options.__dataclass_fields__))
        if unknown:
            raise TypeError(f"prism.optimize: unknown options {unknown}; known: {sorted(Options.__dataclass_fields__)}")
        opts = dataclasses.replace(opts, **kwargs)
    return opts


CAPTURES = ("auto", "dynamo", "export")


def _dynamo_capture(fn_or_module: Any, args: tuple, dynamic: Any, opts: Any,
                    reports: list[GraphReport]) -> tuple[Callable[..., Any], tuple]:
    """``torch.compile`` of ``fn_or_module`` with Prism's backend (each captured graph's report appended to
    ``reports``), and the arguments to run it on first (``dynamic`` dims marked on aliases of ``args``)."""
    import torch

    from prism.frontend import dynamo

    def backend(gm: torch.fx.GraphModule, example: list[Any]) -> Any:
        out = dynamo.prism_backend(gm, example, options=opts)
        from prism.frontend.report import reports as all_reports
        reports.append(all_reports()[-1])
        return out
    if dynamic is None or isinstance(dynamic, bool):
        return torch.compile(fn_or_module, backend=backend, dynamic=dynamic), args
    from prism.frontend.capture import dynamic_dims
    marks = dynamic_dims(list(args), dynamic)
    marked = []
    for x, ds in zip(args, marks):
        if ds and isinstance(x, torch.Tensor):
            x = x.view(x.shape)  # a new tensor object: the caller's tensor is not marked
            for d in sorted(ds):
                torch._dynamo.mark_dynamic(x, d)
        marked.append(x)
    return torch.compile(fn_or_module, backend=backend), tuple(marked)


def optimize(fn_or_module: Any, example_inputs: Any, dynamic: Any = None, *, capture: str = "auto",
             options: Any = None, **option_kwargs: Any) -> Optimized:
    """Capture ``fn_or_module`` on ``example_inputs``, superoptimize what Prism supports, leave the rest to
    PyTorch, and return an :class:`Optimized` callable.

    ``fn_or_module``: a function or ``nn.Module`` (see ``capture``), a
    ``torch.fx.GraphModule`` (e.g. from ``torch.fx.symbolic_trace``) or a ``torch.export.ExportedProgram``
    (captured directly, its own dynamic dims kept).

    ``dynamic``: which input dims are symbolic, so that one search serves every size of them —
    ``{0: [0]}`` or ``[[0], None]`` (input index -> dims; here dim 0 of the first input), ``True`` (every
    dim), ``False`` (none), ``None`` (Dynamo's default: static first, dynamic after a size changes, which
    costs a second search).

    ``capture``:

    - ``"auto"`` (default): exported once through ``torch.export`` (non-strict) and called without Dynamo
      (~4 µs per call around the kernels instead of Dynamo's ~15-30), as ``"export"`` below; a call whose
      inputs do not match the export (count, tensor, dtype, device, rank, static sizes; a module's
      ``training`` flag) goes through a Dynamo capture made on the first such call, and a function that
      does not export (data-dependent control flow, ...) is captured by Dynamo from the start (said in the
      ``prism`` log). The export's contract is ``jax.jit``'s: Python control flow, globals and non-tensor
      attributes read by the function are fixed at capture (parameters and buffers are the module's own,
      so in-place updates are seen). A function whose Python state changes between calls needs
      ``"dynamo"``.
    - ``"dynamo"``: captured through ``torch.compile``: graph breaks are fine and Dynamo's guards
      re-capture when the function's Python state or input properties change, at Dynamo's per-call cost
      (frame evaluation and guards: ~10-25 µs on a 2-core EPYC, more than many small programs take).
    - ``"export"``: as ``"auto"``, but a function that does not export raises
      :class:`~prism.frontend.direct.ExportError`, and a call that does not match runs the original
      function in PyTorch, said once in the ``prism`` log with the fix.

    See docs/frontend.md, "Per-call cost".

    Options (keywords or ``options={...}``): ``time_limit`` (search seconds per piece), ``limits``
    (``prism.search.Limits``), ``top_k``, ``tune_budget_s``, ``measure_machine``, ``verbose``, ``budget``,
    ``progress`` — see :class:`prism.frontend.compiler.Options`.

    The example inputs are run once under ``torch.no_grad()`` so that the search and the tuning at their
    shapes happen now. Prism kernels have no backward: call the result under ``torch.no_grad()`` or
    ``torch.inference_mode()``; while autograd records, pieces run in PyTorch (logged once).
    """
    import logging

    import torch

    args = _as_args(example_inputs)
    opts = _options(options, option_kwargs)
    if capture not in CAPTURES:
        raise ValueError(f"prism.optimize: capture must be one of {list(CAPTURES)}, got {capture!r}")
    reports: list[GraphReport] = []
    fn: Callable[..., Any] | None = None
    note = ""
    if isinstance(fn_or_module, (torch.export.ExportedProgram, torch.fx.GraphModule)):
        gm, report = compile_fx(fn_or_module, args, dynamic=dynamic, options=opts)
        reports.append(report)
        fn, how = gm, "graph"
    elif capture in ("auto", "export"):
        from prism.frontend.direct import ExportError, export_and_compile

        def through_dynamo() -> Callable[..., Any]:
            return _dynamo_capture(fn_or_module, args, None, opts, reports)[0]
        try:
            fn, report = export_and_compile(fn_or_module, args, dynamic, opts,
                                            through_dynamo if capture == "auto" else None)
            reports.append(report)
            how = "export"
        except ExportError as e:
            if capture == "export":
                raise
            note = f"torch.export could not export the function: {e.reason}"
            logging.getLogger("prism").info("prism.optimize: %s -- captured through Dynamo instead", note)
    if fn is None:
        fn, args = _dynamo_capture(fn_or_module, args, dynamic, opts, reports)
        how = "dynamo"
    with torch.no_grad():
        fn(*args)
    return Optimized(fn, fn_or_module, reports, how, note)


def compile_fx(gm_or_exported: Any, example_inputs: Sequence[Any] | None = None, dynamic: Any = None,
               options: Any = None) -> tuple[Any, GraphReport]:
    """Rewrite a copy of an FX ``GraphModule`` (``torch.fx.symbolic_trace``) or of an ``ExportedProgram``'s
    module: returns ``(module, report)``. ``example_inputs`` and ``dynamic`` are needed for graphs without
    fake values (symbolic_trace); an exported program carries its own."""
    import torch

    from prism.frontend.compiler import Options, compile_graph, copy_module

    opts = Options.from_any(options)
    if isinstance(gm_or_exported, torch.export.ExportedProgram):
        gm, source = gm_or_exported.module(), "export"
    elif isinstance(gm_or_exported, torch.fx.GraphModule):
        gm, source = gm_or_exported, "fx"
    else:
        raise TypeError(f"compile_fx expects a torch.fx.GraphModule or torch.export.ExportedProgram, got "
                        f"{type(gm_or_exported).__name__}")
    work = copy_module(gm)
    if source == "export":
        # an exported graph keeps the unused items of a tuple result (the indices of ``torch.max(x, dim)``
        # when only ``.values`` is used); such an item is a use of a dtype Prism does not store
        for n in list(work.graph.nodes):
            if n.op == "call_function" and n.target is operator.getitem and not n.users:
                work.graph.erase_node(n)
    ex = list(example_inputs) if example_inputs is not None else None
    return compile_graph(work, ex, source=source, options=opts, dynamic=dynamic)
