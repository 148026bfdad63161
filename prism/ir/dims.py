"""Symbolic dimensions.

A dimension is a Python ``int`` or a :class:`Dim`: a canonical Laurent polynomial with rational
coefficients over *atoms*. An atom is either a size symbol (``B``, ``G``, ``F``: a positive integer)
or a *selector* ``sel(m, d, g)``, which is ``g`` when the map symbol ``m`` takes the value ``d`` and
``1`` otherwise. Selectors are how symbolic maps enter shapes: the tile of a tensor whose dim ``d`` may
be split by grid dim ``p`` has size ``D / sel(m[T,p], d, g_p)``. The boolean map symbol of DESIGN.md
§4.5, ``m[T, d, p]``, is ``m[T,p] == d``; using one categorical symbol per (tensor, parallel dim)
builds in the partition constraint (a parallel dim splits at most one data dim of a tensor).

Canonical form: terms sorted by monomial, monomials sorted by atom, zero coefficients dropped, and a
constant integer result returned as a plain ``int``. Structurally equal dims are the *same object*
(interned), so hashing and identity are cheap: search creates millions of them.

Comparisons are decided soundly under the assumption that every symbol is an integer >= 1:
``==``, ``<`` and friends return a bool when the sign of the difference is determined for *every*
value of the symbols and raise :class:`InconclusiveDimError` otherwise (``B == 8``). Use
:func:`structurally_equal` when identity of form is what you mean.

Why not sympy or z3: creating, hashing and comparing a dim is on the search's hot path.
``benchmarks/dims_micro.py`` measures this class against sympy; the figures are in
docs/architecture.md (this class is ~10-40x faster, and sympy's ``==`` is structural, not sound).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from fractions import Fraction
from typing import Union

from prism.errors import DimError, InconclusiveDimError
from prism.ir.traced import Traced

# Atom encodings (tuples sort without mixing types at the same position):
#   ("v", name)                  a size symbol
#   ("s", mapvar, d, gkey)       selector; gkey = ("c", int) or ("v", name)
Atom = tuple
Mono = tuple  # tuple[tuple[Atom, int], ...]
Coef = Union[int, Fraction]
DimLike = Union[int, "Dim"]

_INTERN: dict[tuple, Dim] = {}
# sign of (a - b) -> (signs for which `a op b` holds, signs for which it fails)
_CMP_TABLE: dict[str, tuple[tuple, tuple]] = {
    "<": ((-1,), (0, 1, "ge0")),
    "<=": ((-1, 0, "le0"), (1,)),
    ">": ((1,), (0, -1, "le0")),
    ">=": ((1, 0, "ge0"), (-1,)),
}


class Dim:
    """A symbolic dimension. Build with :func:`sym`, arithmetic, or :func:`sel`; never directly."""

    __slots__ = ("_hash", "terms")
    terms: tuple  # tuple[tuple[Mono, Coef], ...], canonical

    def __new__(cls, terms: tuple) -> Dim:  # internal: callers pass canonical terms
        d = _INTERN.get(terms)
        if d is None:
            d = object.__new__(cls)
            d.terms = terms
            d._hash = hash(terms)
            _INTERN[terms] = d
        return d

    # --- arithmetic -------------------------------------------------------------------------
    def __add__(self, other: DimLike) -> DimLike:
        return _add(self, other, 1)

    def __radd__(self, other: DimLike) -> DimLike:
        return _add(self, other, 1)

    def __sub__(self, other: DimLike) -> DimLike:
        return _add(self, other, -1)

    def __rsub__(self, other: DimLike) -> DimLike:
        return _add(_neg(self), other, 1)

    def __neg__(self) -> DimLike:
        return _neg(self)

    def __mul__(self, other: DimLike) -> DimLike:
        return _mul(self, other)

    def __rmul__(self, other: DimLike) -> DimLike:
        return _mul(self, other)

    def __floordiv__(self, other: DimLike) -> DimLike:
        return div_exact(self, other)

    def __rfloordiv__(self, other: DimLike) -> DimLike:
        return div_exact(other, self)

    # --- comparison (sound) -----------------------------------------------------------------
    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:
        if other is self:
            return True
        if not isinstance(other, (int, Dim)) or isinstance(other, bool):
            return NotImplemented
        diff = _add(self, other, -1)
        s = sign(diff)
        if s not in (-1, 0, 1):
            raise InconclusiveDimError(
                f"cannot decide {self} == {other} for every value of {sorted(symbols(self) | symbols(other))}; "
                "use the same symbol on both sides, or substitute concrete values first", diff)
        return s == 0

    def __ne__(self, other: object) -> bool:
        r = self.__eq__(other)
        return r if r is NotImplemented else not r

    def _cmp(self, other: DimLike, op: str) -> bool:
        s = sign(_add(self, other, -1))
        true_when, false_when = _CMP_TABLE[op]
        if s in true_when:
            return True
        if s in false_when:
            return False
        raise InconclusiveDimError(
            f"cannot decide {self} {op} {other} for every value of "
            f"{sorted(symbols(self) | symbols(other))}; substitute concrete values first")

    def __lt__(self, other: DimLike) -> bool:
        return self._cmp(other, "<")

    def __le__(self, other: DimLike) -> bool:
        return self._cmp(other, "<=")

    def __gt__(self, other: DimLike) -> bool:
        return self._cmp(other, ">")

    def __ge__(self, other: DimLike) -> bool:
        return self._cmp(other, ">=")

    def __bool__(self) -> bool:
        return True  # every dim is >= 1 or a nonzero expression; never used as a truth value

    def __index__(self) -> int:
        raise DimError(f"symbolic dim {self} has no concrete value; substitute its symbols "
                       f"{sorted(symbols(self))} first (prism.ir.dims.evaluate)")

    __int__ = __index__

    def __repr__(self) -> str:
        return format_dim(self)

    __str__ = __repr__

    def __reduce__(self) -> tuple:  # pickling re-interns
        return (Dim, (self.terms,))


# --- construction ---------------------------------------------------------------------------

def _gkey(g: DimLike | str) -> tuple:
    if isinstance(g, bool):
        raise DimError(f"grid size must be an int or a symbol, got {g!r}")
    if isinstance(g, int):
        if g < 1:
            raise DimError(f"grid size must be >= 1, got {g}")
        return ("c", g)
    if isinstance(g, str):
        return ("v", _check_name(g))
    if isinstance(g, Dim) and len(g.terms) == 1 and g.terms[0][1] == 1 and len(g.terms[0][0]) == 1:
        (atom, e), = g.terms[0][0]
        if e == 1 and atom[0] == "v":
            return ("v", atom[1])
    raise DimError(f"a selector's size must be an int or a single symbol, got {g}")


def _check_name(name: str) -> str:
    if not isinstance(name, str) or not name or not (name[0].isalpha() or name[0] == "_") or not all(
            c.isalnum() or c in "_[],.:" for c in name):
        raise DimError(f"invalid symbol name {name!r}: use letters, digits and '_' (starting with a letter)")
    return name


def sym(name: str) -> Dim:
    """The size symbol ``name`` (an integer >= 1)."""
    return Dim(((((("v", _check_name(name)), 1),), 1),))


def sel(mapvar: str, d: int, g: DimLike | str) -> Dim:
    """``g`` if map symbol ``mapvar`` equals data dim ``d``, else ``1``."""
    return Dim(((((("s", _check_name(mapvar), int(d), _gkey(g)), 1),), 1),))


def as_dim(x: DimLike | str) -> DimLike:
    """Normalize a user dim: an int >= 0 stays an int, a str becomes a symbol, a Dim stays."""
    if isinstance(x, bool):
        raise DimError(f"a dim must be an int or a symbol name, got {x!r}")
    if isinstance(x, int):
        if x < 0:
            raise DimError(f"a dim must be >= 0, got {x}")
        return x
    if isinstance(x, str):
        return sym(x)
    if isinstance(x, Dim):
        return x
    try:  # numpy integers
        import numbers
        if isinstance(x, numbers.Integral):
            return as_dim(int(x))
    except Exception:  # pragma: no cover
        pass
    raise DimError(f"a dim must be an int or a symbol name, got {x!r} of type {type(x).__name__}")


def _terms_of(x: DimLike) -> tuple:
    if isinstance(x, Dim):
        return x.terms
    if isinstance(x, int) and not isinstance(x, bool):
        return (((), x),) if x else ()
    if isinstance(x, Fraction):
        return (((), x),) if x else ()
    raise DimError(f"not a dim: {x!r} of type {type(x).__name__}")


def _norm_coef(c: Coef) -> Coef:
    if isinstance(c, Fraction) and c.denominator == 1:
        return int(c.numerator)
    return c


def _build(acc: dict) -> DimLike:
    items = [(m, _norm_coef(c)) for m, c in acc.items() if c != 0]
    if not items:
        return 0
    if len(items) == 1 and items[0][0] == ():
        c = items[0][1]
        if isinstance(c, Fraction):
            raise DimError(f"dimension arithmetic produced the non-integer {c}")
        return c
    items.sort(key=lambda t: t[0])
    return Dim(tuple(items))


# Memo of binary operations keyed by operand identity: interned Dims live forever, so an id is a
# stable name for one; ints are keyed by value. Measured: cuts repeated arithmetic ~5x.
_MEMO: dict[tuple, DimLike] = {}
_MEMO_MAX = 1 << 20


def _k(x: DimLike) -> object:
    return ("d", id(x)) if isinstance(x, Dim) else x


def _memo(op: str, a: DimLike, b: DimLike, fn: Callable[[], DimLike]) -> DimLike:
    if a.__class__ is Traced or b.__class__ is Traced:  # keyed by value, a traced int would find a plain result
        return fn()
    key = (op, _k(a), _k(b))
    r = _MEMO.get(key)
    if r is None:
        r = fn()
        if len(_MEMO) >= _MEMO_MAX:
            _MEMO.clear()
        _MEMO[key] = r
    return r


def _add(a: DimLike, b: DimLike, sb: int) -> DimLike:
    return _memo("+" if sb == 1 else "-", a, b, lambda: _add_raw(a, b, sb))


def _add_raw(a: DimLike, b: DimLike, sb: int) -> DimLike:
    acc: dict = dict(_terms_of(a))
    for m, c in _terms_of(b):
        acc[m] = acc.get(m, 0) + sb * c
    return _build(acc)


def _neg(a: DimLike) -> DimLike:
    return _build({m: -c for m, c in _terms_of(a)})


def _mono_mul(m1: Mono, m2: Mono) -> Mono:
    if not m1:
        return m2
    if not m2:
        return m1
    e: dict = dict(m1)
    for atom, k in m2:
        e[atom] = e.get(atom, 0) + k
    return tuple(sorted((a, k) for a, k in e.items() if k))


def _mul(a: DimLike, b: DimLike) -> DimLike:
    if isinstance(b, int) and not isinstance(b, bool):
        if b == 1:
            return a
        if b == 0:
            return 0
    return _memo("*", a, b, lambda: _mul_raw(a, b))


def _mul_raw(a: DimLike, b: DimLike) -> DimLike:
    acc: dict = {}
    for m1, c1 in _terms_of(a):
        for m2, c2 in _terms_of(b):
            m = _mono_mul(m1, m2)
            acc[m] = acc.get(m, 0) + c1 * c2
    return _build(acc)


def _inverse_monomial(b: DimLike) -> tuple:
    t = _terms_of(b)
    if len(t) != 1:
        raise DimError(f"cannot divide by {b}: only divisions by a product of symbols and integers are "
                       "supported (a dim like 'B+1' as a divisor has no exact symbolic quotient)")
    m, c = t[0]
    inv_c: Coef = c if c in (1, -1) else (Fraction(1, c) if not isinstance(c, Fraction) else 1 / c)
    return (tuple((a, -k) for a, k in m), inv_c)


def div_exact(a: DimLike, b: DimLike) -> DimLike:
    """``a / b`` where the division is *assumed* exact.

    Concrete operands are checked now (``DimError`` if ``b`` does not divide ``a``). For symbolic
    operands the caller must record ``Divisible(a, b)`` (see :class:`Divisible`) so that
    instantiation checks it; shape rules do this through their context.
    """
    if isinstance(b, int) and not isinstance(b, bool):
        if b == 0:
            raise DimError(f"division of {a} by zero")
        if isinstance(a, int):
            if a % b:
                raise DimError(f"{b} does not divide {a}")
            return a // b
    if a is b:
        return 1
    return _memo("/", a, b, lambda: _div_raw(a, b))


def _div_raw(a: DimLike, b: DimLike) -> DimLike:
    inv_m, inv_c = _inverse_monomial(b)
    acc: dict = {}
    for m, c in _terms_of(a):
        mm = _mono_mul(m, inv_m)
        acc[mm] = acc.get(mm, 0) + c * inv_c
    items = [(m, _norm_coef(c)) for m, c in acc.items() if c != 0]
    if len(items) == 1 and items[0][0] == () and isinstance(items[0][1], Fraction):
        raise DimError(f"{b} does not divide {a}")
    return _build(acc)


# --- queries ----------------------------------------------------------------------------------

def is_concrete(x: DimLike) -> bool:
    return isinstance(x, int)


def structurally_equal(a: DimLike, b: DimLike) -> bool:
    """Identity of canonical form (never raises). ``B`` and ``8`` are not structurally equal."""
    if isinstance(a, Dim) or isinstance(b, Dim):
        return a is b
    return a == b


def symbols(x: DimLike) -> set[str]:
    """Names of the size symbols and map symbols ``x`` depends on."""
    out: set[str] = set()
    if not isinstance(x, Dim):
        return out
    for m, _ in x.terms:
        for atom, _k in m:
            if atom[0] == "v":
                out.add(atom[1])
            else:
                out.add(atom[1])
                if atom[3][0] == "v":
                    out.add(atom[3][1])
    return out


def has_selectors(x: DimLike) -> bool:
    """True if ``x`` depends on a map symbol (contains a selector atom)."""
    return isinstance(x, Dim) and any(atom[0] == "s" for m, _ in x.terms for atom, _k in m)


def sign(x: DimLike) -> int | str | None:
    """Sign of ``x`` for every value of its symbols (all >= 1): -1, 0, 1, 'ge0', 'le0', or None if unknown."""
    if isinstance(x, (int, Fraction)):
        return (x > 0) - (x < 0)
    const: Coef = 0
    pos = neg = False
    laurent = False
    poly_sum: Coef = 0
    for m, c in x.terms:
        if m == ():
            const = c
            continue
        if c > 0:
            pos = True
        else:
            neg = True
        if any(k < 0 for _a, k in m):
            laurent = True  # value in (0, inf), no lower bound of 1
        else:
            poly_sum += c  # value >= 1 times c
    if pos and neg:
        return None
    if pos:  # x >= const + poly_sum, strictly greater if any laurent term
        lo = const + poly_sum
        if lo > 0 or (lo == 0 and laurent):
            return 1
        return "ge0" if lo == 0 else None
    hi = const + poly_sum
    if hi < 0 or (hi == 0 and laurent):
        return -1
    return "le0" if hi == 0 else None


def _atom_value(atom: Atom, env: Mapping[str, object]) -> DimLike | None:
    """The value of one atom under ``env``, or None when ``env`` leaves it unchanged."""
    if atom[0] == "v":
        v = env.get(atom[1])
        return None if v is None else as_dim(v)  # type: ignore[arg-type]
    _, mv, d, gkey = atom
    g: DimLike | None = gkey[1] if gkey[0] == "c" else (
        as_dim(env[gkey[1]]) if gkey[1] in env else None)  # type: ignore[arg-type]
    if mv in env:
        if env[mv] != d:  # None (replicate) or another data dim: the selector is 1
            return 1
        return g if g is not None else sym(gkey[1])
    if gkey[0] == "v" and g is not None:
        return sel(mv, d, g)
    return None


def subs(x: DimLike, env: Mapping[str, object]) -> DimLike:
    """Substitute symbols (name -> int or Dim) and map symbols (name -> data dim or None).

    Raises DimError if the result is a non-integer constant (an inexact division).
    """
    if not isinstance(x, Dim):
        return x
    total: dict = {}
    for m, c in x.terms:
        val: dict = {(): c}
        for atom, k in m:
            v = _atom_value(atom, env)
            base = v if v is not None else Dim(((((atom, 1),), 1),))
            if k > 0:
                factor = _terms_of(base)
                for _ in range(k):
                    val = _terms_mul(val, factor)
            else:
                inv_m, inv_c = _inverse_monomial(base)
                for _ in range(-k):
                    val = _terms_mul(val, ((inv_m, inv_c),))
        for mm, cc in val.items():
            total[mm] = total.get(mm, 0) + cc
    return _build(total)


def _terms_mul(val: dict, factor: Iterable) -> dict:
    out: dict = {}
    for m1, c1 in val.items():
        for m2, c2 in factor:
            mm = _mono_mul(m1, m2)
            out[mm] = out.get(mm, 0) + c1 * c2
    return out


# Plain-variable Dims as (coefficient, ((name, exponent), ...)) terms, for evaluating them with integers
# and no symbolic substitution; None for a Dim with a selector atom. The tuner evaluates ~300 dims per
# candidate and thousands of candidates per shape: through subs() that was a third of instantiation.
# Keyed by id: interned Dims live forever, and a Dim key would make the dict call Dim.__eq__ (a symbolic
# comparison that raises when undecidable) on a hash collision -- hash(-1) == hash(-2), so A^-1 and A^-2
# terms collide.
_PLAIN: dict[int, tuple | None] = {}


def _plain(x: Dim) -> tuple | None:
    try:
        return _PLAIN[id(x)]
    except KeyError:
        pass
    terms: tuple | None = None
    if all(atom[0] == "v" for m, _ in x.terms for atom, _k in m):
        terms = tuple((c, tuple((atom[1], k) for atom, k in m)) for m, c in x.terms)
    _PLAIN[id(x)] = terms
    return terms


def _evaluate_plain(terms: tuple, env: Mapping[str, object]) -> int | None:
    """The exact value of plain terms when every variable has an int value, else None."""
    total: int | Fraction = 0
    for c, factors in terms:
        num, den = c, 1
        for name, k in factors:
            v = env.get(name)
            if type(v) is not int:
                return None
            if k > 0:
                num *= v ** k
            elif v == 0:
                return None
            else:
                den *= v ** -k
        total += num if den == 1 else Fraction(num, den)
    if isinstance(total, Fraction):
        if total.denominator != 1:
            return None  # an inexact result: subs() raises the error that names it
        return int(total.numerator)
    return total


def evaluate(x: DimLike, env: Mapping[str, object]) -> int:
    """The concrete value of ``x``; raises DimError naming missing symbols or an inexact result."""
    if isinstance(x, int):
        return x
    terms = _plain(x) if isinstance(x, Dim) else None
    if terms is not None:
        r = _evaluate_plain(terms, env)
        if r is not None:
            return r
    try:
        r = subs(x, env)
    except DimError as e:
        raise DimError(f"{x} is not an integer at {_fmt_env(env, x)}: {e}") from None
    if not isinstance(r, int):
        missing = sorted(n for n in symbols(x) if n not in env)
        raise DimError(f"cannot evaluate {x}: no value for {missing}")
    return r


def _fmt_env(env: Mapping[str, object], x: DimLike) -> str:
    return "{" + ", ".join(f"{k}={env[k]}" for k in sorted(symbols(x)) if k in env) + "}"


def format_dim(x: DimLike) -> str:
    if not isinstance(x, Dim):
        return str(x)
    parts = []
    for m, c in x.terms:
        num = [_fmt_atom(a) + (f"^{k}" if k > 1 else "") for a, k in m if k > 0]
        den = [_fmt_atom(a) + (f"^{-k}" if k < -1 else "") for a, k in m if k < 0]
        if isinstance(c, Fraction):
            cn, cd = c.numerator, c.denominator
        else:
            cn, cd = c, 1
        if cd != 1:
            den.insert(0, str(cd))
        sgn = "-" if cn < 0 else "+"
        cn = abs(cn)
        if cn != 1 or not num:
            num.insert(0, str(cn))
        s = "*".join(num)
        if den:
            s += "/" + (den[0] if len(den) == 1 else "(" + "*".join(den) + ")")
        parts.append((sgn, s))
    out = ("-" if parts[0][0] == "-" else "") + parts[0][1]
    for sgn, s in parts[1:]:
        out += f" {sgn} {s}"
    return out


def _fmt_atom(a: Atom) -> str:
    if a[0] == "v":
        return a[1]
    _, mv, d, gkey = a
    return f"[{mv}=={d}?{gkey[1]}]"


def format_shape(shape: Iterable[DimLike]) -> str:
    return "[" + ", ".join(format_dim(d) for d in shape) + "]"


def dims_equal(a: DimLike, b: DimLike) -> bool:
    """Sound equality of two dims (raises InconclusiveDimError when undecidable)."""
    if isinstance(a, int) and isinstance(b, int):
        return a == b
    if isinstance(a, Dim):
        return a.__eq__(b)
    return b.__eq__(a)  # type: ignore[union-attr]


def product(xs: Iterable[DimLike]) -> DimLike:
    r: DimLike = 1
    for x in xs:
        r = _mul(r, x)
    return r


@dataclass(frozen=True)
class Divisible:
    """A recorded constraint: ``den`` divides ``num`` exactly (checked at instantiation)."""

    num: DimLike
    den: DimLike
    why: str = ""

    def holds(self, env: Mapping[str, object]) -> bool | None:
        """True/False once both sides are concrete under ``env``; None while still symbolic."""
        n, d = subs(self.num, env), subs(self.den, env)
        if isinstance(n, int) and isinstance(d, int):
            return d != 0 and n % d == 0
        return None

    def __str__(self) -> str:
        return f"{format_dim(self.den)} | {format_dim(self.num)}" + (f"  ({self.why})" if self.why else "")


@dataclass(frozen=True)
class DimEq:
    """A recorded constraint: ``a == b`` must hold. Recorded by shape rules when two dims can only be
    equal for some values of the *map symbols* (symbolic dimension matching, DESIGN.md §4.5)."""

    a: DimLike
    b: DimLike
    why: str = ""

    def holds(self, env: Mapping[str, object]) -> bool | None:
        """True/False once no map symbol is left under ``env`` (False if equality is not guaranteed for
        every value of the remaining size symbols); None while map symbols remain."""
        x, y = subs(self.a, env), subs(self.b, env)
        if has_selectors(x) or has_selectors(y):
            return None
        return sign(_add(x, y, -1)) == 0

    def __str__(self) -> str:
        return f"{format_dim(self.a)} == {format_dim(self.b)}" + (f"  ({self.why})" if self.why else "")


@dataclass(frozen=True)
class Follows:
    """A block-graph parameter that takes the value of a kernel dim at every shape: ``{"g0": Follows("d0")}``
    is one block per row of ``d0`` rows, whatever ``d0`` is. A tuned winner whose grid size equalled a dim
    (one row per block at prompt length 141: ``g0 = 141``) keeps its *block* at a new value of the dim this
    way, and one template serves every value (codegen/template.py traces the parameter as the dim); as a
    constant (``g0 = 141``) it divided no other length, and each new length compiled and checked a kernel of
    its own (llama-small bf16: 5 of the 13 pieces of a new prompt length)."""

    dim: str

    def __repr__(self) -> str:
        return f"Follows({self.dim!r})"


def resolve_params(params: Mapping[str, object], env: Mapping[str, object]) -> dict[str, object]:
    """``params`` with each :class:`Follows` replaced by its dim's value in ``env``."""
    return {k: env[v.dim] if isinstance(v, Follows) else v for k, v in params.items()}
