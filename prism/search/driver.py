"""``prism.search``: generate, rank and verify fused implementations of a program.

Pipeline: peel boundary layout ops (:mod:`.program`) -> abstract target and its lax e-graph, saturated
once (:mod:`.egraph`) -> operator set (:mod:`.space`) -> kernel-graph generation by iterative deepening
over the number of kernel operators (1, 2, ... ``max_kernel_ops``), each level's first moves run as
independent tasks on an :class:`~.executor.Executor` -> for every complete structure, its map
assignments (sGraphs with symbolic grid sizes and ``F``) ranked by the static cost model -> verification
in rank order until ``max_results`` candidates pass (:mod:`.gate`). Results are cached on disk by
(program key, limits, mode, env, verifier).
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from prism.errors import PrismError
from prism.ir import dims as D
from prism.ir.graph import Graph
from prism.ir.serialize import graph_from_json, graph_to_json
from prism.runtime import store
from prism.runtime.cache import cache_dir
from prism.search import maps as M
from prism.search.abstract import TreeAlgebra, format_tree, graph_exprs
from prism.search.axes import kept_axes
from prism.search.block import BlockContext, BlockSearch, BlockStruct, HardwareSpec, compile_templates
from prism.search.build import assignments, build_graph
from prism.search.cost import CostReport, Machine, estimate, machine
from prism.search.egraph import DEFAULT_AXIOMS, ClassTable, LaxEGraph
from prism.search.executor import Executor, make_executor
from prism.search.gate import UnsplitCheck, Verdict, formal_verifier
from prism.search.gate import verify as gate_verify
from prism.search.kernel import FREE_OPS, Bound, KernelCandidate, KernelSearch
from prism.search.program import CoreProgram, check_searchable_sizes, peel
from prism.search.space import Limits, derive_opset
from prism.search.splitk import Refusal, estimate_split, split_reduction
from prism.search.stats import Budget, Stats, StopReason, StopSearch
from prism.search.transfer import Family, family, narrows, size_map, transferred

VERSION = "search/7"  # 2: split-reduction variants; 3: checksummed envelope, verifier fingerprint in the key;
# 4: block graphs carry their split counts (BlockGraph.splits); 5: dtypes (casts to float32 abstractly the
# identity, mixed float operands promote, outputs cast to the program's dtype); 6: the numeric check judges one
# element by the program's own float32 error (results that lost every candidate to it are searched again);
# 7: candidates that exponentiate an unshifted value where the program shifts by the max are rejected
# (gate.unshifted_exp: softmax as exp(s) / sum(exp(s)) was verified and won decode attention tunings)
# part of the cache key only (the file format is unchanged): results of an older space are not reused.
# 1: several program outputs (savers of used tiles, outputs needing no user), level 0, square permutes;
# 2: inputs read through views (transposes and per-channel scales outside the core, prism.search.program);
# deeper levels explored only where they can win by kernel.LEVEL_MARGIN; 3: a permute of an input is an atom
# of its own in the abstraction (abstract.permuted_atom: x @ x.T was searched to its time limit), and a
# customized operator may take an input it multiplies by its own permutation twice (KernelSearch.twice);
# 4: no reduction over a kept axis of the program (prism.search.axes)
SPACE = 4
MODES = ("symbolic", "concrete")
CONCRETE_MAX_SIZE = 64   # concrete mode: grid sizes and F from {2, 4, ..., 64} dividing the split dims
MAX_CHOICES = 4096       # map assignments costed per structure (the rest: rule enumerate_budget)
MAX_VERIFY = 200         # verification attempts per search (ranked order) before giving up
GRACE = 0.1              # share of time_limit the phases after generation get even when generation used it all
FAMILY_DONORS = 8        # searches a family's file names (prism.search.transfer)
UNSPLIT_MAX_ELEMS = 1 << 21  # the unsplit check runs a structure on whole tensors; skip it above this tile size

Progress = Callable[[dict[str, Any]], None]


@dataclass
class Candidate:
    """One verified result: an sGraph (customized ops with concrete maps, symbolic grid sizes and F)."""

    graph: Graph
    cost: CostReport
    verdict: Verdict
    structure: str

    def to_json(self) -> dict[str, Any]:
        return {"graph": json.loads(graph_to_json(self.graph)), "cost": self.cost.to_json(),
                "verified": {"ok": self.verdict.ok, "how": self.verdict.how, "detail": self.verdict.detail,
                             "instantiations": self.verdict.instantiations},
                "structure": self.structure}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Candidate:
        c = d["cost"]
        v = d["verified"]
        return cls(graph_from_json(json.dumps(d["graph"])),
                   CostReport(c["seconds"], c["dram_bytes"], c["flops"], c["kernels"], c["working_set"],
                              dict(c["params"]), c["feasible"]),
                   Verdict(v["ok"], v["how"], v["detail"], list(v["instantiations"])), d["structure"])


@dataclass
class SearchResult:
    program: Graph
    mode: str
    limits: Limits
    stop_reason: StopReason
    candidates: list[Candidate]
    stats: Stats
    target: str = ""
    egraph: dict[str, Any] = field(default_factory=dict)
    env: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0
    cached: bool = False
    transferred_from: str = ""   # the key of the program whose search's candidates these are (:mod:`.transfer`)

    @property
    def best(self) -> Candidate | None:
        return self.candidates[0] if self.candidates else None

    @property
    def verification(self) -> str:
        hows = {c.verdict.how for c in self.candidates}
        return ", ".join(sorted(hows)) if hows else ("formal+numeric" if formal_verifier() else "numeric-only")

    def to_json(self) -> dict[str, Any]:
        return {"format": VERSION, "program": json.loads(graph_to_json(self.program)), "mode": self.mode,
                "limits": self.limits.key(), "stop_reason": self.stop_reason.value,
                "candidates": [c.to_json() for c in self.candidates], "stats": self.stats.to_json(),
                "target": self.target, "egraph": self.egraph, "env": self.env, "seconds": self.seconds,
                "verification": self.verification, "transferred_from": self.transferred_from}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> SearchResult:
        if d.get("format") != VERSION:
            raise PrismError(f"not a search result of this version (format {d.get('format')!r}, expected {VERSION!r})")
        return cls(graph_from_json(json.dumps(d["program"])), d["mode"], Limits(**d["limits"]),
                   StopReason(d["stop_reason"]), [Candidate.from_json(c) for c in d["candidates"]],
                   Stats.from_json(d["stats"]), d.get("target", ""), d.get("egraph", {}), dict(d.get("env", {})),
                   float(d.get("seconds", 0.0)), transferred_from=str(d.get("transferred_from", "")))


# --- one search context, rebuilt in every worker ----------------------------------------------------

@dataclass
class _Payload:
    core_json: str
    table: ClassTable
    limits: Limits
    mode: str
    env: dict[str, int]
    machine: Machine


class _Context:
    def __init__(self, p: _Payload) -> None:
        self.p = p
        self.core = graph_from_json(p.core_json)
        self.templates = derive_opset(self.core, p.table.ops())
        tab = p.table
        self.inputs = tuple((tab.atom(n.arg[0]) if tab.atom(n.arg[0]) is not None else -1, n.shape)
                            for n in self.core.inputs.values())
        self.roots = tuple(tab.roots)
        self.root_shapes = tuple(o.shape for o in self.core.outputs)
        kept = kept_axes(self.core)
        self.axes = tuple(kept[name] for name in self.core.inputs)
        self.memo: dict[BlockContext, list] = {}
        self.compiled = compile_templates(tab, self.templates)

    def kernel_search(self, k: int, stats: Stats, budget: Budget, best: float | None = None,
                      exact: bool = False) -> KernelSearch:
        """The kernel search of level ``k`` (at most / with ``exact`` exactly ``k`` kernel operators), bounded
        by ``best`` (the best verified cost so far) when given."""
        p = self.p
        lim = replace(p.limits, max_kernel_ops=k)
        hw = HardwareSpec(p.machine.l2_bytes) if p.mode == "concrete" else None
        blocks = BlockSearch(p.table, self.templates, lim, self.roots, self.root_shapes, stats, budget, hw, p.env,
                             self.compiled)
        sizes = _concrete_sizes(p.env) if p.mode == "concrete" else None
        bound = None
        if best is not None:
            io = sum(_elems(n.shape, p.env) for n in self.core.inputs.values())
            io += sum(_elems(o.shape, p.env) for o in self.core.outputs)
            free = any(t.kernel and t.op in FREE_OPS for t in self.templates)
            bound = Bound(best, io * 4, dict(p.env), p.machine.bandwidth, p.machine.launch_s, 0 if free else 1)
        return KernelSearch(p.table, self.templates, lim, self.inputs, self.roots, self.root_shapes, stats, budget,
                            blocks, sizes, self.memo, bound, exact, self.axes)


_CTX: _Context | None = None


def _init(payload: _Payload | None) -> None:
    global _CTX
    _CTX = _Context(payload) if payload is not None else None


def _elems(shape: tuple, env: Mapping[str, int]) -> int:
    return math.prod(d if isinstance(d, int) else D.evaluate(d, env) for d in shape)


@dataclass
class _Task:
    level: int
    key: tuple
    move: tuple
    deadline: float
    states: int
    best: float | None = None


@dataclass
class _TaskResult:
    candidates: list[KernelCandidate]
    stats: Stats
    stop: StopReason | None


def _run_task(task: _Task) -> _TaskResult:
    assert _CTX is not None, "search worker not initialized"
    stats = Stats()
    budget = Budget(task.deadline, task.states)
    ks = _CTX.kernel_search(task.level, stats, budget, task.best, exact=True)
    out: list[KernelCandidate] = []
    stop = None
    with stats.phase("generate"):
        try:
            for c in ks.run_move(task.key, task.move):
                out.append(c)
        except StopSearch as e:
            stop = e.reason
    return _TaskResult(out, stats, stop)


def _concrete_sizes(env: Mapping[str, int]) -> Callable[..., Iterator[tuple[int, ...]]]:
    """Mirage-style numbers: each used grid dim and F from {2, 4, ...} dividing every dim it splits."""
    def sizes_for(ctx: BlockContext, grid: tuple[dict, ...], loop: dict) -> Iterator[tuple[int, ...]]:
        fulls = [[d if isinstance(d, int) else D.evaluate(d, env) for d in shape] for _, shape in ctx.inputs]
        n = len(ctx.inputs)

        def opts(col: dict, c: str) -> list[int]:
            split = [fulls[i][col[M.mvar(i, c)]] for i in range(n) if col[M.mvar(i, c)] != M.NONE]
            if not split:
                return [1]
            g = math.gcd(*split)
            return [1 << k for k in range(1, 7) if (1 << k) <= min(g, CONCRETE_MAX_SIZE) and g % (1 << k) == 0]

        per = [opts(col, M.G) for col in grid] + [[1]] * (M.MAX_GRID - len(grid)) + [opts(loop, M.L)]
        for combo in itertools.product(*per):
            ok = True
            for i in range(n):  # the product of the sizes splitting one dim must divide it
                for d, full in enumerate(fulls[i]):
                    f = math.prod(combo[p] for p, col in enumerate(grid) if col[M.mvar(i, M.G)] == d)
                    f *= combo[3] if loop[M.mvar(i, M.L)] == d else 1
                    if full % f:
                        ok = False
            if ok:
                yield combo
    return sizes_for


# --- the public entry point ------------------------------------------------------------------------

def search(graph: Graph, limits: Limits | None = None, mode: str = "symbolic", *, env: Mapping[str, int] | None = None,
           workers: int = 1, executor: Executor | None = None, cache: bool = True, progress: Progress | None = None,
           axioms: tuple[str, ...] | None = None, transfer: bool = False) -> SearchResult:
    """Search fused implementations of ``graph`` and return verified sGraphs, best first.

    ``limits``: the space and the budget (:class:`Limits`). ``mode``: ``"symbolic"`` (grid sizes, F and
    maps stay symbols during generation) or ``"concrete"`` (Mirage-style: enumerated as numbers up front,
    for comparison). ``env``: representative values of the program's symbolic dims (cost ranking and
    concrete sizes; default 16 each). Results are cached under ``$PRISM_CACHE_DIR/search`` (else
    ``$XDG_CACHE_HOME/prism/search``, else ``~/.cache/prism/search``). ``transfer``: a program of the same family
    as one searched before with the same limits (the same program at other fixed sizes, :mod:`.transfer`) takes
    that search's candidates at its own sizes, each verified again against it; the search runs where none
    verifies (``result.transferred_from`` names the program searched).
    """
    if mode not in MODES:
        raise PrismError(f"search mode must be one of {MODES}, got {mode!r}")
    limits = limits or Limits()
    graph.check()
    check_searchable_sizes(graph)
    env = {s: int((env or {}).get(s, 16)) for s in sorted(graph.symbols())}
    axioms = tuple(axioms) if axioms is not None else DEFAULT_AXIOMS
    path = _cache_path(graph, limits, mode, env, axioms) if cache else None
    if path is not None:
        r = _load_cached(path, graph)
        if r is not None:
            return r
    if path is None:
        return _search(graph, limits, mode, env, workers, executor, progress, axioms)
    # the program's family and its wide family (transfer.family): (family, its file, the donors the file names)
    fams: list[tuple[Family, Path, list[dict[str, Any]]]] = []
    for wide in (False, True):
        fam = family(graph, wide=wide)
        file = _family_path(fam[0], limits, mode, env, axioms, wide=wide)
        fams.append((fam, file, _donors(file)))
    if transfer:
        (own, own_file, own_donors), (wide_fam, wide_file, wide_donors) = fams
        r = _transfer(own_file, own_donors, graph, own, env, progress)
        if r is None and 1 in wide_fam[1]:   # a size of 1: a donor of more rows may serve it (transfer.narrows)
            r = _transfer(wide_file, wide_donors, graph, wide_fam, env, progress, narrowing=True)
        if r is None and env:
            # a symbolic program: the same program at fixed sizes searched before (its fixed family; such donors
            # were searched with no symbols, so with an empty env)
            fixed = family(graph, symbols=True)
            fixed_file = _family_path(fixed[0], limits, mode, {}, axioms)
            r = _transfer(fixed_file, _donors(fixed_file), graph, fixed, env, progress, symbols=True)
        if r is not None:
            store.save(path, "search", r.to_json())
            return r
    r = _search(graph, limits, mode, env, workers, executor, progress, axioms)
    store.save(path, "search", r.to_json())
    if r.candidates:
        # newest first, at most FAMILY_DONORS (two processes that record at once may lose one of the two names: a
        # later program of the family is then searched)
        for _, file, names in fams:
            old = [d for d in names if d.get("file") != path.name]
            store.save(file, "search-family",
                       {"donors": [{"file": path.name, "program": graph.key}, *old][:FAMILY_DONORS]})
    return r


def _family_path(text: str, limits: Limits, mode: str, env: Mapping[str, int], axioms: tuple[str, ...],
                 wide: bool = False) -> Path:
    """Where a family (its text, :func:`.transfer.family`; ``wide``: a wide family's) names the searches that
    serve it."""
    material = json.dumps({"v": VERSION, "space": SPACE, "family": text, "limits": limits.key(), "wide": wide,
                           "mode": mode, "env": env, "axioms": axioms, "verifier": _verifier_key()}, sort_keys=True)
    return cache_dir() / "search" / "family" / (hashlib.sha256(material.encode()).hexdigest()[:32] + ".json")


def _donors(fam: Path) -> list[dict[str, Any]]:
    """The searches the family's file at ``fam`` names (none where it is missing or corrupt)."""
    got = store.load(fam, "search-family")
    donors = (got.payload or {}).get("donors", [])
    return [d for d in donors if isinstance(d, dict)] if isinstance(donors, list) else []


def _transfer(fam: Path, donor_files: list[dict[str, Any]], graph: Graph, own: Family, env: dict[str, int],
              progress: Progress | None, narrowing: bool = False, symbols: bool = False) -> SearchResult | None:
    """The result of a search that serves ``graph``'s family (``own``: its :func:`.transfer.family`), its
    candidates at ``graph``'s sizes and verified against ``graph`` (:mod:`.transfer`), or None when there is none
    or no candidate verifies. Donors whose sizes map one to one onto ``graph``'s come first (their searches saw
    the same pattern of equal sizes), then those with one image per size, then the rest; the newest first among
    equals. Only the programs are read to order them; a donor's candidates when it is tried. ``narrowing``:
    ``own`` and ``fam`` are the wide family's, and a donor serves only where :func:`.transfer.narrows` holds.
    ``symbols``: ``own`` and ``fam`` are the fixed family of a symbolic ``graph`` (donors at fixed sizes)."""
    t0 = time.monotonic()
    donors: list[tuple[int, bool, int, Path, dict[str, Any], dict[int, tuple[int, ...]]]] = []
    for i, d in enumerate(donor_files):
        path = fam.parent.parent / str(d.get("file", ""))
        entry = store.load(path, "search")
        if entry.payload is None:
            continue
        try:
            program = graph_from_json(json.dumps(entry.payload["program"]))
        except (PrismError, ValueError, KeyError, TypeError) as e:
            store.corrupt(path, "search", str(e).splitlines()[0][:300])
            continue
        sizes = size_map(family(program, wide=narrowing, symbols=symbols), own)
        if sizes is not None and (not narrowing or narrows(sizes)):
            # one image per size (the same pattern of equal sizes, or a finer one) first (images compared as text:
            # a symbol's == with a number is undecided)
            merged = len(set(map(repr, sizes.values()))) < len(sizes)
            donors.append((max(map(len, sizes.values()), default=1), merged, i, path, entry.payload, sizes))
    shapes = {name: n.shape for name, n in graph.inputs.items()}
    for *_, path, payload, sizes in sorted(donors, key=lambda d: d[:3]):
        try:
            donor = SearchResult.from_json(payload)
        except (PrismError, ValueError, KeyError, TypeError) as e:
            store.corrupt(path, "search", str(e).splitlines()[0][:300])
            continue
        stats = Stats()
        out: list[Candidate] = []
        seen: set[str] = set()
        with stats.phase("verify"):
            for c in donor.candidates:
                g = transferred(c.graph, sizes, shapes)
                if g is None or g.key in seen:
                    stats.build_errors += g is None
                    continue
                seen.add(g.key)
                v = gate_verify(g, graph)
                if v.ok:
                    stats.verified += 1
                    out.append(Candidate(g, c.cost, v, c.structure))
                else:
                    stats.rejected += 1
                if progress:
                    progress({"phase": "transfer", "verified": stats.verified, "rejected": stats.rejected,
                              "elapsed": time.monotonic() - t0})
        if out:
            return SearchResult(graph, donor.mode, donor.limits, donor.stop_reason, out, stats, donor.target,
                                donor.egraph, env, time.monotonic() - t0, transferred_from=donor.program.key)
    return None


def _load_cached(path: Path, graph: Graph) -> SearchResult | None:
    """The cached result at ``path`` with every candidate proved again (an entry is data on disk that
    anyone can edit: "every returned kernel is proved" must hold with any cache content), or None when
    there is none or it is corrupt, stale, or a candidate no longer proves (then the search runs again)."""
    got = store.load(path, "search")
    if got.payload is None:
        return None
    try:
        r = SearchResult.from_json(got.payload)
        if r.program.key != graph.key:
            raise PrismError(f"the entry holds another program ({r.program.key}, expected {graph.key})")
        for c in r.candidates:
            why = _reprove(c, graph)
            if why:
                raise PrismError(f"a cached candidate ({c.structure}) {why}")
    except (PrismError, ValueError, KeyError, TypeError) as e:
        store.corrupt(path, "search", str(e).splitlines()[0][:300])
        return None
    r.cached = True
    return r


def _reprove(c: Candidate, graph: Graph) -> str:
    """Why the cached candidate ``c`` cannot be served as it is verified ("" when it can). A formal
    verdict is proved again (milliseconds: docs/reliability.md); a numeric-only one is tested again."""
    if not c.verdict.ok:
        return "is marked as not verified"
    if c.verdict.how == "formal+numeric" and formal_verifier() is not None:
        from prism.verify.egraph import prove
        res = prove(c.graph, graph)
        return "" if res.proved else f"no longer proves: {str(res).splitlines()[0]}"
    v = gate_verify(c.graph, graph)
    return "" if v.ok else f"fails verification: {v.detail}"


def _cache_path(graph: Graph, limits: Limits, mode: str, env: Mapping[str, int], axioms: tuple[str, ...]) -> Path:
    material = json.dumps({"v": VERSION, "space": SPACE, "program": graph.key, "limits": limits.key(), "mode": mode,
                           "env": env, "axioms": axioms, "verifier": _verifier_key()}, sort_keys=True)
    return cache_dir() / "search" / (hashlib.sha256(material.encode()).hexdigest()[:32] + ".json")


def _verifier_key() -> str:
    """The verifier part of the cache key: its rules, schedule and egglog version (numeric-only builds:
    the gate's name)."""
    if formal_verifier() is None:
        return "numeric"
    from prism.verify.egraph import rules_fingerprint
    return "formal:" + rules_fingerprint()


def _search(graph: Graph, limits: Limits, mode: str, env: dict[str, int], workers: int,
            executor: Executor | None, progress: Progress | None, axioms: tuple[str, ...]) -> SearchResult:
    t0 = time.monotonic()
    stats = Stats()
    deadline = t0 + limits.time_limit
    with stats.phase("egraph"):
        prog = peel(graph)
        targets = graph_exprs(prog.core, TreeAlgebra())
        eg = LaxEGraph(targets, axioms=axioms)
        for n in prog.core.inputs.values():  # (an input read only permuted is not in the target itself)
            eg.table.ensure_atom(n.arg[0])
    egraph_info = {"nodes": eg.report.nodes, "iterations": eg.report.iterations, "saturated": eg.report.saturated,
                   "seconds": round(eg.report.seconds, 4), "axioms": list(eg.report.axioms)}
    payload = _Payload(graph_to_json(prog.core), eg.table, limits, mode, env, machine())
    ex = executor or make_executor(workers)
    ex.start(_init, payload)
    found: set[str] = set()
    verified: list[Candidate] = []
    stop = StopReason.EXHAUSTED
    try:
        # level 0: every program output is a program input (an identity program, after boundary reshapes are
        # peeled): the kernel graph with no operator is complete, and compiled it copies the inputs
        probe0 = _CTX if _CTX is not None and _CTX.p is payload else _Context(payload)
        ks0 = probe0.kernel_search(1, Stats(), Budget(deadline, limits.state_limit))
        st0 = ks0.initial()
        outs0 = ks0._outputs(st0)
        if outs0 is not None:
            stats.complete_structures += 1
            level0 = KernelCandidate((), outs0, len(st0.tensors), tuple(x.shape for x in st0.tensors))
            verified += _rank_and_verify(prog, [level0], limits, env, stats, progress, t0, deadline, False)
        # iterative deepening over the number of kernel operators: level k only completes graphs of exactly
        # k operators, and is bounded by the best verified cost of the levels before it
        for level in range(1, limits.max_kernel_ops + 1):
            if stop is not StopReason.EXHAUSTED:
                break
            best = verified[0].cost.seconds if verified else None
            probe = _CTX if _CTX is not None and _CTX.p is payload else _Context(payload)
            ks = probe.kernel_search(level, Stats(), Budget(deadline, limits.state_limit), best, exact=True)
            moves = list(ks.moves(ks.initial()))
            stats.states_kernel += 1

            def tasks(level: int = level, best: float | None = best, moves: list = moves) -> Iterator[_Task]:
                # lazily, so an in-process executor gives each task the states left after the previous ones
                for key, move in moves:
                    if stop is not StopReason.EXHAUSTED:  # noqa: B023 - read live on purpose: stop handing out work
                        return
                    yield _Task(level, key, move, deadline, max(0, limits.state_limit - stats.states), best)

            new: list[KernelCandidate] = []
            for res in ex.run(_run_task, tasks()):
                stats.merge(res.stats)
                for c in res.candidates:
                    k = c.describe() + repr(c.outputs)
                    if k not in found:
                        found.add(k)
                        new.append(c)
                if res.stop is not None and stop is StopReason.EXHAUSTED:
                    stop = res.stop
                if stats.states > limits.state_limit and stop is StopReason.EXHAUSTED:
                    stop = StopReason.STATE_LIMIT
                if progress:
                    progress({"phase": "generate", "level": level, "states": stats.states, "structures": len(found),
                              "elapsed": time.monotonic() - t0})
            verified += _rank_and_verify(prog, new, limits, env, stats, progress, t0, deadline, bool(verified))
            if (stats.pruned["enumerate_budget"] or stats.pruned["verify_budget"]) and stop is StopReason.EXHAUSTED:
                stop = StopReason.TIME_LIMIT
            verified.sort(key=lambda c: c.cost.key())
            del verified[limits.max_results:]
    finally:
        ex.close()
        _init(None)  # drop this search's memo (the inline executor's worker state lives in this process)
    if limits.split_reductions:
        verified += _split_variants(prog, verified, limits, env, stats, progress, t0, deadline)
        verified.sort(key=lambda c: c.cost.key())
    return SearchResult(graph, mode, limits, stop, verified, stats, "; ".join(format_tree(t) for t in targets),
                        egraph_info, env, time.monotonic() - t0)


def _rank_and_verify(prog: CoreProgram, cands: list[KernelCandidate], limits: Limits, env: dict[str, int],
                     stats: Stats, progress: Progress | None, t0: float, deadline: float,
                     have_verified: bool) -> list[Candidate]:
    plans: list[tuple[tuple, CostReport, KernelCandidate, tuple]] = []
    m = machine()
    # The enumeration of map assignments is bounded by the search's deadline, but gets at least GRACE of
    # the time limit after generation (which may have used all of it) and MAX_CHOICES per structure.
    # Measured need: W2 at d = 2048 with 2 kernel operators has 178k sGraphs, and costing them all took
    # 400 s after a 52 s generation. Cut assignments are counted (rule "enumerate_budget").
    enum_deadline = max(deadline, time.monotonic() + GRACE * limits.time_limit)
    with stats.phase("enumerate"):
        unsplit_ok = UnsplitCheck(prog.program)
        for cand in cands:
            if time.monotonic() > enum_deadline:
                stats.pruned["enumerate_budget"] += 1
                continue
            alternatives = [op.structs for op in cand.ops if op.custom]
            for structs in itertools.product(*alternatives):
                firsts = [next(assignments(s), None) for s in structs]
                if any(a is None for a in firsts):
                    continue
                if unsplit_ok.big or max((_unsplit_elems(s, unsplit_ok.env) for s in structs),
                                         default=0) > UNSPLIT_MAX_ELEMS:
                    stats.unsplit_skipped += 1  # too big to run whole (e.g. a broadcast [q, kv, D] product)
                else:
                    try:
                        ok = unsplit_ok(build_graph(prog, cand, list(zip(structs, firsts))))
                    except PrismError:
                        stats.build_errors += 1
                        continue
                    if not ok:
                        stats.pruned["unsplit"] += 1
                        continue
                per_op = [[(s, a) for a in assignments(s)] for s in structs]
                memo: dict = {}   # each op's block estimate, shared by the combinations (per_op keeps the keys alive)
                for n_choice, choice in enumerate(itertools.product(*per_op)):
                    if n_choice >= MAX_CHOICES or (n_choice % 256 == 0 and time.monotonic() > enum_deadline):
                        stats.pruned["enumerate_budget"] += 1
                        break
                    stats.map_assignments += 1
                    cost = estimate(cand.ops, choice, cand.shapes, env, m, memo)
                    if not cost.feasible:
                        stats.pruned["hardware"] += 1
                        continue
                    stats.sgraphs += 1
                    plans.append((cost.key(), cost, cand, choice))
    plans.sort(key=lambda p: p[0])
    out: list[Candidate] = []
    seen: set[str] = set()
    with stats.phase("verify"):
        for attempt, (_, cost, cand, choice) in enumerate(plans):
            if len(out) >= limits.max_results or attempt >= MAX_VERIFY:
                break
            if (out or have_verified) and time.monotonic() > deadline:
                # the budget is spent and something is verified: stop (verifying one candidate at a big fixed
                # shape takes seconds); with nothing verified yet, go on to the first one (the overrun is stated)
                stats.pruned["verify_budget"] += len(plans) - attempt
                break
            try:
                g = build_graph(prog, cand, choice)
            except PrismError:
                stats.build_errors += 1
                continue
            if g.key in seen:
                continue
            seen.add(g.key)
            v = gate_verify(g, prog.program)
            if v.ok:
                stats.verified += 1
                out.append(Candidate(g, cost, v, describe(cand, choice)))
            else:
                stats.rejected += 1
            if progress:
                progress({"phase": "verify", "verified": stats.verified, "rejected": stats.rejected,
                          "elapsed": time.monotonic() - t0})
    return out


def _kernel_ops(g: Graph) -> int:
    return sum(1 for n in g.nodes if n.op not in ("input", "output", "result", *FREE_OPS))


def _split_variants(prog: CoreProgram, bases: list[Candidate], limits: Limits, env: dict[str, int], stats: Stats,
                    progress: Progress | None, t0: float, deadline: float) -> list[Candidate]:
    """The verified split-reduction variants (:mod:`.splitk`) of the returned candidates. They come on top of
    ``max_results``: a variant is the same structure split once more, so it never displaces a different
    structure, and the tuner gets both to measure. The combine counts as one more kernel operator."""
    out: list[Candidate] = []
    seen: set[str] = set()
    m = machine()
    for c in bases:
        if time.monotonic() > deadline:
            stats.split_refused["time_limit"] += 1
            continue
        if _kernel_ops(c.graph) + 1 > limits.max_kernel_ops or limits.max_customized < 1:
            stats.split_refused["limits"] += 1
            continue
        with stats.phase("split"):
            v = split_reduction(c.graph)
            if isinstance(v, Refusal):
                stats.split_refused[v.reason] += 1
                continue
            if v.graph.key in seen:
                continue
            seen.add(v.graph.key)
            stats.split_generated += 1
            cost = estimate_split(v, c.cost.params, env, m)
        with stats.phase("verify"):
            verdict = gate_verify(v.graph, prog.program)
        if verdict.ok:
            stats.split_verified += 1
            out.append(Candidate(v.graph, cost, verdict, f"split-reduction[{v.describe()}] of {c.structure}"))
        else:
            stats.split_rejected += 1
        if progress:
            progress({"phase": "split", "verified": stats.split_verified, "rejected": stats.split_rejected,
                      "elapsed": time.monotonic() - t0})
    return out


def _unsplit_elems(s: BlockStruct, env: Mapping[str, int]) -> int:
    """The largest tile of ``s`` with nothing split (every grid size and F equal to 1)."""
    return max(_elems(tuple(1 if d is None else d[0] for d in t.shape), env) for t in s.tensors)


def describe(cand: KernelCandidate, choice: tuple) -> str:
    """One line per kernel operator: predefined ``op[srcs]`` or the chosen block structure."""
    if not cand.ops:
        return "no kernel operator: every output is an input (the compiled kernel copies it)"
    parts = []
    ci = 0
    for op in cand.ops:
        if op.custom:
            parts.append(f"customized{list(op.srcs)}{{{choice[ci][0].describe()}}}")
            ci += 1
        else:
            parts.append(f"{op.tmpl}{list(op.srcs)}")
    return " ; ".join(parts)
