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


# Storage element types of views: the dtype of the memory a view reads or writes. Values are float32 in
# registers and scratch whatever the storage (prism.ir.dtypes: the mixed-precision rule); a load converts
# (exactly) and a store rounds. C types and the prelude's scalar converters (pr_ld_*, pr_st_*):
ELEMS = {"f32": "float", "bf16": "uint16_t", "f16": "uint16_t", "i8": "int8_t"}
_ELEM_OF = {"float32": "f32", "bfloat16": "bf16", "float16": "f16", "int8": "i8"}


def elem_of(dtype: object) -> str:
    """The view element type that stores ``dtype`` (a DType or its name)."""
    name = str(dtype)
    if name not in _ELEM_OF:
        raise UnsupportedError(f"code generation has no storage for dtype {name}; supported: {sorted(_ELEM_OF)}")
    return _ELEM_OF[name]


def ctype(elem: str) -> str:
    return ELEMS[elem]


def ld(elem: str, access: str) -> str:
    """The float value of the stored element ``access`` (a C lvalue of type ``ctype(elem)``)."""
    return access if elem == "f32" else f"pr_ld_{elem}({access})"


def st(elem: str, value: str) -> str:
    """The C value to store for float ``value`` in an element of type ``ctype(elem)`` (rounded to nearest)."""
    if elem == "f32":
        return value
    return f"pr_st_{elem}({value})"   # i8: an int8 value of the program (a cast's), integral: truncated, saturated


@dataclass(frozen=True)
class View:
    ptr: str
    shape: tuple[int, ...]
    strides: tuple[int, ...]
    elem: str = "f32"   # storage element type (ELEMS)

    @staticmethod
    def dense(ptr: str, shape: tuple[int, ...], elem: str = "f32") -> View:
        return View(ptr, tuple(shape), contiguous_strides(tuple(shape)), elem)

    def at(self, idx: str) -> str:
        """The float value of element ``idx`` (an offset in elements)."""
        return ld(self.elem, f"{self.ptr}[{idx}]")

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    def is_contiguous(self) -> bool:
        return all(s == c for s, c, n in zip(self.strides, contiguous_strides(self.shape), self.shape) if n != 1)

    def permute(self, perm: tuple[int, ...]) -> View:
        return View(self.ptr, tuple(self.shape[p] for p in perm), tuple(self.strides[p] for p in perm), self.elem)

    def reshape(self, shape: tuple[int, ...]) -> View | None:
        """The same memory with a new shape, if that needs no copy (contiguous views only)."""
        if math.prod(shape) != self.numel:
            raise ValueError(f"reshape {self.shape} -> {shape}")
        return View.dense(self.ptr, shape, self.elem) if self.is_contiguous() else None

    def offset(self, elems: int | str) -> View:
        if elems == 0 or elems == "0":
            return self
        return View(f"({self.ptr} + {elems})", self.shape, self.strides, self.elem)

    def slice(self, dim: int, start: int, size: int) -> View:
        v = self.offset(start * self.strides[dim])
        return View(v.ptr, self.shape[:dim] + (size,) + self.shape[dim + 1:], self.strides, self.elem)

    def with_ptr(self, ptr: str) -> View:
        return View(ptr, self.shape, self.strides, self.elem)

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


# the code generator's own element-wise operator: ``exp`` of a value known to be at most 0 (x - max(x)), which
# the prelude's pr_exp_le0 computes without pr_exp's overflow handling
EXP_LE0 = "exp_le0"


def scalar_c(op: str, arg: tuple, args: list[str]) -> str:
    """The C scalar expression of one element-wise operator applied to C expressions ``args``."""
    if op == "const":
        return c_float(arg[0])
    if op == EXP_LE0:
        return f"pr_exp_le0({args[0]})"
    d = OPS.get(op)
    if d is None or d.c is None:
        raise UnsupportedError(f"no C lowering for element-wise operator {op!r}; supported: {sorted(ELEMENTWISE)}")
    return d.c(args, tuple(arg), c_float)


def render(x: Operand, access: dict[int, str]) -> str:
    """C expression for one element of ``x``; ``access[id(leaf)]`` is the C access of each leaf."""
    if isinstance(x, View):
        return access[id(x)]
    return scalar_c(x.op, x.arg, [render(s, access) for s in x.srcs])
