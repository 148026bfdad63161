"""The formal verifier: both sides in one egglog e-graph, named rule sets, a bounded schedule.

Schedule: every iteration first saturates the shape analysis, then runs one round of the active rules
of the current stage. Stages widen the rule sets; a stage ends when it saturates or after its share of
the iteration budget:

1. ``parallel`` + ``cancel``: lift partitions/replicas out of each block and cancel them against the
   block graph's folds (directed; this alone proves most fused kernels);
2. + ``combine``, ``split``, ``softmax``, ``layout``: what is left at the kernel level (combines
   lifted through kernel operators, split reductions, online-softmax rescaling, views);
3. + ``algebra`` (commutativity, associativity, distributivity...).

Running the block-level cancellations first keeps the e-graph small: lifting combines at the kernel
level while partitions are still buried in the blocks multiplies the partially lifted forms.
The run stops as soon as every output pair is in one e-class (``proved``), or at saturation, or at an
iteration, e-node or time limit.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import threading
import time
from collections.abc import Collection, Iterable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Literal

from prism.errors import GraphError
from prism.ir import dims as D
from prism.ir.graph import Graph
from prism.verify import rules as R
from prism.verify.terms import CONSTRUCTORS, declarations
from prism.verify.translate import TermDag, translate

if TYPE_CHECKING:
    from egglog import bindings

StopReason = Literal["proved", "saturated", "iteration_limit", "node_limit", "timeout"]
STAGES: tuple[tuple[str, ...], ...] = (
    ("parallel", "cancel"),
    ("parallel", "cancel", "combine", "split", "softmax", "layout"),
    ("parallel", "cancel", "combine", "split", "softmax", "layout", "algebra"),
)


@dataclass(frozen=True)
class Limits:
    """Bounds of one proof attempt."""

    iterations: int = 40
    nodes: int = 40_000           # e-nodes of the term sort T
    seconds: float = 10.0
    stage_iterations: tuple[int, int] = (15, 30)  # stage 2 starts by iteration 15 at the latest, stage 3 by 30


@dataclass(frozen=True)
class ProofStats:
    seconds: float
    iterations: int
    enodes: int


@dataclass(frozen=True)
class FormalResult:
    """The outcome of one proof attempt.

    ``fired``: per iteration, the rules that matched (name, number of matches) — recorded on request.
    ``chain``: on request, a minimal set of named rules that still proves the result, in the order they
    first fired. egglog 13 does not expose proof terms to Python, so this is what the verifier can
    honestly report: which rules the proof needs, not the sequence of rewrites.
    """

    proved: bool
    stop: StopReason
    stats: ProofStats
    outputs: dict[str, bool]
    fired: tuple[tuple[int, str, int], ...] = ()
    chain: tuple[str, ...] = ()
    message: str = ""

    def __str__(self) -> str:
        s = self.stats
        head = (f"{'proved' if self.proved else 'NOT proved'} ({self.stop}) in {s.seconds:.3f} s, "
                f"{s.iterations} iterations, {s.enodes} e-nodes")
        if self.chain:
            head += "\n  rules used: " + ", ".join(self.chain)
        return head + (f"\n  {self.message}" if self.message else "")


@dataclass
class _Program:
    rules: str        # declarations and rules
    terms: str        # both sides' terms and their shape facts
    goals: dict[str, tuple[str, str]]
    active: frozenset[str] | None
    dag: TermDag = field(repr=False)

    @property
    def text(self) -> str:
        return self.rules + "\n" + self.terms


_BASE: dict[str, object] = {}  # the e-graph holding every rule (no terms), reused through push/pop
CHUNK_CHARS = 1000  # egglog program text handed to one parse_program call (see _execute)


def _chunks(text: str, limit: int = CHUNK_CHARS) -> list[str]:
    """``text`` cut between top-level commands into pieces of about ``limit`` characters (a command longer
    than that is a piece of its own). Parentheses inside string literals (``(Un "gelu(tanh)" x)``) and
    ``;`` comments do not count."""
    out: list[str] = []
    depth, start, in_str, comment = 0, 0, False, False
    for i, ch in enumerate(text):
        if comment:
            comment = ch != "\n"
        elif in_str:
            in_str = ch != '"' or text[i - 1] == "\\"
        elif ch == '"':
            in_str = True
        elif ch == ";":
            comment = True
        elif ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
            if depth == 0 and i + 1 - start >= limit:
                out.append(text[start:i + 1])
                start = i + 1
    if text[start:].strip():
        out.append(text[start:])
    return out


def _execute(eg: bindings.EGraph, text: str) -> None:
    """Run the egglog program ``text`` a few commands at a time. egglog 13 keeps memory that grows with the
    size of each parsed program times its number of commands, for as long as the e-graph lives: the
    43k-character rule set parsed at once added 214-219 MiB to the process (0.60-0.70 s), in pieces of
    1,000 characters 9-14 MiB (0.06-0.07 s), of 8,000 42 MiB. The shared e-graph that every proof uses
    lives as long as the process (a model's start-up re-proves each cached search result against it)."""
    for piece in _chunks(text):
        eg.run_program(*eg.parse_program(piece))
_LOCK = threading.Lock()


@functools.lru_cache(maxsize=64)
def _rules_text(active: frozenset[str] | None) -> str:
    """The rulesets, analysis facts, rules (those named in ``active``, or all) and the staged schedule as egglog
    text. Cached: the rules are fixed data, and formatting them (each side parsed and printed) took ~0.09 s
    per proof, 6 % of a tiny Llama's start-up."""
    lines = [f"(ruleset {R.ANALYSIS})"] + [f"(ruleset {name})" for name in R.RULESETS]
    lines += [f.egglog(R.ANALYSIS) for f in R.FACTS]
    for rules in R.RULESETS.values():
        lines += [r.egglog() for r in rules if active is None or r.name in active]
    lines += [f"(unstable-combined-ruleset stage{i} {' '.join(sets)})" for i, sets in enumerate(STAGES)]
    return "\n".join(lines)


@functools.cache
def rules_fingerprint() -> str:
    """A hash of everything a proof depends on -- the term declarations, every rule, the staged schedule,
    the default limits and egglog's version -- for cache keys: a cached verdict is only as good as the
    verifier that gave it."""
    try:
        version = importlib.metadata.version("egglog")
    except importlib.metadata.PackageNotFoundError:
        version = "unknown"
    text = "\n".join([declarations(), _rules_text(None), repr(STAGES), repr(Limits()), version])
    return hashlib.sha256(text.encode()).hexdigest()[:24]


def build_program(candidate: Graph, reference: Graph, active: Collection[str] | None = None) -> _Program:
    """The egglog program (declarations, rules, both sides' terms) and the goal pairs per output."""
    missing = sorted(set(reference.output_names) - set(candidate.output_names))
    extra = sorted(set(candidate.output_names) - set(reference.output_names))
    if missing or extra:
        raise GraphError(f"candidate and reference outputs differ: missing {missing}, unexpected {extra}; "
                         "name the candidate's outputs like the reference's")
    ins_c, ins_r = candidate.inputs, reference.inputs
    if set(ins_c) != set(ins_r):
        raise GraphError(f"candidate inputs {sorted(ins_c)} differ from reference inputs {sorted(ins_r)}")
    for name, node in ins_r.items():  # an input is one tensor on both sides: its shape must be the same
        other = ins_c[name]
        if len(other.shape) != len(node.shape) or not all(
                D.structurally_equal(a, b) for a, b in zip(other.shape, node.shape)):
            raise GraphError(f"input {name!r} is {D.format_shape(other.shape)} in the candidate but "
                             f"{D.format_shape(node.shape)} in the reference; declare it with the same shape")
    dag, outs = translate({"a": candidate, "b": reference})
    goals = {name: (outs["a"][name].name, outs["b"][name].name) for name in reference.output_names}
    chosen = frozenset(active) if active is not None else None
    return _Program(declarations() + _rules_text(chosen), dag.egglog(), goals, chosen, dag)


def prove(candidate: Graph, reference: Graph, limits: Limits | None = None, *, explain: bool = False,
          active: Collection[str] | None = None) -> FormalResult:
    """Try to prove that ``candidate`` computes the same outputs as ``reference`` for every value of the
    symbols (batch sizes, grid sizes, for-loop ranges). ``active`` restricts the rewrite rules by name."""
    limits = limits or Limits()
    prog = build_program(candidate, reference, active)
    result = _run(prog, limits, record=explain)
    if explain and result.proved:
        result = replace(result, chain=_minimize(candidate, reference, limits, result.fired))
    return result


def _enodes(eg: bindings.EGraph) -> int:
    (out,) = eg.run_program(*eg.parse_program("(print-size)"))
    return sum(n for name, n in out.sizes if name in CONSTRUCTORS)


def _holds(eg: bindings.EGraph, a: str, b: str) -> bool:
    from egglog.bindings import EggSmolError
    try:
        eg.run_program(*eg.parse_program(f"(check (= {a} {b}))"))
    except EggSmolError:
        return False
    return True


def _run(prog: _Program, limits: Limits, record: bool) -> FormalResult:
    from egglog.bindings import EGraph  # imported here: egglog takes ~0.2 s to import

    t0 = time.perf_counter()
    if prog.active is not None:  # a rule subset (explanations): a fresh e-graph
        eg = EGraph()
        _execute(eg, prog.text)
        return _search(eg, prog, limits, record, t0)
    with _LOCK:  # the full rule set: reuse one e-graph with the rules parsed, adding the terms after a push
        eg = _BASE.get("egraph")  # type: ignore[assignment]
        if eg is None:
            eg = _BASE["egraph"] = _rules_egraph(prog)
        result = _pushed(eg, prog, limits, record, t0)
        if result.proved or result.stop == "saturated":
            return result
        # Stopped at a limit: try once more on a fresh e-graph, which then becomes the shared one. A proof's
        # course can depend on the proofs run before it on the shared e-graph (egglog's push/pop restores
        # the terms, not all of the matcher's state): a cached attention candidate that proves in 12
        # iterations and 132 e-nodes on a fresh e-graph hit the node limit (101,682 e-nodes, 28 iterations)
        # as the 52nd proof of a process, so every start-up re-searched its piece. Costs a second attempt
        # only for proofs that stop at a limit (the numeric pre-filter rejects most false candidates first).
        eg = _BASE["egraph"] = _rules_egraph(prog)
        again = _pushed(eg, prog, limits, record, time.perf_counter())
        return again if again.proved else result


def _rules_egraph(prog: _Program) -> bindings.EGraph:
    from egglog.bindings import EGraph
    eg = EGraph()
    _execute(eg, prog.rules)
    return eg


def _pushed(eg: bindings.EGraph, prog: _Program, limits: Limits, record: bool, t0: float) -> FormalResult:
    """``prog``'s proof on the rules e-graph ``eg``: its terms added after a push, removed by the pop."""
    eg.run_program(*eg.parse_program("(push)"))
    try:
        # the terms in one piece: their memory goes with the pop, and 1,000-character pieces made 40
        # cached-result proofs take 1.5 s instead of 0.9 s
        eg.run_program(*eg.parse_program(prog.terms))
        return _search(eg, prog, limits, record, t0)
    finally:
        eg.run_program(*eg.parse_program("(pop)"))


def _search(eg: bindings.EGraph, prog: _Program, limits: Limits, record: bool, t0: float) -> FormalResult:
    step = [eg.parse_program(f"(run-schedule (saturate (run {R.ANALYSIS})) (run stage{i}))")
            for i in range(len(STAGES))]
    fired: list[tuple[int, str, int]] = []
    stage, stop = 0, None
    it = 0
    done = {name: _holds(eg, a, b) for name, (a, b) in prog.goals.items()}
    nodes = _enodes(eg)
    while not all(done.values()):
        if it >= limits.iterations:
            stop = "iteration_limit"
            break
        if time.perf_counter() - t0 > limits.seconds:
            stop = "timeout"
            break
        if nodes > limits.nodes:
            stop = "node_limit"
            break
        while stage < len(STAGES) - 1 and it >= limits.stage_iterations[stage]:
            stage += 1
        (out,) = eg.run_program(*step[stage])
        it += 1
        report = out.report
        if record:
            fired += [(it, name, n) for name, n in sorted(report.num_matches_per_rule.items()) if n > 0]
        nodes = _enodes(eg)
        done = {name: ok or _holds(eg, *prog.goals[name]) for name, ok in done.items()}
        if not report.updated:
            if stage == len(STAGES) - 1:
                stop = "saturated"
                break
            stage += 1
    proved = all(done.values())
    stats = ProofStats(time.perf_counter() - t0, it, nodes)
    open_goals = sorted(name for name, ok in done.items() if not ok)
    message = f"outputs not proved: {open_goals}" if open_goals else ""
    return FormalResult(proved, "proved" if proved else stop or "saturated", stats, done, tuple(fired),
                        message=message)


def _minimize(candidate: Graph, reference: Graph, limits: Limits, fired: Iterable[tuple[int, str, int]]
              ) -> tuple[str, ...]:
    """A 1-minimal set of rules (greedy deletion among the rules that fired) that still proves the result."""
    first: dict[str, int] = {}
    for it, name, _ in fired:
        first.setdefault(name, it)
    analysis = {f.name for f in R.FACTS}
    keep = [n for n in first if n not in analysis]
    for name in sorted(keep, key=lambda n: -first[n]):
        trial = [n for n in keep if n != name]
        if _run(build_program(candidate, reference, trial), limits, record=False).proved:
            keep = trial
    return tuple(sorted(keep, key=lambda n: (first[n], n)))


__all__ = ["STAGES", "FormalResult", "Limits", "ProofStats", "StopReason", "build_program", "prove"]
