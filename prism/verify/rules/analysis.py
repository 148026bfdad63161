"""Shape analysis: ``(rank x)`` and ``(one x d)`` (dim d of x has extent 1, or x has no dim d).

Only extents that are statically 1 give ``one`` facts, so a rule conditioned on ``one`` holds for every
value of the size symbols. Leaves (inputs, opaque reshapes) get their facts from the translation.
"""

from __future__ import annotations

from prism.verify.rules.base import Fact
from prism.verify.terms import BINARY, REDUCTIONS

RULESET = "analysis"
MAX_RANK = 8

_SAME_SHAPE = {  # pattern -> example
    "(Un f x)": {"f": "exp"}, "(Scale x c)": {}, "(Shift x c)": {},
    "(Partition x d p)": {"x": ("a", 1, "b*p"), "d": -1}, "(Replicate x p)": {},
    "(Reduce x p)": {}, "(ReduceMax x p)": {},
}


def _facts() -> list[Fact]:
    out: list[Fact] = []
    for pat, ex in _SAME_SHAPE.items():
        head = pat[1:].split()[0]
        base = {"x": ("a", 1, "b"), **ex}
        out.append(Fact(f"rank.{head}", pat, "(set (rank e) r)", ("(= r (rank x))",), (base,)))
        out.append(Fact(f"one.{head}", pat, "(one e k)", ("(one x k)",), ({**base, "k": -2},)))
    out += [
        Fact("rank.Combine", "(Combine x d p)", "(set (rank e) r)", ("(= r (rank x))",), ({"x": (1, "a"), "d": -1},)),
        Fact("one.Combine", "(Combine x d p)", "(one e k)", ("(one x k)", "(!= k d)"),
             ({"x": (1, "a"), "d": -1, "k": -2},)),
    ]
    for b in BINARY:
        out.append(Fact(f"rank.{b}", f"({b} a b)", "(set (rank e) (max ra rb))", ("(= ra (rank a))", "(= rb (rank b))"),
                        ({"a": ("m", "n"), "b": ("k", 1, "n")},)))
        out.append(Fact(f"one.{b}", f"({b} a b)", "(one e k)", ("(one a k)", "(one b k)"),
                        ({"a": ("m", 1, "n"), "b": (1, "n"), "k": -2},)))
    out += [
        Fact("rank.Matmul", "(Matmul a b)", "(set (rank e) (max ra rb))", ("(= ra (rank a))", "(= rb (rank b))"),
             ({"a": ("z", "m", "k"), "b": ("k", "n")},)),
        Fact("one.Matmul.cols", "(Matmul a b)", "(one e -1)", ("(one b -1)",), ({"a": ("m", "k"), "b": ("k", 1)},)),
        Fact("one.Matmul.rows", "(Matmul a b)", "(one e -2)", ("(one a -2)",), ({"a": (1, "k"), "b": ("k", "n")},)),
        Fact("one.Matmul.batch", "(Matmul a b)", "(one e k)", ("(one a k)", "(one b k)", "(< k -2)"),
             ({"a": (1, "m", "k"), "b": ("k", "n"), "k": -3},)),
    ]
    for r in REDUCTIONS:
        ex = {"x": ("a", 1, "b"), "d": -1}
        out.append(Fact(f"rank.{r}", f"({r} x d)", "(set (rank e) r)", ("(= r (rank x))",), (ex,)))
        out.append(Fact(f"one.{r}.reduced", f"({r} x d)", "(one e d)", (), (ex,)))
        out.append(Fact(f"one.{r}", f"({r} x d)", "(one e k)", ("(one x k)",), ({**ex, "k": -2},)))
    tr = {"x": ("a", 1, "b", "c"), "i": -3, "j": -1}
    out += [
        Fact("rank.Transpose", "(Transpose x i j)", "(set (rank e) r)", ("(= r (rank x))",), (tr,)),
        Fact("one.Transpose.i", "(Transpose x i j)", "(one e i)", ("(one x j)",), ({**tr, "x": ("a", "b", "c", 1)},)),
        Fact("one.Transpose.j", "(Transpose x i j)", "(one e j)", ("(one x i)",), ({**tr, "x": ("a", 1, "c", "b")},)),
        Fact("one.Transpose.other", "(Transpose x i j)", "(one e k)", ("(one x k)", "(!= k i)", "(!= k j)"),
             ({**tr, "k": -3, "i": -4, "j": -2},)),
        Fact("rank.Unsqueeze", "(Unsqueeze x k)", "(set (rank e) (+ r 1))", ("(= r (rank x))",),
             ({"x": ("a", "b"), "k": -2},)),
        Fact("one.Unsqueeze.new", "(Unsqueeze x k)", "(one e k)", (), ({"x": ("a", "b"), "k": -2},)),
        Fact("one.Unsqueeze.right", "(Unsqueeze x k)", "(one e d)", ("(one x d)", "(> d k)"),
             ({"x": ("a", 1), "k": -2, "d": -1},)),
        Fact("one.Unsqueeze.left", "(Unsqueeze x k)", "(one e (- d 1))", ("(one x d)", "(<= d k)"),
             ({"x": (1, "a", "b"), "k": -2, "d": -3},)),
        Fact("rank.Squeeze", "(Squeeze x k)", "(set (rank e) (- r 1))", ("(= r (rank x))",),
             ({"x": ("a", 1, "b"), "k": -2},)),
        Fact("one.Squeeze.right", "(Squeeze x k)", "(one e d)", ("(one x d)", "(> d k)"),
             ({"x": ("a", 1, 1), "k": -2, "d": -1},)),
        Fact("one.Squeeze.left", "(Squeeze x k)", "(one e (+ d 1))", ("(one x d)", "(< d k)"),
             ({"x": (1, "a", 1, "b"), "k": -2, "d": -4},)),
        Fact("rank.SplitAxis", "(SplitAxis x d sa sb)", "(set (rank e) (+ r 1))", ("(= r (rank x))",),
             ({"x": ("c", "a*b"), "d": -1, "sa": "a", "sb": "b"},)),
        Fact("one.SplitAxis.inner", '(SplitAxis x d sa "1")', "(one e d)", (),
             ({"x": ("c", "a"), "d": -1, "sa": "a"},)),
        Fact("one.SplitAxis.outer", '(SplitAxis x d "1" sb)', "(one e (- d 1))", (),
             ({"x": ("c", "b"), "d": -1, "sb": "b"},)),
        Fact("one.SplitAxis.right", "(SplitAxis x d sa sb)", "(one e k)", ("(one x k)", "(> k d)"),
             ({"x": ("c", "a*b", 1), "d": -2, "k": -1, "sa": "a", "sb": "b"},)),
        Fact("one.SplitAxis.left", "(SplitAxis x d sa sb)", "(one e (- k 1))", ("(one x k)", "(< k d)"),
             ({"x": (1, "c", "a*b"), "d": -1, "k": -3, "sa": "a", "sb": "b"},)),
        Fact("rank.Concat", "(Concat a b d s1 s2)", "(set (rank e) r)", ("(= r (rank a))",),
             ({"a": (1, "m"), "b": (1, "n"), "d": -1, "s1": "m", "s2": "n"},)),
        Fact("one.Concat", "(Concat a b d s1 s2)", "(one e k)", ("(one a k)", "(!= k d)"),
             ({"a": (1, "m"), "b": (1, "n"), "d": -1, "s1": "m", "s2": "n", "k": -2},)),
        Fact("rank.Slice", "(Slice x d st ln)", "(set (rank e) r)", ("(= r (rank x))",),
             ({"x": ("a", "m+n"), "d": -1, "st": "m", "ln": "n"},)),
        Fact("one.Slice.len1", '(Slice x d st "1")', "(one e d)", (), ({"x": ("a", "m+1"), "d": -1, "st": "m"},)),
        Fact("one.Slice", "(Slice x d st ln)", "(one e k)", ("(one x k)", "(!= k d)"),
             ({"x": (1, "m+n"), "d": -1, "st": "m", "ln": "n", "k": -2},)),
    ]
    for n in range(1, MAX_RANK + 1):
        out.append(Fact(f"one.missing{n}", "", f"(one e {-n})", ("(= r (rank e))", f"(< r {n})"),
                        ({"e": ("a",) * max(n - 1, 0)},)))
    return out


FACTS: tuple[Fact, ...] = tuple(_facts())
