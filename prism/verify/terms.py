"""The term language of the formal verifier, as egglog declarations plus an s-expression toolkit.

A term denotes a tensor or a *family* of tensors indexed by parallel dims. A parallel dim is
``(P name size)``: a unique name (``a0.g1`` = grid dim 1 of the first customized operator of side
``a``; ``a0.L`` = its for-loop) and its size as a canonical dim string (``"P"``, ``"8"``). Sizes are
never evaluated: a proof holds for every value of the symbols.

Tensor dims are *negative* indices (counted from the last dim): NumPy broadcasting aligns operands
from the right, so a dim index means the same thing in every operand of a binary operator and no
rank bookkeeping is needed in the lifting rules.

Family operators (``x`` a tensor or family, ``p`` a parallel dim):

* ``(Partition x d p)``: the p-family of the |p| equal chunks of ``x`` along ``d``.
* ``(Replicate x p)``: the p-family whose members all equal ``x``.
* ``(Combine x d p)``: concatenation of the members of the p-family ``x`` along ``d``.
* ``(Reduce x p)`` / ``(ReduceMax x p)``: sum / element-wise max over the members of ``x``.

Every other operator applies member-wise. A partial sum (DESIGN.md §6 ``partial_sum``) is not a
separate constructor: it is the family ``(Matmul (Partition a -1 p) (Partition b -2 p))`` itself,
and ``(Reduce ... p)`` of it cancels to ``(Matmul a b)``. A constructor ``partial_sum(t, p)`` that
named only the total ``t`` would identify different families with equal sums, which is unsound
under non-linear operators.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass

from prism.ir.ops import OPS

# argument kinds: T tensor term, i dim (i64), f float (f64), s string, p parallel dim
CONSTRUCTORS: dict[str, tuple[str, ...]] = {
    "In": ("s",),                  # a named input tensor
    "Un": ("s", "T"),              # a point-wise unary operator, by name (see UNARY_OPS)
    "Scale": ("T", "f"),           # x * c
    "Shift": ("T", "f"),           # x + c
    # the binary element-wise operators, by their OpDef.term_head (Add, Sub, Mul, Div, Maximum, ...)
    **{o.term_head: ("T", "T") for o in OPS.values() if o.group == "binary"},
    "Matmul": ("T", "T"),
    # the keepdim reductions, by their OpDef.term_head (Sum, Max, Mean, Min)
    **{o.term_head: ("T", "i") for o in OPS.values() if o.group == "reduction"},
    "Transpose": ("T", "i", "i"),  # swap two dims
    "Unsqueeze": ("T", "i"),       # insert an extent-1 axis at output dim k
    "Squeeze": ("T", "i"),         # remove the extent-1 input dim k
    "SplitAxis": ("T", "i", "s", "s"),  # reshape dim d of extent A*B into the two dims (A, B)
    "Reshape": ("T", "s"),         # any other row-major reshape (opaque), to the shape string
    "Concat": ("T", "T", "i", "s", "s"),  # concat along d; the parts' extents along d
    "Slice": ("T", "i", "s", "s"),        # the part of x along d at offset start of length len
    "Partition": ("T", "i", "p"), "Replicate": ("T", "p"), "Combine": ("T", "i", "p"),
    "Reduce": ("T", "p"), "ReduceMax": ("T", "p"),
}
BINARY = tuple(o.term_head for o in OPS.values() if o.group == "binary")
REDUCTIONS = tuple(o.term_head for o in OPS.values() if o.group == "reduction")
# names of the unary element-wise operators in (Un name x): OpDef.term_name (attributes other than the
# defaults are part of the name: "gelu(tanh)", "leaky_relu(0.2)"); the scalar ops have Scale/Shift
UNARY_OPS = tuple(n for n, o in OPS.items() if o.group == "unary" and n not in ("mul_scalar", "add_scalar"))

_SORT = {"T": "T", "i": "i64", "f": "f64", "s": "String", "p": "Pd"}


def declarations() -> str:
    """The egglog datatype and analysis declarations (one program prefix per proof)."""
    ctors = "\n".join(f"  ({name} {' '.join(_SORT[k] for k in kinds)})" for name, kinds in CONSTRUCTORS.items())
    return (
        "(datatype Pd (P String String))\n"
        f"(datatype T\n{ctors})\n"
        "(function rank (T) i64 :merge (min old new))\n"
        "(relation one (T i64))\n"  # (one x d): dim d of x has extent 1 or does not exist
    )


# --- s-expressions ------------------------------------------------------------------------------

@dataclass(frozen=True)
class Var:
    """A pattern variable (lower-case identifier in rule text)."""

    name: str


Sexp = object  # str (a head symbol) | int | float | Str | Var | tuple[Sexp, ...]


@dataclass(frozen=True)
class Str:
    """A string literal."""

    value: str


_TOKEN = re.compile(r'\s*(?:(\()|(\))|"((?:[^"\\]|\\.)*)"|([^\s()"]+))')


def parse(text: str) -> Sexp:
    """Parse one s-expression of rule text: heads are symbols, lower-case identifiers are variables."""
    tokens = list(_tokens(text))
    pos, out = _parse_at(tokens, 0, text)
    if pos != len(tokens):
        raise ValueError(f"trailing input after the s-expression in {text!r}")
    return out


def _tokens(text: str) -> Iterator[tuple[str, str]]:
    pos = 0
    text = text.rstrip()
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if not m:
            raise ValueError(f"cannot tokenize {text[pos:]!r}")
        pos = m.end()
        if m.group(1):
            yield ("(", "(")
        elif m.group(2):
            yield (")", ")")
        elif m.group(3) is not None:
            yield ("str", m.group(3))
        else:
            yield ("atom", m.group(4))


def _atom(tok: str) -> Sexp:
    if re.fullmatch(r"-?\d+", tok):
        return int(tok)
    if re.fullmatch(r"-?(\d+\.\d*|\d*\.\d+|\d+)(e-?\d+)?|-?\d+e-?\d+", tok):
        return float(tok)
    if tok[0].islower():
        return Var(tok)
    return tok


def _parse_at(tokens: list[tuple[str, str]], i: int, text: str) -> tuple[int, Sexp]:
    if i >= len(tokens):
        raise ValueError(f"unexpected end of {text!r}")
    kind, tok = tokens[i]
    if kind == "(":
        items: list[Sexp] = []
        i += 1
        while i < len(tokens) and tokens[i][0] != ")":
            i, item = _parse_at(tokens, i, text)
            if not items and isinstance(item, Var):
                item = item.name  # the head of a list is an operator name, never a variable
            items.append(item)
        if i >= len(tokens):
            raise ValueError(f"missing ')' in {text!r}")
        return i + 1, tuple(items)
    if kind == ")":
        raise ValueError(f"unexpected ')' in {text!r}")
    if kind == "str":
        return i + 1, Str(tok)
    return i + 1, _atom(tok)


def fmt(e: Sexp) -> str:
    """Format an s-expression as egglog text."""
    if isinstance(e, tuple):
        return "(" + " ".join(fmt(x) for x in e) + ")"
    if isinstance(e, Var):
        return e.name
    if isinstance(e, Str):
        return '"' + e.value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(e, bool):
        raise TypeError("booleans are not terms")
    if isinstance(e, float):
        return fmt_float(e)
    return str(e)


def fmt_float(c: float) -> str:
    """A float literal egglog parses back to the same double."""
    r = repr(float(c))
    if r in ("inf", "-inf", "nan"):
        raise ValueError(f"constant {c} cannot appear in a term")
    if "." not in r and "e" not in r:
        r += ".0"
    if "e" in r and "." not in r.split("e")[0]:
        mant, ex = r.split("e")
        r = f"{mant}.0e{ex}"
    return r


def variables(e: Sexp) -> list[str]:
    """Variable names of a pattern, in first-occurrence order."""
    out: list[str] = []

    def walk(x: Sexp) -> None:
        if isinstance(x, Var):
            if x.name not in out:
                out.append(x.name)
        elif isinstance(x, tuple):
            for y in x:
                walk(y)
    walk(e)
    return out


def size(e: Sexp) -> int:
    return 1 + sum(size(x) for x in e) if isinstance(e, tuple) else 1
