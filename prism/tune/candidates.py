"""Instantiation: concrete values for an sGraph's symbols at a concrete shape, filtered by the machine.

1. **Symbols.** The sGraph's own symbols: grid sizes and for-loop ranges of its customized operators
   (size symbols) and symbolic map entries (map symbols); the program's batch dims are given.
2. **Values per size symbol.** Every ``Divisible(num, den)`` constraint whose ``num`` is concrete at the
   shape says that each symbol of ``den`` divides ``num``: a symbol's values are the common divisors of
   those ``num`` -- all powers of two among them, plus other divisors (log-spaced, at most
   ``MAX_VALUES`` in all), always including 1 -- except for a split count ``P...`` of a split reduction
   (one split is the base sGraph plus a useless combine). A symbol no constraint mentions splits nothing and gets
   powers of two up to ``FREE_MAX``. Map symbols range over None and the data dims of their tensor.
3. **Exactness.** Assignments are enumerated with every constraint (``Divisible`` and ``DimEq``) checked
   as soon as its symbols are bound; each survivor must produce the program's output shapes and is
   costed on the sGraph under its values. Only the candidates that get compiled are instantiated by the
   IR (which re-derives and re-checks every shape; one that fails is skipped).
4. **Machine filters**, in order, each applied only if some candidate survives it (otherwise it is
   *relaxed* and the relaxation is reported): per-block working set <= L2; blocks >= threads for every
   customized operator; the innermost dim of every split tile a multiple of the SIMD width.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field

from prism.errors import PrismError
from prism.ir import dims as D
from prism.ir.block import MapVar
from prism.ir.graph import Graph
from prism.tune.cost import Dims, Estimate, estimate
from prism.tune.machine import Machine

MAX_VALUES = 20          # values per size symbol
FREE_MAX = 64            # a symbol no constraint bounds: powers of two up to this
MAX_ASSIGNMENTS = 50_000  # assignments examined per sGraph
MAX_INSTANCES = 3_000    # instances kept per sGraph (each is instantiated and costed)
MAX_MAP_CHOICES = 64


@dataclass(eq=False)
class Instance:
    """One instantiation of an sGraph, with the model's estimate. ``graph`` (the concrete kernel graph) is
    built by the IR on first use: only the candidates that get compiled need it."""

    sgraph: int
    params: dict[str, int | None]
    source: Graph                # the sGraph (its map symbols, if any, already substituted)
    env: dict[str, int]          # batch dims and size parameters
    estimate: Estimate
    dropped: str = ""            # the machine filter that removed it ("" = kept)
    _graph: Graph | None = None

    @property
    def graph(self) -> Graph:
        if self._graph is None:
            self._graph = self.source.instantiate(self.env)
        return self._graph

    @property
    def label(self) -> str:
        return ",".join(f"{k}={v}" for k, v in sorted(self.params.items())) or "-"


@dataclass
class Instantiation:
    """All instances of one sGraph at one shape, and what the filters did."""

    sgraph: int
    symbols: list[str]
    values: dict[str, list[int]]
    kept: list[Instance] = field(default_factory=list)
    dropped: list[Instance] = field(default_factory=list)
    relaxed: list[str] = field(default_factory=list)
    invalid: int = 0             # assignments rejected by constraints or the IR
    truncated: bool = False
    failure: str = ""            # why there is no instance at all


def divisors(n: int) -> list[int]:
    n = abs(int(n))
    if n == 0:
        return [1]
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return sorted(set(small + [n // d for d in small]))


def _is_pow2(v: int) -> bool:
    return v > 0 and v & (v - 1) == 0


def thin(values: Sequence[int], limit: int = MAX_VALUES) -> list[int]:
    """All powers of two, then other values spread evenly on a log scale, at most ``limit``, with 1."""
    vals = sorted(set(values) | {1})
    if len(vals) <= limit:
        return vals
    keep = [v for v in vals if _is_pow2(v)][:limit]
    others = [v for v in vals if not _is_pow2(v)]
    room = limit - len(keep)
    if room > 0 and others:
        step = len(others) / room
        keep += [others[int(i * step)] for i in range(room)]
    return sorted(set(keep))


def _constraints(g: Graph) -> list[D.Divisible | D.DimEq]:
    return [c for bg in g.customized_ops() for c in bg.constraints]


def sgraph_symbols(g: Graph) -> tuple[list[str], list[str]]:
    """(size symbols, map symbols) of the sGraph's customized operators, excluding the program's dims."""
    size: set[str] = set()
    maps: set[str] = set()
    for bg in g.customized_ops():
        ms = bg.map_symbols()
        maps |= ms
        size |= bg.symbols() - ms
    size -= g.symbols()
    return sorted(size), sorted(maps)


def symbol_values(g: Graph, env: Mapping[str, int]) -> dict[str, list[int]]:
    """Candidate values of every size symbol of ``g`` at the batch-dim values ``env``."""
    size, _ = sgraph_symbols(g)
    allowed: dict[str, set[int] | None] = dict.fromkeys(size)
    for c in _constraints(g):
        if not isinstance(c, D.Divisible):
            continue
        num = D.subs(c.num, env)
        if not isinstance(num, int) or D.has_selectors(c.den):
            continue
        for s in D.symbols(c.den):
            if s in allowed:
                ds = set(divisors(num))
                allowed[s] = ds if allowed[s] is None else allowed[s] & ds  # type: ignore[operator]
    splits = {s for bg in g.customized_ops() for s in bg.splits}  # split counts (BlockGraph.splits)
    out = {}
    for s, vals in allowed.items():
        v = thin(vals) if vals is not None else [1 << k for k in range(int(math.log2(FREE_MAX)) + 1)]
        if s in splits and len(v) > 1:
            v = [x for x in v if x != 1]  # one split = the base sGraph + a useless combine (see splitk)
        out[s] = v
    return out


def _map_domains(g: Graph) -> dict[str, list[int | None]]:
    doms: dict[str, set[int | None]] = {}
    for bg in g.customized_ops():
        for n in bg.nodes:
            if n.op not in ("iter", "save"):
                continue
            rank = len(bg.inputs[n.arg[0]].shape) if n.op == "iter" else len(n.shape)
            for e in (*n.arg[1], n.arg[2]):
                if isinstance(e, MapVar):
                    doms.setdefault(e.name, set()).update([None, *range(rank)])
    return {k: sorted(v, key=lambda x: -1 if x is None else x) for k, v in doms.items()}


def _assignments(names: list[str], values: dict[str, list[int]], cons: list, env: Mapping[str, int],
                 limit: int) -> Iterator[dict[str, int]]:
    """Depth-first over ``names``; a constraint is checked once all its symbols are bound."""
    bound_at: dict[int, list] = {}
    order = {s: i for i, s in enumerate(names)}
    for c in cons:
        syms = (D.symbols(c.num) | D.symbols(c.den)) if isinstance(c, D.Divisible) else \
            (D.symbols(c.a) | D.symbols(c.b))
        last = max((order[s] for s in syms if s in order), default=-1)
        bound_at.setdefault(last, []).append(c)
    count = 0
    cur: dict[str, int] = dict(env)

    def ok(i: int) -> bool:
        return all(c.holds(cur) is not False for c in bound_at.get(i, ()))

    if not ok(-1):
        return

    def rec(i: int) -> Iterator[dict[str, int]]:
        nonlocal count
        if i == len(names):
            yield {s: cur[s] for s in names}
            return
        for v in values[names[i]]:
            count += 1
            if count > limit:
                return
            cur[names[i]] = v
            if ok(i):
                yield from rec(i + 1)
        cur.pop(names[i], None)

    yield from rec(0)


def _split_inner_ok(inst: Instance, lanes: int) -> bool:
    """Every tile whose innermost dim is split has that dim a multiple of the SIMD width."""
    if lanes <= 1:
        return True
    S = Dims(inst.env)
    for bg in inst.source.customized_ops():
        for n in bg.nodes:
            if n.op == "iter":
                full = bg.inputs[n.arg[0]].shape
            elif n.op == "save":
                full = bg.output_shapes[n.arg[0]]
            else:
                continue
            t, f = S.dim(n.shape[-1]), S.dim(full[-1])
            if t != f and t % lanes:
                return False
    return True


FILTERS = ("cache", "cores", "vector")


def _passes(inst: Instance, name: str, m: Machine) -> bool:
    est = inst.estimate
    if name == "cache":
        return est.working_set <= m.l2
    if name == "cores":
        return est.min_blocks >= m.threads
    return _split_inner_ok(inst, m.simd)


def instantiate(g: Graph, env: Mapping[str, int], m: Machine, index: int = 0,
                expected: Mapping[str, tuple[int, ...]] | None = None) -> Instantiation:
    """Every valid instantiation of sGraph ``g`` at batch dims ``env``, costed and filtered (see module doc).

    ``expected``: the program's output shapes at ``env`` (an instance must produce exactly these).
    """
    env = {k: int(v) for k, v in env.items()}
    missing = sorted(g.symbols() - set(env))
    if missing:
        raise PrismError(f"instantiate: give values for the program's dims {missing}")
    size, maps = sgraph_symbols(g)
    res = Instantiation(index, size + maps, {})
    map_doms = _map_domains(g)
    map_choices = list(itertools.islice(itertools.product(*(map_doms[s] for s in maps)), MAX_MAP_CHOICES))
    instances: list[Instance] = []
    for mc in map_choices:
        menv = dict(zip(maps, mc))
        try:
            gm = g.instantiate(menv) if menv else g
        except PrismError:
            res.invalid += 1
            continue
        values = symbol_values(gm, env)
        res.values.update({k: v for k, v in values.items() if k not in res.values})
        names = sorted(values, key=lambda s: len(values[s]))
        cons = _constraints(gm)
        outs = gm.output_shapes
        for params in _assignments(names, values, cons, env, MAX_ASSIGNMENTS):
            if len(instances) >= MAX_INSTANCES:
                res.truncated = True
                break
            full = {**env, **params}
            if not all(c.holds(full) is True for c in cons):
                res.invalid += 1
                continue
            try:
                S = Dims(full)
                if expected is not None and any(S(outs[k]) != tuple(v) for k, v in expected.items()):
                    res.invalid += 1
                    continue
                est = estimate(gm, m, full)
            except (PrismError, ValueError, ZeroDivisionError):
                res.invalid += 1
                continue
            instances.append(Instance(index, {**menv, **params}, gm, full, est))
    if not instances:
        res.failure = _why_none(g, env)
        return res
    kept = instances
    for name in FILTERS:
        ok = [i for i in kept if _passes(i, name, m)]
        if ok:
            for i in kept:
                if i not in ok:
                    i.dropped = name
                    res.dropped.append(i)
            kept = ok
        else:
            res.relaxed.append(name)
    kept.sort(key=lambda i: i.estimate.seconds)
    res.kept = kept
    return res


def _why_none(g: Graph, env: Mapping[str, int]) -> str:
    """Which constraints fail at ``env`` even with every sGraph symbol at its most permissive value 1."""
    size, maps = sgraph_symbols(g)
    ones = {**env, **dict.fromkeys(size, 1)}
    bad = [str(c) for c in _constraints(g) if isinstance(c, D.Divisible) and c.holds(ones) is False]
    shape = ", ".join(f"{k}={v}" for k, v in sorted(env.items()))
    if bad:
        return f"at {shape} no values of {size} satisfy: " + "; ".join(bad)
    return f"at {shape} no assignment of {size + maps} instantiates cleanly"


def working_sizes(g: Graph, env: Mapping[str, int], m: Machine, limit: int = 256, count: int = 8
                  ) -> dict[str, list[int]]:
    """For each batch dim: values up to ``limit`` (others as in ``env``) at which ``g`` has an instance."""
    out: dict[str, list[int]] = {}
    cons = _constraints(g)
    for s in sorted(env):
        found = []
        for v in range(1, limit + 1):
            trial = {**env, s: v}
            values = symbol_values(g, trial)
            names = sorted(values, key=lambda x: len(values[x]))
            if next(_assignments(names, values, cons, trial, 2000), None) is not None:
                found.append(v)
                if len(found) >= count:
                    break
        out[s] = found
    return out
