"""``prism.verify``: a candidate is verified only when the e-graph proof and the numeric check both pass."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from prism.errors import InputError, PrismError
from prism.ir.graph import Graph
from prism.verify.egraph import FormalResult, Limits, prove
from prism.verify.numeric import KINDS, SEEDS, NumericResult, Runner, choose_instantiations, generalized, numeric_check


@dataclass(frozen=True)
class VerifyResult:
    formal: FormalResult
    numeric: NumericResult

    @property
    def verified(self) -> bool:
        return self.formal.proved and self.numeric.passed

    def __str__(self) -> str:
        verdict = "VERIFIED" if self.verified else "NOT VERIFIED"
        return f"{verdict}\n  formal: {self.formal}\n  {self.numeric}"


def verify(candidate: Graph, reference: Graph, *, limits: Limits | None = None, explain: bool = False,
           instantiations: Sequence[Mapping[str, int]] | None = None, n_instantiations: int = 3,
           kinds: Sequence[str] = KINDS,
           seeds: Sequence[int] = SEEDS, runners: Sequence[Runner] | None = None,
           hostile_input: str | Sequence[str] | None = None, generalize: bool = False,
           formal: FormalResult | None = None) -> VerifyResult:
    """Check that ``candidate`` computes ``reference``: an e-graph proof for every value of the symbols
    (grid sizes, for-loop ranges, batch dims) and numeric testing at small instantiations.

    ``explain=True`` also reports the rules the proof needs; ``runners`` adds ways to run the candidate
    (e.g. ``compiled_runner(prism.compile)``); ``hostile_input`` names the input(s) scaled for hostile and tiny
    runs (default: every input in turn). See :func:`~prism.verify.numeric.numeric_check`.
    ``generalize=True``: the numeric check runs on both graphs with their big fixed sizes made symbols
    (:func:`~prism.verify.numeric.generalized`), at small values of them (the search's gate: a check at a
    [32000, 2048] weight's real size costs seconds per run); the proof stays at the real sizes. Ignored with
    ``instantiations`` or ``runners`` given (they are of the real sizes). ``formal``: the proof of this very pair
    made already (``prove(candidate, reference)`` with the default limits; the search's gate proves first, to skip
    the numeric check of a candidate that cannot pass), used instead of proving again (not with ``limits`` or
    ``explain``).
    Raises :class:`~prism.errors.UnsupportedError` for constructs the formal verifier does not model yet.
    """
    for what, g in (("candidate", candidate), ("reference", reference)):
        if not isinstance(g, Graph):
            raise InputError(f"prism.verify: the {what} must be a prism.Graph, got {type(g).__name__} ({g!r:.60}); "
                             "build it with prism.Graph() or load it with prism.ir.serialize.graph_from_json")
    if formal is not None and (limits is not None or explain):
        raise InputError("prism.verify: formal= is a proof made with the default limits and no explanation; "
                         "leave it out to prove with limits= or explain=")
    if formal is None:
        formal = prove(candidate, reference, limits, explain=explain)
    gen = generalized(candidate, reference) if generalize and instantiations is None and runners is None else None
    if gen is not None:
        try:
            envs = choose_instantiations(gen[0], gen[1], n_instantiations, sizes=gen[2])
        except PrismError:   # no small values satisfy the candidate's constraints: check at the real sizes
            envs = None
        if envs is not None:
            candidate, reference, instantiations = gen[0], gen[1], envs
    numeric = numeric_check(candidate, reference, instantiations=instantiations, n_instantiations=n_instantiations,
                            kinds=kinds, seeds=seeds, runners=runners, hostile_input=hostile_input)
    return VerifyResult(formal, numeric)
