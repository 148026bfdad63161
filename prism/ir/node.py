"""Interned IR nodes shared by kernel graphs and block graphs.

A node is (op, src, arg, shape, dtype). Nodes are immutable and interned: two structurally equal
nodes are the same object, so equality and hashing are identity (cheap), and common sub-expressions
are shared automatically. ``arg`` holds the operator's attributes as a hashable tuple.
"""

from __future__ import annotations

import contextvars
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from prism.ir.dims import DimLike, format_shape
from prism.ir.dtypes import DType

_INTERN: weakref.WeakValueDictionary = weakref.WeakValueDictionary()
# Part of every interning key: None, or the trace whose Traced sizes (prism/ir/traced.py) are being built. A
# traced node must never be found as an untraced one of the same value (that would drop the trace) nor the
# other way round, so nodes built inside a trace scope are interned apart. Per thread (a context variable): the
# background compiler (prism/tune/ahead.py) traces templates while the caller builds and checks graphs, and a
# process-wide scope interned the caller's nodes in the other thread's trace. Measured: llama-1b bf16, a new
# prompt length's pieces failed "block graph does not re-derive to itself" when their derived kernels were
# compiled (the rebuilt block graph's nodes were interned in the other scope), so they were tuned again instead
# (3 pieces, 0.6-2.9 s each, at every new length).
_SCOPE: contextvars.ContextVar[object] = contextvars.ContextVar("prism_interning_scope", default=None)


@contextmanager
def interning_scope(scope: object) -> Iterator[None]:
    """Nodes built inside (in this thread) are interned apart from every other scope's (see ``_SCOPE``)."""
    token = _SCOPE.set(scope)
    try:
        yield
    finally:
        _SCOPE.reset(token)


class Node:
    __slots__ = ("__weakref__", "arg", "dtype", "op", "shape", "src")
    op: str
    src: tuple[Node, ...]
    arg: Any
    shape: tuple[DimLike, ...]
    dtype: DType | None

    def __new__(cls, op: str, src: tuple[Node, ...], arg: Any, shape: tuple[DimLike, ...],
                dtype: DType | None) -> Node:
        key = (op, src, arg, shape, dtype, _SCOPE.get())
        n = _INTERN.get(key)
        if n is None:
            n = object.__new__(cls)
            n.op, n.src, n.arg, n.shape, n.dtype = op, src, arg, shape, dtype
            _INTERN[key] = n
        return n

    def __setattr__(self, name: str, value: object) -> None:
        if hasattr(self, "dtype"):
            raise AttributeError("Node is immutable")
        object.__setattr__(self, name, value)

    def __reduce__(self) -> tuple:
        return (Node, (self.op, self.src, self.arg, self.shape, self.dtype))

    @property
    def rank(self) -> int:
        return len(self.shape)

    def describe(self) -> str:
        return f"{self.op} {format_shape(self.shape)} {self.dtype}"

    def __repr__(self) -> str:
        return f"Node({self.op}, arg={self.arg!r}, shape={format_shape(self.shape)}, dtype={self.dtype})"


def toposort(roots: tuple[Node, ...] | list[Node]) -> list[Node]:
    """All nodes reachable from ``roots``, each after its sources (iterative: graphs can be deep)."""
    order: list[Node] = []
    seen: set[int] = set()
    stack: list[tuple[Node, bool]] = [(r, False) for r in reversed(list(roots))]
    while stack:
        n, done = stack.pop()
        if done:
            order.append(n)
            continue
        if id(n) in seen:
            continue
        seen.add(id(n))
        stack.append((n, True))
        for s in reversed(n.src):
            if id(s) not in seen:
                stack.append((s, False))
    return order
