"""Numeric interpretation of the term language in NumPy (float64).

Used to check every rule on random tensors (the axiom self-check) and to test that the translation of
a block graph means what the block-graph simulator computes. A value is a :class:`FamilyValue`: a
map from an assignment of its free parallel dims to an array (a plain tensor has no free dims).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np

from prism.errors import PrismError
from prism.ir.ops import OPS, parse_term_name
from prism.reference.numpy_ops import IMPL
from prism.verify.terms import Sexp, Str, Var


class TermShapeError(ValueError):
    """The operands of a term do not fit (the instantiation is not well-shaped)."""


@dataclass(frozen=True)
class Pdim:
    """A parallel dim: name and size."""

    name: str
    size: int


@dataclass
class FamilyValue:
    dims: tuple[str, ...]                        # free parallel dims, sorted by name
    sizes: dict[str, int]
    data: dict[tuple[int, ...], np.ndarray]

    @staticmethod
    def plain(a: np.ndarray) -> FamilyValue:
        return FamilyValue((), {}, {(): np.asarray(a, dtype=np.float64)})

    def member(self, assign: Mapping[str, int]) -> np.ndarray:
        return self.data[tuple(assign[d] for d in self.dims)]

    @property
    def shape(self) -> tuple[int, ...]:
        return next(iter(self.data.values())).shape


def _lift(fn: Callable[..., np.ndarray], *vals: FamilyValue) -> FamilyValue:
    sizes: dict[str, int] = {}
    for v in vals:
        for d, n in v.sizes.items():
            if sizes.get(d, n) != n:
                raise TermShapeError(f"parallel dim {d} has sizes {sizes[d]} and {n}")
            sizes[d] = n
    dims = tuple(sorted(sizes))
    data = {}
    for idx in itertools.product(*(range(sizes[d]) for d in dims)):
        assign = dict(zip(dims, idx))
        with np.errstate(all="ignore"):
            try:
                data[idx] = np.asarray(fn(*(v.member(assign) for v in vals)), dtype=np.float64)
            except (ValueError, IndexError, np.exceptions.AxisError) as e:
                raise TermShapeError(str(e)) from None
    return FamilyValue(dims, sizes, data)


def _axis(x: np.ndarray, d: int) -> int:
    if not -x.ndim <= d < 0:
        raise TermShapeError(f"dim {d} does not exist in a tensor of shape {x.shape}")
    return d


def _partition(v: FamilyValue, d: int, p: Pdim) -> FamilyValue:
    if p.name in v.dims:
        raise TermShapeError(f"partition over {p.name}: the operand already depends on it")
    sizes = {**v.sizes, p.name: p.size}
    dims = tuple(sorted(sizes))
    data = {}
    for idx, a in v.data.items():
        _axis(a, d)
        if a.shape[d] % p.size:
            raise TermShapeError(f"extent {a.shape[d]} is not divisible by {p.size}")
        for i, chunk in enumerate(np.split(a, p.size, axis=d)):
            assign = {**dict(zip(v.dims, idx)), p.name: i}
            data[tuple(assign[x] for x in dims)] = chunk
    return FamilyValue(dims, sizes, data)


def _replicate(v: FamilyValue, p: Pdim) -> FamilyValue:
    if p.name in v.dims:
        raise TermShapeError(f"replicate over {p.name}: the operand already depends on it")
    sizes = {**v.sizes, p.name: p.size}
    dims = tuple(sorted(sizes))
    data = {}
    for idx, a in v.data.items():
        for i in range(p.size):
            assign = {**dict(zip(v.dims, idx)), p.name: i}
            data[tuple(assign[x] for x in dims)] = a
    return FamilyValue(dims, sizes, data)


def _fold(v: FamilyValue, p: Pdim, how: Callable[[list[np.ndarray]], np.ndarray]) -> FamilyValue:
    if p.name not in v.dims:
        raise TermShapeError(f"combine/reduce over {p.name}: the operand does not depend on it")
    if v.sizes[p.name] != p.size:
        raise TermShapeError(f"parallel dim {p.name} has sizes {v.sizes[p.name]} and {p.size}")
    rest = tuple(d for d in v.dims if d != p.name)
    data = {}
    for idx in itertools.product(*(range(v.sizes[d]) for d in rest)):
        assign = dict(zip(rest, idx))
        members = [v.member({**assign, p.name: i}) for i in range(p.size)]
        try:
            data[idx] = how(members)
        except ValueError as e:
            raise TermShapeError(str(e)) from None
    return FamilyValue(rest, {d: v.sizes[d] for d in rest}, data)


def _concat(a: np.ndarray, b: np.ndarray, d: int, s1: int, s2: int) -> np.ndarray:
    if a.shape[_axis(a, d)] != s1 or b.shape[_axis(b, d)] != s2:
        raise TermShapeError(f"concat parts {a.shape}, {b.shape} do not have extents {s1}, {s2} along {d}")
    return np.concatenate([a, b], axis=d)


def _slice(x: np.ndarray, d: int, start: int, length: int) -> np.ndarray:
    if start + length > x.shape[_axis(x, d)]:
        raise TermShapeError(f"slice [{start}, {start + length}) out of range for extent {x.shape[d]}")
    sl = [slice(None)] * x.ndim
    sl[d] = slice(start, start + length)
    return x[tuple(sl)]


def _split_axis(x: np.ndarray, d: int, a: int, b: int) -> np.ndarray:
    ax = x.ndim + _axis(x, d)
    if x.shape[ax] != a * b:
        raise TermShapeError(f"cannot split extent {x.shape[ax]} into ({a}, {b})")
    return x.reshape(x.shape[:ax] + (a, b) + x.shape[ax + 1:])


def _squeeze(x: np.ndarray, k: int) -> np.ndarray:
    if x.shape[_axis(x, k)] != 1:
        raise TermShapeError(f"cannot squeeze dim {k} of shape {x.shape}")
    return np.squeeze(x, axis=k)


def _unsqueeze(x: np.ndarray, k: int) -> np.ndarray:
    if not -(x.ndim + 1) <= k < 0:
        raise TermShapeError(f"cannot insert an axis at {k} into shape {x.shape}")
    return np.expand_dims(x, axis=k)


def _matmul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    if a.ndim < 2 or b.ndim < 2:
        raise TermShapeError("matmul needs rank >= 2")
    return np.matmul(a, b)


def _binary(fn: Callable[[np.ndarray, np.ndarray], np.ndarray]) -> Callable[[np.ndarray, np.ndarray], np.ndarray]:
    def run(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        np.broadcast_shapes(a.shape, b.shape)  # raises ValueError -> TermShapeError
        return fn(a, b)
    return run


_BIN = {o.term_head: (lambda impl: lambda a, b: impl((a, b), ()))(o.numpy)
        for o in OPS.values() if o.group == "binary" and o.numpy is not None}
_RED = {o.term_head: o.numpy for o in OPS.values() if o.group == "reduction" and o.numpy is not None}  # keepdim


def _unary(name: str, x: np.ndarray) -> np.ndarray:
    try:
        op, arg = parse_term_name(name)
    except PrismError:
        raise TermShapeError(f"unknown unary operator {name!r}") from None
    return IMPL[op]([x], arg)


class Interpreter:
    """Evaluates terms. ``size_of`` resolves size strings (parallel-dim sizes, split extents)."""

    def __init__(self, inputs: Mapping[str, np.ndarray], size_of: Callable[[str], int],
                 bindings: Mapping[str, object] | None = None) -> None:
        self.inputs = inputs
        self.size_of = size_of
        self.bindings = dict(bindings or {})
        self.memo: dict[int, object] = {}

    def eval(self, e: Sexp) -> object:
        key = id(e)
        if isinstance(e, tuple) and key in self.memo:
            return self.memo[key]
        out = self._eval(e)
        if isinstance(e, tuple):
            self.memo[key] = out
        return out

    def tensor(self, e: Sexp) -> FamilyValue:
        v = self.eval(e)
        if not isinstance(v, FamilyValue):
            raise TermShapeError(f"expected a tensor term, got {v!r}")
        return v

    def _eval(self, e: Sexp) -> object:
        if isinstance(e, Var):
            if e.name not in self.bindings:
                raise KeyError(f"unbound pattern variable {e.name}")
            return self.bindings[e.name]
        if isinstance(e, Str):
            return e.value
        if not isinstance(e, tuple):
            return e
        head, *args = e
        if head in ("-", "+", "*", "max", "min"):
            a, b = (self.eval(x) for x in args)
            return {"-": a - b, "+": a + b, "*": a * b, "max": max(a, b), "min": min(a, b)}[head]  # type: ignore[operator]
        if head == "P":
            name, sz = (self.eval(x) for x in args)
            return Pdim(str(name), self.size_of(str(sz)))
        if head == "In":
            name = self.eval(args[0])
            return FamilyValue.plain(self.inputs[name])  # type: ignore[index]
        t = self.tensor
        if head == "Un":
            f = self.eval(args[0])
            return _lift(lambda x: _unary(str(f), x), t(args[1]))
        if head in ("Scale", "Shift"):
            c = float(self.eval(args[1]))  # type: ignore[arg-type]
            return _lift((lambda x: x * c) if head == "Scale" else (lambda x: x + c), t(args[0]))
        if head in _BIN:
            return _lift(_binary(_BIN[head]), t(args[0]), t(args[1]))
        if head == "Matmul":
            return _lift(_matmul, t(args[0]), t(args[1]))
        if head in _RED:
            d = int(self.eval(args[1]))  # type: ignore[arg-type]
            fn = _RED[head]
            return _lift(lambda x: fn((x,), (_axis(x, d),)), t(args[0]))
        if head == "Transpose":
            i, j = (int(self.eval(x)) for x in args[1:])  # type: ignore[arg-type]
            return _lift(lambda x: np.swapaxes(x, _axis(x, i), _axis(x, j)), t(args[0]))
        if head == "Unsqueeze":
            k = int(self.eval(args[1]))  # type: ignore[arg-type]
            return _lift(lambda x: _unsqueeze(x, k), t(args[0]))
        if head == "Squeeze":
            k = int(self.eval(args[1]))  # type: ignore[arg-type]
            return _lift(lambda x: _squeeze(x, k), t(args[0]))
        if head == "SplitAxis":
            d = int(self.eval(args[1]))  # type: ignore[arg-type]
            a, b = (self.size_of(str(self.eval(x))) for x in args[2:])
            return _lift(lambda x: _split_axis(x, d, a, b), t(args[0]))
        if head == "Reshape":
            shape = tuple(self.size_of(s) for s in str(self.eval(args[1])).split(","))
            return _lift(lambda x: _reshape(x, shape), t(args[0]))
        if head == "Concat":
            d = int(self.eval(args[2]))  # type: ignore[arg-type]
            s1, s2 = (self.size_of(str(self.eval(x))) for x in args[3:])
            return _lift(lambda a, b: _concat(a, b, d, s1, s2), t(args[0]), t(args[1]))
        if head == "Slice":
            d = int(self.eval(args[1]))  # type: ignore[arg-type]
            st, ln = (self.size_of(str(self.eval(x))) for x in args[2:])
            return _lift(lambda x: _slice(x, d, st, ln), t(args[0]))
        if head in ("Partition", "Combine"):
            x = t(args[0])
            d = int(self.eval(args[1]))  # type: ignore[arg-type]
            p = self.eval(args[2])
            assert isinstance(p, Pdim)
            if head == "Partition":
                return _partition(x, d, p)
            return _fold(x, p, lambda ms: np.concatenate([_check_axis(m, d) for m in ms], axis=d))
        if head in ("Replicate", "Reduce", "ReduceMax"):
            x = t(args[0])
            p = self.eval(args[1])
            assert isinstance(p, Pdim)
            if head == "Replicate":
                return _replicate(x, p)
            fold = (lambda ms: np.sum(ms, axis=0)) if head == "Reduce" else (lambda ms: np.max(ms, axis=0))
            return _fold(x, p, fold)
        raise TermShapeError(f"unknown term head {head!r}")


def _check_axis(m: np.ndarray, d: int) -> np.ndarray:
    _axis(m, d)
    return m


def _reshape(x: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    if int(np.prod(shape)) != x.size:
        raise TermShapeError(f"cannot reshape {x.shape} to {shape}")
    return x.reshape(shape)


def extent_is_one(shape: tuple[int, ...], d: int) -> bool:
    """The meaning of the analysis fact ``(one x d)``."""
    return d < -len(shape) or shape[d] == 1
