"""The verification gate every returned candidate passes.

When the verifier (``prism.verify``, issue 4) is importable, a candidate is accepted only if it proves
the candidate equal to the program (formal e-graph proof, plus its own numeric check). Until then the
gate is numeric only and says so (``how == "numeric-only"``): the candidate and the program run in
float64 through the reference interpreters at two or more small instantiations of every symbol (batch
dims, grid sizes, ``F``) that satisfy the candidate's divisibility constraints, on normal and on hostile
(x30) inputs, and must agree to a relative 1e-8 and stay finite.
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from prism.errors import PrismError, UnsupportedError
from prism.ir import dims as D
from prism.ir.graph import Graph
from prism.ir.node import toposort

RTOL = 1e-8
HOSTILE = 30.0
_PREFER = (2, 4, 3, 1, 8, 6)


@dataclass
class Verdict:
    ok: bool
    how: str                         # "formal+numeric" | "numeric-only"
    detail: str = ""
    instantiations: list[dict[str, int]] = field(default_factory=list)


def formal_verifier() -> Any | None:
    """``prism.verify``'s entry point if the verifier exists in this build, else None."""
    try:
        mod = importlib.import_module("prism.verify")
    except ImportError:
        return None
    fn = getattr(mod, "verify", None)
    return fn if callable(fn) else None


BIG_WORK = 1 << 30   # element operations (a matmul counts m*n*k) above which an instantiation is "big"


def work(program: Graph, env: Mapping[str, int]) -> int:
    """Element operations of one float64 run of ``program`` at ``env``: every node's output elements, times
    the contraction length for a matmul."""
    total = 0
    for n in program.nodes:
        elems = math.prod(int(D.evaluate(d, env)) for d in n.shape)
        if n.op == "matmul":
            elems *= int(D.evaluate(n.src[0].shape[-1], env))
        total += elems
    return total


def _shifted(x: Any) -> bool:
    """Whether ``x`` is ``a - b`` with a maximum among b's producers (``exp(x)`` then cannot overflow where
    ``a`` is what the maximum was taken of)."""
    if x.op != "sub":
        return False
    return any(n.op == "max" or (n.op == "acc" and n.arg and n.arg[0] == "max") for n in toposort([x.src[1]]))


def unshifted_exp(candidate: Graph, program: Graph) -> str | None:
    """Why ``candidate`` may overflow where ``program`` does not, or None: the program exponentiates only
    max-shifted values (``softmax``, or ``exp(x - max(x))`` written out) and the candidate exponentiates a value
    that is not shifted (``exp(s) / sum(exp(s))``: equal in exact arithmetic, so the proof holds, but inf / inf =
    NaN once a score passes ~88.7 in float32). The numeric checks do not show it at the sizes they run: with
    head dim 128 the hostile draw's scores stay below exp's range at a decode shape. Measured need: llama-1b
    bf16's decode attention had such a winner in the tuning cache; at a 141-token prefill two candidates of
    it failed their final check with NaN. The online-softmax accumulators (softmax_sum, softmax_matmul) keep
    their running maximum and are safe."""
    prog_nodes = list(program.nodes)
    if not any(n.op == "softmax" for n in prog_nodes) and not any(n.op == "exp" for n in prog_nodes):
        return None
    if any(n.op == "exp" and not _shifted(n.src[0]) for n in prog_nodes):
        return None   # the program itself exponentiates an unshifted value: its own range
    roots: list[Any] = list(candidate.nodes)
    for bg in candidate.customized_ops():
        roots.extend(bg.outputs)
    for n in toposort(roots):
        if n.op == "exp" and not _shifted(n.src[0]):
            return ("exponentiates a value not shifted by its maximum (exp(s) / sum(exp(s))), where the program "
                    "subtracts the maximum first: it overflows to inf / inf = NaN for scores above ~88")
    return None


def verify(candidate: Graph, program: Graph, seed: int = 0) -> Verdict:
    """The verifier's verdict (formal proof AND its numeric check) when it exists; the numeric-only gate
    otherwise, or when the verifier says it cannot model the candidate yet (then labelled so). A candidate
    that exponentiates values the program shifts by their maximum first is rejected outright
    (:func:`unshifted_exp`)."""
    unsafe = unshifted_exp(candidate, program)
    if unsafe is not None:
        return Verdict(False, "formal+numeric", f"numerically unsafe: {unsafe}")
    fn = formal_verifier()
    # the numeric checks run with the program's big fixed sizes made symbols, at small values of them
    # (prism.verify.numeric.generalized); the proof and the compiled kernel's final check at the real ones
    nc, nprog = generalized_pair(candidate, program)
    if fn is None:
        return numeric(nc, nprog, seed)
    envs = instantiations(nc, nprog, 1)
    if nc is not candidate and (not envs or work(nprog, {k: envs[0][k] for k in nprog.symbols()}) > BIG_WORK):
        nc, nprog = candidate, program   # no small values fit the candidate, or still big: the real sizes
        envs = instantiations(nc, nprog, 1)
    if nc is candidate and envs and work(program, {k: envs[0][k] for k in program.symbols()}) > BIG_WORK:
        return _verify_big(candidate, program, envs[0], seed)
    quick = numeric(nc, nprog, seed, count=1, scales=(1.0, HOSTILE), envs=envs)
    if not quick.ok:  # a cheap float64 pre-filter: most false candidates of the lax pruning die here
        quick.how = "formal+numeric"
        quick.detail = "rejected by the float64 pre-filter: " + quick.detail
        return quick
    disproof, proof = _not_proved(candidate, program)
    if disproof:
        return Verdict(False, "formal+numeric", disproof)
    try:
        # the proof just made is the verifier's (the same pair, its default limits): not made again. Measured
        # need: every verification proved its candidate twice; llama-1b int8w-g32-bf16's first generate() made
        # 156 proofs in 2.1 s (profiled) for 78 candidates
        r = fn(candidate, program, generalize=nc is not candidate, formal=proof)
    except UnsupportedError as e:
        v = numeric(nc, nprog, seed)
        v.detail = f"{v.detail} [formal verifier cannot model this candidate: {e}]"
        return v
    except PrismError as e:
        return Verdict(False, "formal+numeric", f"verifier error: {e}")
    ok = bool(r.verified)
    detail = f"formal: {str(r.formal).splitlines()[0]}; {str(r.numeric).splitlines()[0]}"
    envs = [dict(e) for e in getattr(r.numeric, "instantiations", ())]
    return Verdict(ok, "formal+numeric", detail, envs)


def _not_proved(candidate: Graph, program: Graph) -> tuple[str, Any]:
    """(why the proof does not cover ``candidate`` -- "" when it does, or when the verifier cannot model it: the
    caller's verification then says so --, the proof's result, None where it could not be made). Run before the
    numeric check, which cannot make an unproved candidate pass: measured need, llama-1b's grouped int8 Linear at
    128 rows had 10 candidates the e-graph saturates without proving, each numerically checked for 0.5-0.8 s (7 of
    its search's 13.5 s)."""
    from prism.verify.egraph import prove
    try:
        res = prove(candidate, program)
    except PrismError:   # UnsupportedError included: verify() below raises it again and the caller handles it
        return "", None
    return ("" if res.proved else f"formal: {str(res).splitlines()[0]} (no numeric check: it cannot change this)",
            res)


def _generalization(program: Graph) -> Any:
    """The program's big fixed sizes made symbols (:func:`prism.verify.numeric.generalization`), None when
    none can be or the verifier is not there."""
    try:
        from prism.verify.numeric import generalization
    except ImportError:
        return None
    return generalization(program, program)


def generalized_pair(candidate: Graph, program: Graph) -> tuple[Graph, Graph]:
    """The candidate and the program with their big fixed sizes made symbols when the verifier is there
    and both graphs stay consistent (:func:`prism.verify.numeric.generalized`), else the two as given."""
    try:
        from prism.verify.numeric import generalized
    except ImportError:
        return candidate, program
    gen = generalized(candidate, program)
    return (gen[0], gen[1]) if gen is not None else (candidate, program)


def _verify_big(candidate: Graph, program: Graph, env: dict[str, int], seed: int) -> Verdict:
    """The verifier at a big instantiation (fixed dims that no small instantiation can replace, e.g. a
    2048-cube matmul: three instantiations of three kinds took 8-13 s and up to 10 GB per candidate).
    The formal proof is the same; the numeric check runs once, normal inputs, at one instantiation, on the
    candidate's compiled code (the block-graph interpreter took seconds per candidate), with the draw and
    the float64 reference computed once per program and shared by every candidate, so its memory is the
    program's tensors plus one candidate run. The hostile and tiny kinds are checked on the
    compiled kernel at its real shape before it is returned (prism.superoptimize's final check)."""
    from prism.runtime.kernel import compile as compile_kernel
    from prism.verify.egraph import prove
    from prism.verify.numeric import compiled_runner, normal_reference, numeric_check
    try:
        formal = prove(candidate, program)
    except UnsupportedError as e:
        return Verdict(False, "formal+numeric", f"formal verifier cannot model this candidate at a big shape: {e}")
    except PrismError as e:
        return Verdict(False, "formal+numeric", f"verifier error: {e}")
    if not formal.proved:
        return Verdict(False, "formal+numeric", f"formal: {str(formal).splitlines()[0]}")
    draw, ref = normal_reference(program, env, seed)
    try:
        r = numeric_check(candidate, program, instantiations=[env], kinds=("normal",), seeds=(seed,),
                          draws={seed: draw}, normal_references={seed: ref},
                          runners=[compiled_runner(compile_kernel, name="compiled (big instantiation)")])
    except PrismError as e:   # e.g. the candidate does not compile at this instantiation
        return Verdict(False, "formal+numeric", f"formal: proved; numeric: {type(e).__name__}: {e}"[:500])
    detail = (f"formal: {str(formal).splitlines()[0]}; {str(r).splitlines()[0]} (big instantiation: normal inputs "
              "only; hostile and tiny inputs are checked on the compiled kernel at its shape)")
    return Verdict(bool(r.passed), "formal+numeric", detail, [dict(env)])


def instantiations(candidate: Graph, program: Graph, count: int = 2) -> list[dict[str, int]]:
    """``count`` distinct small values of every symbol of ``candidate`` that satisfy its constraints
    (batch dims and grid/loop sizes > 1 preferred so every split path runs)."""
    cons: list[D.Divisible] = []
    names: set[str] = set(program.symbols()) | set(candidate.symbols())
    for bg in candidate.customized_ops():
        cons.extend(bg.constraints)
        names |= bg.symbols() - bg.map_symbols()
    for n in program.inputs.values():  # full dims that a symbolic size must divide exactly
        for d in n.shape:
            names |= D.symbols(d)
    order = sorted(names)

    def tries() -> Iterator[dict[str, int]]:
        # drawn as they are needed: the first two serve most candidates, and drawing all 400 took 4 ms per
        # candidate (0.4 s of a one-row grouped Linear's search, 170 candidates pre-filtered)
        yield from (dict.fromkeys(order, v) for v in (2, 4))
        rng = np.random.default_rng(0)
        for _ in range(400):
            yield dict(zip(order, (int(x) for x in rng.choice(_PREFER, len(order)))))
    out: list[dict[str, int]] = []
    for env in tries():
        if any(env == o for o in out):
            continue
        if all(c.holds(env) is not False for c in cons) and _shapes_ok(candidate, env):
            out.append(env)
            if len(out) >= count:
                break
    return out


def _shapes_ok(g: Graph, env: Mapping[str, int]) -> bool:
    try:
        g.instantiate(env)
    except PrismError:
        return False
    return True


def same_nonfinite(o: np.ndarray, r: np.ndarray) -> bool:
    """NaN and ±inf exactly where the program's float64 value has them (a fully masked softmax row is NaN
    in the program; a candidate may not be non-finite anywhere else)."""
    return bool(np.array_equal(np.isnan(o), np.isnan(r)) and np.array_equal(np.isinf(o), np.isinf(r))
                and np.array_equal(o[np.isinf(o)], r[np.isinf(r)]))


def relative_error(o: np.ndarray, r: np.ndarray) -> float:
    """max |o - r| / max |r| over the finite values (0 when there are none)."""
    fin = np.isfinite(r)
    if not fin.any():
        return 0.0
    return float(np.max(np.abs(o[fin] - r[fin])) / max(float(np.max(np.abs(r[fin]))), 1e-300))


def numeric(candidate: Graph, program: Graph, seed: int = 0, count: int = 2,
            scales: tuple[float, ...] = (1.0, HOSTILE), envs: list[dict[str, int]] | None = None) -> Verdict:
    """The float64 gate at ``count`` instantiations (``envs``: ones the caller already chose)."""
    envs = instantiations(candidate, program, count) if envs is None else envs
    if len(envs) < count:
        return Verdict(False, "numeric-only", f"found only {len(envs)} instantiation(s) satisfying the constraints",
                       envs)
    # inputs exact in their dtypes (int8 integers, bfloat16 rounded): with plain float64 draws a cast the search
    # drops as exact (int8 -> bfloat16, search.program.identity_cast) rounded in the program and not in the
    # candidate, and no int8 weight-only Linear of a bfloat16 model passed
    from prism.verify.numeric import scaled_inputs, standard_normal_inputs
    worst = 0.0
    batch = set(program.symbols())
    dtypes = {k: n.dtype for k, n in program.inputs.items()}
    for env in envs:
        ins = standard_normal_inputs(program, env, seed)
        params = {k: v for k, v in env.items() if k not in batch}
        for scale in scales:
            x = scaled_inputs(ins, scale, dtypes)
            try:
                with np.errstate(all="ignore"):  # non-finite results are judged below, not warned about
                    ref = program.evaluate(x, dtype=np.float64)
                    got = candidate.evaluate(x, dtype=np.float64, params=params)
            except PrismError as e:
                return Verdict(False, "numeric-only", f"evaluation failed at {env}: {e}", envs)
            for name, r in ref.items():
                o = got[name]
                if o.shape != r.shape or not same_nonfinite(o, r):
                    return Verdict(False, "numeric-only", f"output {name!r} is non-finite where the program is not "
                                   f"(or the reverse), or has shape {o.shape} (expected {r.shape}) at {env}, "
                                   f"inputs x{scale:g}", envs)
                err = relative_error(o, r)
                worst = max(worst, err)
                if not err <= RTOL:
                    return Verdict(False, "numeric-only", f"output {name!r} differs by {err:.2e} (relative) at "
                                   f"{env}, inputs x{scale:g}", envs)
    return Verdict(True, "numeric-only", f"max relative error {worst:.1e} at {envs} (normal and x{HOSTILE:g} inputs)",
                   envs)


class UnsplitCheck:
    """Does a candidate compute the program with every grid size and for-loop range set to 1?

    An sGraph claims correctness for every value of its symbols, 1 included, and at 1 its maps split
    nothing: every structure that fails here is wrong under every map assignment. One float64 run per
    *structure* rejects what the lax abstract expressions let through (sizes, eps, reduction axes).
    The inputs and the program's output are computed once per search.
    """

    GENERAL_VALUE = 6   # the value of a generalized fixed size here (any value fits: nothing is split)

    def __init__(self, program: Graph, seed: int = 0) -> None:
        found = _generalization(program)   # the big fixed sizes made symbols, as in verify()
        for gen in ([found] if found is not None else []) + [None]:
            self.gen = gen
            sizes = gen.fixed if gen is not None else {}
            self.program = gen.apply(program) if gen is not None else program
            self.env = {**dict.fromkeys(sorted(program.symbols()), 2), **dict.fromkeys(sizes, self.GENERAL_VALUE)}
            # at a big fixed shape one float64 run per structure costs seconds and gigabytes (a 1 GB output:
            # the reference, the candidate and their difference in float64): the check is skipped there,
            # and the formal proof (milliseconds, run first by the big-shape verifier) rejects wrong ones
            self.big = work(self.program, self.env) > BIG_WORK
            if self.big:
                return
            from prism.verify.numeric import standard_normal_inputs  # exact in their dtypes, as in numeric()
            self.inputs = standard_normal_inputs(self.program, self.env, seed)
            try:
                with np.errstate(all="ignore"):
                    self.ref = self.program.evaluate(self.inputs, dtype=np.float64)
            except PrismError:
                if not sizes:
                    raise
                continue
            return

    def __call__(self, candidate: Graph) -> bool:
        if self.gen is not None:
            try:
                candidate = self.gen.apply(candidate)
            except PrismError:
                return True   # a pre-filter only: the gate verifies every candidate returned
        params = {s: 1 for bg in candidate.customized_ops() for s in bg.symbols() - bg.map_symbols()
                  if s not in self.env}
        try:
            with np.errstate(all="ignore"):
                got = candidate.evaluate(self.inputs, dtype=np.float64, params=params)
        except PrismError:
            return False
        for name, r in self.ref.items():
            o = got.get(name)
            if o is None or o.shape != r.shape or not same_nonfinite(o, r) or not relative_error(o, r) <= RTOL:
                return False
        return True
