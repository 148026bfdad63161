"""Prism: a symbolic superoptimizer for tensor programs (CPU first).

The public API is deliberately small::

    import prism
    g = prism.Graph()
    X = g.input("X", ("B", 1024)); W = g.input("W", (1024, 1024))
    g.output(g.matmul(g.rms_norm(X), W))
    g.evaluate({"X": x, "W": w})          # the NumPy reference
"""

from prism import reference as _reference  # noqa: F401 -- registers the interpreter behind Graph.evaluate
from prism import search, verify  # verify: the package, callable as the function (prism/verify/__init__.py)
from prism.api import superoptimize
from prism.errors import (
    DimError,
    DTypeError,
    GraphError,
    InconclusiveDimError,
    InputError,
    MapError,
    PrismError,
    ShapeError,
    UnsupportedError,
)
from prism.frontend import optimize
from prism.ir import BlockBuilder, BlockGraph, Dim, Graph, MapVar, Tensor, sym
from prism.runtime import compile

__version__ = "0.1.0"


def __getattr__(name: str) -> object:
    if name == "quantize_weights":   # imports torch: only when asked for
        from prism.frontend.quantize import quantize_weights
        return quantize_weights
    raise AttributeError(f"module 'prism' has no attribute {name!r}")

__all__ = ["BlockBuilder", "BlockGraph", "DTypeError", "Dim", "DimError", "Graph", "GraphError",
           "InconclusiveDimError", "InputError", "MapError", "MapVar", "PrismError", "ShapeError", "Tensor",
           "UnsupportedError", "compile", "optimize", "quantize_weights", "search", "superoptimize", "sym",
           "verify"]
