"""Layout (view) rules: an inserted extent-1 axis moves outward through operators, so a reshape that
turned concatenated chunks into a new axis (``cancel.splitaxis-combine``) meets its inverse squeeze."""

from __future__ import annotations

from prism.verify.rules.base import Rule, rewrite
from prism.verify.terms import BINARY, REDUCTIONS

RULESET = "layout"


def _rules() -> list[Rule]:
    out = [
        rewrite("view.unsqueeze.Un", RULESET, "(Un f (Unsqueeze x k))", "(Unsqueeze (Un f x) k)",
                ex={"x": ("m", "n"), "k": -2}),
        rewrite("view.unsqueeze.Scale", RULESET, "(Scale (Unsqueeze x k) c)", "(Unsqueeze (Scale x c) k)",
                ex={"x": ("m", "n"), "k": -1}),
        rewrite("view.unsqueeze.Shift", RULESET, "(Shift (Unsqueeze x k) c)", "(Unsqueeze (Shift x c) k)",
                ex={"x": ("m", "n"), "k": -3}),
        rewrite("view.unsqueeze.Replicate", RULESET, "(Replicate (Unsqueeze x k) p)", "(Unsqueeze (Replicate x p) k)",
                ex={"x": ("m", "n"), "k": -2}),
        rewrite("view.unsqueeze.Matmul", RULESET, "(Matmul (Unsqueeze a k) (Unsqueeze b k))",
                "(Unsqueeze (Matmul a b) k)", "(< k -2)", ex={"a": ("z", "m", "k"), "b": ("k", "n"), "k": -3}),
        rewrite("view.unsqueeze.adjacent-right", RULESET, "(Unsqueeze x k)", "(Unsqueeze x (+ k 1))",
                "(< k -1)", "(one x (+ k 1))", ex={"x": ("m", 1, "n"), "k": -3},
                doc="inserting an extent-1 axis before or after another one is the same reshape"),
        rewrite("view.unsqueeze.adjacent-left", RULESET, "(Unsqueeze x k)", "(Unsqueeze x (- k 1))",
                "(one x k)", "(= r (rank x))", "(>= k (- 0 r))", ex={"x": ("m", 1, "n"), "k": -2}),
        rewrite("view.squeeze.adjacent-right", RULESET, "(Squeeze x k)", "(Squeeze x (+ k 1))",
                "(< k -1)", "(one x (+ k 1))", ex={"x": ("m", 1, 1, "n"), "k": -3}),
        rewrite("view.squeeze.adjacent-left", RULESET, "(Squeeze x k)", "(Squeeze x (- k 1))",
                "(one x (- k 1))", "(= r (rank x))", "(>= (- k 1) (- 0 r))", ex={"x": ("m", 1, 1, "n"), "k": -2}),
        rewrite("view.splitaxis-inner1", RULESET, '(SplitAxis x d sa "1")', "(Unsqueeze x d)",
                ex={"x": ("m", "n"), "d": -2, "sa": "m"}),
        rewrite("view.splitaxis-outer1", RULESET, '(SplitAxis x d "1" sb)', "(Unsqueeze x (- d 1))",
                ex={"x": ("m", "n"), "d": -1, "sb": "n"}),
    ]
    for b in BINARY:
        out.append(rewrite(f"view.unsqueeze.{b}", RULESET, f"({b} (Unsqueeze a k) (Unsqueeze b k))",
                           f"(Unsqueeze ({b} a b) k)", ex={"a": ("z", "m", "n"), "b": ("n",), "k": -2}))
    for r in REDUCTIONS:
        out += [
            rewrite(f"view.unsqueeze.{r}-right", RULESET, f"({r} (Unsqueeze x k) d)", f"(Unsqueeze ({r} x d) k)",
                    "(> d k)", ex={"x": ("m", "n"), "k": -2, "d": -1}),
            rewrite(f"view.unsqueeze.{r}-left", RULESET, f"({r} (Unsqueeze x k) d)", f"(Unsqueeze ({r} x (+ d 1)) k)",
                    "(< d k)", ex={"x": ("m", "n"), "k": -2, "d": -3}),
        ]
    return out


RULES: tuple[Rule, ...] = tuple(_rules())
