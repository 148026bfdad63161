"""PyTorch's symbolic sizes (``SymInt`` / sympy expressions) as Prism dims.

Dynamo, ``torch.export`` and fake-tensor propagation name dynamic sizes with sympy symbols (``s0``,
``s77``); they become Prism symbols of the same name. Sums, products, integer powers and exact floor
divisions translate; anything else (``Mod``, ``Max``, a non-exact division) raises
:class:`~prism.errors.UnsupportedError` and the operator using it stays in PyTorch.
"""

from __future__ import annotations

from fractions import Fraction
from typing import Any

from prism.errors import DimError, UnsupportedError
from prism.ir import dims as D
from prism.ir.dims import DimLike


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
        return expr_to_dim(_simplified(x))
    if hasattr(x, "is_Integer"):
        return expr_to_dim(x)
    raise UnsupportedError(f"expected a size, got {type(x).__name__} {x!r}")


def to_shape(shape: Any) -> tuple[DimLike, ...]:
    return tuple(to_dim(s) for s in shape)
