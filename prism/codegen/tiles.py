"""Values during lowering: strided views of memory and lazy element-wise expressions over them.

A :class:`View` is a C pointer expression with a concrete shape and element strides: device tensors,
tiles that are windows into them (input iterators, permutes and splits of those are free), and
materialized tiles in per-thread scratch. An :class:`Expr` is a fused chain of element-wise operators
whose leaves are views (NumPy broadcasting); it is evaluated inside the loop nest of its consumer, so a
chain costs one pass over memory.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Union

from prism.codegen.prelude import c_float
from prism.errors import UnsupportedError
from prism.ir.ops import OPS


def contiguous_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    out = [1] * len(shape)
    for d in range(len(shape) - 2, -1, -1):
        out[d] = out[d + 1] * shape[d + 1]
    return tuple(out)


@dataclass(frozen=True)
class View:
    ptr: str
    shape: tuple[int, ...]
    strides: tuple[int, ...]

    @staticmethod
    def dense(ptr: str, shape: tuple[int, ...]) -> View:
        return View(ptr, tuple(shape), contiguous_strides(tuple(shape)))

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    def is_contiguous(self) -> bool:
        return all(s == c for s, c, n in zip(self.strides, contiguous_strides(self.shape), self.shape) if n != 1)

    def permute(self, perm: tuple[int, ...]) -> View:
        return View(self.ptr, tuple(self.shape[p] for p in perm), tuple(self.strides[p] for p in perm))

    def reshape(self, shape: tuple[int, ...]) -> View | None:
        """The same memory with a new shape, if that needs no copy (contiguous views only)."""
        if math.prod(shape) != self.numel:
            raise ValueError(f"reshape {self.shape} -> {shape}")
        return View.dense(self.ptr, shape) if self.is_contiguous() else None

    def offset(self, elems: int | str) -> View:
        if elems == 0 or elems == "0":
            return self
        return View(f"({self.ptr} + {elems})", self.shape, self.strides)

    def slice(self, dim: int, start: int, size: int) -> View:
        v = self.offset(start * self.strides[dim])
        return View(v.ptr, self.shape[:dim] + (size,) + self.shape[dim + 1:], self.strides)

    def with_ptr(self, ptr: str) -> View:
        return View(ptr, self.shape, self.strides)

    def bstrides(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        """Strides of this view broadcast (NumPy rules, right-aligned) to ``shape``."""
        pad = len(shape) - len(self.shape)
        if pad < 0:
            raise ValueError(f"cannot broadcast {self.shape} to {shape}")
        out = [0] * pad
        for n, s, want in zip(self.shape, self.strides, shape[pad:]):
            if n == want:
                out.append(s if n != 1 else 0)
            elif n == 1:
                out.append(0)
            else:
                raise ValueError(f"cannot broadcast {self.shape} to {shape}")
        return tuple(out)


@dataclass(frozen=True)
class Expr:
    """op(srcs...) element-wise, with NumPy broadcasting to ``shape``."""

    op: str
    arg: tuple
    srcs: tuple[Union[View, Expr], ...]
    shape: tuple[int, ...]


Operand = Union[View, Expr]


def leaves(x: Operand) -> list[View]:
    if isinstance(x, View):
        return [x]
    out: list[View] = []
    for s in x.srcs:
        out.extend(leaves(s))
    return out


# the element-wise operators' C lowerings come from their definitions (OpDef.c, prism.ir.elementwise)
ELEMENTWISE = frozenset(n for n, o in OPS.items() if o.elementwise and o.c is not None)


def scalar_c(op: str, arg: tuple, args: list[str]) -> str:
    """The C scalar expression of one element-wise operator applied to C expressions ``args``."""
    if op == "const":
        return c_float(arg[0])
    d = OPS.get(op)
    if d is None or d.c is None:
        raise UnsupportedError(f"no C lowering for element-wise operator {op!r}; supported: {sorted(ELEMENTWISE)}")
    return d.c(args, tuple(arg), c_float)


def render(x: Operand, access: dict[int, str]) -> str:
    """C expression for one element of ``x``; ``access[id(leaf)]`` is the C access of each leaf."""
    if isinstance(x, View):
        return access[id(x)]
    return scalar_c(x.op, x.arg, [render(s, access) for s in x.srcs])
