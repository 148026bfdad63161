"""Prism's error types. Every error names the offending values and, where there is one, the fix."""

from __future__ import annotations


class PrismError(Exception):
    """Base class of every error Prism raises on purpose."""


class DimError(PrismError):
    """A dimension expression is malformed or cannot be evaluated (missing symbol, inexact division)."""


class InconclusiveDimError(DimError):
    """A comparison of symbolic dimensions cannot be decided for every value of the symbols.

    Prism never guesses: ``B == 8`` is neither true nor false for a symbolic ``B``. Fix it by making
    the dims structurally equal (use the same symbol), by substituting concrete values, or by
    comparing with :func:`prism.ir.dims.structurally_equal` when identity of form is what you mean.

    ``diff``: for an undecided equality ``a == b``, the dim ``a - b`` (the frontend uses it to identify two
    sizes PyTorch named differently, :mod:`prism.frontend.symbolic`); None for an inequality.
    """

    def __init__(self, msg: str, diff: object = None) -> None:
        super().__init__(msg)
        self.diff = diff


class ShapeError(PrismError):
    """Operand shapes do not fit an operator (matmul inner dims, broadcasting, reshape sizes...)."""


class DTypeError(PrismError):
    """An unknown dtype, or operands whose dtypes do not fit an operator."""


class GraphError(PrismError):
    """A kernel or block graph is ill-formed (no outputs, a cycle, a foreign tensor, a bad map...)."""


class MapError(GraphError):
    """An imap/fmap/omap is invalid: a dim out of range, or a split that does not divide the dim."""


class UnsupportedError(PrismError):
    """The program uses something Prism does not support; the message lists what is supported."""


class InputError(PrismError):
    """Arrays passed to evaluate/call do not match the graph's inputs (name, shape, dtype)."""


class CompileError(PrismError):
    """The C compiler rejected a generated source (or could not be run). The message names the source
    file, the command and the compiler's output; the source stays on disk for inspection."""


class CacheError(PrismError):
    """A cache entry could not be written anywhere (neither the cache directory nor a private temporary
    one). The message names both places and the fix (``PRISM_CACHE_DIR``)."""


class PrismWarning(UserWarning):
    """Base class of the warnings Prism emits (a corrupt cache entry rebuilt, a read-only cache, ...)."""


class CacheWarning(PrismWarning):
    """Something in the on-disk caches was damaged or unwritable; Prism worked around it (the message says
    how) and the result is unaffected."""
