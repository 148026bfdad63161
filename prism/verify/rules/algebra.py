"""Algebraic identities of the operators (no parallel dims): commutativity, associativity,
distributivity, matmul rules, transposes, exp/sub/div rules, concat and slice with matmul.

A direction is left out where it would need a shape fact the analysis cannot give (e.g. expanding
``a @ (b + c)`` when ``b`` broadcasts along the contraction dim); the other direction stays.
"""

from __future__ import annotations

from prism.verify.rules.base import Rule, SizeStr, both, rewrite
from prism.verify.terms import BINARY

RULESET = "algebra"
_MN = {"a": ("m", "n"), "b": ("m", "n"), "c": ("m", "n")}
_CHAIN = {"a": ("m", "k"), "b": ("k", "n"), "c": ("n", "o")}


def _rules() -> list[Rule]:
    r = RULESET
    out = [
        rewrite("alg.add-comm", r, "(Add a b)", "(Add b a)", ex={"a": ("m", "n"), "b": ("n",)}),
        rewrite("alg.mul-comm", r, "(Mul a b)", "(Mul b a)", ex={"a": ("m", "n"), "b": ("m", 1)}),
        rewrite("alg.maximum-comm", r, "(Maximum a b)", "(Maximum b a)", ex=_MN),
        *both("alg.add-assoc", r, "(Add (Add a b) c)", "(Add a (Add b c))", ex={**_MN, "b": ("n",)}),
        *both("alg.mul-assoc", r, "(Mul (Mul a b) c)", "(Mul a (Mul b c))", ex={**_MN, "c": ("m", 1)}),
        *both("alg.mul-add-distrib", r, "(Mul a (Add b c))", "(Add (Mul a b) (Mul a c))", ex={**_MN, "a": ("m", 1)}),
        *both("alg.mul-sub-distrib", r, "(Mul a (Sub b c))", "(Sub (Mul a b) (Mul a c))", ex=_MN),
        *both("alg.div-add-distrib", r, "(Div (Add a b) c)", "(Add (Div a c) (Div b c))", ex={**_MN, "c": ("m", 1)}),
        rewrite("alg.matmul-factor-left", r, "(Add (Matmul a b) (Matmul a c))", "(Matmul a (Add b c))",
                ex={"a": ("m", "k"), "b": ("k", "n"), "c": ("z", "k", "n")},
                doc="only the factoring direction: expanding would need b, c to have the full contraction extent"),
        rewrite("alg.matmul-factor-right", r, "(Add (Matmul a c) (Matmul b c))", "(Matmul (Add a b) c)",
                ex={"a": ("m", "k"), "b": ("m", "k"), "c": ("k", "n")}),
        *both("alg.matmul-assoc", r, "(Matmul (Matmul a b) c)", "(Matmul a (Matmul b c))", ex=_CHAIN),
        *both("alg.matmul-scale-left", r, "(Matmul (Scale a c) b)", "(Scale (Matmul a b) c)",
              ex={"a": ("m", "k"), "b": ("k", "n")}),
        *both("alg.matmul-scale-right", r, "(Matmul a (Scale b c))", "(Scale (Matmul a b) c)",
              ex={"a": ("m", "k"), "b": ("k", "n")}),
        *both("alg.scale-mul", r, "(Mul (Scale a c) b)", "(Scale (Mul a b) c)", ex={"a": ("m", "n"), "b": ("n",)}),
        *both("alg.scale-add", r, "(Scale (Add a b) c)", "(Add (Scale a c) (Scale b c))", ex=_MN),
        rewrite("alg.scale-comm", r, "(Scale (Scale x a) b)", "(Scale (Scale x b) a)", ex={"x": ("m", "n")}),
        *both("alg.matmul-col-mul", r, "(Mul (Matmul a b) s)", "(Matmul a (Mul b s))", "(one s -2)",
              ex={"a": ("m", "k"), "b": ("k", "n"), "s": ("z", 1, "n")}, doc="a column scale commutes with matmul"),
        *both("alg.matmul-col-div", r, "(Div (Matmul a b) s)", "(Matmul a (Div b s))", "(one s -2)",
              ex={"a": ("m", "k"), "b": ("k", "n"), "s": (1, "n")}),
        *both("alg.transpose-matmul", r, "(Transpose (Matmul a b) -2 -1)",
              "(Matmul (Transpose b -2 -1) (Transpose a -2 -1))", ex={"a": ("z", "m", "k"), "b": ("k", "n")}),
        *both("alg.transpose-Un", r, "(Transpose (Un f x) i j)", "(Un f (Transpose x i j))",
              ex={"x": ("m", "n", "k"), "i": -3, "j": -2}),
        *both("alg.transpose-Scale", r, "(Transpose (Scale x c) i j)", "(Scale (Transpose x i j) c)",
              ex={"x": ("m", "n"), "i": -2, "j": -1}),
        *both("alg.exp-add", r, '(Un "exp" (Add a b))', '(Mul (Un "exp" a) (Un "exp" b))',
              ex={"a": ("m", "n"), "b": ("m", 1)}),
        *both("alg.exp-sub", r, '(Un "exp" (Sub a b))', '(Div (Un "exp" a) (Un "exp" b))',
              ex={"a": ("m", "n"), "b": ("m", 1)}),
        rewrite("alg.add-sub-cancel", r, "(Add (Sub a b) b)", "a", ex={"a": ("m", "n"), "b": ("m", "n")}),
        rewrite("alg.sub-add-cancel", r, "(Sub (Add a b) b)", "a", ex={"a": ("m", "n"), "b": ("m", "n")}),
        *both("alg.sub-neg", r, "(Sub a b)", '(Add a (Un "neg" b))', ex={"a": ("m", "n"), "b": ("n",)}),
        rewrite("alg.neg-neg", r, '(Un "neg" (Un "neg" x))', "x", ex={"x": ("m", "n")}),
        *both("alg.silu", r, '(Un "silu" x)', '(Mul x (Un "sigmoid" x))', ex={"x": ("m", "n")}),
        *both("alg.rsqrt", r, '(Div a (Un "sqrt" x))', '(Mul a (Un "rsqrt" x))',
              ex={"a": ("m", "n"), "x": ("m", 1)}),
        *both("alg.square", r, '(Un "square" x)', "(Mul x x)", ex={"x": ("m", "n")}),
        *both("alg.div-div", r, "(Div (Div a b) c)", "(Div a (Mul b c))", ex={**_MN, "c": ("m", 1)}),
        *both("alg.sum-matmul-cols", r, "(Sum (Matmul a b) -1)", "(Matmul a (Sum b -1))",
              ex={"a": ("m", "k"), "b": ("k", "n")}),
        *both("alg.sum-matmul-rows", r, "(Sum (Matmul a b) -2)", "(Matmul (Sum a -2) b)",
              ex={"a": ("m", "k"), "b": ("k", "n")}),
        rewrite("alg.sum-sum-comm", r, "(Sum (Sum x d) e)", "(Sum (Sum x e) d)", ex={"x": ("m", "n", "k"), "d": -1,
                                                                                "e": -3}),
        rewrite("alg.max-max-comm", r, "(Max (Max x d) e)", "(Max (Max x e) d)", ex={"x": ("m", "n", "k"), "d": -2,
                                                                                "e": -1}),
        # concat and slice (sizes are part of the term, so parts line up by construction)
        rewrite("alg.concat-matmul-contract", r, "(Matmul (Concat a1 a2 -1 s1 s2) (Concat b1 b2 -2 s1 s2))",
                "(Add (Matmul a1 b1) (Matmul a2 b2))",
                ex={"a1": ("m", "k"), "a2": ("m", "l"), "b1": ("k", "n"), "b2": ("l", "n"),
                    "s1": SizeStr("k"), "s2": SizeStr("l")}, doc="concat along the contraction = sum of products"),
        *both("alg.matmul-concat-cols", r, "(Matmul a (Concat b1 b2 -1 s1 s2))",
              "(Concat (Matmul a b1) (Matmul a b2) -1 s1 s2)",
              ex={"a": ("m", "k"), "b1": ("k", "n"), "b2": ("k", "l"), "s1": SizeStr("n"), "s2": SizeStr("l")}),
        *both("alg.matmul-concat-rows", r, "(Matmul (Concat a1 a2 -2 s1 s2) b)",
              "(Concat (Matmul a1 b) (Matmul a2 b) -2 s1 s2)",
              ex={"a1": ("m", "k"), "a2": ("l", "k"), "b": ("k", "n"), "s1": SizeStr("m"), "s2": SizeStr("l")}),
        rewrite("alg.slice-concat-first", r, '(Slice (Concat a b d s1 s2) d "0" s1)', "a",
                ex={"a": ("m", "k"), "b": ("m", "l"), "d": -1, "s1": SizeStr("k"), "s2": SizeStr("l")}),
        rewrite("alg.slice-concat-second", r, "(Slice (Concat a b d s1 s2) d s1 s2)", "b",
                ex={"a": ("k", "m"), "b": ("l", "m"), "d": -2, "s1": SizeStr("k"), "s2": SizeStr("l")}),
        *both("alg.slice-matmul-cols", r, "(Slice (Matmul a b) -1 st ln)", "(Matmul a (Slice b -1 st ln))",
              ex={"a": ("m", "k"), "b": ("k", "s+l+t"), "st": SizeStr("s"), "ln": SizeStr("l")}),
        *both("alg.slice-matmul-rows", r, "(Slice (Matmul a b) -2 st ln)", "(Matmul (Slice a -2 st ln) b)",
              ex={"a": ("s+l+t", "k"), "b": ("k", "n"), "st": SizeStr("s"), "ln": SizeStr("l")}),
        *both("alg.concat-Un", r, "(Un f (Concat a b d s1 s2))", "(Concat (Un f a) (Un f b) d s1 s2)",
              ex={"a": ("m", "k"), "b": ("m", "l"), "d": -1, "s1": SizeStr("k"), "s2": SizeStr("l")}),
        *both("alg.concat-Scale", r, "(Scale (Concat a b d s1 s2) c)", "(Concat (Scale a c) (Scale b c) d s1 s2)",
              ex={"a": ("m", "k"), "b": ("m", "l"), "d": -1, "s1": SizeStr("k"), "s2": SizeStr("l"), "c": 1.5}),
        *both("alg.concat-Shift", r, "(Shift (Concat a b d s1 s2) c)", "(Concat (Shift a c) (Shift b c) d s1 s2)",
              ex={"a": ("k", "m"), "b": ("l", "m"), "d": -2, "s1": SizeStr("k"), "s2": SizeStr("l"), "c": -0.5}),
        rewrite("alg.sum-of-scale", r, "(Sum (Scale x c) d)", "(Scale (Sum x d) c)",
                ex={"x": ("m", "n"), "c": 1.5, "d": -1}, doc="a constant scale leaves a sum (one direction)"),
        # a transpose moves through a concat: the concatenated axis follows the swap (i <-> j), any other
        # axis stays (i < j, as the translator writes them)
        *both("alg.transpose-concat-i", r, "(Transpose (Concat a b i s1 s2) i j)",
              "(Concat (Transpose a i j) (Transpose b i j) j s1 s2)",
              ex={"a": ("k", "m"), "b": ("l", "m"), "i": -2, "j": -1, "s1": SizeStr("k"), "s2": SizeStr("l")}),
        *both("alg.transpose-concat-j", r, "(Transpose (Concat a b j s1 s2) i j)",
              "(Concat (Transpose a i j) (Transpose b i j) i s1 s2)",
              ex={"a": ("z", "m", "k"), "b": ("z", "m", "l"), "i": -3, "j": -1, "s1": SizeStr("k"),
                  "s2": SizeStr("l")}),
        *both("alg.transpose-concat-other", r, "(Transpose (Concat a b d s1 s2) i j)",
              "(Concat (Transpose a i j) (Transpose b i j) d s1 s2)", "(!= d i)", "(!= d j)",
              ex={"a": ("k", "m", "n"), "b": ("l", "m", "n"), "d": -3, "i": -2, "j": -1, "s1": SizeStr("k"),
                  "s2": SizeStr("l")}),
        # constant folding (f64 arithmetic on the constants: (x*2)*3 = x*6, (x+1)*2 = x*2+2); one direction
        # each, so the e-graph only ever gets fewer nested constants
        rewrite("alg.scale-fold", r, "(Scale (Scale x a) b)", "(Scale x (* a b))", ex={"x": ("m", "n"), "a": 2.0,
                                                                                   "b": -3.0}),
        rewrite("alg.shift-fold", r, "(Shift (Shift x a) b)", "(Shift x (+ a b))", ex={"x": ("m", "n"), "a": 1.5,
                                                                                   "b": -0.25}),
        rewrite("alg.scale-shift", r, "(Scale (Shift x a) b)", "(Shift (Scale x b) (* a b))",
                ex={"x": ("m", "n"), "a": 1.0, "b": 2.0}, doc="(x + a) * b = x * b + a * b"),
        rewrite("alg.scale-one", r, "(Scale x 1.0)", "x", ex={"x": ("m", "n")}),
        rewrite("alg.shift-zero", r, "(Shift x 0.0)", "x", ex={"x": ("m", "n")}),
    ]
    for b in BINARY:
        out += both(f"alg.concat-{b}", r, f"({b} (Concat a1 a2 d s1 s2) (Concat b1 b2 d s1 s2))",
                    f"(Concat ({b} a1 b1) ({b} a2 b2) d s1 s2)",
                    ex={"a1": ("m", "k"), "a2": ("m", "l"), "b1": ("m", "k"), "b2": ("m", "l"), "d": -1,
                        "s1": SizeStr("k"), "s2": SizeStr("l")})
        out += both(f"alg.transpose-{b}", r, f"(Transpose ({b} a b) i j)", f"({b} (Transpose a i j) (Transpose b i j))",
                    "(= (rank a) (rank b))", ex={"a": ("m", "n", 1), "b": ("m", 1, "k"), "i": -3, "j": -1})
    return out


RULES: tuple[Rule, ...] = tuple(_rules())
