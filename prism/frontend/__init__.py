"""PyTorch integration: ``prism.optimize`` and ``torch.compile(model, backend="prism")``.

The only place Prism imports torch, and only lazily: importing this package does not import torch.

    opt = prism.optimize(model, (x,), dynamic={0: [0]})     # capture, cut, superoptimize (cached)
    with torch.no_grad():
        y = opt(x)                                           # pieces run as Prism kernels
    print(opt.explain())

    compiled = torch.compile(model, backend="prism")         # the same through Dynamo

See docs/frontend.md. ``reports()`` lists what every captured graph became (pieces run by Prism, pieces
and operators left to PyTorch, with reasons); every fallback is also logged on the ``prism`` logger.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
from typing import TYPE_CHECKING, Any

from prism.frontend.api import optimize
from prism.frontend.partition import Budget
from prism.frontend.report import GraphReport, PieceReport, clear_reports, reports

if TYPE_CHECKING:  # pragma: no cover
    from prism.frontend.api import Optimized
    from prism.frontend.compiler import Options

__all__ = ["SUPPORTED", "Budget", "GraphReport", "Int8DynLinear", "Int8Linear", "Optimized", "Options", "PieceReport",
           "clear_reports", "compile_fx", "optimize", "prism_backend", "quantize_weights", "register", "reports"]

_LAZY = {"Optimized": "prism.frontend.api", "compile_fx": "prism.frontend.api", "Options": "prism.frontend.compiler",
         "SUPPORTED": "prism.frontend.ops", "prism_backend": "prism.frontend.dynamo",
         "register": "prism.frontend.dynamo", "quantize_weights": "prism.frontend.quantize",
         "Int8Linear": "prism.frontend.quantize", "Int8DynLinear": "prism.frontend.quantize"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'prism.frontend' has no attribute {name!r}")


# --- registering the backend name without importing torch ------------------------------------------------

_REGISTRY = "torch._dynamo.backends.registry"


def _backend(gm: Any, example_inputs: Any, **kwargs: Any) -> Any:
    """``backend="prism"`` before prism.frontend.dynamo is imported: import it and delegate."""
    from prism.frontend.dynamo import prism_backend
    return prism_backend(gm, example_inputs, **kwargs)


def _register_into(registry: Any) -> None:
    """Register ``prism`` in torch's backend registry unless it is there, or an installed entry point names it:
    torch's lookup of that entry point imports prism (which landed here) and then registers what it names, so
    registering here too made every ``torch.compile(..., backend="prism")`` of a user who had not imported prism
    fail with "duplicate name: prism"."""
    if "prism" in registry._COMPILER_FNS or getattr(registry, "_BACKENDS", {}).get("prism") is not None:
        return
    registry.register_backend(_backend, name="prism")


class _RegisterOnLoad(importlib.abc.MetaPathFinder):
    """Registers ``prism`` right after torch's backend registry module executes (one shot)."""

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname != _REGISTRY:
            return None
        if self in sys.meta_path:
            sys.meta_path.remove(self)
        for finder in sys.meta_path:
            spec = getattr(finder, "find_spec", lambda *a: None)(fullname, path, target)
            if spec is not None and spec.loader is not None and hasattr(spec.loader, "exec_module"):
                inner = spec.loader.exec_module

                def exec_module(module: Any, _inner: Any = inner) -> None:
                    _inner(module)
                    _register_into(module)
                spec.loader.exec_module = exec_module  # type: ignore[method-assign]
                return spec
        return None


def _install() -> None:
    mod = sys.modules.get(_REGISTRY)
    if mod is not None:
        _register_into(mod)
    elif not any(isinstance(f, _RegisterOnLoad) for f in sys.meta_path):
        sys.meta_path.insert(0, _RegisterOnLoad())


_install()
