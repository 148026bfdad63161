"""Cancellation rules: a fold over a parallel dim undoes the layer that introduced it."""

from __future__ import annotations

from prism.verify.rules.base import Rule, SizeStr, rewrite
from prism.verify.terms import REDUCTIONS

RULESET = "cancel"

RULES: tuple[Rule, ...] = (
    rewrite("cancel.combine-partition", RULESET, "(Combine (Partition t d p) d p)", "t",
            ex={"t": ("m", "n*p"), "d": -1}, doc="concatenating the chunks gives back the tensor"),
    rewrite("cancel.reduce-partial-matmul", RULESET, "(Reduce (Matmul (Partition a -1 p) (Partition b -2 p)) p)",
            "(Matmul a b)", ex={"a": ("z", "m", "k*p"), "b": ("k*p", "n")},
            doc="split-K: the partial products over the chunks of the contraction add up to the product"),
    rewrite("cancel.reduce-partial-sum", RULESET, "(Reduce (Sum (Partition x d p) d) p)", "(Sum x d)",
            ex={"x": ("m", "n*p"), "d": -1}),
    rewrite("cancel.reducemax-partial-max", RULESET, "(ReduceMax (Max (Partition x d p) d) p)", "(Max x d)",
            ex={"x": ("m", "n*p"), "d": -1}),
    rewrite("cancel.squeeze-unsqueeze", RULESET, "(Squeeze (Unsqueeze x k) k)", "x", ex={"x": ("m", "n"), "k": -2}),
    rewrite("cancel.transpose-transpose", RULESET, "(Transpose (Transpose x i j) i j)", "x",
            ex={"x": ("m", "n", "k"), "i": -3, "j": -1}),
    rewrite("cancel.splitaxis-combine", RULESET, "(SplitAxis (Combine x d (P n sa)) d sa sb)",
            "(Combine (Unsqueeze x (- d 1)) (- d 1) (P n sa))",
            ex={"x": ("z", "r", "e"), "d": -2, "n": "p", "sa": SizeStr("a"), "sb": SizeStr("r")},
            doc="reshaping [.., |p|*r, ..] to [.., |p|, r, ..] turns the concatenated chunks into a new axis"),
    *(rewrite(f"cancel.{r}-extent1", RULESET, f"({r} x d)", "x", "(one x d)", ex={"x": ("m", 1), "d": -1},
              doc="a reduction over a dim of extent 1 is the identity") for r in REDUCTIONS),
)
