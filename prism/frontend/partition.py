"""Cutting the supported part of a captured graph into *pieces*: sub-programs one search can handle.

The maximal connected region of supported operators of a whole model (a decoder layer) is far larger
than what one search explores in seconds, so it is cut. Input: the captured *units* (one per FX node,
or one per recognized pattern such as a written-out RMSNorm) in topological order. Rules:

* Only **compute** units (contractions, element-wise, reductions, row-wise ops, attention) form pieces.
  **Layout** units (view, transpose, cat, split, slicing, ...) run in PyTorch, where they are views or
  copies that a piece could not fuse anyway; they end pieces.
* Every piece has **one output** (the search handles single-output programs far better): a unit joins
  a consumer's piece only when *all* its users are in that piece.
* Producer first: units are visited in topological order and a piece is merged into the piece of its
  consumers when the union stays within the :class:`Budget` (distinct inputs, operators, matmuls). The
  defaults follow the search's own limits (``prism.search.Limits``: 4 block inputs, 8 block operators)
  and two contractions per kernel, what a one-kernel search covers in seconds. A piece without a
  contraction (element-wise chains, row reductions, norms, losses) may have twice the operators: without a
  product the search's space stays small (measured: a Huber loss of 11 operators, a KL divergence of
  two log-softmaxes of 16, each one block in 0.1 s of search), and cutting such a chain costs a pass
  over memory per cut (the Huber loss as three pieces recomputed ``a - b`` three times: 53 µs against
  ``torch.compile``'s 24). The compiler searches such a wide piece with the search's block limit raised
  to its size and, should that find nothing, plans its operators again within ``max_ops``.
* A contraction is not merged into a piece that normalizes rows (RMSNorm): ``linear -> add -> rms_norm``
  (a decoder's residual stream into the next norm) hit the search's time limit with 600k block states at
  hidden sizes 64 and 2048, in float32 and bfloat16, while ``linear+add`` and ``rms_norm+mul+...`` search in
  seconds each (a norm *feeding* contractions, W1/W2, stays one piece).
* A piece is sent to the search if it has a contraction, a reduction or a row-wise operator, or at least
  two operators; a lone element-wise operator is already one pass in PyTorch and stays there (the compiler
  searches one that sits between pieces at a decode step's sizes, so that their chain is not cut:
  ``compiler._between_pieces``).

Single-output pieces cannot form cycles: a piece's only output feeds only the piece it joins.
Nothing here imports torch; ``plan`` works on plain ids.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Budget:
    """Upper bounds on one piece (see the module docstring for where the defaults come from)."""

    max_inputs: int = 4
    max_ops: int = 8
    max_matmuls: int = 2
    max_ops_no_matmul: int = 16   # a piece without a contraction (module docstring)

    def max_ops_for(self, matmuls: int) -> int:
        """The operator bound of a piece with ``matmuls`` contractions."""
        return self.max_ops if matmuls else max(self.max_ops, self.max_ops_no_matmul)


@dataclass(frozen=True)
class PlanUnit:
    """What the planner needs to know of a unit: its kind, the values it reads and its size."""

    id: int
    kind: str                     # "compute" | "layout"
    srcs: tuple[Hashable, ...]    # values read: other units' ids or keys of external values
    ops: int = 1                  # Prism operators it expands to (reshapes not counted)
    matmuls: int = 0
    heavy: bool = False           # a contraction, reduction or row-wise operator
    norm: bool = False            # an RMS normalization
    alone: bool = False           # a piece of its own (nothing joins it, it joins nothing)


@dataclass
class Piece:
    members: list[int]            # unit ids, topological order
    output: int                   # the unit whose value leaves the piece
    inputs: list[Hashable] = field(default_factory=list)
    ops: int = 0
    matmuls: int = 0
    searched: bool = True         # False: too small to be worth a search (stays in PyTorch)


def _inputs(members: Sequence[int], units: Mapping[int, PlanUnit]) -> list[Hashable]:
    inside = set(members)
    out: list[Hashable] = []
    for m in members:
        for s in units[m].srcs:
            if s not in inside and s not in out:
                out.append(s)
    return out


def plan(units: Sequence[PlanUnit], users: Mapping[int, Sequence[Hashable]], budget: Budget | None = None
         ) -> list[Piece]:
    """Pieces of the compute units of ``units`` (topological order). ``users[u]``: every consumer of unit
    ``u``'s value — unit ids, or any other key for consumers outside the units (graph outputs, layout or
    unsupported operators)."""
    budget = budget or Budget()
    by_id = {u.id: u for u in units}
    order = {u.id: i for i, u in enumerate(units)}
    compute = [u.id for u in units if u.kind == "compute"]
    piece_of: dict[int, int] = {u: u for u in compute}
    members: dict[int, list[int]] = {u: [u] for u in compute}
    output: dict[int, int] = {u: u for u in compute}

    def fits(ms: list[int]) -> bool:
        mm = sum(by_id[m].matmuls for m in ms)
        return (len(_inputs(ms, by_id)) <= budget.max_inputs
                and sum(by_id[m].ops for m in ms) <= budget.max_ops_for(mm)
                and mm <= budget.max_matmuls)

    changed = True
    while changed:
        changed = False
        for uid in compute:
            p = piece_of[uid]
            if output[p] != uid:
                continue
            cons = list(users.get(uid, ()))
            if not cons or any(c not in piece_of for c in cons):
                continue
            targets = {piece_of[c] for c in cons}
            if len(targets) != 1:
                continue
            (c,) = targets
            merged = sorted(members[p] + members[c], key=order.__getitem__)
            if not fits(merged) or (any(by_id[m].matmuls for m in members[p])
                                    and any(by_id[m].norm for m in members[c])) \
                    or any(by_id[m].alone for m in merged):
                continue
            for m in members[p]:
                piece_of[m] = c
            members[c] = merged
            del members[p], output[p]
            changed = True
    pieces = []
    for p, ms in sorted(members.items(), key=lambda kv: order[output[kv[0]]]):
        ops = sum(by_id[m].ops for m in ms)
        mm = sum(by_id[m].matmuls for m in ms)
        searched = any(by_id[m].heavy for m in ms) or ops >= 2
        pieces.append(Piece(ms, output[p], _inputs(ms, by_id), ops, mm, searched))
    return pieces
