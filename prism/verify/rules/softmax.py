"""Online-softmax rescaling: the identities that make per-chunk softmax statistics, each taken against its
own running max, add up to the statistics against the global max."""

from __future__ import annotations

from prism.verify.rules.base import Rule, both, rewrite

RULESET = "softmax"

RULES: tuple[Rule, ...] = (
    rewrite("softmax.rescale", RULESET, '(Mul (Un "exp" (Sub a b)) (Un "exp" (Sub b c)))', '(Un "exp" (Sub a c))',
            ex={"a": ("m", "n"), "b": ("m", 1), "c": ("m", 1)},
            doc="exp(x - m_old) * exp(m_old - m_new) = exp(x - m_new)"),
    *both("softmax.sum-mul", RULESET, "(Mul (Sum x d) y)", "(Sum (Mul x y) d)", "(one y d)",
          ex={"x": ("m", "n"), "y": ("m", 1), "d": -1}, doc="a factor constant along d moves into a sum over d"),
    *both("softmax.sum-div", RULESET, "(Div (Sum x d) y)", "(Sum (Div x y) d)", "(one y d)",
          ex={"x": ("m", "n"), "y": ("m", 1), "d": -1}),
    *both("softmax.matmul-row-mul", RULESET, "(Mul (Matmul a b) r)", "(Matmul (Mul a r) b)", "(one r -1)",
          ex={"a": ("m", "k"), "b": ("k", "n"), "r": ("z", "m", 1)}, doc="a row scale commutes with matmul"),
    *both("softmax.matmul-row-div", RULESET, "(Div (Matmul a b) r)", "(Matmul (Div a r) b)", "(one r -1)",
          ex={"a": ("m", "k"), "b": ("k", "n"), "r": ("m", 1)}),
    *both("softmax.max-shift", RULESET, "(Max (Add x c) d)", "(Add (Max x d) c)", "(one c d)",
          ex={"x": ("m", "n"), "c": ("m", 1), "d": -1}),
    rewrite("softmax.sub-shift", RULESET, "(Sub (Add a c) (Add b c))", "(Sub a b)",
            ex={"a": ("m", "n"), "b": ("m", 1), "c": ("m", "n")}),
)
