"""Traced sizes: concrete ints that remember how they were computed from a program's symbolic dims.

Code generation works on concrete graphs; a decoder's KV length changes at every token, so a kernel
compiled per value pays a C compile per token (0.28 s of gcc for decode attention). Instead, the concrete
pipeline (``Graph.instantiate`` + ``codegen.generate``) is run once with each dim given as a
:class:`Traced` int: it behaves exactly as its value does, so the generated code is the code of that
value, but every int computed from it carries an expression over the dims (an affine form over atoms:
dims, floor divisions, products), and every decision taken on it (``<``, ``==``, ``bool``, a format other
than a plain integer, a float, a bit operation) is recorded as a *guard*: a predicate over the dims that
held for this value. Where such an int is printed into the C text (``str``/``format``) a *hole* is left.

The result (``codegen.template``) is one C source whose holes are C expressions over runtime dims,
valid for every value of the dims that satisfies the guards. Not every conversion of an int subclass can
be intercepted (``%d``, ``range``, indexing and C functions read the value directly), so a template is
also checked against plain code generation at other values of its guard region before it is used: a
value that leaked through such a path stays a literal there and the two texts differ.

Python's ``//`` and ``%`` round toward minus infinity; the C rendering uses ``pr_fdiv`` with the same
rounding. Everything the C text needs is integer arithmetic on ``long``.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Mapping
from contextvars import ContextVar
from typing import Any

# A linear form: (terms, const), terms a sorted tuple of (atom, coef) with coef != 0. An atom is
# ("v", name), ("fdiv", lin, lin) or ("mul", lin, lin).
Lin = tuple
_CMP = {"<": operator.lt, "<=": operator.le, "==": operator.eq, "!=": operator.ne, ">": operator.gt,
        ">=": operator.ge}
HOLE_OPEN, HOLE_CLOSE = "\x01", "\x02"
ANY = "any"   # the head of a disjunctive guard's key: (ANY, paths), see any_of
# the guards that comparisons record while any_of evaluates one of its predicates: (trace, key, outcome)
_CAPTURE: ContextVar[list | None] = ContextVar("prism_trace_capture", default=None)


def _key(atom: tuple) -> str:
    return repr(atom)


def lin_const(c: int) -> Lin:
    return ((), c)


def lin_var(name: str) -> Lin:
    return (((("v", name), 1),), 0)


def _combine(a: Lin, b: Lin, k: int) -> Lin:
    """a + k * b"""
    terms = dict(a[0])
    for atom, c in b[0]:
        terms[atom] = terms.get(atom, 0) + k * c
    return (tuple(sorted(((t, c) for t, c in terms.items() if c), key=lambda tc: _key(tc[0]))), a[1] + k * b[1])


def _scale(a: Lin, k: int) -> Lin:
    if k == 0:
        return lin_const(0)
    return (tuple((t, c * k) for t, c in a[0]), a[1] * k)


def _atom(atom: tuple) -> Lin:
    return (((atom, 1),), 0)


def lin_fdiv(a: Lin, b: Lin) -> Lin:
    if not b[0]:
        c = b[1]
        if not a[0]:
            return lin_const(a[1] // c)
        if c > 0 and all(k % c == 0 for _, k in a[0]):  # floor((c X + r) / c) = X + floor(r / c)
            return ((tuple((t, k // c) for t, k in a[0])), a[1] // c)
    return _atom(("fdiv", a, b))


def lin_mul(a: Lin, b: Lin) -> Lin:
    if not a[0]:
        return _scale(b, a[1])
    if not b[0]:
        return _scale(a, b[1])
    x, y = sorted((a, b), key=repr)
    return _atom(("mul", x, y))


def lin_eval(a: Lin, env: Mapping[str, int]) -> int:
    total = a[1]
    for atom, c in a[0]:
        total += c * _atom_eval(atom, env)
    return total


def _atom_eval(atom: tuple, env: Mapping[str, int]) -> int:
    if atom[0] == "v":
        return int(env[atom[1]])
    x, y = lin_eval(atom[1], env), lin_eval(atom[2], env)
    return x // y if atom[0] == "fdiv" else x * y


def c_name(dim: str) -> str:
    return f"pr_dim_{dim}"


def lin_c(a: Lin) -> str:
    """C text of ``a`` (long arithmetic; floor division through pr_fdiv)."""
    parts = []
    for atom, c in a[0]:
        x = _atom_c(atom)
        parts.append(x if c == 1 else f"{c} * {x}")
    if a[1] or not parts:
        parts.append(str(a[1]))
    return "(" + " + ".join(parts) + ")" if len(parts) > 1 else parts[0]


def _atom_c(atom: tuple) -> str:
    if atom[0] == "v":
        return c_name(atom[1])
    x, y = lin_c(atom[1]), lin_c(atom[2])
    return f"pr_fdiv({x}, {y})" if atom[0] == "fdiv" else f"({x} * {y})"


def lin_dims(a: Lin) -> set[str]:
    out: set[str] = set()
    for atom, _ in a[0]:
        if atom[0] == "v":
            out.add(atom[1])
        else:
            out |= lin_dims(atom[1]) | lin_dims(atom[2])
    return out


class Trace:
    """What one traced run recorded: the guards (predicates that held) and the holes (printed ints)."""

    def __init__(self, env: Mapping[str, int]) -> None:
        self.env = dict(env)
        self.guards: dict[tuple, bool] = {}   # (lin, op) -> outcome; lin op 0
        self.holes: list[Lin] = []
        self._hole_ids: dict[Lin, int] = {}

    def dims(self) -> dict[str, Traced]:
        return {k: Traced(v, lin_var(k), self) for k, v in self.env.items()}

    def guard(self, lin: Lin, op: str, outcome: bool) -> None:
        if lin[0]:   # a constant difference decides nothing about the dims
            self.record((lin, op), outcome)

    def record(self, key: tuple, outcome: bool) -> None:
        """Record guard ``key`` (``(lin, op)`` or ``(ANY, paths)``) with ``outcome`` (or hand it to any_of)."""
        cap = _CAPTURE.get()
        if cap is not None:
            cap.append((self, key, outcome))
        else:
            self.guards[key] = outcome

    def pin(self, lin: Lin, value: int) -> None:
        """Guard ``lin == value``: the template holds where ``lin`` has this value only."""
        self.guard(_combine(lin, lin_const(value), -1), "==", True)

    def hole(self, lin: Lin) -> str:
        if not lin[0]:
            return str(lin[1])
        i = self._hole_ids.get(lin)
        if i is None:
            i = self._hole_ids[lin] = len(self.holes)
            self.holes.append(lin)
        return f"{HOLE_OPEN}{i}{HOLE_CLOSE}"

    def holds(self, env: Mapping[str, int]) -> bool:
        """Whether every guard holds at ``env`` (its dims)."""
        try:
            return all(_holds(key, outcome, env) for key, outcome in self.guards.items())
        except ZeroDivisionError:
            return False

    def specialized(self) -> bool:
        """True when a guard pins a dim's value outright (the template serves one value of it)."""
        return any(op == "==" and outcome and len(lin[0]) == 1 and lin[0][0][0][0] == "v"
                   for (lin, op), outcome in self.guards.items())


def _holds(key: tuple, outcome: bool, env: Mapping[str, int]) -> bool:
    if key[0] == ANY:   # (ANY, paths): some path's guards all hold
        return any(all(_holds(k, o, env) for k, o in path) for path in key[1]) == outcome
    lin, op = key
    return _CMP[op](lin_eval(lin, env), 0) == outcome  # type: ignore[no-any-return]


def any_of(*preds: Callable[[], bool]) -> bool:
    """``any(p() for p in preds)`` for predicates that compare traced ints, recorded as one guard where plain
    ``or`` records one per comparison it evaluates: where the result is true, the guard holds wherever one of
    the true predicates decides as it did here (each predicate's own comparisons); where it is false, every
    predicate's comparisons are recorded as usual (each must stay false). Every predicate is evaluated.

    Measured need: ``M >= 16 or K * N <= 65536`` (codegen.matmul.plan_nn) holds at every prompt length for the
    prefill attention's ``P @ V`` (M = K = the length), but as an ``or`` it recorded ``K * N <= 65536`` below 16
    rows and ``M >= 16`` above: a template's region ended at one of the two, a new template (and gcc) there."""
    results = []
    for p in preds:
        cap: list = []
        tok = _CAPTURE.set(cap)
        try:
            out = bool(p())
        finally:
            _CAPTURE.reset(tok)
        results.append((out, cap))
    if not any(out for out, _ in results):
        for _, cap in results:
            for tr, key, o in cap:
                tr.record(key, o)
        return False
    true = [cap for out, cap in results if out]
    if any(not cap for cap in true):   # a true predicate that compared nothing traced: true everywhere
        return True
    traces = {id(tr): tr for cap in true for tr, _, _ in cap}
    if len(traces) != 1:
        raise ValueError("any_of over traced ints of several traces")
    (tr,) = traces.values()
    tr.record((ANY, tuple(tuple((k, o) for _, k, o in cap) for cap in true)), True)
    return True


def varies(x: object) -> bool:
    """Whether ``x`` is a traced int that depends on the dims (a template's size that changes over its region).
    A structural fact, not a value, so deciding on it records no guard: code generation may choose the form that
    serves every value (a row loop split at any length, K-chunk sums in groups at any K) where the size varies,
    and the one best for the value where it is fixed. Plain generation for a template's validation is traced
    too (codegen.template.plain_source), so both sides see the same answers."""
    return isinstance(x, Traced) and bool(x.expr[0])


def lin_of(x: object, trace: Trace | None) -> Lin:
    if isinstance(x, Traced):
        if trace is not None and x.trace is not trace:
            raise ValueError("traced ints of two different traces were combined")
        return x.expr
    return lin_const(int(x))  # type: ignore[call-overload]


def _plain(x: object) -> int:
    return int.__int__(x) if isinstance(x, int) else x  # type: ignore[return-value]


class Traced(int):
    """An int that is its value and remembers its expression over the traced dims (see the module doc)."""

    expr: Lin
    trace: Trace

    def __new__(cls, value: int, expr: Lin, trace: Trace) -> Traced:
        obj = int.__new__(cls, value)
        obj.expr, obj.trace = expr, trace
        return obj

    def _make(self, value: int, expr: Lin) -> int:
        return Traced(value, expr, self.trace) if expr[0] else value

    def _pin(self) -> int:
        """A decision the trace cannot express: the template holds for this value only."""
        v = int.__int__(self)
        self.trace.pin(self.expr, v)
        return v

    # arithmetic that stays traced
    def __add__(self, o: object) -> Any:
        if not isinstance(o, int):
            return int.__add__(self, o)  # type: ignore[operator]
        return self._make(int.__int__(self) + _plain(o), _combine(self.expr, lin_of(o, self.trace), 1))

    __radd__ = __add__

    def __sub__(self, o: object) -> Any:
        if not isinstance(o, int):
            return int.__sub__(self, o)  # type: ignore[operator]
        return self._make(int.__int__(self) - _plain(o), _combine(self.expr, lin_of(o, self.trace), -1))

    def __rsub__(self, o: object) -> Any:
        if not isinstance(o, int):
            return NotImplemented
        return self._make(_plain(o) - int.__int__(self), _combine(lin_of(o, self.trace), self.expr, -1))

    def __mul__(self, o: object) -> Any:
        if not isinstance(o, int):
            return int.__mul__(self, o)  # type: ignore[operator]
        return self._make(int.__int__(self) * _plain(o), lin_mul(self.expr, lin_of(o, self.trace)))

    __rmul__ = __mul__

    def __floordiv__(self, o: object) -> Any:
        if not isinstance(o, int):
            return int.__floordiv__(self, o)  # type: ignore[operator]
        d = lin_of(o, self.trace)
        if d[0]:
            self.trace.guard(d, "!=", True)
        return self._make(int.__int__(self) // _plain(o), lin_fdiv(self.expr, d))

    def __rfloordiv__(self, o: object) -> Any:
        if not isinstance(o, int):
            return NotImplemented
        self.trace.guard(self.expr, "!=", True)
        return self._make(_plain(o) // int.__int__(self), lin_fdiv(lin_of(o, self.trace), self.expr))

    def __mod__(self, o: object) -> Any:
        if not isinstance(o, int):
            return int.__mod__(self, o)  # type: ignore[operator]
        q = self.__floordiv__(o)
        return self - q * o

    def __rmod__(self, o: object) -> Any:
        if not isinstance(o, int):
            return NotImplemented
        return o - self.__rfloordiv__(o) * self

    def __divmod__(self, o: object) -> Any:
        return self.__floordiv__(o), self.__mod__(o)

    def __neg__(self) -> Any:
        return self._make(-int.__int__(self), _scale(self.expr, -1))

    def __pos__(self) -> Any:
        return self

    def __abs__(self) -> Any:
        return self if self >= 0 else -self

    def __pow__(self, o: object, mod: object = None) -> Any:
        if mod is None and type(o) is int and 0 <= o <= 4:
            r: Any = 1
            for _ in range(o):
                r = r * self
            return r
        return pow(self._pin(), o, mod)  # type: ignore[call-overload]

    # decisions: recorded as guards
    def _cmp(self, o: object, op: str) -> Any:
        if not isinstance(o, int):
            return NotImplemented
        out = _CMP[op](int.__int__(self), _plain(o))
        self.trace.guard(_combine(self.expr, lin_of(o, self.trace), -1), op, out)
        return out

    def __lt__(self, o: object) -> Any:
        return self._cmp(o, "<")

    def __le__(self, o: object) -> Any:
        return self._cmp(o, "<=")

    def __gt__(self, o: object) -> Any:
        return self._cmp(o, ">")

    def __ge__(self, o: object) -> Any:
        return self._cmp(o, ">=")

    def __eq__(self, o: object) -> Any:
        return self._cmp(o, "==")

    def __ne__(self, o: object) -> Any:
        return self._cmp(o, "!=")

    def __hash__(self) -> int:
        return int.__hash__(self)

    def __bool__(self) -> bool:
        return self._cmp(0, "!=")  # type: ignore[no-any-return]

    # conversions the trace cannot follow: pinned
    def __truediv__(self, o: object) -> Any:
        return self._pin() / o  # type: ignore[operator]

    def __rtruediv__(self, o: object) -> Any:
        return o / self._pin()  # type: ignore[operator]

    def __float__(self) -> float:
        return float(self._pin())

    def __and__(self, o: object) -> Any:
        return self._pin() & o  # type: ignore[operator]

    def __rand__(self, o: object) -> Any:
        return o & self._pin()  # type: ignore[operator]

    def __or__(self, o: object) -> Any:
        return self._pin() | o  # type: ignore[operator]

    def __ror__(self, o: object) -> Any:
        return o | self._pin()  # type: ignore[operator]

    def __xor__(self, o: object) -> Any:
        return self._pin() ^ o  # type: ignore[operator]

    def __lshift__(self, o: object) -> Any:
        return self._pin() << o  # type: ignore[operator]

    def __rlshift__(self, o: object) -> Any:
        return o << self._pin()  # type: ignore[operator]

    def __rshift__(self, o: object) -> Any:
        return self._pin() >> o  # type: ignore[operator]

    def __rrshift__(self, o: object) -> Any:
        return o >> self._pin()  # type: ignore[operator]

    def __invert__(self) -> Any:
        return ~self._pin()

    # printing: a hole in the text
    def __format__(self, spec: str) -> str:
        if spec in ("", "d"):
            return self.trace.hole(self.expr)
        return format(self._pin(), spec)

    def __str__(self) -> str:
        return self.trace.hole(self.expr)

    def __repr__(self) -> str:
        return f"Traced({int.__int__(self)}, {lin_c(self.expr)})"


def as_int(x: object) -> int:
    """``int(x)`` that keeps a :class:`Traced` int traced (``int()`` of an int subclass drops it)."""
    return x if isinstance(x, int) else int(x)  # type: ignore[call-overload]


def concrete(x: int) -> int:
    """``x`` as a plain int, pinned: for values that choose code structure (a micro-kernel's rows, a Python
    loop's count), where the trace cannot follow how they are used (``range``, indexing)."""
    return x._pin() if isinstance(x, Traced) else x
