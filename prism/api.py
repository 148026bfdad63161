"""``prism.superoptimize``: search -> verify -> instantiate and tune -> compile, cached at every stage.

    kernel = prism.superoptimize(g)          # searches now (or reads the search's disk cache)
    y = kernel(X=x, W=w)                     # first call per shape: instantiate, tune, compile, check
    print(kernel.explain())                  # chosen graph, proof, generated C, tuning table

Every kernel it returns is (1) an sGraph proved equal to the program by ``prism.verify`` (the search's
verdict, re-checked here when the search could only test it numerically) and (2) a compiled instance
that passed ``prism.verify.numeric_check`` against the float64 reference at that very shape. Nothing else
is ever returned: without a verified candidate it raises :class:`NoVerifiedKernelError` with the search's
stop reason. See docs/tune.md.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import json
import logging
import math
import os
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prism.errors import InputError, PrismError, UnsupportedError
from prism.ir import dims as D
from prism.ir.graph import Graph
from prism.ir.serialize import graph_from_json, graph_to_json
from prism.runtime import cache, store
from prism.runtime.kernel import Kernel
from prism.runtime.kernel import compile as compile_graph
from prism.tune import ahead
from prism.tune.contention import contended
from prism.tune.machine import Machine, detect
from prism.tune.stats import STATS
from prism.tune.tuner import TOP_K, TUNE_VERSION, Plan, Row, Tuned, TuneResult, candidate_key, plan, tune
from prism.verify.numeric import forget_normal_reference

LOG = logging.getLogger("prism")


class NoVerifiedKernelError(PrismError):
    """The search returned no candidate that verifies; the message carries the search's stop reason."""


@dataclass
class Implementation:
    """One verified sGraph from the search."""

    index: int
    graph: Graph
    how: str                 # how it was verified: "formal+numeric"
    proof: str               # the verifier's summary
    structure: str           # the search's one-line description


@dataclass
class Specialization:
    """The tuned, compiled and checked kernel for one shape."""

    env: dict[str, int]
    implementation: Implementation
    params: dict[str, Any]
    kernel: Kernel
    tuning: TuneResult
    check: Any               # prism.verify.NumericResult of the compiled kernel at this shape
    from_cache: bool
    derived_from: dict[str, int] | None = None   # the tuned shape whose winner this is (Options.derive)
    check_cached: str | None = None   # the recorded check this very kernel (same C, flags, compiler) passed at
    #                                   this shape when the shape was tuned (the tuning entry): not repeated on load
    cached_from: str = "tuning"       # where that record is: "tuning" (the tuning entry), "template" (the
    #                                   compiled template's check record, api._record_check) or "record" (a derived
    #                                   kernel's own check record, api._record)
    split: tuple[tuple[int, str], ...] | None = None   # served as calls on ranges of rows: (rows, kernel) each
    split_tile: tuple[str, str, int] | None = None      # ... the dim, the grid parameter over it and the tuned tile

    @property
    def source(self) -> str:
        return self.kernel.source_at(self.env)


@dataclass
class Options:
    top_k: int = TOP_K
    tune_budget_s: float | None = None
    verbose: int = 0
    measure_machine: bool | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    time_limit: float | None = None     # the search's time limit: also the budget of the first shape's tuning
    deadline: float | None = None       # perf_counter time by which the superoptimize call's work should end
    derive: bool = False                # a new shape near a tuned one takes its winner (SuperKernel._derive)
    prebuild: str = "now"               # "later": a tuning's pre-build is held for the next graph compile (_prebuild)


DERIVE_WINDOW = 2.0   # a shape within this factor (each dim) of a tuned one is derived from it for good; a farther
#                       one is derived too (served at once) and recorded as pending: `prism cache retune` tunes it
#                       (PRISM_DERIVE_FAR=0: tuned on first use instead)
# a far fixed-shape twin is an anchor only where every dim that moved is at least this large at both ends: a prefill
# length is not derived from a decode step's GEMV (the twin at 1 row), but a decode attention at KV length 301 is
# from its twin at 129 (it was tuned there instead, in the middle of a decode: llama-1b float32 from a 128-token
# prompt, a 300-token prompt's decode attention, +1-2 s)
FAR_TWIN_MIN = 16
DERIVE_SLACK = 1.10   # a derived shape may take a tuning's other candidate measured this close to its winner
NEAR = 4              # ... or its winner's sGraph with sizes at most this factor from the winner's (api._derived)
NEAR_ESTIMATE = 2.0   # ... or farther, where the model's seconds per flop of those sizes at the new shape are within
#                       this factor of the winner's at its own (a row-wise piece one row per block at a prime length;
#                       not the MLP one row per block, whose weights it reads per row)
TEMPLATE_CHECKS = 3   # served shapes of a template checked numerically before its other shapes reuse the checks
SPLIT_CHECKS = 1      # splits of a program checked numerically before the others reuse the check (api._split)
SPLIT_FIRST_RUNS = 3  # a split of at most this many calls comes before a derived kernel with no compiled code yet,
SPLIT_STREAM_SHARE = 0.25   # ... or of any number where the tuned run is compute-bound: its row blocks' reads of the
#                             operands without the row axis (weights) take at most this share of its measured time
#                             at the machine's bandwidth (api.SuperKernel._split)
WINNER_REACH = 8      # the pre-build builds the winner's template at most this far past the tuned shape (_prebuild)
RESIDUE_REACH = 3     # ... and, where the shape one past took another candidate, derives every shape this far past
SLOW_S = 5.0          # a search or a tuning longer than this logs a line saying where the time went
BUDGET_TOP_K = 2      # candidates tuned when the call's time budget is already spent
RETUNE_ROUNDS = 2     # further tunings of a shape whose measured candidates all failed the final check


def _tail_runs(r: int, covered: Callable[[int], bool], most: int = 3) -> list[int] | None:
    """``r`` rows as at most ``most`` runs, largest first, of lengths ``covered`` says a split's tail kernel has
    compiled code for (a variant, or a template whose guards hold: api.SuperKernel._covers); [] for no rows, None
    when there is no such cut. Measured need: llama-1b bf16 under dynamic=True after 128, the prompt 200 (128 + a
    whole tile of 64 + 8) compiled and checked two new templates of the tail kernel per split piece (4.2 s), where
    the tail templates the pre-build had built and checked (at 2 and 33 rows) serve its 72 rows in two runs."""
    if r == 0:
        return []
    if covered(r):
        return [r]
    cov = [x for x in range(r - 1, 0, -1) if covered(x)]
    have = set(cov)

    def cut(rest: int, parts: int, top: int) -> list[int] | None:
        if rest in have and rest <= top:
            return [rest]
        if parts == 1:
            return None
        for x in cov:
            if x <= top and x < rest:
                more = cut(rest - x, parts - 1, x)
                if more is not None:
                    return [x, *more]
        return None
    return next((c for k in range(2, most + 1) if (c := cut(r, k, r)) is not None), None)   # fewest runs


def _kernel_key(sgraph: int, params: Mapping[str, Any]) -> tuple:
    """SuperKernel._kernels' key of an sGraph (its index) with its params."""
    return sgraph, tuple(sorted((k, repr(v)) for k, v in params.items()))


def _plain_ints(inst: Mapping[str, Any]) -> dict[str, int]:
    """A checked instantiation as its check record holds it: the integer values."""
    return {k: int(v) for k, v in inst.items() if isinstance(v, int)}


def _log_slow(what: str, seconds: float, parts: Mapping[str, float], limit: float | None) -> None:
    """One line on the ``prism`` logger when ``what`` took long: the phases that took the time and the
    overrun of the time limit, if any."""
    if seconds < SLOW_S:
        return
    top = ", ".join(f"{k} {v:.1f} s" for k, v in sorted(parts.items(), key=lambda kv: -kv[1]) if v >= 0.05)
    over = ""
    if limit is not None and seconds > limit:
        over = f"; {seconds - limit:.1f} s over its time_limit of {limit:g} s"
    LOG.warning("prism: %s took %.1f s (%s)%s", what, seconds, top or "no phase recorded", over)


_SEARCH_MEMO: dict[tuple, tuple[Any, list[Implementation]]] = {}
_MEMO_LOCK = threading.Lock()


# superoptimize(program) with the same search and tuning options returns one SuperKernel per process, so
# the pieces of a model with equal programs (a decoder's layers) share its tunings: one per distinct
# (program, shape, machine), tuned or read from disk once (issue 14: 130 tunings of 42 distinct pieces)
_KERNEL_MEMO: dict[tuple, SuperKernel] = {}


def clear_memory_caches() -> None:
    """Forget the search results and kernels held in this process (the disk caches stay): the next
    superoptimize of a program reads the search's disk cache as a new process would."""
    with _MEMO_LOCK:
        _SEARCH_MEMO.clear()
        _KERNEL_MEMO.clear()
    ahead.drop_held()   # pre-builds held for those kernels


def _console(verbose: int) -> Any:
    if verbose <= 0:
        return None
    from prism.console import console
    return console(stderr=True)


@contextlib.contextmanager
def _status(console: Any, verbose: int, text: str) -> Iterator[Any]:
    """A rich spinner (verbose >= 2) whose text callers may update; a no-op when quiet."""
    if console is None or verbose < 2:
        yield lambda _msg: None
        return
    with console.status(text) as st:
        yield lambda msg: st.update(f"{text}: {msg}")


def _search_module() -> Any:
    try:  # the module, even where prism/__init__ re-exports a function under the same name
        S = importlib.import_module("prism.search")
    except ImportError as e:
        raise PrismError(f"prism.superoptimize needs the search (prism.search), which cannot be imported in this "
                         f"build ({e}); use prism.compile(graph, params=...) on a hand-written block graph instead"
                         ) from None
    if not callable(getattr(S, "search", None)):
        raise PrismError("prism.search has no search() entry point in this build; prism.superoptimize needs it")
    return S


def _verified_implementations(result: Any, program: Graph, console: Any) -> list[Implementation]:
    """The search's candidates that are verified formally and numerically; numeric-only ones are re-checked
    with ``prism.verify`` and dropped unless that proves them."""
    from prism.verify import verify
    out: list[Implementation] = []
    for c in result.candidates:
        v = c.verdict
        if not v.ok:
            continue
        if v.how == "formal+numeric":
            out.append(Implementation(len(out), c.graph, v.how, v.detail, c.structure))
            continue
        STATS.reverifications += 1
        try:
            r = verify(c.graph, program, generalize=True)
        except UnsupportedError as e:
            if console is not None:
                console.log(f"dropped a numeric-only candidate the verifier cannot model: {e}")
            continue
        if r.verified:
            out.append(Implementation(len(out), c.graph, "formal+numeric",
                                      f"formal: {str(r.formal).splitlines()[0]}; {str(r.numeric).splitlines()[0]}",
                                      c.structure))
        elif console is not None:
            console.log(f"dropped a candidate that prism.verify does not verify: {str(r).splitlines()[0]}")
    return out


SEARCH_DIM = 8   # default value of every symbolic dim for the search's ranking and pruning (see superoptimize)


def _check_positive(dims: Mapping[str, Any], what: str) -> None:
    bad = {k: v for k, v in dims.items() if not isinstance(v, int) or isinstance(v, bool) or v < 1}
    if bad:
        raise InputError(f"{what} must be positive ints, got {bad}")


def search_env(graph: Graph, search_dims: Mapping[str, int] | None = None) -> dict[str, int]:
    """The concrete values the search ranks and prunes with: ``search_dims`` where given, else
    ``SEARCH_DIM`` for every symbolic dim of ``graph``. Raises on unknown or non-positive dims."""
    syms = graph.symbols()
    given = dict(search_dims or {})
    extra = sorted(set(given) - syms)
    if extra:
        raise InputError(f"search_dims: {extra} are not symbolic dims of the program (those are {sorted(syms)})")
    _check_positive(given, "search_dims")
    return {s: given.get(s, SEARCH_DIM) for s in sorted(syms)}


def superoptimize(graph: Graph, *, limits: Any = None, time_limit: float | None = None, top_k: int = TOP_K,
                  tune_budget_s: float | None = None, workers: int = 1, verbose: int = 0,
                  measure_machine: bool | None = None, search_dims: Mapping[str, int] | None = None,
                  derive: bool = False, prebuild: str = "now") -> SuperKernel:
    """Search, verify and (per shape, on first use) tune and compile ``graph``.

    ``limits``: a ``prism.search.Limits`` (the search space and its budget); ``time_limit``: shorthand for
    its time budget in seconds. ``top_k``: candidates compiled and measured per shape; ``tune_budget_s``:
    a soft time budget for measuring them. ``workers``: search processes. ``verbose``: 0 quiet, 1 a line
    per stage, 2 also live progress. ``measure_machine=False`` skips measuring the machine's bandwidth and
    peak (the cost model then uses defaults). ``search_dims``: values of the program's symbolic dims that
    the search ranks and prunes with (default ``SEARCH_DIM`` = 8 each) -- the sGraphs it returns stay
    symbolic and every shape is still tuned and checked on its own. Measured need: with no values the
    search could not apply its size-dependent pruning and W2 generated 1.7M states (time limit, 153 s)
    instead of 16k (7 s). ``derive=True``: a new shape within a factor of 2 (each dim) of a tuned one takes
    that tuning's winner -- compiled at the new shape and numerically checked, not measured
    (:meth:`SuperKernel.specialize`; the frontend's choice, where a dynamic dim takes a new value per call).
    ``prebuild``: where a shape is tuned, the shape one past it is derived right after (its template built and
    checked: :meth:`SuperKernel._prebuild`) -- ``"now"``, in that call, or ``"later"``, held for the background
    compiler until the next graph compile starts (:func:`prism.tune.ahead.release`; the frontend's choice: a graph's
    first call then does only what it needs).
    Calls with the same program and options return the same kernel object (its tunings shared).
    Raises :class:`NoVerifiedKernelError` when nothing verifies.
    """
    t_start = time.perf_counter()
    if not isinstance(graph, Graph):
        raise UnsupportedError(f"prism.superoptimize expects a prism.Graph, got {type(graph).__name__}")
    graph.check()
    S = _search_module()
    if limits is None:
        limits = S.Limits()
    if time_limit is not None:
        import dataclasses
        limits = dataclasses.replace(limits, time_limit=float(time_limit))
    console = _console(verbose)
    senv = search_env(graph, search_dims)
    key = (graph.key, repr(sorted(limits.key().items())), repr(sorted(senv.items())), str(store.root()))
    with _MEMO_LOCK:
        memo = _SEARCH_MEMO.get(key)
    if memo is not None:
        STATS.search_memory_hits += 1
        result, impls = memo
    else:
        t0 = time.perf_counter()
        with _status(console, verbose, "searching") as update:
            def progress(d: Mapping[str, Any]) -> None:
                update(", ".join(f"{k} {v:.1f}" if isinstance(v, float) else f"{k} {v}" for k, v in d.items()))
            # one fixed env for the ranking: the search's cache is keyed by it, so every shape reuses it
            result = S.search(graph, limits, env=senv, workers=workers, progress=progress,
                              transfer=importlib.import_module("prism.search.transfer").enabled())
        if result.cached:
            STATS.search_cache_hits += 1
        elif result.transferred_from:
            STATS.search_transfers += 1
        else:
            STATS.searches += 1
            _log_slow(f"the search of {graph.name or 'the program'!r}", result.seconds,
                      dict(getattr(result.stats, "seconds", {})), limits.time_limit)
        impls = _verified_implementations(result, graph, console)
        if console is not None:
            console.log(f"search: {len(result.candidates)} candidates, {len(impls)} verified, stop reason "
                        f"{result.stop_reason.value}{' (from cache)' if result.cached else ''}"
                        f"{' (transferred from another size)' if result.transferred_from else ''} "
                        f"in {time.perf_counter() - t0:.1f} s")
        with _MEMO_LOCK:
            _SEARCH_MEMO[key] = (result, impls)
    if not impls:
        raise NoVerifiedKernelError(_no_kernel_message(graph, result, limits))
    if prebuild not in ("now", "later"):
        raise InputError(f"superoptimize: prebuild must be 'now' or 'later', got {prebuild!r}")
    kkey = (*key, top_k, tune_budget_s, verbose, measure_machine, derive, prebuild)
    with _MEMO_LOCK:
        k = _KERNEL_MEMO.get(kkey)
        if k is None:
            k = _KERNEL_MEMO[kkey] = SuperKernel(
                graph, result, impls, Options(top_k, tune_budget_s, verbose, measure_machine,
                                              time_limit=limits.time_limit, deadline=t_start + limits.time_limit,
                                              derive=derive, prebuild=prebuild))
    return k


def _no_kernel_message(graph: Graph, result: Any, limits: Any) -> str:
    """Why superoptimize has nothing to return, truthfully by stop reason: a search that ran out of time or
    states may succeed with more; one that exhausted its space will not, whatever its time budget."""
    st = result.stats
    head = (f"the search found no verified implementation of {graph.name or 'the program'!r} (stop reason: "
            f"{result.stop_reason.value}; {st.states} states, {st.complete_structures} complete structures, "
            f"{len(result.candidates)} candidates returned, {st.rejected} rejected by verification)")
    if result.stop_reason.value != "exhausted":
        return (f"{head}; the search stopped early: raise its budget (limits=prism.search.Limits(time_limit=..., "
                "state_limit=...)) or use prism.compile on a hand-written block graph")
    if st.complete_structures == 0:
        why = (f"no kernel graph within max_kernel_ops={limits.max_kernel_ops}, max_block_ops="
               f"{limits.max_block_ops} computes every output of the program: it needs something "
               "the search space does not contain (docs/search.md, 'Space restrictions': e.g. reshape, concat or "
               "split inside a kernel, per-iteration savers, reductions split across blocks)")
    else:
        why = ("every structure that computes the program failed verification (the lax abstraction let through "
               "structures that are wrong on real values)")
    return (f"{head}. It exhausted its space, so more time will not help: {why}. Use prism.compile on a "
            "hand-written block graph, or report the program")


class SuperKernel:
    """The kernel ``prism.superoptimize`` returns: callable on any values of the program's symbolic dims.

    ``kernel(X=x, W=w)`` or ``kernel.call({"X": x}, out=...)`` (numpy arrays or CPU torch tensors, float32,
    contiguous; as ``prism.compile``'s kernels). A new shape is instantiated, tuned, compiled and checked
    on first use, then kept in memory and on disk. ``kernel.specialize(n=8)`` does that ahead of time.
    """

    def __init__(self, program: Graph, search_result: Any, implementations: list[Implementation],
                 options: Options) -> None:
        self.program = program
        self.search_result = search_result
        self.implementations = implementations
        self.options = options
        self.input_names = tuple(program.inputs)
        self.output_names = tuple(program.output_names)
        self._specs: dict[tuple, Specialization] = {}
        self._lock = threading.Lock()
        self._machine: Machine | None = None
        self._disk_anchors: list[tuple[dict[str, int], TuneResult]] | None = None
        self._twins: dict[tuple[int, int], tuple[dict[str, int], TuneResult] | None] = {}   # (_twin_anchors)
        self._twin_specs: dict[int, Specialization] = {}   # id of a twin anchor's tuning -> the twin's spec (_split)
        self._split_checks: dict[tuple, int] = {}   # a split's distinct parts -> its composites checked (_split)
        self._tails_built: set[tuple] = set()   # (anchor, split tile) whose tail templates are built (_build_tails)
        self._kernels: dict[tuple, Kernel] = {}   # (sGraph, params) -> kernel of every shape (_kernel)
        self._by_shapes: dict[tuple, Kernel] = {}   # input shapes called before -> their kernel (call)
        self._keys: tuple[str, list[str]] | None = None   # the program's and the sGraphs' keys (_cache_path)
        self._pending_octaves: set[tuple] = set()   # octaves of far shapes recorded pending (_mark_pending)
        self._graphs_json: dict[str, Any] | None = None   # the program and sGraphs as a record holds them
        self._symbols: frozenset[str] | None = None   # the program's symbolic dims (symbols)
        self._planned: dict[tuple, Plan] = {}   # shapes planned ahead -> their tuning's plan (compile_ahead)
        self._deriving: set[tuple] = set()   # shapes whose derivation was submitted ahead (compile_ahead)

    @property
    def stop_reason(self) -> str:
        return self.search_result.stop_reason.value

    def symbols(self) -> frozenset[str]:
        """The program's symbolic dims (computed once: every new shape and every other kernel's derivation asks)."""
        if self._symbols is None:
            self._symbols = frozenset(self.program.symbols())
        return self._symbols

    @property
    def machine(self) -> Machine:
        if self._machine is None:
            self._machine = detect(self.options.measure_machine)
        return self._machine

    # --- calling ---------------------------------------------------------------------------------
    def __call__(self, **inputs: Any) -> Any:
        return self.call(inputs)

    def call(self, inputs: Mapping[str, Any], out: Any = None) -> Any:
        # shapes seen before go straight to their kernel, which checks every buffer again: binding the dims and
        # looking up the specialization cost ~6 of the ~15 µs this call took from Python on a kernel of ~2 µs
        try:
            key = tuple([inputs[n].shape for n in self.input_names])
            kernel = self._by_shapes.get(key) if len(inputs) == len(self.input_names) else None
        except (KeyError, AttributeError, TypeError):
            kernel = None
        if kernel is not None:
            STATS.tune_memory_hits += 1
            return kernel.call(inputs, out)
        if not isinstance(inputs, Mapping):
            raise InputError(f"call: inputs must be a mapping name -> array, got {type(inputs).__name__}")
        shapes = {}
        for k, v in inputs.items():
            if not hasattr(v, "shape"):
                raise InputError(f"input {k!r}: expected a numpy.ndarray or a torch.Tensor, got {type(v).__name__}")
            shapes[k] = tuple(int(s) for s in v.shape)
        env = self.program.bind(shapes)  # names, ranks, fixed dims: clear errors before anything runs
        kernel = self.specialize(**env).kernel
        result = kernel.call(inputs, out)
        self._by_shapes[tuple(shapes[n] for n in self.input_names)] = kernel
        return result

    # --- per-shape work --------------------------------------------------------------------------
    def specialize(self, **dims: int) -> Specialization:
        """The tuned kernel for concrete values of the program's symbolic dims (tuned on first use)."""
        syms = self.symbols()
        missing, extra = sorted(syms - set(dims)), sorted(set(dims) - syms)
        if missing or extra:
            raise InputError(f"specialize: the program's symbolic dims are {sorted(syms)}"
                             + (f"; missing {missing}" if missing else "") + (f"; unknown {extra}" if extra else ""))
        _check_positive(dims, "specialize: dims")
        key = tuple(sorted(dims.items()))
        with self._lock:
            spec = self._specs.get(key)
            if spec is not None:
                STATS.tune_memory_hits += 1
                return spec
            from prism.verify.numeric import shared_draws
            # a new shape's checks (a split's parts and composite, templates at several rows, the prebuilt next
            # shape) all read the program's fixed-shape inputs, its weights: drawn and converted once here.
            # Measured need: llama-1b bf16, a new process's first prefill spent 0.64 s of its 1.16 s of checks
            # drawing the same weights again
            with shared_draws():
                spec = self._build(dict(dims))
                self._specs[key] = spec
                self._planned.pop(key, None)
                if spec.derived_from is None and dims:
                    self._prebuild_after(dict(dims), spec)
            return spec

    def compile_ahead(self, dims: Mapping[str, int]) -> int:
        """Plan the tuning that the first ``specialize(**dims)`` will run (:func:`prism.tune.tuner.plan`) and submit
        its candidates to the background compiler (:mod:`prism.tune.ahead`), which compiles them while the caller
        goes on (the frontend: searching the graph's next pieces). Where that call derives its kernel from a tuning
        (``_nearest_anchor``), the whole derivation is submitted instead (:meth:`_derive_early`). Returns how many jobs
        were submitted: none where the first call will neither tune nor derive -- the shape is held or a tuning of it
        is on disk -- or with ``PRISM_AHEAD=0``. Nothing is measured here, and the kernels are still checked and timed
        by the tuning that takes them."""
        env = {k: int(v) for k, v in dims.items()}
        if not ahead.enabled() or set(env) != self.symbols():
            return 0
        key = tuple(sorted(env.items()))
        if key in self._deriving:   # (a derivation in flight holds the lock: the caller must not wait for it)
            return 0
        with self._lock:
            if key in self._specs or key in self._planned:
                return 0
            path, material = self._cache_path(env)
            if store.load(path, "tuning").payload is not None:
                return 0
            near = self._nearest_anchor(env, material) if self.options.derive else None
            if near is not None:
                self._deriving.add(key)
                new = ahead.submit_call(f"derive:{id(self)}:{key}", lambda: self._derive_early(env))
                STATS.derived_ahead += new
                return new
            top_k = self._top_k(time.perf_counter())
            try:
                planned = plan([i.graph for i in self.implementations], self.program, env, self.machine,
                               top_k=top_k)
            except PrismError:
                return 0   # the tuning raises it, with its message
            self._planned[key] = planned
        return ahead.submit([x.graph for x in planned.chosen])

    def _derive_tries(self, env: dict[str, int], anchor: dict[str, int], res: TuneResult
                      ) -> list[tuple[Row, Mapping[str, Any] | None]]:
        """:meth:`_derived`'s (1)-(3): the winner and the candidates within DERIVE_SLACK of it, each with its grid sizes
        that follow a moving dim, then as they are."""
        ok = [r for r in res.rows if r.status == "ok" and math.isfinite(r.measured_s)]
        win = res.best
        tries: list[tuple[Row, Mapping[str, Any] | None]] = []
        for row in [win] + sorted((r for r in ok if r is not win and r.measured_s <= win.measured_s * DERIVE_SLACK),
                                  key=lambda r: r.measured_s):
            follow = _following(row.params, anchor, env)
            tries += [(row, follow), (row, None)] if follow is not None else [(row, None)]
        return tries

    def _near_tries(self, env: dict[str, int], anchor: dict[str, int], res: TuneResult) -> list[dict[str, Any]]:
        """:meth:`_derived`'s (5): the winner's sGraph with the valid sizes nearest to its own (following the new dim
        where equal to it), where close enough."""
        win = res.best
        found = self._nearest_params(env, win, anchor)
        near, per_flop = found if found is not None else (None, math.inf)
        if near is None or near == win.params or not (per_flop <= NEAR_ESTIMATE or all(
                max(int(v), int(win.params[k])) <= NEAR * min(int(v), int(win.params[k]))
                for k, v in near.items() if isinstance(v, int) and isinstance(win.params.get(k), int))):
            return []
        # a nearest size equal to the new dim (a prime length's only split but 1) follows it: one template serves
        # every length
        follow = _following(near, env, anchor)
        return ([follow] if follow is not None else []) + [near]

    def _derive_early(self, env: dict[str, int]) -> Specialization | None:
        """What the first ``specialize(**env)`` does where it derives (:meth:`_derive`: the compiles, a split's tail
        templates, every check), done now on the background compiler (:func:`prism.tune.ahead.submit_call`) and
        held for that call; nothing where the derivation does not hold (that call then tunes: nothing is measured
        here). Measured need: llama-1b int8w-g32-bf16's first new prompt length under Dynamo's default: the
        dynamic graph's 13 pieces derived at its first call, 6.1 s one after another on the main thread, after a
        compile of 3.6 s (its searches transferred from the fixed-shape twins') that kept one core of two busy.
        Before this, only the derivation's first compile was guessed ahead; the splits' tail templates and the
        checks were not."""
        key = tuple(sorted(env.items()))
        with self._lock:
            if key in self._specs:
                return None
            path, material = self._cache_path(env)
            if store.load(path, "tuning").payload is not None:
                return None   # (that call serves the disk's tuning)
            from prism.verify.numeric import shared_draws
            with shared_draws():
                spec = self._derive(env, material)
            if spec is not None:
                self._specs[key] = spec
                self._planned.pop(key, None)
            return spec

    def _top_k(self, now: float) -> int:
        """Candidates a tuning measures: the option's, or BUDGET_TOP_K for the first shape once the superoptimize
        call's time limit is spent."""
        top_k, deadline = self.options.top_k, self.options.deadline
        if deadline is not None and not self._specs and deadline - now <= 0 and top_k > BUDGET_TOP_K:
            return BUDGET_TOP_K
        return top_k

    def has_spec(self, dims: Mapping[str, int]) -> bool:
        """Whether the shape of ``dims`` has its specialization already (``specialize`` returns it at once)."""
        return tuple(sorted(dims.items())) in self._specs

    def plans_cheaply(self, dims: Mapping[str, int], kernel: Kernel) -> bool:
        """Whether ``specialize(**dims)`` is a lookup, or a derivation that ``kernel`` (the kernel a neighbouring
        shape took) serves from a compiled template whose guards hold at ``dims`` and which has had its
        TEMPLATE_CHECKS checks: no compile and no numeric check (what planning ahead may run on speculation)."""
        if self.has_spec(dims):
            return True
        if not kernel.covers(**dims):
            return False
        t = kernel.specialize(**dims).template
        return t is not None and len(t.checks) >= TEMPLATE_CHECKS

    def _prebuild_after(self, env: dict[str, int], spec: Specialization) -> None:
        """:meth:`_prebuild` now, or held for the next graph compile (``prebuild="later"``: :func:`ahead.defer`)."""
        if self.options.prebuild == "later" and self._prebuilding():
            key = tuple(sorted(env.items()))
            if ahead.defer(f"prebuild:{id(self)}:{key}", lambda: self._prebuild_held(env, spec)):
                STATS.prebuilt_later += 1
                return
        self._prebuild(env, spec)

    def _prebuild_held(self, env: dict[str, int], spec: Specialization) -> None:
        """A held pre-build, run by the background compiler: under the kernel's lock and shared draws, as
        :meth:`specialize` runs it."""
        from prism.verify.numeric import shared_draws
        with self._lock, shared_draws():
            self._prebuild(env, spec)

    def _prebuild(self, env: dict[str, int], spec: Specialization) -> None:
        """Derive the shape one past the tuned ``env`` in every symbolic dim now, while the caller is compiling
        anyway: its template is built and checked, and later values of the region are served from it. Without
        this the first new value paid for it: llama-1b bf16 with ``dynamic=True`` tuned at a 128-token prompt
        spent 5.2 s of its first new prompt length (141) building 13 pieces' templates one after another (3.2 s
        of gcc) and checking them (1.7 s), and its second (157) 0.5 s. For a decode graph the shape one past is
        the next step's. ``PRISM_PREBUILD=0`` turns it off (then the first new value builds them)."""
        if not self._prebuilding():
            return
        built = self._derive_ahead(env, 1, spec.tuning)
        if built is None:
            return
        if built.split_tile is not None:
            self._build_tails(env, spec.tuning, built.split_tile)
        win = spec.tuning.best
        if built.split is None and (built.implementation.index, built.params) != (win.sgraph, dict(win.params)):
            # one past took another candidate: the winner is not valid there
            self._prebuild_winner(env, spec.tuning)
            for k in range(2, RESIDUE_REACH + 1):
                self._derive_ahead(env, k, spec.tuning)

    def _derive_ahead(self, env: dict[str, int], k: int, tuning: TuneResult) -> Specialization | None:
        """The shape ``k`` past the tuned ``env`` in every dim derived now and kept (compiled where no compiled
        kernel serves it, and checked); None where it is kept already or no kernel serves it.
        Past n + 1 (``RESIDUE_REACH``), only where n + 1 took another candidate than the winner: where the
        winner's grid must divide the dim, each residue of the dim takes a candidate of its own, and its first
        length compiled it. Measured need: llama-1b float32 under dynamic=True tuned at 128 tokens (the bench's
        tuning of 2026-11-29): the prefill attention's winner (4 row blocks, 2 KV chunks) serves multiples of 4
        (its template from 132), 129's candidate (3 row blocks) odd multiples of 3; 157 compiled the nearest sizes
        (+0.76 s), 190 a candidate valid at even lengths (+1.61 s). With n + 2 and n + 3 (`/tmp` sweep, the same
        tunings, kernels compiled afresh): 157 and 190 +0.02 and +0.17 s; the first generate() 22.4 s against 22.2
        s (two more gcc runs, ~1 s of the two cores); bfloat16 unchanged (its pieces took the winner or a split
        one past); the first token of a new process with warm caches 3.8-4.0 s. Derived for every piece (not
        only where 129 took another candidate) it cost bfloat16's start-up 1.5 s."""
        nxt = {d: v + k for d, v in env.items()}
        key = tuple(sorted(nxt.items()))
        if key in self._specs:
            return None
        try:
            built = self._derived(nxt, env, tuning)
        except PrismError:   # not a valid shape of the program (a dim that must divide another)
            return None
        if built is None:
            return None
        STATS.template_prebuilt += 1
        self._specs[key] = dataclasses.replace(built, derived_from=dict(env))
        return built

    def _prebuild_winner(self, env: dict[str, int], tuning: TuneResult) -> None:
        """Where the shape one past the tuned ``env`` took another candidate than the winner (no split: the winner is
        not valid there, e.g. a loop of 2 KV chunks at an odd length), the winner's template at the next values it is
        valid at, up to WINNER_REACH past ``env`` (and checked): the first of them asked for later then runs code
        that is compiled. Measured need: llama-1b float32 under dynamic=True tuned at 128 tokens, its prefill
        attention's winner (2 chunks) first compiled at 190 (the first even new length after 141, 157 and 163,
        served by the candidate built at 129): 1.8 s of gcc and checks at that length."""
        win = tuning.best
        for k in range(2, WINNER_REACH + 1):
            nxt = {d: v + k for d, v in env.items()}
            if self._covers(win, None, nxt):
                return
            key = tuple(sorted(nxt.items()))
            if key in self._specs:
                continue
            spec = self._from_cached(nxt, tuning, None, template=True, row=win)
            if spec is None:
                continue
            # its other checks now, at the region's cheapest values (as _build_tails): a later length it serves
            # ran them (bf16, 190 after 128: four such templates, 8 checks, +0.4-0.9 s)
            t = spec.kernel.specialize(**spec.env).template
            if t is not None and len(t.checks) < TEMPLATE_CHECKS and not self._checked_below(
                    t, spec.implementation, dict(win.params), spec.kernel, {d: 2 * v for d, v in nxt.items()},
                    always=True):
                return
            STATS.template_prebuilt += 1
            self._specs[key] = dataclasses.replace(spec, derived_from=dict(env))
            return

    def _prebuilding(self) -> bool:
        """Whether work for shapes not yet asked for is done ahead (_prebuild, _build_tails): ``PRISM_PREBUILD=0``
        turns it off."""
        return self.options.derive and os.environ.get("PRISM_PREBUILD", "1").strip() != "0"

    def _build_tails(self, anchor: dict[str, int], tuning: TuneResult, split_tile: tuple[str, str, int]) -> None:
        """The tail kernel of the splits of ``tuning`` (at ``anchor``) built at 2 rows and at half a tile, each
        template checked at all its TEMPLATE_CHECKS values; once per anchor and tile. Called by the pre-build, and by
        the first split derived from a tuning with no pre-build (Dynamo's default: a dynamic graph's pieces derive
        from the fixed-shape twins' tunings; llama-1b bf16 then compiled and checked new tail templates at prompt
        lengths 190 and 200 after 128 and 141, +2.9 and +3.7 s).
        A split one past the tuned shape has a tail of one row, a template of its own (a dim of 1 is dropped): the
        tail kernel at 2 rows and at half a tile builds the templates other remainders use (the code of a short and
        of a long tail differ: llama-1b's fused MLP below and above 32 rows). Measured need: llama-1b bf16 under
        dynamic=True, the MLP's 13-row tail at 141 after 128: 0.86 s. These templates are checked at all their
        values here: the checks read the weights this specialization has drawn already (specialize's shared
        draws), where a new length drew them again for its first check of the template (0.33 s of the fused MLP's
        0.39 s check at 141 after 128). A whole tile's run (a length past the tuned one by a tile or more) is left
        to its first length: checking it here cost every start-up 0.4 s and a gcc run."""
        dim, grid, tile = split_tile
        key = (tuple(sorted(anchor.items())), split_tile)
        if key in self._tails_built:
            return
        self._tails_built.add(key)
        win = tuning.best
        params = {**win.params, grid: 1}
        for rows in sorted({2, tile // 2 + 1}):
            if rows >= tile:
                continue
            part = self._from_cached({**anchor, dim: rows}, tuning, params, template=True, row=win)
            t = part.kernel.specialize(**part.env).template if part is not None else None
            if t is not None and len(t.checks) < TEMPLATE_CHECKS:
                self._checked_below(t, part.implementation, params, part.kernel, {**anchor, dim: tile}, always=True)

    def _cache_path(self, env: Mapping[str, int]) -> tuple[Any, dict[str, Any]]:
        m = self.machine
        program, sgraphs = self._graph_keys()
        shapes = {k: [int(D.evaluate(d, env)) for d in n.shape] for k, n in self.program.inputs.items()}
        material = {"v": TUNE_VERSION, "program": program, "sgraphs": sgraphs,
                    "shapes": shapes, "machine": m.fingerprint, "threads": m.threads, "isa": m.isa}
        path = store.root() / "results" / program / (store.digest(material)[:32] + ".json")
        return path, material

    def _build(self, env: dict[str, int]) -> Specialization:
        path, material = self._cache_path(env)
        spec = self._from_store(env, path, material)
        if spec is None and self.options.derive:
            spec = self._derive(env, material)
        return spec if spec is not None else self._tune(env, path, material)

    def _anchors(self, material: dict[str, Any]) -> list[tuple[dict[str, int], TuneResult]]:
        """Measured tunings of this program on this machine: this kernel's, and the disk cache's (read once
        per kernel object)."""
        out = [(s.env, s.tuning) for s in self._specs.values() if s.derived_from is None]
        if self._disk_anchors is None:
            self._disk_anchors = []
            same = {k: v for k, v in material.items() if k != "shapes"}
            for path in sorted((store.root() / "results" / self.program.key).glob("*.json")):
                p = store.load(path, "tuning").payload
                try:
                    key = dict(p["key"]) if p is not None else None
                    if key is None or {k: v for k, v in key.items() if k != "shapes"} != same:
                        continue
                    env = self.program.bind({k: tuple(v) for k, v in key["shapes"].items()})
                    self._disk_anchors.append((env, TuneResult.from_json(p["result"])))
                except (PrismError, KeyError, TypeError, ValueError):
                    continue  # an unreadable entry is not an anchor (its own lookup reports it)
        return out + self._disk_anchors

    def _twin_anchors(self) -> list[tuple[dict[str, int], TuneResult]]:
        """Tunings of this process's fixed-shape kernels whose program is this one at some value of its dims:
        (that value, the tuning with its rows renumbered to this kernel's sGraphs). A row whose sGraph is not one
        of this kernel's, instantiated at that value -- the same key, or the same structure once this kernel's
        for-loop runs once (:func:`_one_trip`; the row then takes range 1) --, is left out; a tuning whose winner is
        left out takes its fastest kept candidate within DERIVE_SLACK of it, or is no anchor.
        Measured need: under Dynamo's default, a model's first prompt length compiles a static prefill graph and
        the first new length a dynamic one, whose pieces are these programs over a symbolic length; llama-1b
        bf16's 13 were tuned again at 141 tokens (11.9 s of the 21 s that new length took) after their twins had
        been tuned at 128."""
        if not self.symbols():
            return []
        with _MEMO_LOCK:
            kernels = [k for k in _KERNEL_MEMO.values() if k is not self and not k.symbols()]
        out = []
        for k in kernels:
            for spec in list(k._specs.values()):
                if spec.derived_from is not None:
                    continue
                key = (id(k), id(spec))
                if key not in self._twins:
                    self._twins[key] = self._twin(k, spec)
                    if self._twins[key] is not None:
                        self._twin_specs[id(self._twins[key][1])] = spec
                if self._twins[key] is not None:
                    out.append(self._twins[key])
        return out

    def _twin(self, other: SuperKernel, spec: Specialization) -> tuple[dict[str, int], TuneResult] | None:
        """(env, ``spec``'s tuning renumbered) when ``other``'s program is this program at ``env``, else None."""
        if (other.input_names != self.input_names or other.options.top_k != self.options.top_k
                or other.machine.fingerprint != self.machine.fingerprint):
            return None
        try:
            env = self.program.bind({n: [int(d) for d in node.shape] for n, node in other.program.inputs.items()})
            if self.program.instantiate(env).key != other.program.key:
                return None
            mine = [impl.graph.instantiate(env) for impl in self.implementations]
            theirs = {impl.graph.key: j for j, impl in enumerate(other.implementations)}
            index = {theirs[g.key]: i for i, g in enumerate(mine) if g.key in theirs}
            extra: dict[int, dict[str, int]] = {}   # their sGraph -> the loop ranges set to 1 in mine
            if len(index) < len(theirs):
                once = {}
                for i, g in enumerate(mine):
                    if i not in index.values() and (k := _one_trip(g)) is not None:
                        once.setdefault(k[0], (i, k[1]))
                for j, impl in enumerate(other.implementations):
                    if j in index:
                        continue
                    k = _one_trip(impl.graph)
                    if k is not None and not k[1] and k[0] in once:
                        index[j], loops = once[k[0]]
                        extra[j] = dict.fromkeys(loops, 1)
        except Exception as e:  # no twin (ranks, fixed sizes or constraints differ): tuned as before, never failed
            LOG.debug("prism: %r is no twin of %r: %s", other.program.name, self.program.name, e)
            return None
        res = spec.tuning
        kept = [r for r in res.rows if r.sgraph in index]
        best = res.best
        if best.sgraph not in index:
            # the winner's sGraph is not one of this kernel's: its fastest kept candidate stands in for it if it was
            # measured within DERIVE_SLACK of it (llama-1b's Q projection at 128 rows: a row-tiled sGraph only the
            # static search keeps, 1.319 ms, then a column grid both have, 1.320 ms)
            ok = [r for r in kept if r.status == "ok" and math.isfinite(r.measured_s)
                  and r.measured_s <= best.measured_s * DERIVE_SLACK]
            if not ok:
                return None
            best = min(ok, key=lambda r: r.measured_s)
        rows = [dataclasses.replace(r, sgraph=index[r.sgraph], params={**r.params, **extra.get(r.sgraph, {})})
                for r in kept]
        winner = next(i for i, r in enumerate(kept) if r is best)
        return env, dataclasses.replace(res, rows=rows, winner=winner,
                                        sgraph_keys=[i.graph.key for i in self.implementations])

    def _nearest_anchor(self, env: dict[str, int], material: dict[str, Any]
                        ) -> tuple[dict[str, int], TuneResult, bool] | None:
        """The tuning :meth:`_derive` derives ``env`` from (its shape, the tuning, whether it is far), if any."""
        best: tuple[float, dict[str, int], TuneResult, bool] | None = None
        far_ok = os.environ.get("PRISM_DERIVE_FAR", "1").strip() != "0"
        anchors = [(aenv, res, False) for aenv, res in self._anchors(material)]
        anchors += [(aenv, res, True) for aenv, res in self._twin_anchors()]
        for aenv, res, twin in anchors:
            # a twin tuned at this very shape is the nearest anchor (its program is this one there: a dynamic graph
            # called at the size its fixed-shape twin was tuned at); one of this kernel's own there is not (that
            # shape is served before deriving, or failed)
            if set(aenv) != set(env) or (aenv == env and not twin) or any(aenv[k] <= 0 for k in env):
                continue
            ratios = [env[k] / aenv[k] for k in env]
            far = not all(1 / DERIVE_WINDOW <= r <= DERIVE_WINDOW for r in ratios)
            # a far twin is no anchor where a moved dim is small at either end (FAR_TWIN_MIN)
            if far and (not far_ok or (twin and min(min(aenv[k], env[k]) for k in env if aenv[k] != env[k])
                                       < FAR_TWIN_MIN)):
                continue
            dist = sum(abs(math.log(r)) for r in ratios)
            if best is None or dist < best[0]:
                best = (dist, aenv, res, far)
        return None if best is None else best[1:]

    def _derive(self, env: dict[str, int], material: dict[str, Any]) -> Specialization | None:
        """The winner of the nearest tuned shape within a factor of 2 in every dim, compiled at ``env`` and
        numerically checked there (never unverified); None when there is none or it fails (then ``env``
        is tuned). Saves the tuning's compiles and measurements (decode attention: 1.9 s per KV length,
        of which 1.5 s compiling 6 candidates); the choice is the neighbour's, not measured at ``env``."""
        best = self._nearest_anchor(env, material)
        if best is None:
            return None
        anchor, res, far = best
        spec = self._derived(env, anchor, res)
        if spec is None:
            return None
        if spec.split_tile is not None and self._prebuilding():
            self._build_tails(anchor, res, spec.split_tile)
        STATS.tune_derived += 1
        if far:
            STATS.tune_derived_far += 1
            self._mark_pending(env, anchor, material)
        return dataclasses.replace(spec, derived_from=dict(anchor))

    def _mark_pending(self, env: dict[str, int], anchor: dict[str, int], material: dict[str, Any]) -> None:
        """Record ``env`` -- served from the tuning at ``anchor``, more than DERIVE_WINDOW away -- as pending in the
        tuning cache, where this shape's own tuning would be: `prism cache retune` tunes it (the program and its
        sGraphs are in the record, as in a tuning entry). Why not tune now: a tuning at a new size blocks the call
        for tens of seconds (llama-1b bf16: a 1900-token prompt after tunings at 600: 56 s, nearly all of it in
        its 13 pieces' tunings -- the attention's alone 17.8 s), while the far winner compiled at the new size
        served it as fast (3.21 s per prefill against the tuned kernels' 3.31; from 20 to 1000 rows 1.35 against
        1.41 s)."""
        # one record per octave of the shape (bit length of each dim) and anchor: a decode past twice its tuned KV
        # length is far at every new length, and each token wrote a record of the program and its sGraphs and a cache
        # entry per KV length for `prism cache retune` to tune. Measured (llama-1b w8a8, batch 1, KV 260-400 after a
        # tuning at 129, clean cache, two runs each): the derivation of a new length 5.8 -> 0.7 ms, a decode step
        # there +6.8-7.0 -> +1.7-2.7 ms over the step at lengths seen before; 140 records -> 1. The octave's first
        # far shape is the one tuned; the others derive from it then
        octave = (tuple(sorted((k, int(v).bit_length()) for k, v in env.items())), tuple(sorted(anchor.items())))
        if octave in self._pending_octaves:
            return
        self._pending_octaves.add(octave)
        path, _ = self._cache_path(env)
        if store.load(path, "tuning").payload is not None:
            return
        try:
            store.save(path, "tuning", {"key": material, "pending": {"derived_from": dict(anchor)},
                                        **self._record_graphs()})
        except (OSError, PrismError) as e:   # the record is for later tuning; never fail the call for it
            LOG.debug("prism: pending tuning record not written: %s", e)

    def _record_graphs(self) -> dict[str, Any]:
        """The program and its sGraphs as a tuning record holds them (serialized once per kernel)."""
        if self._graphs_json is None:
            self._graphs_json = {"program": json.loads(graph_to_json(self.program)),
                                 "sgraphs": [json.loads(graph_to_json(i.graph)) for i in self.implementations]}
        return self._graphs_json

    def _derived(self, env: dict[str, int], anchor: dict[str, int], res: TuneResult) -> Specialization | None:
        """The kernel the tuning ``res`` at ``anchor`` gives ``env``, compiled through its template and checked;
        the first that holds of: (1) the winner with its grid sizes that equalled a moving dim following it
        (:func:`_following`); (2) the winner; (3) another candidate of the tuning, measured within
        DERIVE_SLACK of the winner, with its own params (following, then as they are; valid at ``env``: e.g.
        a grid over the weight's columns where the winner's split the rows into 3 and the new length is
        prime); (4) a split (:meth:`_split`: the tuned kernel on the runs of rows it divides, the winner's sGraph
        with one block along the rows on the rows left) -- tried first when none of (1)-(3) has compiled code for
        ``env`` (:meth:`_covers`; where some have, those come first, in this order); (5) the winner's sGraph
        with the valid sizes nearest to its own, if each is within NEAR of it or the model's cost per flop there
        is within NEAR_ESTIMATE (a size equal to the new dim following it); (6) the other measured candidates,
        fastest first.
        Measured need: at a prime prompt length only 1 and the length divide it,
        and (5) made llama-small's MLP piece one row per block (its weights read once per row): prompts 229
        and 271 prefilled in 131-162 ms where 250 took 72-77 ms."""
        ok = sorted((r for r in res.rows if r.status == "ok" and math.isfinite(r.measured_s)),
                    key=lambda r: r.measured_s)
        win = res.best
        tries = self._derive_tries(env, anchor, res)
        # where none of those has compiled code for env yet (each a new template: a gcc run and its checks at
        # values of its region), a split comes first if its parts are all compiled: the tuned kernel and the tail
        # templates the pre-build compiled and checked. Measured need: llama-1b bf16 under dynamic=True, prompt 190
        # after 128 and 141 (tuned grids of 2 row blocks fit 190): 44 pieces derived, 30 checks, new templates, +7.1 s
        # -- where it is at most SPLIT_FIRST_RUNS calls, or more where the tuned run is compute-bound (_split)
        # and a close candidate that has compiled code comes before a winner that has none: within DERIVE_SLACK of
        # it at the anchor, for no gcc run and no checks. Measured need: llama-1b bf16 under dynamic=True, 190 after
        # 128: three linear+add pieces compiled and checked the winner's template (2 row blocks; 0.55-0.96 s each)
        # where a close candidate (one row block, 8 column blocks) had a template covering 64-255 rows
        compiled = [self._covers(row, params, env) for row, params in tries]
        split_first = None if any(compiled) else self._split(env, anchor, res, first=True)
        if split_first is not None:
            return split_first
        for row, params in [t for t, c in zip(tries, compiled) if c] + [t for t, c in zip(tries, compiled) if not c]:
            spec = self._from_cached(env, res, params, template=True, row=row)
            if spec is not None:
                return spec
        # the winner's own grid on the rows it divides and a remainder: the same two kernels serve every length,
        # where the nearest sizes are a template per divisor class of the lengths (or one row per block)
        spec = self._split(env, anchor, res)   # (again where the first try was over SPLIT_FIRST_RUNS)
        if spec is not None:
            return spec
        for params in self._near_tries(env, anchor, res):
            spec = self._from_cached(env, res, params, template=True)
            if spec is not None:
                return spec
        for row in ok:
            if row.measured_s > win.measured_s * DERIVE_SLACK:
                spec = self._from_cached(env, res, None, template=True, row=row)
                if spec is not None:
                    return spec
        return None

    def _split(self, env: dict[str, int], anchor: dict[str, int], res: TuneResult,
               first: bool = False) -> Specialization | None:
        """``env`` served as calls on ranges of rows (prism/runtime/split.py): the kernel tuned at ``anchor`` on
        each whole run of its length, then the winner's sGraph with one block along the rows on each run of its
        tuned tile and on the rows left: a grid with a remainder block, where a prime length has no other grid
        than one row per block. Only where the winner's sGraph proves the program row-separable along the
        dim that moved (prism/ir/rows.py); every part is a kernel compiled and checked at its own length, and the
        composite is checked at ``env`` the first SPLIT_CHECKS times it passes its parts the same pointers (below).
        None when any of that does not hold, or (``first``: the split tried before a kernel with no compiled code)
        when it would compile a part (a tail length with no compiled code: then it saves no compile over the
        winner's new template), or take more than SPLIT_FIRST_RUNS calls where the tuned run is not compute-bound
        (:meth:`_stream_share` over SPLIT_STREAM_SHARE).
        Measured need: see prism/runtime/split.py (the fused MLP of llama-1b tuned again at 157 tokens)."""
        from prism.ir.rows import NotRowSeparable, check_one_row, row_grid
        from prism.runtime.split import SplitKernel, compose
        moved = [d for d in env if env[d] != anchor.get(d)]
        win = res.best
        if len(moved) != 1 or not 0 <= win.sgraph < len(self.implementations):
            return None
        (dim,), impl = moved, self.implementations[win.sgraph]
        n, a = env[dim], anchor[dim]
        try:
            rows = row_grid(impl.graph, self.program, dim, win.params)
            grid, ins, outs = rows.param, rows.inputs, rows.outputs
            tiles = D.resolve_params(win.params, anchor).get(grid)
            if isinstance(win.params.get(grid), D.Follows) or type(tiles) is not int or tiles < 1 or a % tiles:
                return None
            tile = a // tiles
            q, r = divmod(n, a)
            # the rows left: blocks of the tuned tile, then one block of the last rows -- one kernel (one block
            # along the rows) at two lengths -- or that kernel on runs of lengths it has compiled code for
            # (_tail_runs), where that is at most one run more (each run reads the weights once more)
            rest = [tile] * (r // tile) + ([r % tile] if r % tile else [])
            tail = {**win.params, grid: 1}

            def covered(x: int) -> bool:
                return self._covers(win, tail, {**env, dim: x})
            cut = _tail_runs(r, covered)
            if cut is not None and q + len(cut) >= 2 and len(cut) <= len(rest) + 1:
                rest = cut
            runs: list[int | None] = [None] * q + rest
            if len(runs) < 2 or (first and not all(map(covered, rest))):
                return None
            check_one_row(impl.graph, dim, rows, win.params, env, [n, a] + [x for x in runs if x])
        except NotRowSeparable as e:
            LOG.debug("prism: %r at %s is not split: %s", self.program.name, env, e)
            return None
        # the byte offset of one row of each operand and output: its row axis must follow only axes of size 1
        shapes = {k: [int(D.evaluate(d, env)) for d in node.shape] for k, node in self.program.inputs.items()}
        dtypes = {k: node.dtype for k, node in self.program.inputs.items()}
        for o in self.program.outputs:
            shapes[o.arg[0]] = [int(D.evaluate(d, env)) for d in o.shape]
            dtypes[o.arg[0]] = o.dtype
        row_bytes: dict[str, int] = {}
        for k, ax in [*ins.items(), *outs.items()]:
            if ax is None:
                continue
            if any(x != 1 for x in shapes[k][:ax]):
                return None
            row_bytes[k] = math.prod(shapes[k][ax + 1:]) * dtypes[k].itemsize
        if first and len(runs) > SPLIT_FIRST_RUNS and self._stream_share(
                sum(math.prod(shapes[k]) * dtypes[k].itemsize for k, ax in ins.items() if ax is None), tiles,
                win.measured_s) > SPLIT_STREAM_SHARE:
            return None
        main = self._anchor_variant(anchor, res) if q else None
        if q and main is None:
            return None
        calls, parts, start, built = [], [], 0, {}
        for x in runs:
            if x is None:
                v, x = main, a
            elif x in built:
                v = built[x]
            else:
                penv = {**env, dim: x}
                part = self._from_cached(penv, res, {**win.params, grid: 1}, template=True, row=win)
                if part is None:
                    return None
                v = built[x] = part.kernel.specialize(**penv)
            calls.append((v, {k: start * b for k, b in row_bytes.items()}))
            parts.append((x, "tuned" if v is main else f"{grid}=1"))
            start += x
        names = (*self.program.inputs, *self.output_names)
        try:
            variant = compose(names, len(self.program.inputs), [tuple(shapes[o]) for o in self.output_names],
                              calls, env)
        except PrismError as e:
            LOG.debug("prism: %r at %s is not split: %s", self.program.name, env, e)
            return None
        kernel = SplitKernel(self.program, env, variant)
        # the composite's checks: each part is a kernel checked at its own length; what the composite adds is the
        # shim (fixed C) and the pointers it passes each part -- its io in the part's order, advanced by the rows
        # before it times the bytes per row. Those are the same for every length of the program but for the rows
        # before each part: the first SPLIT_CHECKS composites with the same io orders and row sizes are checked
        key = (tuple(dict.fromkeys(tuple(v.gen.input_names) + tuple(v.gen.output_names) for v, _ in calls)),
               tuple(sorted(row_bytes.items())))
        params = {**D.resolve_params(win.params, env), grid: n}   # the witness instance: one row per block
        from prism.verify.numeric import NumericResult
        # a composite checked by an earlier process is recorded under its C (the shim and, by their content-named
        # libraries, its parts at this length with their offsets), as a template's checks are
        record, inst = cache.cache_key(variant.gen.source), {**env, **params}
        if self._split_checks.get(key, 0) >= SPLIT_CHECKS:
            check = NumericResult(True, (), (inst,), 0.0)
        elif _plain_ints(inst) in self._recorded(record):
            check = NumericResult(True, (), (inst,), 0.0)
            STATS.checks_cached += 1
            self._split_checks[key] = self._split_checks.get(key, 0) + 1
        else:
            check = self._check(impl, env, params, kernel, kinds=("normal",))
            if not check.passed:
                LOG.warning("prism: %r at %s: the split kernel failed its check (not used): %s", self.program.name,
                            env, str(check).splitlines()[-1])
                return None
            self._split_checks[key] = self._split_checks.get(key, 0) + 1
            self._record(record, inst)
        STATS.tune_split += 1
        return Specialization(env, impl, params, kernel, res, check, True, split=tuple(parts),
                              split_tile=(dim, grid, tile))

    def _stream_share(self, weight_bytes: int, blocks: int, measured_s: float) -> float:
        """The share of a tuned run's measured time its ``blocks`` row blocks would take to read the operands that
        have no row axis (``weight_bytes``: each block reads them whole) at the machine's bandwidth: what a split
        pays per extra run at most, against a template whose blocks hold more rows. A split runs at the tuned
        kernel's own rate per row; the winner's template at the new length reads the weights fewer times per row.
        Measured (llama-1b under dynamic=True after 128 tokens, 350-1024 tokens, split against the winner's template
        in one process, interleaved; bandwidth 37.5 GB/s): shares 0.15-0.24 (float32 linear pieces, 2 row blocks;
        bfloat16 linear pieces and fused MLP, 2 row blocks) ran the splits at 0.85-1.0 of the template's time
        (their tails of 30-64 rows 1.15-1.19 in float32); the float32 fused MLP's 4 row blocks of 32, share 0.34,
        at 1.26. Programs with no such operand (norms, RoPE) have 0: the split costs a call per run."""
        if weight_bytes == 0:
            return 0.0
        if not (measured_s > 0 and math.isfinite(measured_s)):
            return math.inf
        return blocks * weight_bytes / self.machine.bandwidth / measured_s

    def _anchor_variant(self, anchor: dict[str, int], res: TuneResult) -> Any:
        """The compiled kernel of the tuning ``res`` at ``anchor``: this kernel's (tuned, or from the tuning cache)
        or its fixed-shape twin's; None when there is none."""
        key = tuple(sorted(anchor.items()))
        spec = self._specs.get(key)
        if spec is None or spec.derived_from is not None:
            twin = self._twin_specs.get(id(res))
            if twin is not None:
                return twin.kernel.specialize()
            path, material = self._cache_path(anchor)
            spec = self._from_store(anchor, path, material)
            if spec is None:
                return None
            self._specs[key] = spec
        return spec.kernel.specialize(**anchor)

    def _nearest_params(self, env: dict[str, int], row: Row,
                        anchor: dict[str, int]) -> tuple[dict[str, Any], float] | None:
        """The values of ``row``'s sGraph's symbols valid at ``env`` nearest to ``row.params`` (the same map
        choices; grid sizes and loop ranges nearest in log scale, ties to the model's estimate), from the
        tuner's own instantiation of the sGraph at ``env`` (every constraint holds, the machine filters
        applied), with the model's seconds per flop of them at ``env`` over its seconds per flop of ``row`` at
        ``anchor`` (inf where either has no flops); None when there is none. Measured need: a new prompt length
        adopted the neighbouring length's winner only where its grid sizes divided the new length, so 5 of the
        11 pieces of a 2048-wide Llama's prefill were tuned again at a prime length (7 of the 12.9 s it added).
        Why against the winner at the anchor and not the sGraph's best at ``env``: at a prime length every valid
        instance of the fused MLP's row-tiled sGraph is one row per block (the weights read per row), so its best
        there is no better, and the ratio was 1.0 for a prefill 2.3x slower (llama-1b bf16, 157 tokens)."""
        from prism.tune.candidates import instantiate, sgraph_symbols
        from prism.tune.cost import estimate
        from prism.tune.tuner import expected_shapes
        if not 0 <= row.sgraph < len(self.implementations):
            return None
        g = self.implementations[row.sgraph].graph
        try:
            inst = instantiate(g, env, self.machine, row.sgraph, expected_shapes(self.program, env))
        except PrismError:
            return None
        size, maps = sgraph_symbols(g)
        best: tuple[float, int, Any] | None = None
        for rank, i in enumerate(inst.kept):
            if any(i.params.get(k) != row.params.get(k) for k in maps):
                continue
            dist = sum(abs(math.log(max(1, int(i.params[k])) / max(1, int(row.params[k]))))
                       for k in size if k in i.params and isinstance(row.params.get(k), int))
            if best is None or (dist, rank) < best[:2]:
                best = (dist, rank, i)
        if best is None:
            return None
        params, near = dict(best[2].params), best[2].estimate
        try:
            at = D.resolve_params(dict(row.params), anchor)
            gm = g.instantiate({k: at[k] for k in maps if k in at}) if maps else g
            was = estimate(gm, self.machine, {**anchor, **at})
        except (PrismError, KeyError, ValueError, ZeroDivisionError):
            return params, math.inf
        if not (near.flops > 0 and was.flops > 0 and was.seconds > 0):
            return params, math.inf
        return params, (near.seconds / near.flops) / (was.seconds / was.flops)

    def _from_store(self, env: dict[str, int], path: Any, material: dict[str, Any]) -> Specialization | None:
        """The cached tuning of this shape, its winner compiled and checked again; None when there is none
        or it is unusable (then it is rebuilt). Entries measured under contention are served too (and
        counted): ``prism cache retune`` measures them again."""
        got = store.load(path, "tuning")
        if got.payload is None:
            if got.corrupt:
                STATS.rebuilds += 1
            return None
        if got.payload.get("pending") is not None and "result" not in got.payload:
            return None   # served from a far tuning, not tuned yet (SuperKernel._derive; `prism cache retune`)
        try:
            if got.payload.get("key") != material:
                raise ValueError("its key does not match the program, shapes and machine")
            cached = TuneResult.from_json(got.payload["result"])
        except (ValueError, KeyError, TypeError) as e:
            store.corrupt(path, "tuning", f"unusable entry: {e}")
            STATS.rebuilds += 1
            return None
        checked = got.payload.get("checked")
        spec = self._from_cached(env, cached, checked=checked if isinstance(checked, dict) else None)
        if spec is None:
            store.corrupt(path, "tuning", "the cached winner no longer passes the numeric check")
            STATS.rebuilds += 1
            return None
        if spec.check_cached is None:
            # checked again here (the code generator or the compiler changed since the entry was written, so the
            # recorded kernel differs): record this kernel's check, so that the next process does not repeat it
            # (a warm start of llama-small after a code generator change re-checked its 28 tuned shapes, 2.0 s, in
            # every process)
            payload = dict(got.payload)
            payload["checked"] = _check_record(spec)
            try:
                store.save(path, "tuning", payload)
            except (OSError, PrismError) as e:   # the record saves time later; never fail the call for it
                LOG.debug("prism: tuning entry's check record not updated: %s", e)
        STATS.tune_cache_hits += 1
        if got.payload.get("contended") is not None:
            STATS.contended_served += 1
        return spec

    def _tune(self, env: dict[str, int], path: Any, material: dict[str, Any]) -> Specialization:
        console = _console(self.options.verbose)
        shape = ", ".join(f"{k}={v}" for k, v in sorted(env.items())) or "the fixed shape"
        t0 = time.perf_counter()
        top_k, budget = self.options.top_k, self.options.tune_budget_s
        deadline = self.options.deadline
        if deadline is not None and not self._specs:
            # the first shape is tuned within the superoptimize call's time limit (prism.optimize, or a call
            # right after superoptimize); once it is spent, fewer candidates are compiled and measured
            left = deadline - t0
            if budget is None:
                budget = max(0.5, left)
            if self._top_k(t0) != top_k:
                LOG.warning("prism: the time_limit of %g s is spent: tuning %r at %s with %d candidates instead of %d",
                            self.options.time_limit, self.program.name, shape, BUDGET_TOP_K, top_k)
                top_k = BUDGET_TOP_K
        tried: set[tuple] = set()
        rounds = 0
        try:
            while True:
                with _status(console, self.options.verbose, f"tuning at {shape}") as update:
                    tuned = tune([i.graph for i in self.implementations], self.program, env, self.machine,
                                 top_k=top_k, budget_s=budget, progress=update, skip=tried,
                                 planned=None if tried else self._planned.pop(tuple(sorted(env.items())), None))
                t1 = time.perf_counter()
                try:
                    spec = self._pick(env, tuned)
                    break
                except NoVerifiedKernelError as e:
                    # every measured candidate failed the final check: tune the next ones, if any are left
                    # (never an unchecked kernel; the error names each failure when none is left)
                    tried |= {candidate_key(row.sgraph, row.params) for row in tuned.result.rows}
                    rounds += 1
                    # at most RETUNE_ROUNDS more: when that many rounds all fail, something systematic is
                    # wrong (a pool of 40 candidates tuned one at a time took minutes)
                    if len(tuned.result.rows) >= tuned.result.candidates or rounds > RETUNE_ROUNDS:
                        raise
                    LOG.warning("prism: %s", str(e).splitlines()[0] + "; tuning the next candidates")
        finally:
            forget_normal_reference()   # the shared draw and float64 reference of this shape: memory back
        parts = {k: v for k, v in tuned.result.seconds.items() if k != "total"}
        parts["final check"] = time.perf_counter() - t1
        _log_slow(f"tuning {self.program.name or 'the program'!r} at {shape}", time.perf_counter() - t0, parts,
                  None)
        busy = tuned.result.contention
        marked = contended(busy)
        if marked:
            # a contended measurement may have picked a slower winner than a quiet one would: store it marked,
            # so later processes use it instead of tuning again, and `prism cache retune` re-measures it
            STATS.contended_tunings += 1
            if console is not None:
                console.log(f"other processes used {busy:.2f} cores while tuning at {shape}: stored marked as "
                            "measured under contention (`prism cache retune` measures it again)")
        store.save(path, "tuning", {"key": material, "result": tuned.result.to_json(),
                                    "contended": busy if marked else None,
                                    "checked": _check_record(spec), **self._record_graphs()})
        if console is not None:
            r = tuned.result
            console.log(f"tuned at {shape}: sGraph {spec.implementation.index} [{r.best.label}] "
                        f"{r.best.measured_s * 1e6:.1f} µs; model Spearman "
                        f"{'n/a' if r.spearman is None else f'{r.spearman:.2f}'}; {r.seconds.get('total', 0):.1f} s")
        return spec

    def _check(self, impl: Implementation, env: Mapping[str, int], params: Mapping[str, Any], kernel: Kernel,
               tuned: Tuned | None = None, kinds: tuple[str, ...] | None = None) -> Any:
        """The numeric check (normal, negated, hostile, tiny inputs against float64) of ``kernel`` at this
        shape; after tuning it starts from the tuner's draw instead of drawing the inputs again.

        One seed, and hostile / tiny scale the program's first input only: scaling every input in turn made
        W3's final check at m=11008 4x slower (each scaled 4096 x 11008 weight is a new float64 array, its
        float32 copy and a reference run). ``impl.graph`` passed ``prism.verify`` -- the proof, and the numeric
        check with two seeds and every input scaled in turn at small instantiations -- so this check is for
        the compiled code at this shape (docs/verify.md). ``kinds``: only these (a template's later checks)."""
        from prism.verify import compiled_runner, numeric_check
        from prism.verify.numeric import KINDS
        STATS.final_checks += 1
        seed, draws, refs, pairs = 0, None, None, []
        if tuned is not None:
            seed, pairs = tuned.seed, [(tuned.draw[k], tuned.inputs[k]) for k in tuned.draw]
            draws = {seed: tuned.draw} if tuned.draw else None
            refs = {seed: tuned.reference} if tuned.reference else None
        runner = compiled_runner(lambda _g, _p: kernel, name="compiled kernel", float32=pairs)
        return numeric_check(impl.graph, self.program, instantiations=[{**env, **params}], runners=[runner],
                             seeds=(seed,), hostile_input=next(iter(self.program.inputs)), draws=draws,
                             normal_references=refs, kinds=KINDS if kinds is None else kinds)

    def _pick(self, env: dict[str, int], tuned: Tuned) -> Specialization:
        """The fastest measured candidate whose compiled kernel passes the numeric check at this shape."""
        r = tuned.result
        order = sorted((i for i, row in enumerate(r.rows) if row.status == "ok"),
                       key=lambda i: (r.rows[i].measured_s, r.rows[i].model_rank))
        failures = []
        for i in order:
            row = r.rows[i]
            impl = self.implementations[row.sgraph]
            check = self._check(impl, env, row.params, tuned.kernels[i], tuned)
            if check.passed:
                r.winner = i
                return Specialization(env, impl, dict(row.params), tuned.kernels[i], r, check, False)
            row.status, row.measured_s = "failed check", float("inf")
            row.detail = str(check).splitlines()[-1][:200]
            failures.append(f"sGraph {row.sgraph} [{row.label}]: {row.detail}")
        raise NoVerifiedKernelError("no tuned candidate passed the final numeric check at "
                                    f"{env}:\n  " + "\n  ".join(failures or ["no candidate was measured"]))

    def _from_cached(self, env: dict[str, int], cached: TuneResult, params: Mapping[str, Any] | None = None,
                     template: bool = False, checked: dict[str, Any] | None = None,
                     row: Row | None = None) -> Specialization | None:
        """``cached``'s winner (or ``row`` of it; ``params`` instead of its own where given) compiled at ``env`` and
        numerically checked there; None when it does not compile or fails the check. ``template``: compiled
        through the kernel shared by every shape of the winner (:meth:`_kernel`: a template of the guard
        region where the code allows) -- for shapes that were not measured; a tuned shape gets its own."""
        row = cached.best if row is None else row
        if not 0 <= row.sgraph < len(self.implementations):
            return None
        impl = self.implementations[row.sgraph]
        kparams = dict(row.params if params is None else params)   # the kernel's (D.Follows kept)
        params = D.resolve_params(kparams, env)                      # their values at env
        t = None
        try:
            if template:
                kernel = self._kernel(impl, kparams)
                t = kernel.specialize(**env).template
            else:
                kernel = compile_graph(impl.graph.instantiate({**env, **params}))
        except PrismError:
            return None
        if checked is not None and t is None and checked.get("kernel") == cache.cache_key(kernel.source_at(env)):
            # the tuning entry (checksummed) records that this very kernel -- the same C text, compiler, flags
            # and machine: the kernel cache's key -- passed the final check at this shape, which is
            # deterministic (seeded draws): repeating it on every load cost a warm start 2.1 s of 8.2 (llama-small)
            from prism.verify.numeric import NumericResult
            STATS.checks_cached += 1
            return Specialization(env, impl, params, kernel, cached, NumericResult(True, (), ({**env, **params},), 0.0),
                                  True, check_cached=str(checked.get("check", "numeric check passed")))
        if t is not None and len(t.checks) < TEMPLATE_CHECKS:
            self._recorded_checks(t, kernel.source_at(env))
            inst = {**env, **params}
            if any(i == inst for r in t.checks for i in r.instantiations):   # this very shape, checked before
                from prism.verify.numeric import NumericResult
                STATS.checks_cached += 1
                return Specialization(env, impl, params, kernel, cached, NumericResult(True, (), (inst,), 0.0), True,
                                      check_cached="numeric check passed", cached_from="template")
        plain = None   # a kernel that is no template: its check is recorded under its own kernel-cache key
        if t is None:
            plain, inst = cache.cache_key(kernel.source_at(env)), {**env, **params}
            if _plain_ints(inst) in self._recorded(plain):
                from prism.verify.numeric import NumericResult
                STATS.checks_cached += 1
                return Specialization(env, impl, params, kernel, cached, NumericResult(True, (), (inst,), 0.0), True,
                                      check_cached="numeric check passed", cached_from="record")
        if t is not None and len(t.checks) < TEMPLATE_CHECKS and not self._checked_below(t, impl, kparams, kernel, env):
            return None
        if t is not None and len(t.checks) >= TEMPLATE_CHECKS:
            # the code that runs here is the template's, validated as plain generation's text at this shape
            # (its guards hold) and checked at TEMPLATE_CHECKS shapes of its region: no check of its own
            from prism.verify.numeric import NumericResult
            STATS.template_served += 1
            check = NumericResult(True, tuple(c for r in t.checks for c in r.checks),
                                  tuple(i for r in t.checks for i in r.instantiations), 0.0)
            return Specialization(env, impl, params, kernel, cached, check, True)
        # a template's first check runs every kind; its later ones (other shapes of the region: the same C text,
        # its sizes at another value) the normal draw only. The kinds that scale an input test the arithmetic
        # of that text, checked at the first shape; what a new value can get wrong is a size, which the normal
        # draw shows. Measured need: a new prompt length of llama-1b bf16 past its templates' first checks
        # spent 3.2 s in checks at 294 rows (the fused MLP's 1.39 s), each kind a float64 reference run of the
        # whole shape
        later = t is not None and len(t.checks) > 0
        check = self._check(impl, env, params, kernel, kinds=("normal",) if later else None)
        if not check.passed:
            return None
        if t is not None:
            t.checks.append(check)
            self._record_check(t, {**env, **params})
        elif plain is not None:
            self._record(plain, {**env, **params})
        return Specialization(env, impl, params, kernel, cached, check, True)

    def _checked_below(self, t: Any, impl: Implementation, kparams: Mapping[str, Any], kernel: Kernel,
                       env: Mapping[str, int], always: bool = False) -> bool:
        """Run template ``t``'s missing checks at cheap values of its region below the served ``env``
        (``template.check_points``: the region's smallest value, then from a quarter and a half of ``env``) rather
        than at this and the next served shapes, where that costs less: a check's float64 reference grows with the
        dim, and the first check runs every input kind. The first with every kind, the others the normal draw.
        False when one fails (the template is not used); True otherwise, also when no value is cheaper (the
        served shapes are checked instead). ``always``: at the values below ``env`` whatever they cost (_build_tails).
        Measured need: llama-1b bf16, a 1000-token prompt after 600: 16.5 s,
        11.3 s of it in the 13 pieces' checks at 1000 rows (8.4 s in float64 reference runs)."""
        from prism.codegen.template import check_points
        from prism.verify.numeric import KINDS
        dims = {k: v for k, v in env.items() if k in t.trace.env}
        need = TEMPLATE_CHECKS - len(t.checks)
        seen = [{k: v for k, v in i.items() if k in dims} for r in t.checks for i in r.instantiations]
        points = [p for p in check_points(t.trace, dims, need, seen) if kernel.specialize(**p).template is t]
        if len(points) < need:   # (none for a template over several dims)
            return True
        # the check's cost grows with the dim's value: these points against this shape's check and the next ones'
        (d,) = dims
        first = len(KINDS) if not t.checks else 1
        if not always and sum(p[d] * (first if i == 0 else 1) for i, p in enumerate(points)) >= dims[d] * (
                first + need - 1):
            return True
        from prism.verify.numeric import shared_draws
        with shared_draws():   # the checks change the rows, not the weights: drawn and converted once
            for p in points:
                params = D.resolve_params(kparams, p)
                check = self._check(impl, p, params, kernel, kinds=("normal",) if t.checks else None)
                if not check.passed:
                    return False
                STATS.template_checks_below += 1
                t.checks.append(check)
                self._record_check(t, {**p, **params})
        return True

    # A template's checks are recorded beside the kernel cache, keyed by the compiled template (its C text,
    # compiler, flags and machine: the kernel cache's key) and this program: a later process serving the same
    # template takes them as its own instead of checking its first TEMPLATE_CHECKS shapes again (the checks are
    # deterministic, seeded draws; as the tuning entry's record of a tuned shape's check). Measured need: a new
    # prompt length of llama-small bf16 in a process with warm caches spent 0.64 s of its 1.1 s in 13 such checks.
    def _graph_keys(self) -> tuple[str, list[str]]:
        """The program's and the sGraphs' keys (serializing them: 0.4 ms each, at every new shape)."""
        if self._keys is None:
            self._keys = (self.program.key, [i.graph.key for i in self.implementations])
        return self._keys

    @staticmethod
    def _checks_path(record_key: str) -> Path:
        return cache.cache_dir() / "checks" / f"{record_key}.json"

    def _recorded_checks(self, t: Any, source: str) -> None:
        """Adopt the checks a process recorded for template ``t`` and this program (once per template)."""
        if t.records_read:
            return
        t.records_read = True
        t.record_key = cache.cache_key(source)
        from prism.verify.numeric import NumericResult
        seen = [i for r in t.checks for i in r.instantiations]
        for e in self._recorded(t.record_key):
            if e not in seen and all(isinstance(v, int) for v in e.values()):
                t.checks.append(NumericResult(True, (), (dict(e),), 0.0))
                seen.append(e)
                STATS.template_checks_recorded += 1

    @staticmethod
    def _read_checks(path: Any) -> dict[str, Any]:
        """A template's check record (program key -> checked shapes); empty when missing or damaged."""
        try:
            data = json.loads(cache.readable(path).read_text())
        except (OSError, ValueError):
            return {}
        return data if isinstance(data, dict) else {}

    def _record_check(self, t: Any, inst: dict[str, Any]) -> None:
        if t.record_key is not None:   # _recorded_checks, called before any check of t, names the record
            self._record(t.record_key, inst)

    def _recorded(self, record_key: str) -> list[dict[str, Any]]:
        """The shapes of this program recorded as checked under ``record_key`` (a kernel's cache key)."""
        envs = self._read_checks(self._checks_path(record_key)).get(self._graph_keys()[0])
        return [e for e in envs if isinstance(e, dict)] if isinstance(envs, list) else []

    def _record(self, record_key: str, inst: dict[str, Any]) -> None:
        """Record that the kernel of ``record_key`` passed its numeric check at ``inst`` for this program."""
        path = self._checks_path(record_key)
        data, key = self._read_checks(path), self._graph_keys()[0]
        envs = data[key] = data[key] if isinstance(data.get(key), list) else []
        inst = _plain_ints(inst)
        if inst in envs:
            return
        envs.append(inst)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            cache.atomic_write(path, json.dumps(data, sort_keys=True).encode())
        except (OSError, PrismError) as e:  # a record saves time later; never fail the call for it
            LOG.debug("prism: check record not written: %s", e)

    def _covers(self, row: Row, params: Mapping[str, Any] | None, env: Mapping[str, int]) -> bool:
        """Whether ``row`` of a tuning (``params`` instead of its own where given) has compiled code for ``env``."""
        k = self._kernels.get(_kernel_key(row.sgraph, row.params if params is None else params))
        return k is not None and k.covers(**env)

    def _kernel(self, impl: Implementation, params: Mapping[str, Any]) -> Kernel:
        """The kernel of ``impl`` with ``params`` for every shape (one per pair, kept): a new shape is compiled
        through it, from a template of its guard region where the code allows (runtime/kernel.py)."""
        key = _kernel_key(impl.index, params)
        k = self._kernels.get(key)
        if k is None:
            k = self._kernels[key] = compile_graph(impl.graph, dict(params), templates=True)
        return k

    # --- reporting -------------------------------------------------------------------------------
    def explain(self, **dims: int) -> str:
        """The chosen graph, its proof summary, the generated C and the tuning table (of the shape given by
        ``dims``, else of every shape tuned so far)."""
        r = self.search_result
        lines = [f"prism.superoptimize of {self.program.name or 'a program'!r} (program key {self.program.key})",
                 str(self.program), "",
                 f"search: stop reason {r.stop_reason.value}, {r.stats.states} states, "
                 f"{len(r.candidates)} candidates, {len(self.implementations)} verified"
                 f"{' (from the search cache)' if r.cached else ''}"]
        for impl in self.implementations:
            lines.append(f"  sGraph {impl.index}: {impl.structure}  [{impl.how}]")
        if dims:
            specs = [self.specialize(**dims)]
        else:
            specs = list(self._specs.values())
        if not specs:
            lines += ["", "no shape tuned yet: call the kernel, or kernel.explain(<dim>=...) for a shape"]
        for s in specs:
            shape = ", ".join(f"{k}={v}" for k, v in sorted(s.env.items())) or "fixed shape"
            params = ", ".join(f"{k}={v}" for k, v in sorted(s.params.items())) or "none"
            lines += ["", f"=== shape {shape}: sGraph {s.implementation.index} with {params}"
                      f"{' (tuning from cache)' if s.from_cache else ''}"]
            if s.split is not None:
                lines.append("served as calls on ranges of rows (a split; the params above are its proof's instance, "
                             "one row per block): " + " + ".join(f"{x} rows ({how})" for x, how in s.split))
            lines += [str(s.implementation.graph), "",
                      f"proof: {s.implementation.how}: {s.implementation.proof}",
                      _check_line(s), "",
                      f"machine: {s.tuning.machine.get('describe', '')}", "tuning table:", s.tuning.table(), "",
                      "generated C:", s.source]
        return "\n".join(lines)

    def __repr__(self) -> str:
        return (f"<prism.SuperKernel {self.program.name!r} inputs={list(self.input_names)} "
                f"sgraphs={len(self.implementations)} shapes tuned={len(self._specs)}>")


def _one_trip(g: Graph) -> tuple[tuple, tuple[str, ...]] | None:
    """(a key, the for-loop range symbols) of sGraph ``g`` with every customized operator's for-loop run once
    (:meth:`prism.ir.block.BlockGraph.one_trip_key`); None where a loop has a constant range above 1. Measured need:
    the static search at a model's first prompt length keeps grid sGraphs without a loop, the symbolic search of
    the same program their twins with a loop over K of a symbolic range, so the fixed-shape twins' tunings (below)
    mapped none of llama-1b's plain Linears and both were tuned again at the first new prompt length."""
    memo: dict[Any, tuple] = {}
    loops: set[str] = set()

    def sig(n: Any) -> tuple:
        if n not in memo:
            if n.op == "customized":
                k = n.arg[0].one_trip_key()
                if k is None:
                    raise ValueError("a loop of constant range")
                loops.update(k[1])
                head: tuple = ("customized", k[0])
            else:
                head = (n.op, n.arg, tuple(n.shape), str(n.dtype))
            memo[n] = (*head, tuple(sig(x) for x in n.src))
        return memo[n]

    try:
        key = tuple(sig(n) for n in g.nodes if n.op == "output")
    except ValueError:
        return None
    return key, tuple(sorted(loops))


def _following(params: Mapping[str, Any], anchor: Mapping[str, int], env: Mapping[str, int]) -> dict[str, Any] | None:
    """``params`` (a tuned winner's at the dims ``anchor``) with each grid size or loop range that equalled a dim
    which takes a new value in ``env`` replaced by :class:`prism.ir.dims.Follows` of that dim (one row per block
    stays one row per block); None when no parameter does. A value equal to two such dims stays as it is
    (ambiguous). The result is checked like any derived kernel (SuperKernel._from_cached)."""
    moved = {d: v for d, v in anchor.items() if env.get(d, v) != v}
    out: dict[str, Any] = {}
    for k, v in params.items():
        dims = [d for d, a in moved.items() if type(v) is int and v == a > 1]
        out[k] = D.Follows(dims[0]) if len(dims) == 1 else v
    return out if out != dict(params) else None


def _check_record(s: Specialization) -> dict[str, str]:
    """A tuning entry's record of the check ``s``'s kernel passed: the kernel (the kernel cache's key) and the
    check's summary (``_from_cached`` serves that kernel at that shape without checking it again)."""
    return {"kernel": cache.cache_key(s.source), "check": str(s.check).splitlines()[0]}


def _check_line(s: Specialization) -> str:
    """The explain() line of a shape's final check: its own, or its template's (runtime/kernel.py)."""
    if s.check_cached is not None and s.cached_from in ("template", "record"):
        what = "template" if s.cached_from == "template" else "kernel"
        return (f"compiled check at this shape: {s.check_cached} -- recorded when this very {what} (same C, "
                "compiler, flags, machine) was checked at this shape, by this process or an earlier one")
    if s.check_cached is not None:
        return (f"compiled check at this shape: {s.check_cached} -- recorded when this very kernel (same C, "
                "compiler, flags, machine) was tuned here; not repeated on load")
    head = str(s.check).splitlines()[0]
    own = {k: v for k, v in s.env.items()}
    if s.check.instantiations and not any({k: i.get(k) for k in own} == own for i in s.check.instantiations):
        at = "; ".join(", ".join(f"{k}={i[k]}" for k in sorted(own)) for i in s.check.instantiations)
        return (f"compiled check: served by a template of its guard region, whose code was checked at {at} "
                f"(its text is plain generation's here): {head}")
    return f"compiled check at this shape: {head}"


# --- re-measuring tunings taken under contention ------------------------------------------------------

@dataclass
class Retuned:
    path: str
    program: str
    shape: dict[str, int]
    status: str          # "retuned" | "tuned (was pending)" | "still contended" | "skipped: ..." | "dropped: ..."


def _marked() -> list[tuple[Path, dict[str, Any]]]:
    """(path, payload) of the tuning cache's entries marked as measured under contention, and of the shapes
    served from a far tuning and not tuned yet (pending: SuperKernel._mark_pending)."""
    out = []
    for path in sorted((store.root() / "results").glob("*/*.json")):
        got = store.load(path, "tuning")
        if got.payload is not None and (got.payload.get("contended") is not None
                                        or got.payload.get("pending") is not None):
            out.append((path, got.payload))
    return out


def contended_entries() -> list[Path]:
    """The tuning cache's entries marked as measured under contention, and the pending shapes (served from a
    tuning more than DERIVE_WINDOW away): what ``prism cache retune`` tunes."""
    return [path for path, _ in _marked()]


def retune_contended(progress: Any = None) -> list[Retuned]:
    """Tune every tuning-cache entry marked as measured under contention again, and every pending shape (served
    from a tuning more than DERIVE_WINDOW away) for the first time (``prism cache retune``). Each entry's sGraphs
    are proved again before they are tuned; an entry stays marked when the new measurement is contended too.
    ``progress(i, n, text)`` is called before each entry."""
    from prism.verify.egraph import prove
    marked = _marked()
    out: list[Retuned] = []
    for i, (path, p) in enumerate(marked):
        try:
            program = graph_from_json(json.dumps(p["program"]))
            graphs = [graph_from_json(json.dumps(g)) for g in p["sgraphs"]]
            env = program.bind({k: tuple(v) for k, v in p["key"]["shapes"].items()})
        except (PrismError, KeyError, TypeError, ValueError) as e:
            out.append(Retuned(str(path), "?", {}, f"skipped: unreadable entry ({e})"))
            continue
        if progress is not None:
            progress(i, len(marked), f"{program.name or program.key} at {env}")
        if not all(prove(g, program).proved for g in graphs):
            path.unlink(missing_ok=True)
            out.append(Retuned(str(path), program.name, env, "dropped: an sGraph no longer proves"))
            continue
        impls = [Implementation(j, g, "formal+numeric", "proved again for retune", "") for j, g in enumerate(graphs)]
        sk = SuperKernel(program, None, impls, Options())
        new_path, material = sk._cache_path(env)
        if new_path != path:
            out.append(Retuned(str(path), program.name, env, "skipped: tuned on another machine or version"))
            continue
        before = STATS.contended_tunings
        sk._tune(env, path, material)
        out.append(Retuned(str(path), program.name, env,
                           "still contended" if STATS.contended_tunings > before
                           else "tuned (was pending)" if p.get("pending") is not None else "retuned"))
    return out
