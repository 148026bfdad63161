"""Split-reduction rules: a reduction over a concatenated dim is a fold of per-chunk reductions, and
folds over a parallel dim distribute over linear operators."""

from __future__ import annotations

from prism.verify.rules.base import Rule, both, rewrite

RULESET = "split"

RULES: tuple[Rule, ...] = (
    rewrite("split.sum-combine", RULESET, "(Sum (Combine x d p) d)", "(Reduce (Sum x d) p)",
            ex={"x": ("m", "n"), "d": -1}, doc="sum(t) = reduce(sum(partition(t)))"),
    rewrite("split.max-combine", RULESET, "(Max (Combine x d p) d)", "(ReduceMax (Max x d) p)",
            ex={"x": ("m", "n"), "d": -1}),
    rewrite("split.matmul-combine", RULESET, "(Matmul (Combine a -1 p) (Combine b -2 p))", "(Reduce (Matmul a b) p)",
            ex={"a": ("m", "k"), "b": ("k", "n")},
            doc="a matmul over a concatenated contraction is a sum of partial products"),
    *both("split.reduce-add", RULESET, "(Reduce (Add a b) p)", "(Add (Reduce a p) (Reduce b p))",
          ex={"a": ("m", "n"), "b": ("m", "n")}),
    *both("split.reduce-scale", RULESET, "(Reduce (Scale x c) p)", "(Scale (Reduce x p) c)", ex={"x": ("m", "n")}),
    rewrite("split.reduce-mul-rep", RULESET, "(Reduce (Mul a (Replicate b p)) p)", "(Mul (Reduce a p) b)",
            ex={"a": ("m", "n"), "b": ("m", 1)}),
    rewrite("split.reduce-div-rep", RULESET, "(Reduce (Div a (Replicate b p)) p)", "(Div (Reduce a p) b)",
            ex={"a": ("m", "n"), "b": ("m", 1)}),
    rewrite("split.reduce-matmul-left", RULESET, "(Reduce (Matmul a (Replicate b p)) p)", "(Matmul (Reduce a p) b)",
            ex={"a": ("m", "k"), "b": ("k", "n")}),
    rewrite("split.reduce-matmul-right", RULESET, "(Reduce (Matmul (Replicate a p) b) p)", "(Matmul a (Reduce b p))",
            ex={"a": ("m", "k"), "b": ("k", "n")}),
    rewrite("split.reduce-unsqueeze", RULESET, "(Reduce (Unsqueeze x k) p)", "(Unsqueeze (Reduce x p) k)",
            ex={"x": ("m", "n"), "k": -2}),
    rewrite("split.reducemax-unsqueeze", RULESET, "(ReduceMax (Unsqueeze x k) p)", "(Unsqueeze (ReduceMax x p) k)",
            ex={"x": ("m", "n"), "k": -3}),
)
