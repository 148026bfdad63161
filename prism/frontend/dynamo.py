"""``torch.compile(model, backend="prism")``: the Dynamo backend.

Registered under the name ``prism`` through the ``torch_dynamo_backends`` entry point (pyproject.toml)
and, for checkouts whose installed metadata predates it, by :func:`register` (called when this module is
imported, by ``prism.optimize``, and by ``import prism`` when torch is already imported).

Options: ``torch.compile(model, backend="prism", options={"time_limit": 30, "top_k": 2})`` — the fields
of :class:`prism.frontend.compiler.Options`. Dynamo hands the backend one graph per graph break; each
is captured, cut into pieces and superoptimized, and anything Prism cannot run stays PyTorch code.
The backend never raises: if capturing a graph fails, that graph runs as PyTorch with a log line.
"""

from __future__ import annotations

import logging
from typing import Any

import torch

from prism.frontend.compiler import Options, compile_graph, copy_module
from prism.frontend.report import new_report

log = logging.getLogger("prism")


def _module_state(node: Any, example: Any) -> bool:
    """Is this Dynamo graph input a parameter or buffer of the module (stable between calls)?"""
    if isinstance(example, torch.nn.Parameter):
        return True
    ga = node.meta.get("grapharg")
    src = getattr(ga, "source", None)
    try:
        name = src.name() if callable(getattr(src, "name", None)) else str(getattr(src, "name", ""))
    except Exception:  # an unusual source: treat as an ordinary input
        return False
    return "_parameters" in name or "_buffers" in name


def fold_float_inputs(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> list[tuple[int, float]]:
    """Fold Python floats that Dynamo made graph inputs back into constants; returns (input index, value) for
    each, the values every call must still pass (``guard_floats``).

    With ``dynamic=True`` (or a float that changed between calls) Dynamo does not bake a module's float
    attributes (an RMSNorm's ``eps``, attention's ``scaling``) into the graph: each is a 0-d float64 tensor input
    read with ``.item()``, a symbolic float that no kernel can take as a constant, so the norms and attention of
    a Llama were left to PyTorch under ``dynamic=True``. The example value is what every call passes unless
    the model's attribute is changed; the guard checks it per call and runs the graph in PyTorch if not."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    folded: list[tuple[int, float]] = []
    for i, (node, x) in enumerate(zip(placeholders, example_inputs)):
        ga = node.meta.get("grapharg")
        if not (isinstance(x, torch.Tensor) and x.dim() == 0 and x.dtype == torch.float64
                and getattr(ga, "pass_arg_as_tensor", False) and node.users
                and all(u.op == "call_method" and u.target == "item" for u in node.users)):
            continue
        try:
            value = float(x.item())
        except Exception:  # a fake or meta example: no value to fold
            continue
        for item in list(node.users):
            def const(a: Any, it: Any = item, v: float = value) -> Any:
                return v if a is it else a
            for user in list(item.users):
                user.args = torch.fx.node.map_aggregate(user.args, const)
                user.kwargs = torch.fx.node.map_aggregate(user.kwargs, const)
            gm.graph.erase_node(item)
        folded.append((i, value))
    if folded:
        gm.recompile()
    return folded


def guard_floats(fast: Any, slow: Any, floats: list[tuple[int, float]]) -> Any:
    """``fast`` (the graph with ``floats`` folded in) while every call passes those values, else ``slow`` (the
    graph as Dynamo gave it, in PyTorch), said once in the log."""
    if not floats:
        return fast
    warned: list[bool] = []

    def call(*args: Any) -> Any:
        for i, v in floats:
            if float(args[i]) != v:
                if not warned:
                    warned.append(True)
                    log.warning("prism: a float that Prism compiled as the constant %r is now %r (a changed module "
                                "attribute): this graph runs in PyTorch while it differs", v, float(args[i]))
                return slow(*args)
        return fast(*args)
    return call


def prism_backend(gm: torch.fx.GraphModule, example_inputs: list[Any], options: Any = None,
                  mode: str | None = None) -> Any:
    """The Dynamo backend (see the module docstring). ``mode`` (torch.compile's) is accepted and ignored:
    Prism always searches and tunes."""
    opts = Options.from_any(options)
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    persistent = {i for i, (n, x) in enumerate(zip(placeholders, example_inputs)) if _module_state(n, x)}
    try:
        work = copy_module(gm)
        floats = fold_float_inputs(work, example_inputs)
        new_gm, report = compile_graph(work, None, source="dynamo", options=opts, persistent_inputs=persistent)
    except Exception as e:  # never break the user's model: run this graph in PyTorch
        r = new_report("dynamo", len(gm.graph.nodes))
        r.error = f"{type(e).__name__}: {e}"
        log.warning("prism: capturing a Dynamo graph failed (%s); it runs in PyTorch", r.error)
        return gm.forward
    if not any(p.by_prism for p in report.pieces):
        return gm.forward  # nothing runs on Prism: Dynamo's own graph, no rewritten copy to pay for
    _hint_dynamic(placeholders)
    # the module's forward, not the module: Dynamo calls what the backend returns on every call, and a
    # module costs nn.Module.__call__ plus Dynamo's own wrapping of it (measured on a 1-piece graph:
    # 38.7 µs per call through the module, 32.4 µs through its forward)
    return guard_floats(new_gm.forward, gm.forward, floats)


_HINTED = False


def _hint_dynamic(placeholders: list[Any]) -> None:
    """Say once per process, when Dynamo's default (static first) hands over a graph made dynamic because a size
    changed, that ``dynamic=True`` would have compiled it at the first call: under the default, llama-1b bf16's
    first new prompt length compiled a dynamic graph whose pieces cost 13.9 s (inductor's 11.3 s), where with
    ``dynamic=True`` a new length cost 0.2 s (docs/frontend.md). Since then the pieces take their fixed-shape
    twins' searches and derive from their tunings (7.15 s for that length, Dynamo's trace 1.7 s of it)."""
    global _HINTED
    if _HINTED or not torch._dynamo.config.assume_static_by_default:
        return
    cid = torch._guards.CompileContext.current_compile_id()
    if cid is None or not getattr(cid, "frame_compile_id", 0):
        return   # the frame's first graph: dynamic because the user marked it so (mark_dynamic), not a recompile
    for n in placeholders:
        v = n.meta.get("example_value")
        if isinstance(v, torch.Tensor) and any(isinstance(d, torch.SymInt) for d in v.shape):
            _HINTED = True
            log.warning("prism: Dynamo recompiled a graph for a changed size (its default: static first, dynamic "
                        "after a size changes); Prism compiles that graph's pieces now, once, from the first "
                        "graph's searches and tunings (seconds). "
                        "torch.compile(..., backend=\"prism\", dynamic=True) compiles the dynamic graph at the "
                        "first call, and new sizes then cost well under a second")
            return


def register() -> None:
    """Register ``prism`` as a ``torch.compile`` backend name (idempotent)."""
    from torch._dynamo.backends import registry

    from prism.frontend import _register_into
    _register_into(registry)


register()
