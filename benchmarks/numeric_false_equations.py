"""How many false equations does the numeric check alone pass? A generated corpus of equation pairs.

Run: python benchmarks/numeric_false_equations.py [--pairs 3000] [--out results.json]
(figures recorded in docs/verify.md). Run it with two checkouts on PYTHONPATH to compare versions: the
corpus and the oracle are deterministic.

* Corpus: a random point-wise/reduction expression over inputs a, b (m, n), r (m, 1), c (1, n) and
  s (1, 1), and a mutant of it (one random edit: drop, insert or replace a unary op, replace or drop a
  binary op, swap operands, swap an input, change a reduction, a constant or an epsilon, or wrap a node in
  a domain-limited identity -- relu(x), sqrt(square(x)), square(sqrt(x)) -- that holds for one sign only).
  Which side is the candidate is drawn at random.
* Oracle (independent of the numeric check's design): both sides in float64 on 144 draws per pair (12
  each of standard normal, uniform in [-4, 4], the same x1e-3 and uniform in [-16, 16], at 3
  instantiations); the pair is *false* when on some draw the NaN / +inf / -inf positions differ or a
  finite value differs by more than 1e-9 (|r| + rms(r)). A false pair the check passes is also counted as
  "below float32 resolution" when it differs by at most 1e-3 on every draw (e.g. an epsilon changed
  inside a normalization that another normalization undoes). Pairs the oracle finds equal are counted
  separately: a check that rejects them is too strict, or they are ill-conditioned in float32 -- or the
  oracle missed the difference (the check's x30 scaling reaches magnitudes the oracle does not draw).
"""

from __future__ import annotations

import argparse
import json
import math
import time
from collections import Counter
from collections.abc import Callable

import numpy as np

from prism.ir.builder import Tensor
from prism.ir.graph import Graph
from prism.verify import numeric_check

Tree = tuple
SHAPES: dict[str, tuple[object, ...]] = {"a": ("m", "n"), "b": ("m", "n"), "r": ("m", 1), "c": (1, "n"), "s": (1, 1)}
UNARY = ("exp", "square", "sqrt", "relu", "neg", "sigmoid", "tanh", "silu")
BINARY = ("add", "sub", "mul", "div", "maximum")
REDUCE = ("sum", "max", "mean")
WRAPS: tuple[tuple[str, ...], ...] = (("relu",), ("square", "sqrt"), ("sqrt", "square"))  # outermost first


def shape(t: Tree) -> tuple[object, object]:
    kind = t[0]
    if kind == "in":
        return SHAPES[t[1]]  # type: ignore[return-value]
    if kind == "bin":
        a, b = shape(t[2]), shape(t[3])
        return tuple(x if x != 1 else y for x, y in zip(a, b))  # type: ignore[return-value]
    if kind == "red":
        s = list(shape(t[2]))
        s[t[3]] = 1
        return tuple(s)  # type: ignore[return-value]
    return shape(t[2] if kind in ("un", "scal") else t[1])


def random_tree(rng: np.random.Generator, depth: int) -> Tree:
    if depth == 0 or rng.random() < 0.2:
        return ("in", str(rng.choice(list(SHAPES))))
    k = rng.choice(["un", "bin", "bin", "red", "scal", "softmax", "rms"])
    child = random_tree(rng, depth - 1)
    if k == "un":
        return ("un", str(rng.choice(UNARY)), child)
    if k == "bin":
        return ("bin", str(rng.choice(BINARY)), child, random_tree(rng, depth - 1))
    if k == "red":
        return ("red", str(rng.choice(REDUCE)), child, int(rng.integers(0, 2)))
    if k == "scal":
        return ("scal", str(rng.choice(["mul_scalar", "add_scalar"])), child, float(rng.choice([0.5, 2.0, 3.0])))
    if k == "softmax":
        return ("softmax", child)
    return ("rms", child, float(rng.choice([1e-6, 1e-5])))


def nodes(t: Tree, path: tuple[int, ...] = ()) -> list[tuple[int, ...]]:
    out = [path]
    for i, c in enumerate(t):
        if isinstance(c, tuple):
            out += nodes(c, (*path, i))
    return out


def get(t: Tree, path: tuple[int, ...]) -> Tree:
    for i in path:
        t = t[i]
    return t


def put(t: Tree, path: tuple[int, ...], new: Tree) -> Tree:
    if not path:
        return new
    i = path[0]
    return (*t[:i], put(t[i], path[1:], new), *t[i + 1:])


def mutate(rng: np.random.Generator, t: Tree) -> tuple[Tree, str] | None:
    """One random edit, drawn among those that apply at a random node; None when it changes the shape."""
    path = nodes(t)[int(rng.integers(0, len(nodes(t))))]
    x = get(t, path)
    edits = ["insert-unary", "wrap-one-sign"]
    if x[0] in ("un", "softmax", "rms", "scal"):
        edits.append("drop-unary")
    if x[0] == "un":
        edits.append("replace-unary")
    if x[0] == "bin":
        edits += ["replace-binary", "swap-operands", "drop-operand"]
    if x[0] == "in":
        edits.append("swap-input")
    if x[0] == "red":
        edits.append("reduction")
    if x[0] in ("scal", "rms"):
        edits.append("constant")
    how = str(rng.choice(edits))
    if how == "drop-unary":
        new = x[2] if x[0] in ("un", "scal") else x[1]
    elif how == "replace-unary":
        new = ("un", str(rng.choice([u for u in UNARY if u != x[1]])), x[2])
    elif how == "insert-unary":
        new = ("un", str(rng.choice(UNARY)), x)
    elif how == "wrap-one-sign":
        new = x
        for op in reversed(WRAPS[int(rng.integers(0, len(WRAPS)))]):
            new = ("un", op, new)
    elif how == "replace-binary":
        new = ("bin", str(rng.choice([b for b in BINARY if b != x[1]])), x[2], x[3])
    elif how == "swap-operands":
        new = ("bin", x[1], x[3], x[2])
    elif how == "drop-operand":
        new = x[2 + int(rng.integers(0, 2))]
    elif how == "swap-input":
        new = ("in", str(rng.choice([k for k in SHAPES if k != x[1]])))
    elif how == "reduction":
        new = ("red", str(rng.choice([r for r in REDUCE if r != x[1]])), x[2], x[3])
    else:  # constant
        new = (*x[:-1], float(rng.choice([0.0, 1e-2, 1.5, 4.0])))
    if new == x:
        return None
    out = put(t, path, new)
    return (out, how) if shape(out) == shape(t) else None


def build(t: Tree, g: Graph, ins: dict[str, Tensor]) -> Tensor:
    kind = t[0]
    if kind == "in":
        return ins[t[1]]
    if kind == "un":
        return getattr(g, t[1])(build(t[2], g, ins))
    if kind == "bin":
        return getattr(g, t[1])(build(t[2], g, ins), build(t[3], g, ins))
    if kind == "red":
        return getattr(g, t[1])(build(t[2], g, ins), t[3])
    if kind == "scal":
        return getattr(g, t[1])(build(t[2], g, ins), t[3])
    if kind == "softmax":
        return g.softmax(build(t[1], g, ins), -1)
    return g.rms_norm(build(t[1], g, ins), t[2], -1)


def graph(t: Tree, name: str) -> Graph:
    g = Graph(name)
    ins = {k: g.input(k, s) for k, s in SHAPES.items()}
    g.output(build(t, g, ins), "out")
    return g


def corpus(n: int, seed: int = 0) -> list[tuple[Tree, Tree, str]]:
    rng = np.random.default_rng(seed)
    out: list[tuple[Tree, Tree, str]] = []
    seen: set[tuple[Tree, Tree]] = set()
    while len(out) < n:
        t = random_tree(rng, int(rng.integers(1, 5)))
        m = mutate(rng, t)
        if m is None:
            continue
        cand, ref = (m[0], t) if rng.random() < 0.5 else (t, m[0])
        if (cand, ref) in seen:
            continue
        seen.add((cand, ref))
        out.append((cand, ref, m[1]))
    return out


def _gap(c: np.ndarray, r: np.ndarray) -> float:
    """inf when the NaN / +inf / -inf positions differ, else max |c - r| / (|r| + rms(r)) over finite r."""
    for test in (np.isnan, np.isposinf, np.isneginf):
        if not np.array_equal(test(c), test(r)):
            return math.inf
    fin = np.isfinite(r)
    if not fin.any():
        return 0.0
    scale = float(np.sqrt(np.mean(np.square(r[fin])))) or 1.0
    return float(np.max(np.abs(c[fin] - r[fin]) / (np.abs(r[fin]) + scale)))


_FAMILIES: tuple[Callable[[np.random.Generator, tuple[int, ...]], np.ndarray], ...] = (
    lambda rng, s: rng.standard_normal(s),
    lambda rng, s: rng.uniform(-4, 4, s),
    lambda rng, s: rng.uniform(-4, 4, s) * 1e-3,
    lambda rng, s: rng.uniform(-16, 16, s),
)


def oracle_gap(cand: Graph, ref: Graph, draws: int = 12, stop_above: float = math.inf) -> float:
    """The largest difference (``_gap``) of the two sides in float64 over the oracle's draws: ``draws`` of
    each family (standard normal; uniform in [-4, 4], the same x1e-3, uniform in [-16, 16]) at three
    instantiations; stops early once it exceeds ``stop_above``."""
    rng = np.random.default_rng(12345)
    worst = 0.0
    for env in ({"m": 2, "n": 3}, {"m": 4, "n": 1}, {"m": 1, "n": 5}):
        for _ in range(draws):
            for family in _FAMILIES:
                x = {k: family(rng, tuple(env[d] if isinstance(d, str) else d for d in s))
                     for k, s in SHAPES.items()}
                with np.errstate(all="ignore"):
                    a = cand.evaluate(x, dtype=np.float64)["out"]
                    b = ref.evaluate(x, dtype=np.float64)["out"]
                worst = max(worst, _gap(np.asarray(a, np.float64), np.asarray(b, np.float64)))
                if worst > stop_above:
                    return worst
    return worst


FALSE_ABOVE = 1e-9      # the oracle's verdict: false when the sides differ by more than this on some draw
RESOLVABLE = 1e-3       # a false pair that differs by less than this everywhere is below float32 resolution


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--pairs", type=int, default=3000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--oracle", help="a JSON file of the oracle's verdicts (written when missing)")
    p.add_argument("--out", help="write the per-pair verdicts here (JSON)")
    a = p.parse_args(argv)
    pairs = corpus(a.pairs, a.seed)
    graphs = [(graph(c, "cand"), graph(r, "ref")) for c, r, _ in pairs]
    t0 = time.perf_counter()
    if a.oracle:
        try:
            with open(a.oracle) as f:
                false = json.load(f)
        except FileNotFoundError:
            false = None
    if not a.oracle or false is None or len(false) != len(pairs):
        false = [oracle_gap(c, r, stop_above=FALSE_ABOVE) > FALSE_ABOVE for c, r in graphs]
        if a.oracle:
            with open(a.oracle, "w") as f:
                json.dump(false, f)
    t_oracle = time.perf_counter() - t0
    t0 = time.perf_counter()
    passed: list[bool] = []
    for c, r in graphs:
        try:
            passed.append(numeric_check(c, r).passed)
        except Exception:  # an unbuildable instantiation counts as a rejection
            passed.append(False)
    t_check = time.perf_counter() - t0
    by_edit: Counter[str] = Counter()
    fooled: Counter[str] = Counter()
    for (_, _, how), f, ok in zip(pairs, false, passed):
        if f:
            by_edit[how] += 1
            fooled[how] += ok
    n_false = sum(false)
    fooled_all = [i for i, (f, ok) in enumerate(zip(false, passed)) if f and ok]
    unresolvable = sum(oracle_gap(*graphs[i], stop_above=RESOLVABLE) <= RESOLVABLE for i in fooled_all)
    summary = {
        "pairs": len(pairs), "false": n_false, "true": len(pairs) - n_false,
        "false_passed": len(fooled_all),
        "false_passed_below_float32_resolution": unresolvable,
        "true_rejected": sum(not ok for f, ok in zip(false, passed) if not f),
        "false_passed_by_edit": {k: f"{fooled[k]}/{by_edit[k]}" for k in sorted(by_edit)},
        "oracle_s": round(t_oracle, 1), "check_s": round(t_check, 1),
        "check_ms_per_pair": round(1e3 * t_check / max(1, len(pairs)), 2),
    }
    print(json.dumps(summary, indent=1))
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"summary": summary, "passed": passed, "false": false,
                       "pairs": [[repr(c), repr(r), h] for c, r, h in pairs]}, f)


if __name__ == "__main__":
    main()
