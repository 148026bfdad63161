"""The numeric verifier: run the candidate and the reference on random inputs at a few small
instantiations of the symbols and compare.

* Reference: the kernel-graph interpreter in float64 (``Graph.evaluate(dtype=numpy.float64)``).
* Candidate: every *runner* (the block-graph interpreter in float32 by default; a compiled kernel can be
  plugged in with :func:`compiled_runner`).
* Draws: standard normal, one per seed and instantiation (seeded by the seed and the input shapes, so a
  fixed-shape input gets new values at every instantiation); two seeds by default (``SEEDS``).
* Runs, per instantiation: ``normal`` on every seed; ``negated`` on every seed, once per *small* input
  (at most ``SMALL_INPUT`` = 4 elements: a scalar, a (1, 1) scale, an (m, 1) column at m <= 4) with that
  input negated, so every small input is seen with both signs whatever the draw and an identity that
  holds for one sign only fails deterministically (no run when there is no small input); on the first
  seed, ``hostile`` (x32: a softmax without max subtraction overflows) and ``tiny`` (x2^-10: a dropped
  epsilon shows; both powers of two, exact in every float dtype) once per input in turn (``hostile_input``
  restricts them to named inputs), and ``tiny`` once more with all those inputs at once (``rms_norm(x + h)``
  with its epsilon dropped shows only then).
  Cost: W1-W7's hand-written structures at their first shapes, 21-33 runs instead of 9, 2.8x the time
  (1.7 s -> 4.8 s for all seven, interleaved A/B on the shared 2-core machine); the 49 true identities
  1.05x (small graphs: the instantiation search dominates).
* Non-finite values: NaN, +inf and -inf must sit at exactly the same positions in the candidate and the
  float64 reference (a finite candidate where the reference is NaN fails, and so does the opposite sign
  of an infinity). One exception: where the candidate is non-finite and the float64 reference finite, the
  position is excused if the program itself, run in float32 on the same inputs, is non-finite the same
  way there (scaling every input x32 reaches inputs that a program overflows on in float32 by itself: a
  candidate is rejected for being less safe than the program, not for being as unsafe). That float32 run
  is made only when such a position exists.
* Tolerance (fp32 candidate against a float64 reference), per output element::

      |c - r| <= tol * (|r| + rms(r)),   tol = rtol * sqrt(max(1, K / 64))

  with ``rtol = 1e-4`` and ``K`` the longest reduction (matmul contraction or reduced dim) of the
  reference at that instantiation: fp32 rounding error of a sum grows like sqrt(K).

The final check of a tuned kernel at its real shape (``SuperKernel._check``) runs one seed and scales the
program's first input only (normal, negated small inputs, hostile and tiny of the first input): scaling
every input in turn there cost 2.6 s instead of 0.22 s on W3 at m=11008 (each scaled 4096 x 11008 weight
is a new float64 array, its float32 copy and a float64 reference run). See docs/verify.md.
"""

from __future__ import annotations

import functools
import itertools
import math
import os
import threading
import time
import zlib
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field

import numpy as np

from prism.errors import PrismError
from prism.ir import dims as D
from prism.ir.block import BlockGraph
from prism.ir.dtypes import DType, float32, of_array, round_to
from prism.ir.elementwise import is_exact_cast
from prism.ir.graph import Graph
from prism.ir.node import Node
from prism.ir.ops import OPS

RTOL = 1e-4
KINDS = ("normal", "negated", "hostile", "tiny")
SEEDS = (0, 1)
SMALL_INPUT = 4           # an input with at most this many elements at an instantiation is negated in turn
# hostile and tiny scale by powers of two: the scaled draw is exact in every float dtype (bar bfloat16/float16's
# subnormal range), so a program homogeneous in the scaled input takes the normal run's reference times c**d
# (_joint_degrees) in bfloat16 too -- with x30 / x1e-3 a bfloat16 draw was rounded again after scaling
_SCALE = {"normal": 1.0, "negated": -1.0, "hostile": 32.0, "tiny": 2.0 ** -10}
_EVERY_SEED = ("normal", "negated")  # the kinds run on every seed; hostile and tiny on the first seed only

RunFn = Callable[[Graph, Mapping[str, np.ndarray], Mapping[str, int]], Mapping[str, np.ndarray]]


@dataclass(frozen=True)
class Runner:
    """A way to run a candidate: ``run(graph, inputs, params) -> {output name: array}``."""

    name: str
    run: RunFn


def interpreter_runner(dtype: object = np.float32) -> Runner:
    """The reference interpreters (block graphs simulated literally) in ``dtype`` (float32: each input given in
    its declared dtype, computed in float32, each output stored in its dtype, as generated code does)."""
    def run(g: Graph, inputs: Mapping[str, np.ndarray], params: Mapping[str, int]) -> Mapping[str, np.ndarray]:
        if np.dtype(dtype) == np.float32:
            return g.evaluate({k: to_dtype(v, g.inputs[k].dtype) for k, v in inputs.items()}, params=params)
        return g.evaluate({k: v.astype(dtype) for k, v in inputs.items()}, params=params)
    return Runner(f"interpreter[{np.dtype(dtype).name}]", run)


def compiled_runner(compile_fn: Callable[[Graph, Mapping[str, int]], Callable[..., object]], name: str = "compiled",
                    float32: Sequence[tuple[np.ndarray, np.ndarray]] = ()) -> Runner:
    """A runner for generated code, e.g. ``compiled_runner(prism.runtime.kernel.compile)``.

    ``compile_fn(graph, params)`` returns a callable taking the inputs as keyword arrays of their declared
    dtypes (float32, bfloat16, ...) and returning a dict by output name, a tuple in output order, or the
    single output array.

    The typed copy of an input array is made once and reused while a later run passes the same array
    (the input kinds share every input but the changed one: converting W3's 360 MB of weights three times
    took 0.9 s of a final check); ``float32`` seeds that memo with ``(float64 array, its typed copy)``
    pairs the caller already has. The memo keeps those pairs, the first run's arrays (the draw every kind
    starts from) and the last run's.
    """
    kept: dict[int, tuple[np.ndarray, np.ndarray]] = {id(a): (a, b) for a, b in float32}
    memo = dict(kept)
    first = True

    def convert(v: np.ndarray, dtype: DType) -> np.ndarray:
        hit = memo.get(id(v))
        if hit is not None and hit[0] is v and hit[1].dtype == dtype.np:
            return hit[1]
        shared = _shared()   # shared_draws: the typed copy of a shared draw, made once
        if shared is None or id(v) not in shared.drawn:
            return to_dtype(v, dtype)
        key = (id(v), dtype.name)
        if key not in shared.typed:
            shared.typed[key] = to_dtype(v, dtype)
        return shared.typed[key]

    def run(g: Graph, inputs: Mapping[str, np.ndarray], params: Mapping[str, int]) -> Mapping[str, np.ndarray]:
        nonlocal memo, first
        kernel = compile_fn(g, dict(params))
        x = {k: convert(v, g.inputs[k].dtype) for k, v in inputs.items()}
        this = {id(v): (v, x[k]) for k, v in inputs.items()}
        if first:
            kept.update(this)
            first = False
        memo = {**kept, **this}  # a changed (scaled, negated) array lives until the next run only
        out = kernel(**x)
        names = g.output_names
        if isinstance(out, Mapping):
            return {k: np.asarray(v) for k, v in out.items()}
        if isinstance(out, (tuple, list)):
            return {k: np.asarray(v) for k, v in zip(names, out)}
        return {names[0]: np.asarray(out)}
    return Runner(name, run)


@dataclass(frozen=True)
class Check:
    """One comparison: one runner, instantiation, input kind and seed, one output; ``input`` names the input
    the kind changed (negated, or scaled for hostile / tiny), "" for ``normal``."""

    runner: str
    params: tuple[tuple[str, int], ...]
    kind: str
    seed: int
    output: str
    max_error: float      # max |c - r| / (|r| + rms(r)); inf on a shape mismatch or a failure to run
    tolerance: float
    ok: bool
    detail: str = ""
    input: str = ""

    def __str__(self) -> str:
        p = ",".join(f"{k}={v}" for k, v in self.params)
        verdict = "ok" if self.ok else "FAIL"
        kind = f"{self.kind}[{self.input}]" if self.input else self.kind
        return (f"{verdict:4} {self.runner} [{p}] {kind} seed={self.seed} {self.output}: "
                f"error {self.max_error:.3g} (tolerance {self.tolerance:.3g})"
                + (f" {self.detail}" if self.detail else ""))


@dataclass(frozen=True)
class NumericResult:
    passed: bool
    checks: tuple[Check, ...]
    instantiations: tuple[dict[str, int], ...]
    seconds: float

    @property
    def failures(self) -> tuple[Check, ...]:
        return tuple(c for c in self.checks if not c.ok)

    def __str__(self) -> str:
        head = (f"numeric check {'passed' if self.passed else 'FAILED'}: {len(self.checks)} comparisons at "
                f"{len(self.instantiations)} instantiations in {self.seconds:.2f} s")
        fails = self.failures
        more = f"\n  ... {len(fails) - 5} more" if len(fails) > 5 else ""
        return head + "".join(f"\n  {c}" for c in fails[:5]) + more


# --- instantiations ------------------------------------------------------------------------------

def _block_graphs(g: Graph) -> list[BlockGraph]:
    return g.customized_ops()


def _symbols(*graphs: Graph) -> tuple[list[str], list[str]]:
    """(batch-like symbols of the inputs, block-graph symbols) of the graphs."""
    batch: set[str] = set()
    block: set[str] = set()
    for g in graphs:
        batch |= g.symbols()
        for bg in _block_graphs(g):
            block |= bg.symbols()
    return sorted(batch), sorted(block - batch)


def _constraints_hold(env: Mapping[str, int], blocks: Sequence[BlockGraph]) -> bool:
    for bg in blocks:
        for c in bg.constraints:
            try:
                num, den = D.evaluate(c.num, env), D.evaluate(c.den, env)
            except D.DimError:
                return False
            if den <= 0 or num % den:
                return False
    return True


def _instantiable(env: Mapping[str, int], graphs: Sequence[Graph]) -> bool:
    for g in graphs:
        try:
            g.instantiate(env)
        except PrismError:
            return False
    return True


def _work(env: Mapping[str, int], blocks: Sequence[BlockGraph]) -> int:
    """Number of block iterations the simulator runs (its cost)."""
    total = 0
    for bg in blocks:
        n = D.evaluate(bg.forloop, env)
        for d in bg.grid:
            n *= D.evaluate(d, env)
        total += n
    return total


def _fits_one_by_one(names: Sequence[str], combos: Sequence[tuple[int, ...]], blocks: Sequence[BlockGraph],
                     max_work: int) -> dict[tuple[int, ...], tuple[dict[str, int], int]]:
    """:func:`_fits` one combination at a time (any dims: selectors, any constraint)."""
    fits: dict[tuple[int, ...], tuple[dict[str, int], int]] = {}
    for values in combos:
        env = dict(zip(names, values))
        w = _work(env, blocks)
        if w <= max_work and _constraints_hold(env, blocks):
            fits[values] = (env, w)
    return fits


def _columns(x: D.DimLike, cols: Mapping[str, np.ndarray], rows: int) -> tuple[np.ndarray, np.ndarray] | None:
    """``x`` at every row of ``cols`` (symbol -> its int64 values), exactly: (values, where they are integers), or
    None where ``x`` is not a plain polynomial (a selector) or its magnitudes could overflow."""
    if isinstance(x, int):
        return np.full(rows, x, np.int64), np.ones(rows, bool)
    terms = D._plain(x) if isinstance(x, D.Dim) else None
    if terms is None or any(name not in cols for _c, factors in terms for name, _k in factors):
        return None
    big = 1 << 62
    num = np.zeros(rows, np.int64)
    den = np.ones(rows, np.int64)
    for c, factors in terms:   # num / den += c * prod(v^k): exact fractions over a common denominator
        tn = np.full(rows, int(getattr(c, "numerator", c)), np.int64)
        td = np.full(rows, int(getattr(c, "denominator", 1)), np.int64)
        for name, k in factors:
            if (cols[name] <= 0).any():
                return None
            if k > 0:
                tn = tn * cols[name] ** k
            else:
                td = td * cols[name] ** -k
        if float(np.abs(tn).max()) * float(den.max()) + float(np.abs(num).max()) * float(td.max()) >= big or \
                float(den.max()) * float(td.max()) >= big:
            return None
        num, den = num * td + tn * den, den * td
    ok = num % den == 0
    return np.where(ok, num // den, 0), ok


def _fits(names: Sequence[str], combos: Sequence[tuple[int, ...]], blocks: Sequence[BlockGraph], max_work: int
          ) -> dict[tuple[int, ...], tuple[dict[str, int], int]]:
    """The combinations (distinct, in order) whose simulation takes at most ``max_work`` block iterations and that
    satisfy every block graph's divisibility constraint: values -> (env, work). All combinations at once with numpy
    (exact integer arithmetic) where every dim is a plain polynomial of the symbols, else one by one. Measured need:
    llama-1b int8w-g32-bf16's first new prompt length spent 1.1 s of its verifications (12 transferred searches) in
    the one-by-one tests, its first generate() 1.9 s (profiled), evaluating ~3000 combinations per candidate."""
    rows = len(combos)
    if rows == 0:
        return {}
    arr = np.asarray(combos, np.int64).reshape(rows, len(names))
    cols = {n: arr[:, i] for i, n in enumerate(names)}
    work = np.zeros(rows, np.int64)
    for bg in blocks:
        n = _columns(bg.forloop, cols, rows)
        if n is None:
            return _fits_one_by_one(names, combos, blocks, max_work)
        w, ok = n
        for d in bg.grid:
            g = _columns(d, cols, rows)
            if g is None or float(np.abs(w).max()) * float(np.abs(g[0]).max()) >= 1 << 62:
                return _fits_one_by_one(names, combos, blocks, max_work)
            w, ok = w * g[0], ok & g[1]
        if not ok.all():   # (a grid size or loop that is not an integer: the scalar path raises there)
            return _fits_one_by_one(names, combos, blocks, max_work)
        work += w
    keep = work <= max_work
    for bg in blocks:
        for c in bg.constraints:
            if not isinstance(c, D.Divisible):
                return _fits_one_by_one(names, combos, blocks, max_work)
            a, b = _columns(c.num, cols, rows), _columns(c.den, cols, rows)
            if a is None or b is None:
                return _fits_one_by_one(names, combos, blocks, max_work)
            (num, num_ok), (den, den_ok) = a, b
            safe = np.where(den > 0, den, 1)
            keep &= num_ok & den_ok & (den > 0) & (num % safe == 0)
    return {combos[i]: (dict(zip(names, combos[i])), int(work[i])) for i in np.flatnonzero(keep)}


_BATCH_VALUES = (1, 2, 3, 5)
_BLOCK_VALUES = (1, 2, 3, 4, 5, 6, 8, 12, 16, 32)


def choose_instantiations(candidate: Graph, reference: Graph, n: int = 3, max_work: int = 256,
                          seed: int = 0, sizes: Collection[str] = ()) -> list[dict[str, int]]:
    """Up to ``n`` small valid instantiations of all symbols, satisfying every Divisible constraint.

    The first keeps every value small but > 1 where the constraints allow (so splits are exercised);
    the next prefers values that are not powers of two; the rest are random valid choices. ``sizes``:
    symbols that stand for generalized fixed sizes (:func:`generalized`), given the block graphs' values
    (a grid size must divide them).
    """
    graphs = (candidate, reference)
    batch, block = _symbols(*graphs)
    names = batch + block
    if not names:
        return [{}]
    blocks = [bg for g in graphs for bg in _block_graphs(g)]
    choices = [_BATCH_VALUES if s in batch and s not in sizes else _BLOCK_VALUES for s in names]
    combos = itertools.product(*choices)
    rng = np.random.default_rng(seed)
    space = math.prod(len(c) for c in choices)
    if space > 4096:  # sample instead of enumerating
        picked = [np.asarray(c)[rng.integers(0, len(c), 4096)].tolist() for c in choices]
        combos = zip(*picked)
    # the cheap tests (work, divisibility) on every combination; instantiating the graphs (the costly
    # test) only on the ones picked, in the order of preference
    fits = _fits(names, list(dict.fromkeys(tuple(v) for v in combos)), blocks, max_work)
    known: dict[tuple[int, ...], bool] = {}

    def valid(values: tuple[int, ...]) -> bool:
        if values not in known:
            known[values] = _instantiable(fits[values][0], graphs)
        return known[values]

    def small(values: tuple[int, ...]) -> tuple:
        return (sum(v == 1 for v in values), fits[values][1], sum(values))

    def odd(values: tuple[int, ...]) -> tuple:
        return (-sum(v & (v - 1) != 0 for v in values), small(values))
    picks: list[tuple[int, ...]] = []
    for key in (small, odd):
        for values in sorted(fits, key=key):
            if values not in picks and valid(values):
                picks.append(values)
                break
    if not picks:
        raise PrismError(f"no small instantiation of {names} satisfies the block graphs' constraints "
                         f"(tried values {_BLOCK_VALUES} for grid/loop symbols, {_BATCH_VALUES} for batch dims); "
                         "pass instantiations=[{...}] explicitly")
    rest = [v for v in fits if v not in picks]
    for i in rng.permutation(len(rest)):
        if len(picks) >= n:
            break
        if valid(rest[int(i)]):
            picks.append(rest[int(i)])
    return [fits[v][0] for v in picks[:n]]


# --- generalized sizes -------------------------------------------------------------------------------

GENERAL_MIN = 64   # fixed input sizes above this become symbols for the numeric check (:func:`generalized`)


@dataclass(frozen=True)
class Generalization:
    """Fixed sizes made symbols: ``sizes`` every occurrence of a value (:meth:`prism.Graph.generalize`),
    ``axes`` single input axes, ``{(input name, axis): (symbol, its fixed size)}``, where a value as a whole
    could not be; ``images``: the symbols such an axis's value may stand for inside ops (reshape and split
    sizes), besides itself, each combination tried (:meth:`prism.Graph.generalize`)."""
    sizes: Mapping[int, D.Dim]
    axes: Mapping[tuple[str, int], tuple[D.Dim, int]]
    images: Mapping[int, tuple[D.DimLike, ...]] = field(default_factory=dict)

    def apply(self, g: Graph) -> Graph:
        """``g`` generalized (its inputs named as the reference's); PrismError where it becomes inconsistent."""
        return g.generalize(self.sizes, {k: sym for k, (sym, _) in self.axes.items()}, images=self.images or None)

    @property
    def fixed(self) -> dict[str, int]:
        """{symbol: the fixed size it stands for}."""
        return {**{D.format_dim(s): v for v, s in self.sizes.items()},
                **{D.format_dim(s): v for s, v in self.axes.values()}}


def generalization(candidate: Graph, reference: Graph, min_size: int = GENERAL_MIN) -> Generalization | None:
    """The fixed sizes above ``min_size`` of the reference's inputs that can be made symbols in both graphs
    (:func:`generalized`), biggest first; None when none can.

    A value is generalized at every occurrence where both graphs stay consistent; where they do not, the
    occurrences at the same axis counted from the end (the axis broadcasting lines up) are tried as a group of
    their own, each group one symbol. Measured need: llama-1b at batch 8 and a 128-token prompt checked its six
    RoPE candidates at their real [8, 16, 128, 128] size (4.5 s of its start-up): the sequence length 128
    equals the head dim 128, which ``rotate_half`` halves and which therefore cannot be a symbol, so nothing
    was generalized."""
    found = _generalize(candidate, reference, min_size)
    return None if found is None else found[0]


def _generalize(candidate: Graph, reference: Graph, min_size: int
                ) -> tuple[Generalization, Graph, Graph] | None:
    """:func:`generalization` and the two graphs it gives (built while checking it, not again)."""
    values = sorted({d for n in reference.inputs.values() for d in n.shape
                     if isinstance(d, int) and not isinstance(d, bool) and d > min_size}, reverse=True)
    used = set(reference.symbols()) | set(candidate.symbols())
    for bg in candidate.customized_ops():
        used |= bg.symbols()
    sizes: dict[int, D.Dim] = {}
    axes: dict[tuple[str, int], tuple[D.Dim, int]] = {}
    images: dict[int, tuple[D.DimLike, ...]] = {}
    best: tuple[Graph, Graph] | None = None

    def fresh(v: int) -> D.Dim:
        name = f"size{v}"
        while name in used:
            name += "_"
        used.add(name)
        return D.sym(name)

    def trial(s: Mapping[int, D.Dim], a: Mapping[tuple[str, int], tuple[D.Dim, int]],
              im: Mapping[int, tuple[D.DimLike, ...]] | None = None) -> bool:
        nonlocal best
        gen = Generalization(s, a, images if im is None else im)
        try:
            best = gen.apply(candidate), gen.apply(reference)
        except PrismError:
            return False
        return True

    # sizes that only operators hold (an input's dims must stay single symbols)
    in_ops = _op_sizes(candidate) | _op_sizes(reference)
    op_sizes = in_ops - {
        d for g in (candidate, reference) for n in g.inputs.values() for d in n.shape if isinstance(d, int)}
    for v in values:
        sym = fresh(v)
        if trial({**sizes, v: sym}, axes):
            sizes[v] = sym
            continue
        # with its multiples that only operators hold: a reshape of [8, 128, 5632] to [1024, 176, 32] ties 1024
        # to 8 * 128 (measured need: llama-1b's grouped Linear at batch 8 and a 128-token prompt was checked at
        # 1024 rows, 2-2.8 s per candidate)
        multiples = {u: (u // v) * sym for u in op_sizes if u > v and u % v == 0 and u not in sizes}
        if multiples and trial({**sizes, v: sym, **multiples}, axes):
            sizes.update({v: sym, **multiples})
            continue
        groups: dict[int, list[tuple[str, int]]] = {}
        for name, n in reference.inputs.items():
            for i, d in enumerate(n.shape):
                if isinstance(d, int) and not isinstance(d, bool) and d == v:
                    groups.setdefault(len(n.shape) - i, []).append((name, i))
        if len(groups) < 2:
            continue   # one group is the whole value, which failed
        for _, members in sorted(groups.items()):
            grown = {**axes, **dict.fromkeys(members, (sym, v))}
            if trial(sizes, grown):
                axes = grown
                sym = fresh(v)
                continue
            # the group's symbol also at the reshapes that carry the value through (a Linear's [N, K] weight
            # with N == K, K cut into groups of 32: the output's reshape back to [.., N] holds N; without it
            # N stayed fixed and llama-1b's grouped 2048 x 2048 Linear checked each candidate with the whole
            # weight, 1.2-3.7 s each at batch 8)
            more = {**images, v: (sym, *images.get(v, (v,)))}
            if v in in_ops and trial(sizes, grown, more):
                axes, images = grown, more
                sym = fresh(v)
    if best is None or not (sizes or axes):
        return None
    # ``best`` is the last consistent trial's pair: a failed trial leaves it, and every accepted one is the last
    # accepted so far, so it is the pair of (sizes, axes, images) as they stand
    return Generalization(sizes, axes, images), best[0], best[1]


def _op_sizes(g: Graph) -> set[int]:
    """The fixed sizes in ``g``'s operators' size attributes (reshape shapes, split sizes), its block graphs'
    inputs included."""
    from prism.ir import ops as O
    out: set[int] = set()

    def take(d: D.DimLike) -> D.DimLike:
        if isinstance(d, int) and not isinstance(d, bool):
            out.add(d)
        return d
    for n in g.nodes:
        if n.op in O.OPS and n.op != "input":
            O.map_sizes(O.OPS[n.op], n.arg, take)
    for bg in g.customized_ops():
        for spec in bg.inputs:
            for d in spec.shape:
                take(d)
    return out


def generalized(candidate: Graph, reference: Graph, min_size: int = GENERAL_MIN
                ) -> tuple[Graph, Graph, dict[str, int]] | None:
    """``(candidate, reference, {symbol: fixed size})`` with the fixed sizes above ``min_size`` of the
    reference's inputs replaced by symbols in both graphs (:func:`generalization`), so the numeric check runs at
    small instantiations of them: a search over a Linear of a [32000, 2048] weight drew, copied and evaluated
    the whole weight in float64 about 40 times per candidate (63 s for 5 candidates). At the real sizes the
    generalized graphs are the given ones; the formal proof and the final check of the compiled kernel run at
    the real sizes. A size is left fixed where generalizing it makes either graph inconsistent (a reshape that
    only coincides with it). None when no size is generalized."""
    found = _generalize(candidate, reference, min_size)
    if found is None:
        return None
    gen, c, r = found
    return c, r, gen.fixed


# --- inputs and tolerances ----------------------------------------------------------------------

# Draws and float32 copies of large inputs run in chunks on every core (numpy's fills and casts release
# the GIL): drawing W3's two 4096 x 11008 weights took 1.6 s on one core of the 2-core machine, 0.5 s
# chunked. Each chunk has its own generator, seeded by (seed, the input shapes, input index, chunk index), so
# a draw is the same whatever the number of threads, and an input of a fixed shape (a weight, a (1, 1) scale)
# gets new values at every instantiation instead of the same ones.
_CHUNK = 1 << 20          # elements per chunk
_PARALLEL_MIN = 4 * _CHUNK  # fewer elements than this in all: one thread (a pool costs more than it saves)


def _run_chunks(tasks: Sequence[Callable[[], object]], elements: int) -> None:
    workers = min(len(tasks), os.cpu_count() or 1)
    if workers <= 1 or elements < _PARALLEL_MIN:
        for t in tasks:
            t()
        return
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="prism-draw") as pool:
        for f in [pool.submit(t) for t in tasks]:
            f.result()


def _draw(c: np.ndarray, s: tuple, dtype: DType) -> None:
    """One chunk of a draw: standard normal in float32, rounded to a low-precision input's precision (the float64
    reference then sees exactly the values the candidate is given); an int8 input gets integers in
    [-127, 127] (a quantized weight).

    SFC64 and float32 draws, bfloat16 rounded in place on the bits: the PCG64 float64 draw and ``round_to``'s three
    copies took 19 ms per million bfloat16 elements (a 2-vCPU Zen 4 EPYC), this 13.6 (float32 inputs: 10.2 ->
    8.9, their values now exact in float32); a new prompt length of llama-1b bf16 spent 0.42 s of its 0.83 s
    drawing the fused MLP's weights for one template check."""
    rng = np.random.Generator(np.random.SFC64(np.random.SeedSequence(s)))
    if dtype.kind == "int":
        c[...] = rng.integers(-127, 128, c.size)
        return
    x = rng.standard_normal(c.size, dtype=np.float32)
    if dtype.name == "bfloat16":   # round to nearest even on the bits (the draws are finite)
        u = x.view(np.uint32)
        t = u >> np.uint32(16)
        t &= np.uint32(1)
        t += np.uint32(0x7FFF)
        u += t
        u &= np.uint32(0xFFFF0000)
    elif dtype.low_precision:
        x = round_to(x, dtype)
    c[...] = x.reshape(c.shape)


@dataclass
class _Shared:
    """The draws of the checks run inside one :func:`shared_draws`, by (seed, input position, shape, dtype), and
    their typed copies (compiled_runner), by (id of the draw, dtype); ``drawn`` keeps each draw (so its id)."""
    draws: dict[tuple, np.ndarray]
    drawn: dict[int, np.ndarray]
    typed: dict[tuple[int, str], np.ndarray]


_LOCAL = threading.local()   # .shared: this thread's open shared_draws scope, if any


def _shared() -> _Shared | None:
    return getattr(_LOCAL, "shared", None)


@contextmanager
def shared_draws() -> Iterator[None]:
    """Within it, the numeric checks draw an input of a shape drawn before (same seed, position and dtype) once
    -- that first draw is reused -- and convert it to its dtype once: a template's checks at several values of
    its dim (api.SuperKernel._checked_below) change the rows, not the weights. Measured need: llama-1b bf16, the
    13 pieces' first templates at prompt 157: 1.24 s of their 2.8 s of checks drew inputs, 0.36 s converted
    them. Nested inside another, it is that one (api.SuperKernel.specialize holds one over a new shape's whole
    derivation: a split's parts, its composite and the templates' checks all read the program's weights)."""
    if _shared() is not None:
        yield
        return
    _LOCAL.shared = _Shared({}, {}, {})
    try:
        yield
    finally:
        _LOCAL.shared = None


def standard_normal_inputs(reference: Graph, env: Mapping[str, int], seed: int) -> dict[str, np.ndarray]:
    """Standard-normal float64 inputs of ``reference`` at ``env`` (the ``normal`` kind's draw), each exactly
    representable in its input's dtype. Inside :func:`shared_draws` an input of a shape drawn before (same seed,
    position and dtype) is that draw again."""
    out: dict[str, np.ndarray] = {}
    tasks: list[Callable[[], object]] = []
    shapes = [tuple(int(D.evaluate(d, env)) for d in node.shape) for node in reference.inputs.values()]
    key = zlib.crc32(repr(shapes).encode())
    shared = _shared()
    drawn = 0
    for i, (name, shape) in enumerate(zip(reference.inputs, shapes)):
        dt = reference.inputs[name].dtype
        memo_key = (seed, i, shape, dt.name)
        if shared is not None and memo_key in shared.draws:
            out[name] = shared.draws[memo_key]
            continue
        a = np.empty(shape)
        flat = a.reshape(-1)
        for j, lo in enumerate(range(0, flat.size, _CHUNK)):
            chunk = flat[lo:lo + _CHUNK]
            tasks.append(lambda c=chunk, s=(seed, key, i, j), dt=dt: _draw(c, s, dt))
        out[name] = a
        drawn += a.size
        if shared is not None:
            shared.draws[memo_key] = shared.drawn[id(a)] = a
    _run_chunks(tasks, drawn)
    return out


_NORMAL: dict[tuple, tuple[dict[str, np.ndarray], dict[str, np.ndarray]]] = {}


def normal_reference(reference: Graph, env: Mapping[str, int], seed: int
                     ) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """(:func:`standard_normal_inputs`, the float64 reference's outputs on them), kept for the last
    (program, env, seed) only: the search's big-shape check, the tuner and the final check of one shape
    share them (a 2048-cube matmul's float64 reference takes seconds; a 1 GB output's takes 2 GB).
    :func:`forget_normal_reference` drops it."""
    key = (reference.key, tuple(sorted((k, int(v)) for k, v in env.items() if k in reference.symbols())), seed)
    hit = _NORMAL.get(key)
    if hit is None:
        _NORMAL.clear()
        draw = standard_normal_inputs(reference, env, seed)
        with np.errstate(all="ignore"):
            ref = reference.evaluate(draw, dtype=np.float64)
        hit = _NORMAL[key] = (draw, dict(ref))
    return hit


def forget_normal_reference() -> None:
    _NORMAL.clear()


def to_float32(a: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """A C-contiguous float32 copy of ``a`` (into ``out`` when given), chunked over the cores when large."""
    return to_dtype(a, float32, out)


def to_dtype(a: np.ndarray, dtype: DType, out: np.ndarray | None = None) -> np.ndarray:
    """A C-contiguous copy of ``a`` in ``dtype`` (into ``out`` when given), chunked over the cores when large.
    Values not representable in a low-precision dtype are rounded (the draws here are representable)."""
    a = np.asarray(a)
    want = dtype.np
    if out is None:
        if a.dtype == want and a.flags.c_contiguous:
            return a
        out = np.empty(a.shape, want)
    elif out.shape != a.shape or out.dtype != want or not out.flags.c_contiguous:
        raise PrismError(f"to_dtype: out must be a C-contiguous {dtype} array of shape {a.shape}, "
                         f"got {out.dtype} {out.shape}")
    # round as the kernels do: float32 first (exact for the draws here), chunk by chunk on every core (the
    # whole array's astype ran on one thread: 0.6 s of llama-1b's LM head tuning, 65M weights)
    via32 = dtype.low_precision and dtype.kind == "float" and a.dtype == np.float64
    src, dst = np.ascontiguousarray(a).reshape(-1), out.reshape(-1)

    def chunk(lo: int) -> None:
        part = src[lo:lo + _CHUNK]
        np.copyto(dst[lo:lo + _CHUNK], part.astype(np.float32) if via32 else part, casting="unsafe")
    _run_chunks([lambda lo=lo: chunk(lo) for lo in range(0, src.size, _CHUNK)], src.size)
    return out


def make_inputs(reference: Graph, env: Mapping[str, int], kind: str, seed: int, hostile_input: str | None = None,
                base: Mapping[str, np.ndarray] | None = None) -> dict[str, np.ndarray]:
    """Random float64 inputs at ``env``: standard normal; ``negated``/``hostile``/``tiny`` multiply one input
    (``hostile_input``, default the first) by -1 / 32 / 2^-10.

    ``base``: the standard-normal draw (:func:`standard_normal_inputs`) of an earlier call with the same
    ``env`` and ``seed`` -- every kind starts from the same draw -- reused instead of drawn again."""
    if kind not in _SCALE:
        raise PrismError(f"input kind must be one of {list(_SCALE)}, got {kind!r}")
    names = list(reference.inputs)
    target = hostile_input or names[0]
    if target not in names:
        raise PrismError(f"hostile_input {target!r} is not an input of the reference ({names})")
    if base is None:
        base = standard_normal_inputs(reference, env, seed)
    return _vary(base, kind, (target,), _dtypes(reference))


def _dtypes(reference: Graph) -> dict[str, DType]:
    return {k: n.dtype for k, n in reference.inputs.items()}


def _vary(base: Mapping[str, np.ndarray], kind: str, targets: Collection[str],
          dtypes: Mapping[str, DType] | None = None) -> dict[str, np.ndarray]:
    """``base`` with the ``targets`` multiplied by the kind's factor (:func:`scaled_inputs`); every other array
    is ``base``'s own."""
    return scaled_inputs(base, _SCALE[kind], dtypes, targets)


def scaled_inputs(base: Mapping[str, np.ndarray], scale: float, dtypes: Mapping[str, DType] | None = None,
                  targets: Collection[str] | None = None) -> dict[str, np.ndarray]:
    """``base`` with each input (or each of ``targets``) multiplied by ``scale`` and still exact in its dtype:
    rounded again to a low-precision float input's precision; an integer input (a quantized weight) is only
    negated, never scaled. Unchanged arrays are ``base``'s own."""
    dtypes = dtypes or {}
    out = {}
    for name, a in base.items():
        dt = dtypes.get(name, float32)
        if (targets is not None and name not in targets) or scale == 1.0 or (dt.kind == "int" and scale != -1.0):
            out[name] = a
        else:
            out[name] = round_to(a * scale, dt) if dt.low_precision else a * scale
    return out


def _targets(reference: Graph, hostile_input: str | Sequence[str] | None) -> list[str]:
    """The inputs hostile and tiny scale, one in turn: ``hostile_input`` (a name or names), default all."""
    names = list(reference.inputs)
    if hostile_input is None:
        return names
    chosen = [hostile_input] if isinstance(hostile_input, str) else list(hostile_input)
    bad = [n for n in chosen if n not in names]
    if bad or not chosen:
        raise PrismError(f"hostile_input {hostile_input!r} must name inputs of the reference ({names})")
    return list(dict.fromkeys(chosen))


def _plan(reference: Graph, env: Mapping[str, int], kinds: Sequence[str], seeds: Sequence[int],
          scaled: Sequence[str]) -> list[tuple[str, int, tuple[str, ...]]]:
    """The runs at ``env`` as (kind, seed, changed inputs): ``normal`` on every seed; ``negated`` on every
    seed, once per input of at most ``SMALL_INPUT`` elements (none: no run); ``hostile`` and ``tiny`` on
    the first seed, once per input of ``scaled``, and ``tiny`` once more with all of them at once (a
    dropped epsilon of ``rms_norm(x + h)`` shows only when both are small)."""
    small = [name for name, n in reference.inputs.items()
             if math.prod(int(D.evaluate(d, env)) for d in n.shape) <= SMALL_INPUT]
    runs: list[tuple[str, int, tuple[str, ...]]] = []
    for kind in kinds:
        for seed in (seeds if kind in _EVERY_SEED else seeds[:1]):
            if kind == "normal":
                runs.append((kind, seed, ()))
            elif kind == "negated":
                runs += [(kind, seed, (name,)) for name in small]
            else:
                runs += [(kind, seed, (name,)) for name in scaled]
                if kind == "tiny" and len(scaled) > 1:
                    runs.append((kind, seed, tuple(scaled)))
    return runs


# operators f with f(c * x) == c * f(x) for a scale c > 0 (positively homogeneous of degree 1 in their operand)
_SCALE_LINEAR = frozenset(("neg", "mul_scalar", "relu", "abs", "rotate_half", "sum", "mean", "max", "min", "permute",
                           "reshape", "output"))


# float dtypes with float32's exponent range: rounding to them commutes with a power-of-two scale (scale_degrees)
_WIDE_EXPONENT = frozenset(("float32", "bfloat16"))


def scale_degrees(reference: Graph, name: str) -> dict[str, int] | None:
    """Per output of ``reference``, the degree d with ``out(c * x) == c**d * out(x)`` for every power-of-two scale
    ``c > 0`` of input ``name`` (the others fixed), when every output has one; else None. The scaled kinds (hostile
    x32, tiny x2^-10) of a float input need no float64 run of their own then: the normal run's outputs times ``c**d``
    (within float64 rounding). Measured need: the final check at a tuned shape ran the float64 reference three times
    (normal from the tuner, hostile, tiny); at llama-1b's batch-8 prompt (1024 rows) each run of a grouped Linear is
    a float64 product of [1024, 2048] x [2048, 5632], and the reference runs took ~9.5 s of a 45 s start-up (py-spy).
    A rounding cast to bfloat16 or float32 keeps the degree: round to nearest commutes with a power-of-two scale
    while the value stays in the normal range (8 exponent bits: 2^-126..2^128; the scaled kinds move a value by
    2^(5 d) or 2^(-10 d)). Conservative otherwise: any other rounding cast (float16's range is 2^-14..2^16; to an
    integer), an eps (norms), a transcendental, a sum of different degrees -- anything but products, quotients, sums
    of like degrees and the operators in ``_SCALE_LINEAR`` -- of a value that depends on ``name`` gives None."""
    deg: dict[Node, int | None] = {}
    for n in reference.nodes:
        if n.op == "input":
            deg[n] = 1 if n.arg[0] == name else 0
            continue
        ds = [deg[s] for s in n.src]
        if any(d is None for d in ds):
            deg[n] = None
        elif all(d == 0 for d in ds):
            deg[n] = 0
        elif n.op in _SCALE_LINEAR or is_exact_cast(n) or (
                n.op == "cast" and n.arg[0] in _WIDE_EXPONENT and (n.src[0].dtype or float32).kind == "float"):
            deg[n] = ds[0]
        elif n.op in ("mul", "matmul"):
            deg[n] = ds[0] + ds[1]
        elif n.op == "div":
            deg[n] = ds[0] - ds[1]
        elif n.op in ("add", "sub", "maximum", "minimum", "concat") and len(set(ds)) == 1:
            deg[n] = ds[0]
        else:
            deg[n] = None
    out = {o.arg[0]: deg[o] for o in reference.outputs}
    return None if any(d is None for d in out.values()) else out  # type: ignore[return-value]


def _joint_degrees(reference: Graph, changed: Sequence[str], degrees: dict[str, dict[str, int] | None],
                   x: Mapping[str, np.ndarray], base: Mapping[str, np.ndarray], c: float) -> dict[str, int] | None:
    """Per output, the degree d with ``out(x) == c**d * out(base)`` where ``x`` is ``base`` with the ``changed``
    inputs scaled by ``c > 0``; None where some output has none. A program homogeneous of degree d_i in each input
    by itself (:func:`scale_degrees`, the others fixed at any value) is of degree sum(d_i) in them together. An
    integer input is never scaled (:func:`scaled_inputs`): degree 0. A low-precision float input counts only where
    its scaled draw is exactly ``c`` times the base one -- the scales are powers of two, so bar the subnormal range
    it is, and bfloat16 models (every activation bfloat16) need no float64 run of their own for these kinds.
    ``degrees`` caches :func:`scale_degrees` per input."""
    total: dict[str, int] = {o.arg[0]: 0 for o in reference.outputs}
    for name in changed:
        t = reference.inputs[name].dtype
        if t is not None and t.kind == "int":
            continue
        if name not in degrees:
            degrees[name] = scale_degrees(reference, name)
        d = degrees[name]
        if d is None or (t is not None and t.low_precision and not np.array_equal(x[name], base[name] * c)):
            return None   # (the O(n) comparison only where the degrees would be used)
        for o in total:
            total[o] += d[o]
    return total


def reduction_length(reference: Graph, env: Mapping[str, int]) -> int:
    """The longest reduction (matmul contraction or reduced dim) of the reference at ``env``."""
    k = 1
    for n in reference.nodes:
        if n.op == "matmul":
            k = max(k, D.evaluate(n.src[0].shape[-1], env))
        elif OPS[n.op].group in ("reduction", "composite"):
            k = max(k, D.evaluate(n.src[0].shape[n.arg[0]], env))
    return k


def tolerance(k: int, rtol: float = RTOL, rounding: float = 0.0) -> float:
    """``rtol * sqrt(max(1, k / 64))`` (float32 sums of ``k`` terms) plus ``rounding``
    (:func:`rounding_allowance`: what storing values in a low-precision dtype adds)."""
    return rtol * math.sqrt(max(1.0, k / 64)) + rounding


# A low-precision output is off the float64 reference by up to its dtype's eps (relative, round to nearest);
# the allowance is ROUNDINGS of them: the output's own rounding, and one more for a rounding inside the
# program (a cast, or an intermediate an implementation stores in the program's dtype) that the reference
# makes from float64 and the kernel from float32. A kernel that accumulates a matmul or a sum in bfloat16
# errs by ~eps * sqrt(K) or more (tests/cpu/test_low_precision.py: rejected at K = 64 and above).
ROUNDINGS = 2


# Operators whose result's relative error is the sum of their operands' (a product's factors each carry
# theirs); every other operator passes on the largest of its operands'.
_PRODUCTS = frozenset({"mul", "div", "matmul"})


def rounding_allowance(reference: Graph, output: str) -> float:
    """The error that storing values in low precision adds to ``output`` of ``reference`` (0 for a float32
    program): the larger of

    - ``ROUNDINGS`` times the largest eps among the output's dtype and the program's casts, and
    - the rounding error of the program as PyTorch runs it, every value of a low-precision dtype stored in
      it: each such value adds its dtype's eps to the relative error it inherits, which is the sum of
      its operands' for products (``_PRODUCTS``) and the largest of them otherwise.

    The second is what lets an implementation store a bfloat16 value of the program in bfloat16 where
    that pays (a matmul operand: ``vdpbf16ps`` sums bfloat16 pairs at twice the float32 rate): Llama's
    MLP ``silu(h @ Wg^T) * (h @ Wu^T)`` with ``h = bf16(rms_norm(x)) * w`` errs by 0.016 in eager PyTorch
    at K = 256 against the float64 reference, twice the first bound; its second is 8 eps = 0.031. A
    kernel that accumulates in bfloat16 errs by ~eps * sqrt(K) and stays rejected where the program's
    roundings do not allow that much (a plain matmul: 2 eps)."""
    eps = 0.0
    bound: dict[Node, float] = {}
    out = 0.0
    for n in reference.nodes:
        exact = is_exact_cast(n)   # (int8 -> bfloat16) rounds nothing
        if (n.op == "cast" and not exact) or (n.op == "output" and n.arg[0] == output):
            eps = max(eps, n.dtype.eps)
        srcs = [bound[x] for x in n.src]
        inherited = (sum(srcs) if n.op in _PRODUCTS else max(srcs)) if srcs else 0.0
        dt = n.dtype  # None for a block graph's call (its outputs carry their own dtypes)
        # moving or naming values rounds nothing
        computes = OPS[n.op].group not in ("io", "layout", "custom") and not exact
        own = dt.eps if dt is not None and computes and dt.low_precision else 0.0
        bound[n] = inherited + own
        if n.op == "output" and n.arg[0] == output:
            out = bound[n]
    return max(ROUNDINGS * eps, out)


def _same_class(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Where ``a`` and ``b`` are both NaN, both +inf or both -inf."""
    return ((np.isnan(a) & np.isnan(b)) | (np.isposinf(a) & np.isposinf(b)) | (np.isneginf(a) & np.isneginf(b)))


def _nonfinite_mismatch(c: np.ndarray, r: np.ndarray, judged: np.ndarray) -> tuple[str, int, int] | None:
    """None when, at the ``judged`` positions, ``c`` has NaN, +inf and -inf exactly where ``r`` has them;
    else (the class that differs, at how many positions, the first one's flat index)."""
    for label, test in (("NaN", np.isnan), ("+inf", np.isposinf), ("-inf", np.isneginf)):
        diff = (test(c) != test(r)) & judged
        if diff.any():
            return label, int(np.count_nonzero(diff)), int(np.flatnonzero(diff)[0])
    return None


class Float32Program:
    """The reference program run in float32 on one run's inputs, evaluated on first use only: the allowance for the
    program's own float32 error in numeric_check and in the tuner's :func:`max_error` (one per draw, shared)."""

    def __init__(self, reference: Graph, inputs: Mapping[str, np.ndarray], env: Mapping[str, int]) -> None:
        self.reference, self.inputs, self.env = reference, inputs, env
        self.outputs: Mapping[str, np.ndarray] | None = None

    def __call__(self, name: str) -> np.ndarray | None:
        if self.outputs is None:
            try:
                with np.errstate(all="ignore"):  # float32 throughout: a low-precision output is not rounded
                    self.outputs = self.reference.evaluate(   # here, its own error is the program's arithmetic
                        {k: to_dtype(v, self.reference.inputs[k].dtype) for k, v in self.inputs.items()},
                        dtype=np.float32, params=self.env)
            except Exception:  # no baseline: nothing is excused
                self.outputs = {}
        out = self.outputs.get(name)
        return None if out is None else np.asarray(out)


COMPARE_CHUNK = 1 << 18   # elements compared at a time: ~10 MB of temporaries, never a float64 copy of a whole output
# A candidate may err by up to OWN_ERROR_FACTOR times what the program itself errs at each element when run in
# float32 (ill-conditioned programs: x / (x + 1) near x = -1); looked at only when the plain error exceeds
# OWN_ERROR_FROM (below every tolerance), so well-conditioned programs never pay the float32 run for it
OWN_ERROR_FACTOR = 4.0
OWN_ERROR_FROM = 1e-5
# ... and only where such elements are rare (a pole, not the whole output): when the program's float32 run is
# that far off at more than this fraction of the elements, the reference itself is suspect, and nothing is excused.
# One such element is always allowed: a check at a small instantiation has outputs of a few elements (measured:
# a gated MLP at a decode shape [1, 1, 64], generalized to 3 outputs, one of them 5e-39 -- float32's subnormal
# range, where the program itself errs by 1.6e-4 -- rejected every candidate, the correct one included)
OWN_ERROR_MAX_FRACTION = 0.01
OWN_ERROR_MIN_COUNT = 1
# ... except at the scaled kinds: there the inputs are moved away from the scale the program is written for, and a
# program may be ill-conditioned at every element there (a KL divergence of two log-softmaxes at inputs x1e-3:
# float32 rounds both log-softmaxes to -log(n) + O(1e-3), so their difference errs by ~4e-4 relative everywhere,
# the program itself as much as any candidate; the search rejected the one-kernel KL for it). The normal kinds,
# checked with the same reference, still excuse only rare elements, so a wrong reference shows there.
OWN_ERROR_EVERYWHERE_KINDS = ("hostile", "tiny")


def _ill_conditioned_fraction(p32: np.ndarray, rf: np.ndarray, masks: list, scale: float) -> float:
    """The fraction of the finite elements at which the program's own float32 run is off by more than
    ``OWN_ERROR_FROM``; 0 when there are at most ``OWN_ERROR_MIN_COUNT`` of them."""
    bad = total = 0
    for j, i in enumerate(range(0, rf.size, COMPARE_CHUNK)):
        rc = rf[i:i + COMPARE_CHUNK].astype(np.float64, copy=False)
        fin = np.isfinite(rc) if masks[j] is None else np.isfinite(rc) & ~masks[j]
        own = np.abs(p32[i:i + COMPARE_CHUNK][fin].astype(np.float64) - rc[fin]) / (np.abs(rc[fin]) + scale)
        bad += int(np.count_nonzero(~(own <= OWN_ERROR_FROM)))
        total += int(own.size)
    return 0.0 if bad <= OWN_ERROR_MIN_COUNT else bad / max(total, 1)


def _compare(c: np.ndarray, r: np.ndarray, program32: Callable[[], np.ndarray | None] | None = None,
             own_from: float = OWN_ERROR_FROM, stored: DType | None = None, everywhere: bool = False
             ) -> tuple[float, str]:
    """(error, why): inf when the NaN / +inf / -inf positions differ, else the largest relative difference
    ``|c - r| / (|r| + rms(r))`` over the positions where both are finite.

    ``program32``: the reference program's output in float32; where the candidate is non-finite and the
    float64 reference finite, the position is excused if the program itself is non-finite the same way in
    float32 (the candidate overflows exactly as the program does). Works in chunks of ``COMPARE_CHUNK`` elements,
    so a 1 GB output is compared without gigabytes of float64 temporaries.

    ``stored``: the output's low-precision dtype: an overflow of that dtype in the program's own float32 run,
    rounded to it, excuses the candidate's infinity there too; and each element may be off by its rounding
    in the subnormal range, ``ROUNDINGS * stored.tiny`` absolute (float16 stores a 1e-6 result to 6e-8).

    ``everywhere``: the program's own float32 error is allowed at any number of elements (the scaled input kinds,
    ``OWN_ERROR_EVERYWHERE_KINDS``), not only at rare ones."""
    floor = ROUNDINGS * stored.tiny if stored is not None and stored.low_precision else 0.0
    if c.shape != r.shape:
        return math.inf, f"shape {c.shape} != reference shape {r.shape}"
    cf, rf = np.asarray(c).reshape(-1), np.asarray(r).reshape(-1)
    p: np.ndarray | None = None
    excused_total, sq, count = 0, 0.0, 0
    masks: list[np.ndarray | None] = []   # excused positions per chunk (None: none), for the second pass
    for i in range(0, rf.size, COMPARE_CHUNK):
        cc = cf[i:i + COMPARE_CHUNK].astype(np.float64)
        rc = rf[i:i + COMPARE_CHUNK].astype(np.float64, copy=False)
        over = ~np.isfinite(cc) & np.isfinite(rc)
        excused = None
        if program32 is not None and over.any():
            if p is None:
                got = program32()
                p = got.reshape(-1) if got is not None and got.shape == c.shape else np.zeros(0)
            if p.size:
                pc = p[i:i + COMPARE_CHUNK]
                if floor:  # the program's own result stored in the output's dtype (it may overflow there)
                    with np.errstate(all="ignore"):
                        pc = round_to(pc.astype(np.float32), stored)
                excused = over & _same_class(cc, pc)
        bad = _nonfinite_mismatch(cc, rc, np.ones(cc.shape, bool) if excused is None else ~excused)
        if bad is not None:
            label, n, j = bad
            at = tuple(int(x) for x in np.unravel_index(i + j, c.shape)) if c.shape else ()
            return math.inf, (f"non-finite values differ ({label}) at {n} of elements {i}-{i + cc.size - 1} "
                              f"(of {c.size}), first at {at}: candidate {float(cc[j])!r}, reference "
                              f"{float(rc[j])!r}")
        fin = np.isfinite(rc) if excused is None else np.isfinite(rc) & ~excused
        excused_total += 0 if excused is None else int(np.count_nonzero(excused))
        masks.append(excused)
        sq += float(np.sum(np.square(rc[fin])))
        count += int(np.count_nonzero(fin))
    note = f"{excused_total} positions non-finite as in the program run in float32" if excused_total else ""
    if count == 0:
        return 0.0, note
    scale = math.sqrt(sq / count) or 1.0

    def worst_error(p32: np.ndarray | None) -> float:
        worst = 0.0
        for j, i in enumerate(range(0, rf.size, COMPARE_CHUNK)):
            rc = rf[i:i + COMPARE_CHUNK].astype(np.float64, copy=False)
            fin = np.isfinite(rc) if masks[j] is None else np.isfinite(rc) & ~masks[j]
            if fin.any():
                cc = cf[i:i + COMPARE_CHUNK][fin].astype(np.float64)
                diff = np.abs(cc - rc[fin])
                if floor:
                    diff = np.maximum(diff - floor, 0.0)
                if p32 is not None:  # the program's own float32 error at each element, times OWN_ERROR_FACTOR
                    own = np.abs(p32[i:i + COMPARE_CHUNK][fin].astype(np.float64) - rc[fin])
                    diff = np.maximum(diff - OWN_ERROR_FACTOR * np.nan_to_num(own, nan=0.0, posinf=0.0), 0.0)
                worst = max(worst, float(np.max(diff / (np.abs(rc[fin]) + scale))))
        return worst
    worst = worst_error(None)
    if worst > own_from and program32 is not None:
        # near a pole (x / (x + 1) at x = -1) the program itself, run in float32, is that far off: a
        # candidate is judged by the error it adds beyond OWN_ERROR_FACTOR times the program's own
        if p is None:
            got = program32()
            p = got.reshape(-1) if got is not None and got.shape == c.shape else np.zeros(0)
        if p.size and (everywhere or _ill_conditioned_fraction(p, rf, masks, scale) <= OWN_ERROR_MAX_FRACTION):
            allowed = worst_error(p)
            if allowed < worst:
                note = (note + "; " if note else "") + (f"error {worst:.1e} as the program's own in float32 "
                                                         f"allows (beyond it: {allowed:.1e})")
                worst = allowed
    return worst, note


def steps(reference: Graph) -> bool:
    """Whether ``reference`` has a piecewise-constant operator (``OpDef.steps``: round, floor, ...) or a cast to an
    integer dtype: there a float32 rounding of the operand moves the value by a whole step, and the step carries
    through a reduction to every output that reads it -- the program's own float32 run is then off at a whole row
    of outputs, not at rare elements. Measured need: the W8A8 product at 8 decode rows (x [8, 1, 2048], 512
    outputs per row): one of the 16384 quantized values of the tuner's draw rounds across .5 in float32 against
    the float64 reference, the 512 outputs of its row (12.5 %) err by 0.0026, over OWN_ERROR_MAX_FRACTION, so every
    candidate failed the tuner's filter -- each rounding as the program's float32 run does -- and the k and v
    projections of llama-1b w8a8 at batch 8 ran in PyTorch."""
    return any((n.op in OPS and OPS[n.op].steps) or (n.op == "cast" and n.dtype is not None and
                                                       not n.dtype.is_float) for n in reference.nodes)


def max_error(got: Mapping[str, np.ndarray], ref: Mapping[str, np.ndarray],
              program: Float32Program | None = None) -> float:
    """max over outputs of :func:`_compare`'s error (inf when the non-finite positions differ): the measure
    the tuner checks each candidate with. ``program`` (:class:`Float32Program` of the reference on the same
    inputs; share one between candidates: it runs once, and only where some error is above its output's
    ``OWN_ERROR_FROM``) gives the allowance numeric_check gives: a candidate may err where the program itself,
    run in float32, errs at rare elements. Measured need: ``round(x * 1000.3) * 0.001`` -- every candidate
    rounds as the program does in float32, one step from the float64 reference at ~0.1 % of the elements --
    failed the tuner's filter with every candidate (the final check would have passed them)."""
    worst = 0.0
    stepped = program is not None and steps(program.reference)
    for name, r in ref.items():
        c = np.asarray(got[name])
        stored = of_array(c) if c.dtype.name in ("bfloat16", "float16") else None
        if program is None:
            worst = max(worst, _compare(c, np.asarray(r), stored=stored)[0])
            continue
        own_from = max(OWN_ERROR_FROM, rounding_allowance(program.reference, name))
        worst = max(worst, _compare(c, np.asarray(r), functools.partial(program, name), own_from, stored=stored,
                                    everywhere=stepped)[0])
    return worst


def numeric_check(candidate: Graph, reference: Graph, *, instantiations: Sequence[Mapping[str, int]] | None = None,
                  n_instantiations: int = 3, kinds: Sequence[str] = KINDS, seeds: Sequence[int] = SEEDS,
                  runners: Sequence[Runner] | None = None, hostile_input: str | Sequence[str] | None = None,
                  rtol: float = RTOL, stop_on_failure: bool = True,
                  draws: Mapping[int, Mapping[str, np.ndarray]] | None = None,
                  normal_references: Mapping[int, Mapping[str, np.ndarray]] | None = None) -> NumericResult:
    """Compare every runner's output of ``candidate`` with the float64 reference on random inputs.

    Per instantiation: ``normal`` on every seed; ``negated`` on every seed, each input of at most
    ``SMALL_INPUT`` elements negated in turn; ``hostile`` and ``tiny`` on the first seed, each input of
    ``hostile_input`` (a name or names; default every input) scaled in turn.

    ``draws``: standard-normal inputs by seed that the caller already drew at the single instantiation
    given (:func:`standard_normal_inputs`; the tuner's inputs), used instead of drawing them again;
    ``normal_references``: the float64 reference's outputs on ``draws[seed]`` (the ``normal`` kind), when
    the caller has evaluated them already (the tuner has: W4's attention reference costs 0.3 s a time)."""
    t0 = time.perf_counter()
    runners = list(runners) if runners is not None else [interpreter_runner()]
    bad = [k for k in kinds if k not in _SCALE]
    if bad or not seeds:
        raise PrismError(f"numeric_check: kinds must be among {list(_SCALE)} (got {list(kinds)}) and seeds "
                         f"non-empty (got {list(seeds)})")
    scaled = _targets(reference, hostile_input)
    envs = [dict(e) for e in instantiations] if instantiations is not None else choose_instantiations(
        candidate, reference, n_instantiations)
    if normal_references and not set(normal_references) <= set(draws or {}):
        raise PrismError("numeric_check: normal_references= are the reference's outputs on draws= of the same "
                         f"seeds; got references for seeds {sorted(normal_references)}, draws for "
                         f"{sorted(draws or {})}")
    if draws:
        if len(envs) != 1:
            raise PrismError(f"numeric_check: draws= needs exactly one instantiation, got {len(envs)}")
        want = {k: tuple(int(D.evaluate(d, envs[0])) for d in n.shape) for k, n in reference.inputs.items()}
        for seed, x in draws.items():
            got = {k: tuple(np.shape(v)) for k, v in x.items()}
            if got != want:
                raise PrismError(f"numeric_check: draws[{seed}] has shapes {got}; the reference's inputs at "
                                 f"{envs[0]} have {want}")
    checks: list[Check] = []
    rounding = {o: rounding_allowance(reference, o) for o in reference.output_names}
    out_dtypes = {n.arg[0]: n.dtype for n in reference.outputs}
    stepped = steps(reference)   # its own float32 error allowed at every element, at every kind
    degrees: dict[str, dict[str, int] | None] = {}   # per scaled input: scale_degrees (a float input's), or None
    for env in envs:
        k = reduction_length(reference, env)
        tol = tolerance(k, rtol)
        key = tuple(sorted(env.items()))
        drawn: dict[int, Mapping[str, np.ndarray]] = dict(draws or {})
        normal: dict[int, Mapping[str, np.ndarray]] = {}   # the normal kind's reference outputs, per seed
        for kind, seed, changed in _plan(reference, env, kinds, seeds, scaled):
            if seed not in drawn:
                drawn[seed] = standard_normal_inputs(reference, env, seed)
            x = _vary(drawn[seed], kind, changed, _dtypes(reference))
            # (checked above: a reference given for a seed is of draws[seed], the inputs used here)
            known = (normal_references or {}).get(seed) if kind == "normal" else None
            if kind != "normal" and seed in normal and _SCALE[kind] > 0:
                d = _joint_degrees(reference, changed, degrees, x, drawn[seed], _SCALE[kind])
                if d is not None:
                    known = {o: v * _SCALE[kind] ** d[o] for o, v in normal[seed].items()}
            if known is not None:
                ref = known
            else:
                with np.errstate(all="ignore"):  # non-finite results are judged below, not warned about
                    ref = reference.evaluate(x, dtype=np.float64, params=env)
            if kind == "normal":
                normal[seed] = ref
            program32 = Float32Program(reference, x, env)
            label = ",".join(changed)
            for runner in runners:
                try:
                    with np.errstate(all="ignore"):
                        got = runner.run(candidate, x, env)
                except Exception as e:  # any failure to run the candidate is a failed check
                    checks += [Check(runner.name, key, kind, seed, o, math.inf, tol + rounding[o], False,
                                     f"failed to run: {type(e).__name__}: {e}", label) for o in ref]
                    continue
                for o, r in ref.items():
                    if o not in got:
                        checks.append(Check(runner.name, key, kind, seed, o, math.inf, tol, False, "output missing",
                                            label))
                        continue
                    err, why = _compare(np.asarray(got[o]), np.asarray(r), functools.partial(program32, o),
                                        max(OWN_ERROR_FROM, rounding[o]), out_dtypes[o],
                                        everywhere=kind in OWN_ERROR_EVERYWHERE_KINDS or stepped)
                    tol_o = tol + rounding[o]
                    checks.append(Check(runner.name, key, kind, seed, o, err, tol_o, err <= tol_o, why, label))
            if stop_on_failure and any(not c.ok for c in checks):
                break
        if stop_on_failure and any(not c.ok for c in checks):
            break
    passed = bool(checks) and all(c.ok for c in checks)
    return NumericResult(passed, tuple(checks), tuple(envs), time.perf_counter() - t0)


__all__ = ["KINDS", "RTOL", "SEEDS", "SMALL_INPUT", "Check", "Float32Program", "NumericResult", "Runner",
           "choose_instantiations", "compiled_runner", "generalized", "interpreter_runner",
           "make_inputs", "max_error", "numeric_check", "reduction_length", "rounding_allowance",
           "standard_normal_inputs", "to_dtype", "to_float32", "tolerance"]
