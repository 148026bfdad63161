"""Packages that are also functions: ``prism.search(graph)`` and ``prism.verify(candidate, reference)``
call a function while ``import prism.search.space`` / ``import prism.verify.egraph`` keep working (a function
bound to the package's name would hide the package from ``import prism.x.y as z``)."""

from __future__ import annotations

import sys
import types
from collections.abc import Callable
from typing import Any


def make_callable(package: str, fn: Callable[..., Any]) -> None:
    """Make the module object of ``package`` callable as ``fn``."""
    class CallablePackage(types.ModuleType):
        def __call__(self, *args: Any, **kwargs: Any) -> Any:
            return fn(*args, **kwargs)

    sys.modules[package].__class__ = CallablePackage
