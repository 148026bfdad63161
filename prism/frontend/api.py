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

    def __init__(self, fn: Callable[..., Any], original: Any, reports: list[GraphReport]) -> None:
        self._fn = fn
        self.original = original
        self.report = reports

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._fn(*args, **kwargs)

    def pieces(self) -> list[PieceReport]:
        return [p for r in self.report for p in r.pieces]

    def prism_pieces(self) -> list[PieceReport]:
        return [p for p in self.pieces() if p.by_prism]

    def explain(self, kernels: bool = False) -> str:
        """The report of every captured graph; ``kernels=True`` adds each Prism kernel's own explain
        (chosen sGraph, proof, tuning table, generated C)."""
        parts = [r.table() for r in self.report] or ["nothing captured yet"]
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


CAPTURES = ("dynamo", "export")


def optimize(fn_or_module: Any, example_inputs: Any, dynamic: Any = None, *, capture: str = "dynamo",
             options: Any = None, **option_kwargs: Any) -> Optimized:
    """Capture ``fn_or_module`` on ``example_inputs``, superoptimize what Prism supports, leave the rest to
    PyTorch, and return an :class:`Optimized` callable.

    ``fn_or_module``: a function or ``nn.Module`` (captured by Dynamo: graph breaks are fine), a
    ``torch.fx.GraphModule`` (e.g. from ``torch.fx.symbolic_trace``) or a ``torch.export.ExportedProgram``
    (captured directly, its own dynamic dims kept).

    ``dynamic``: which input dims are symbolic, so that one search serves every size of them —
    ``{0: [0]}`` or ``[[0], None]`` (input index -> dims; here dim 0 of the first input), ``True`` (every
    dim), ``False`` (none), ``None`` (Dynamo's default: static first, dynamic after a size changes, which
    costs a second search).

    ``capture``: ``"dynamo"`` (default) captures through ``torch.compile``: graph breaks are fine and Dynamo's
    guards re-capture when the function's Python state or input properties change, at a per-call cost
    (frame evaluation and guards: ~25-35 µs on a 2-core EPYC, more than many small programs take).
    ``"export"`` captures once through ``torch.export`` (non-strict) and calls the rewritten graph
    directly -- the ahead-of-time contract of ``torch.export``: Python control flow, globals and
    non-tensor attributes are fixed at capture (parameters and buffers are shared, so in-place updates
    are seen), the whole function must export (no graph breaks), and each call checks only the inputs
    (count, tensor, dtype, device, rank, static sizes; dynamic sizes by the exported program's own
    check). A call whose inputs do not match runs the original function in PyTorch, said once in the
    ``prism`` log with the fix. See docs/frontend.md, "Per-call cost".

    Options (keywords or ``options={...}``): ``time_limit`` (search seconds per piece), ``limits``
    (``prism.search.Limits``), ``top_k``, ``tune_budget_s``, ``measure_machine``, ``verbose``, ``budget``,
    ``progress`` — see :class:`prism.frontend.compiler.Options`.

    The example inputs are run once under ``torch.no_grad()`` so that the search and the tuning at their
    shapes happen now. Prism kernels have no backward: call the result under ``torch.no_grad()`` or
    ``torch.inference_mode()``; while autograd records, pieces run in PyTorch (logged once).
    """
    import torch

    from prism.frontend import dynamo

    args = _as_args(example_inputs)
    opts = _options(options, option_kwargs)
    if capture not in CAPTURES:
        raise ValueError(f"prism.optimize: capture must be one of {list(CAPTURES)}, got {capture!r}")
    reports: list[GraphReport] = []
    graph_given = isinstance(fn_or_module, (torch.export.ExportedProgram, torch.fx.GraphModule))
    if capture == "export" and not graph_given:
        from prism.frontend.direct import export_and_compile
        fn, report = export_and_compile(fn_or_module, args, dynamic, opts)
        reports.append(report)
    elif graph_given:
        gm, report = compile_fx(fn_or_module, args, dynamic=dynamic, options=opts)
        reports.append(report)
        fn: Callable[..., Any] = gm
    else:
        def backend(gm: torch.fx.GraphModule, example: list[Any]) -> Any:
            out = dynamo.prism_backend(gm, example, options=opts)
            from prism.frontend.report import reports as all_reports
            reports.append(all_reports()[-1])
            return out
        if dynamic is None or isinstance(dynamic, bool):
            fn = torch.compile(fn_or_module, backend=backend, dynamic=dynamic)
        else:
            from prism.frontend.capture import dynamic_dims
            marks = dynamic_dims(list(args), dynamic)
            marked = []
            for x, ds in zip(args, marks):
                if ds and isinstance(x, torch.Tensor):
                    x = x.view(x.shape)  # a new tensor object: the caller's tensor is not marked
                    for d in sorted(ds):
                        torch._dynamo.mark_dynamic(x, d)
                marked.append(x)
            args = tuple(marked)
            fn = torch.compile(fn_or_module, backend=backend)
    with torch.no_grad():
        fn(*args)
    return Optimized(fn, fn_or_module, reports)


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
