"""The rewrite rules operators bring with their definitions (``OpDef.rules`` in ``prism.ir.elementwise`` and
``prism.ir.reductions``),
as rules of the algebra stage. Their examples are drawn on [m, n] tensors (``x``) and broadcast pairs."""

from __future__ import annotations

from prism.ir.ops import OPS
from prism.verify.rules import algebra
from prism.verify.rules.base import Rule, both, rewrite

RULESET = algebra.RULESET
_EX = {"x": ("m", "n"), "a": ("m", "n"), "b": ("m", "n")}


def _rules() -> list[Rule]:
    out: list[Rule] = []
    for op in OPS.values():
        for r in op.rules:
            doc = f"brought by operator {op.name}"
            ex = {**_EX, **dict(r.ex)}
            if r.both:
                out += both(r.name, RULESET, r.lhs, r.rhs, ex=ex, doc=doc)
            else:
                out.append(rewrite(r.name, RULESET, r.lhs, r.rhs, ex=ex, doc=doc))
    return out


RULES: tuple[Rule, ...] = tuple(_rules())
