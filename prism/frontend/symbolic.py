"""PyTorch's symbolic sizes (``SymInt`` / sympy expressions) as Prism dims.

Dynamo, ``torch.export`` and fake-tensor propagation name dynamic sizes with sympy symbols (``s0``,
``s77``); they become Prism symbols of the same name. Sums, products, integer powers and exact floor
divisions translate; anything else (``Mod``, ``Max``, a non-exact division) raises
:class:`~prism.errors.UnsupportedError` and the operator using it stays in PyTorch.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from prism.errors import DimError, UnsupportedError
from prism.ir import dims as D
from prism.ir.dims import DimLike


@dataclass
class SymbolEnv:
    """The example values of PyTorch's size symbols seen so far and the identifications made (see the
    module docstring)."""

    hints: dict[str, int] = field(default_factory=dict)
    aliases: dict[str, DimLike] = field(default_factory=dict)   # symbol -> the dim it is read as
    why: dict[str, str] = field(default_factory=dict)           # symbol -> the operator that needed it

    def assumptions(self) -> list[str]:
        return [f"{s} == {D.format_dim(v)} (equal in the example; "
                + (f"{self.why[s]}; " if s in self.why else "")
                + "checked on every call: a call where it fails runs the piece in PyTorch)"
                for s, v in self.aliases.items()]


_ENV: ContextVar[SymbolEnv | None] = ContextVar("prism_symbol_env", default=None)


@contextmanager
def symbol_env(env: SymbolEnv) -> Iterator[SymbolEnv]:
    """Conversions inside read sizes through ``env``'s identifications and record example values."""
    token = _ENV.set(env)
    try:
        yield env
    finally:
        _ENV.reset(token)


def identify(diff: Any, env: SymbolEnv, why: str = "") -> tuple[str, DimLike] | None:
    """For an undecided ``a == b`` (``diff = a - b``) whose sides are equal at the example values: the symbol
    to replace and its value, recorded in ``env`` (None when the example values differ or are unknown, or
    no symbol appears alone with coefficient +-1). The newest symbol (highest number) is the one replaced."""
    if not isinstance(diff, D.Dim) or D.has_selectors(diff):
        return None
    names = D.symbols(diff)
    if not names or not names <= env.hints.keys() or D.evaluate(diff, env.hints) != 0:
        return None
    candidates: list[tuple[str, int]] = []
    for s in names:
        terms = [(m, c) for m, c in diff.terms if any(atom[1] == s for atom, _k in m)]
        if len(terms) == 1 and terms[0][0] == ((("v", s), 1),) and terms[0][1] in (1, -1):
            candidates.append((s, terms[0][1]))
    if not candidates:
        return None
    s, c = max(candidates, key=lambda t: (len(t[0]), t[0]))
    value = (diff - c * D.sym(s)) * (-c)
    env.aliases = {k: D.subs(v, {s: value}) for k, v in env.aliases.items()}
    env.aliases[s] = value
    if why:
        env.why[s] = why
    return s, value


def _record_hints(x: Any, expr: Any) -> None:
    env = _ENV.get()
    if env is None:
        return
    senv = getattr(x.node, "shape_env", None)
    vals = getattr(senv, "backed_var_to_val", None)
    if vals is None:  # torch before backed_var_to_val
        vals = getattr(senv, "var_to_val", None) or {}
    for s in getattr(expr, "free_symbols", ()):
        v = vals.get(s)
        if v is not None and str(s) not in env.hints:
            try:
                env.hints[str(s)] = int(v)
            except (TypeError, ValueError):
                pass


def _aliased(d: DimLike) -> DimLike:
    env = _ENV.get()
    if env is None or not env.aliases or isinstance(d, int):
        return d
    return D.subs(d, env.aliases)


def _simplified(x: Any) -> Any:
    """The sympy expression of a SymInt with the shape environment's replacements applied (a symbol the
    environment later specialized to 2 reads as 2)."""
    node = x.node
    expr = node.expr
    env = getattr(node, "shape_env", None)
    if env is not None:
        try:
            expr = env.simplify(expr)
        except Exception:  # an older/newer ShapeEnv API: the raw expression is still right
            pass
    return expr


def expr_to_dim(e: Any) -> DimLike:
    """The Prism dim of a sympy size expression (see the module docstring)."""
    out = _conv(e)
    if isinstance(out, int) and out < 0:
        raise UnsupportedError(f"negative size {out}")
    return out


def _conv(e: Any) -> DimLike:
    import sympy

    if isinstance(e, int):
        return e
    if e.is_Integer:
        return int(e)
    if e.is_Symbol:
        return D.sym(str(e))
    if isinstance(e, sympy.Add):
        total: DimLike = 0
        for a in e.args:
            total = total + _conv(a)
        return total
    if isinstance(e, sympy.Mul):
        prod: DimLike = 1
        den = 1
        for a in e.args:
            if a.is_Rational and not a.is_Integer:
                prod, den = prod * int(a.p), den * int(a.q)
            else:
                prod = prod * _conv(a)
        return prod if den == 1 else _exact(prod, den, e)
    if isinstance(e, sympy.Pow) and e.exp.is_Integer and int(e.exp) > 0:
        base = _conv(e.base)
        out: DimLike = 1
        for _ in range(int(e.exp)):
            out = out * base
        return out
    if type(e).__name__ == "FloorDiv":
        num, den_ = (_conv(a) for a in e.args)
        return _exact(num, den_, e)
    raise UnsupportedError(f"size expression {e} ({type(e).__name__}) has no Prism form (supported: symbols, "
                           "+, *, integer powers, exact floor division)")


def _exact(num: DimLike, den: DimLike, e: Any) -> DimLike:
    try:
        out = D.div_exact(num, den)
    except DimError as err:
        raise UnsupportedError(f"size expression {e} is not an exact division ({err})") from None
    if not integral(out):
        raise UnsupportedError(f"size expression {e} is not an integer polynomial of the sizes ({out}): the "
                               "division is exact only for some values of them")
    return out


def integral(d: DimLike) -> bool:
    """An int, or a polynomial with integer coefficients and no negative powers (an integer for every
    value of its symbols)."""
    if isinstance(d, int):
        return True
    return all(not isinstance(c, Fraction) and all(k > 0 for _, k in mono) for mono, c in d.terms)


def to_dim(x: Any) -> DimLike:
    """A Prism dim for an int, a ``torch.SymInt`` or a sympy expression."""
    if isinstance(x, bool):
        raise UnsupportedError(f"expected a size, got the bool {x!r}")
    if isinstance(x, int):
        if x < 0:
            raise UnsupportedError(f"negative size {x}")
        return x
    if type(x).__name__ == "SymInt":
        expr = _simplified(x)
        _record_hints(x, expr)
        return _aliased(expr_to_dim(expr))
    if hasattr(x, "is_Integer"):
        return _aliased(expr_to_dim(x))
    raise UnsupportedError(f"expected a size, got {type(x).__name__} {x!r}")


def to_shape(shape: Any) -> tuple[DimLike, ...]:
    return tuple(to_dim(s) for s in shape)
