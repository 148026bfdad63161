"""Parallel-commuting rules: family layers (partition, replicate, combine) move outward through operators.

Direction: toward the root. A block graph's output is ``combine``/``reduce`` over the grid of a per-block
term whose leaves are partitions/replicas of the inputs; lifting the layers up to the output lets the
cancellation rules (``rules.cancel``) remove them. Layers over different parallel dims commute
(``swap.*``), so a layer stuck at an operator (a reduction over its own dim) lets the others pass.
"""

from __future__ import annotations

from prism.verify.rules.base import Par, Rule, SizeStr, rewrite
from prism.verify.terms import BINARY, REDUCTIONS

RULESET = "parallel"
COMBINE = "combine"  # combine layers lifted at the kernel level (after the block-level cancellations)
_UNARY_LIKE = {"Un": "(Un f {x})", "Scale": "(Scale {x} c)", "Shift": "(Shift {x} c)"}


def _unary() -> list[Rule]:
    out = []
    for name, tmpl in _UNARY_LIKE.items():
        def t(x: str, tmpl: str = tmpl) -> str:
            return tmpl.format(x=x)
        out += [
            rewrite(f"lift.{name}.partition", RULESET, t("(Partition x d p)"), f"(Partition {t('x')} d p)",
                    ex={"x": ("m", "n*p"), "d": -1}),
            rewrite(f"lift.{name}.replicate", RULESET, t("(Replicate x p)"), f"(Replicate {t('x')} p)",
                    ex={"x": ("m", "n")}),
            rewrite(f"lift.{name}.combine", COMBINE, t("(Combine x d p)"), f"(Combine {t('x')} d p)",
                    ex={"x": ("m", "n"), "d": -2}),
        ]
    return out


def _binary() -> list[Rule]:
    out = []
    for b in BINARY:
        full = {"a": ("m", "n*p"), "b": ("m", "n*p"), "d": -1}
        out += [
            rewrite(f"lift.{b}.part-part", RULESET, f"({b} (Partition a d p) (Partition b d p))",
                    f"(Partition ({b} a b) d p)", ex=full),
            rewrite(f"lift.{b}.part-rep", RULESET, f"({b} (Partition a d p) (Replicate b p))",
                    f"(Partition ({b} a b) d p)", "(one b d)", ex={**full, "b": ("m", 1)}),
            rewrite(f"lift.{b}.rep-part", RULESET, f"({b} (Replicate a p) (Partition b d p))",
                    f"(Partition ({b} a b) d p)", "(one a d)", ex={**full, "a": (1, "k", "m", 1)}),
            rewrite(f"lift.{b}.rep-rep", RULESET, f"({b} (Replicate a p) (Replicate b p))",
                    f"(Replicate ({b} a b) p)", ex={"a": ("m", 1), "b": ("n",)}),
            rewrite(f"lift.{b}.comb-comb", COMBINE, f"({b} (Combine a d p) (Combine b d p))",
                    f"(Combine ({b} a b) d p)", ex={"a": ("m", "n"), "b": ("m", "n"), "d": -2}),
            rewrite(f"lift.{b}.comb-any", COMBINE, f"({b} (Combine a d p) b)",
                    f"(Combine ({b} a (Replicate b p)) d p)", "(one b d)",
                    ex={"a": ("m", "n"), "b": (1, "n"), "d": -2}),
            rewrite(f"lift.{b}.any-comb", COMBINE, f"({b} a (Combine b d p))",
                    f"(Combine ({b} (Replicate a p) b) d p)", "(one a d)",
                    ex={"a": ("m", 1), "b": ("m", "n"), "d": -1}),
        ]
    return out


def _reductions() -> list[Rule]:
    out = []
    for r in REDUCTIONS:
        out += [
            rewrite(f"lift.{r}.partition", RULESET, f"({r} (Partition x d p) k)", f"(Partition ({r} x k) d p)",
                    "(!= d k)", ex={"x": ("m*p", "n"), "d": -2, "k": -1}),
            rewrite(f"lift.{r}.replicate", RULESET, f"({r} (Replicate x p) k)", f"(Replicate ({r} x k) p)",
                    ex={"x": ("m", "n"), "k": -1}),
            rewrite(f"lift.{r}.combine", COMBINE, f"({r} (Combine x d p) k)", f"(Combine ({r} x k) d p)",
                    "(!= d k)", ex={"x": ("m", "n"), "d": -1, "k": -2}),
        ]
    return out


def _matmul() -> list[Rule]:
    mk = {"a": ("m*p", "k"), "b": ("k", "n")}
    return [
        rewrite("lift.Matmul.rows", RULESET, "(Matmul (Partition a -2 p) (Replicate b p))",
                "(Partition (Matmul a b) -2 p)", ex=mk),
        rewrite("lift.Matmul.cols", RULESET, "(Matmul (Replicate a p) (Partition b -1 p))",
                "(Partition (Matmul a b) -1 p)", ex={"a": ("z", "m", "k"), "b": ("k", "n*p")}),
        rewrite("lift.Matmul.batch", RULESET, "(Matmul (Partition a d p) (Partition b d p))",
                "(Partition (Matmul a b) d p)", "(< d -2)",
                ex={"a": ("z*p", "m", "k"), "b": ("z*p", "k", "n"), "d": -3}),
        rewrite("lift.Matmul.batch-left", RULESET, "(Matmul (Partition a d p) (Replicate b p))",
                "(Partition (Matmul a b) d p)", "(< d -2)", "(one b d)",
                ex={"a": ("z*p", "y", "m", "k"), "b": ("y", "k", "n"), "d": -4}),
        rewrite("lift.Matmul.batch-right", RULESET, "(Matmul (Replicate a p) (Partition b d p))",
                "(Partition (Matmul a b) d p)", "(< d -2)", "(one a d)",
                ex={"a": (1, "m", "k"), "b": ("z*p", "k", "n"), "d": -3}),
        rewrite("lift.Matmul.rep", RULESET, "(Matmul (Replicate a p) (Replicate b p))",
                "(Replicate (Matmul a b) p)", ex={"a": ("m", "k"), "b": ("k", "n")}),
        rewrite("lift.Matmul.comb-rows", COMBINE, "(Matmul (Combine a -2 p) b)",
                "(Combine (Matmul a (Replicate b p)) -2 p)", ex={"a": ("m", "k"), "b": ("z", "k", "n")}),
        rewrite("lift.Matmul.comb-cols", COMBINE, "(Matmul a (Combine b -1 p))",
                "(Combine (Matmul (Replicate a p) b) -1 p)", ex={"a": ("m", "k"), "b": ("k", "n")}),
        rewrite("lift.Matmul.comb-batch", COMBINE, "(Matmul (Combine a d p) (Combine b d p))",
                "(Combine (Matmul a b) d p)", "(< d -2)", ex={"a": ("z", "m", "k"), "b": ("z", "k", "n"), "d": -3}),
    ]


def _layout() -> list[Rule]:
    x4 = ("a", "b", "c", "e")
    out = []
    for layer, arg in (("Partition", "d p"), ("Combine", "d p")):
        rs = RULESET if layer == "Partition" else COMBINE
        split = {"d": -3, "x": ("a", "b*p" if layer == "Partition" else "b", "c", "e")}
        out += [
            rewrite(f"lift.Transpose.{layer}-i", rs, f"(Transpose ({layer} x i p) i j)",
                    f"({layer} (Transpose x i j) j p)", ex={**split, "i": -3, "j": -1}),
            rewrite(f"lift.Transpose.{layer}-j", rs, f"(Transpose ({layer} x j p) i j)",
                    f"({layer} (Transpose x i j) i p)", ex={**split, "i": -4, "j": -3}),
            rewrite(f"lift.Transpose.{layer}-other", rs, f"(Transpose ({layer} x {arg}) i j)",
                    f"({layer} (Transpose x i j) {arg})", "(!= d i)", "(!= d j)", ex={**split, "i": -2, "j": -1}),
            rewrite(f"lift.Unsqueeze.{layer}-right", rs, f"(Unsqueeze ({layer} x {arg}) k)",
                    f"({layer} (Unsqueeze x k) {arg})", "(> d k)", ex={**split, "d": -2, "k": -3,
                                                                      "x": ("a", "c", "b*p" if layer == "Partition"
                                                                            else "b", "e")}),
            rewrite(f"lift.Unsqueeze.{layer}-left", rs, f"(Unsqueeze ({layer} x {arg}) k)",
                    f"({layer} (Unsqueeze x k) (- d 1) p)", "(<= d k)", ex={**split, "k": -3}),
            rewrite(f"lift.Squeeze.{layer}-right", rs, f"(Squeeze ({layer} x {arg}) k)",
                    f"({layer} (Squeeze x k) {arg})", "(> d k)",
                    ex={**split, "x": ("a", 1, "b*p" if layer == "Partition" else "b", "e"), "d": -2, "k": -3}),
            rewrite(f"lift.Squeeze.{layer}-left", rs, f"(Squeeze ({layer} x {arg}) k)",
                    f"({layer} (Squeeze x k) (+ d 1) p)", "(< d k)",
                    ex={**split, "x": ("a", "b*p" if layer == "Partition" else "b", 1, "e"), "d": -3, "k": -2}),
            rewrite(f"lift.SplitAxis.{layer}-right", rs, f"(SplitAxis ({layer} x e p) d sa sb)",
                    f"({layer} (SplitAxis x d sa sb) e p)", "(> e d)",
                    ex={"x": ("a", "m*n", "c*p" if layer == "Partition" else "c"), "d": -2, "e": -1,
                        "sa": "m", "sb": "n"}),
            rewrite(f"lift.SplitAxis.{layer}-left", rs, f"(SplitAxis ({layer} x e p) d sa sb)",
                    f"({layer} (SplitAxis x d sa sb) (- e 1) p)", "(< e d)",
                    ex={"x": ("a*p" if layer == "Partition" else "a", "m*n", "c"), "d": -2, "e": -3,
                        "sa": "m", "sb": "n"}),
        ]
    out += [
        rewrite("lift.Transpose.Replicate", RULESET, "(Transpose (Replicate x p) i j)",
                "(Replicate (Transpose x i j) p)", ex={"x": x4, "i": -3, "j": -1}),
        rewrite("lift.Unsqueeze.Replicate", RULESET, "(Unsqueeze (Replicate x p) k)",
                "(Replicate (Unsqueeze x k) p)", ex={"x": x4, "k": -2}),
        rewrite("lift.Squeeze.Replicate", RULESET, "(Squeeze (Replicate x p) k)",
                "(Replicate (Squeeze x k) p)", ex={"x": ("a", 1, "b"), "k": -2}),
        rewrite("lift.SplitAxis.Replicate", RULESET, "(SplitAxis (Replicate x p) d sa sb)",
                "(Replicate (SplitAxis x d sa sb) p)", ex={"x": ("a", "m*n"), "d": -1, "sa": "m", "sb": "n"}),
    ]
    return out


def _positional() -> list[Rule]:
    """A slice or a concatenation along a dim that the layer does not partition or combine commutes with it
    (a row-wise composite made of them -- rotate_half -- on tiles holding whole rows)."""
    out = []
    for layer in ("Partition", "Combine"):
        rs = RULESET if layer == "Partition" else COMBINE
        rows = "m*p" if layer == "Partition" else "m"
        out += [
            rewrite(f"lift.Slice.{layer}", rs, f"(Slice ({layer} x d p) k st ln)",
                    f"({layer} (Slice x k st ln) d p)", "(!= d k)",
                    ex={"x": (rows, "s+l+t"), "d": -2, "k": -1, "st": SizeStr("s"), "ln": SizeStr("l")}),
            rewrite(f"lift.Concat.{layer}", rs, f"(Concat ({layer} a d p) ({layer} b d p) k s1 s2)",
                    f"({layer} (Concat a b k s1 s2) d p)", "(!= d k)",
                    ex={"a": (rows, "k1"), "b": (rows, "l"), "d": -2, "k": -1, "s1": SizeStr("k1"),
                        "s2": SizeStr("l")}),
        ]
    out += [
        rewrite("lift.Slice.Replicate", RULESET, "(Slice (Replicate x p) k st ln)", "(Replicate (Slice x k st ln) p)",
                ex={"x": ("m", "s+l+t"), "k": -1, "st": SizeStr("s"), "ln": SizeStr("l")}),
        rewrite("lift.Concat.Replicate", RULESET, "(Concat (Replicate a p) (Replicate b p) k s1 s2)",
                "(Replicate (Concat a b k s1 s2) p)",
                ex={"a": ("m", "k1"), "b": ("m", "l"), "k": -1, "s1": SizeStr("k1"), "s2": SizeStr("l")}),
    ]
    return out


def _layers() -> list[Rule]:
    """Layers over different parallel dims commute; folds (combine/reduce) let other layers out."""
    two = {"p": Par("p"), "q": Par("q")}
    return [
        rewrite("swap.partition-partition", RULESET, "(Partition (Partition x d q) e p)",
                "(Partition (Partition x e p) d q)", "(!= d e)", "(!= p q)",
                ex={**two, "x": ("m*q", "n*p"), "d": -2, "e": -1}),
        rewrite("swap.partition-replicate", RULESET, "(Partition (Replicate x q) d p)",
                "(Replicate (Partition x d p) q)", "(!= p q)", ex={**two, "x": ("m", "n*p"), "d": -1}),
        rewrite("swap.replicate-partition", RULESET, "(Replicate (Partition x d q) p)",
                "(Partition (Replicate x p) d q)", "(!= p q)", ex={**two, "x": ("m", "n*q"), "d": -1}),
        rewrite("swap.replicate-replicate", RULESET, "(Replicate (Replicate x q) p)",
                "(Replicate (Replicate x p) q)", "(!= p q)", ex={**two, "x": ("m", "n")}),
        rewrite("lift.Combine.Partition", RULESET, "(Combine (Partition x e q) d p)",
                "(Partition (Combine x d p) e q)", "(!= d e)", "(!= p q)",
                ex={**two, "x": ("m", "n*q"), "d": -2, "e": -1}),
        rewrite("lift.Combine.Replicate", RULESET, "(Combine (Replicate x q) d p)",
                "(Replicate (Combine x d p) q)", "(!= p q)", ex={**two, "x": ("m", "n"), "d": -1}),
        rewrite("lift.Reduce.Partition", RULESET, "(Reduce (Partition x e q) p)",
                "(Partition (Reduce x p) e q)", "(!= p q)", ex={**two, "x": ("m", "n*q"), "e": -1}),
        rewrite("lift.Reduce.Replicate", RULESET, "(Reduce (Replicate x q) p)",
                "(Replicate (Reduce x p) q)", "(!= p q)", ex={**two, "x": ("m", "n")}),
        rewrite("lift.ReduceMax.Partition", RULESET, "(ReduceMax (Partition x e q) p)",
                "(Partition (ReduceMax x p) e q)", "(!= p q)", ex={**two, "x": ("m", "n*q"), "e": -1}),
        rewrite("lift.ReduceMax.Replicate", RULESET, "(ReduceMax (Replicate x q) p)",
                "(Replicate (ReduceMax x p) q)", "(!= p q)", ex={**two, "x": ("m", "n")}),
        rewrite("lift.Reduce.Combine", COMBINE, "(Reduce (Combine x d q) p)",
                "(Combine (Reduce x p) d q)", "(!= p q)", ex={**two, "x": ("m", "n"), "d": -1}),
    ]


_ALL = _unary() + _binary() + _reductions() + _matmul() + _layout() + _positional() + _layers()
RULES: tuple[Rule, ...] = tuple(r for r in _ALL if r.ruleset == RULESET)
COMBINE_RULES: tuple[Rule, ...] = tuple(r for r in _ALL if r.ruleset == COMBINE)
