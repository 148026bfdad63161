"""Search results shared by programs that differ only in their sizes.

A model's Linear layers are one program at several weight shapes (llama-1b: ``[2048, 2048]``, ``[512, 2048]``,
``[5632, 2048]``, ``[2048, 5632]``, ``[32000, 2048]``), and each shape was searched apart although every search
returned the same structures: from empty caches, llama-1b with int8 weights in groups of 32 spent 5-13 s per
grouped Linear shape in the search, 25 searches in an 85.9 s start-up against inductor's 39.1 s.

Two programs are of one *family* when their nodes are identical once every size that
:meth:`prism.Graph.generalize` replaces (input shapes, reshape shapes, split sizes) is a placeholder, except
sizes of 1 (they broadcast). A program searched before (the *donor*) serves another of its family when the
donor's size at each place determines the other's (:func:`size_map`: ``[5632, 2048]`` serves ``[512, 2048]``
and ``[2048, 2048]``; ``[2048, 2048]`` cannot serve ``[512, 2048]``, where one of its sizes would become two).
A candidate of the donor becomes one of the other program by :meth:`prism.Graph.generalize` with that
substitution of values: input shapes, reshape sizes and block-graph inputs replaced, every tile and constraint
derived again (a candidate whose own sizes only coincide with the program's becomes inconsistent and is
dropped). The driver then verifies every transferred candidate against the new program like a candidate of its
own search (formal proof and numeric check): nothing is served on the strength of the first program's proof.

What a transfer does not give: the new program's own ranking (the candidates keep the first program's order
and cost reports; each shape is still ranked and measured by the tuner) and structures the first program's
search pruned by its sizes. ``PRISM_SEARCH_TRANSFER=0`` turns it off.
"""

from __future__ import annotations

import json
import os

from prism.errors import PrismError
from prism.ir import ops as O
from prism.ir.dims import DimLike
from prism.ir.graph import Graph
from prism.ir.node import toposort
from prism.ir.serialize import encode

# Sizes up to this stay literal in the family: a size of 1 broadcasts, any other is a placeholder.
FAMILY_MIN = 1


def enabled() -> bool:
    """Whether searches may be answered by transfer (``PRISM_SEARCH_TRANSFER=0`` turns it off)."""
    return os.environ.get("PRISM_SEARCH_TRANSFER", "1").strip().lower() not in ("0", "off", "false", "no")


def family(graph: Graph) -> tuple[str, list[int]]:
    """``(the family's canonical text, the graph's sizes at their places in it)``: the graph's nodes with every
    size above FAMILY_MIN that :meth:`prism.Graph.generalize` would replace (input shapes, the size attributes of
    operators: reshape shapes, split sizes) made a placeholder. Everything else stays as it is: axes, symbolic
    dims, constants, operators' other attributes (RoPE's ``half``), block graphs."""
    sizes: list[int] = []

    def size(d: DimLike) -> DimLike:
        if isinstance(d, int) and not isinstance(d, bool) and d > FAMILY_MIN:
            sizes.append(d)
            return "#"
        return d

    nodes = list(toposort(tuple(graph.outputs)))
    nodes += [n for n in graph.inputs.values() if n not in set(nodes)]
    ids = {n: i for i, n in enumerate(nodes)}
    rows = []
    for n in nodes:
        arg = O.map_sizes(O.get(n.op), n.arg, size) if n.op in O.OPS else n.arg
        rows.append([n.op, [ids[x] for x in n.src], encode(arg)])
    return json.dumps({"inputs": [ids[n] for n in graph.inputs.values()], "outputs": [ids[n] for n in graph.outputs],
                       "nodes": rows}, sort_keys=True, separators=(",", ":")), sizes


def size_map(donor: Graph, graph: Graph) -> dict[int, int] | None:
    """The substitution of values that turns ``donor``'s sizes into ``graph``'s (empty where they are the same),
    None when the two are not of one family or a size of the donor would have to become two."""
    fd, vd = family(donor)
    fg, vg = family(graph)
    if fd != fg:
        return None
    out: dict[int, int] = {}
    for a, b in zip(vd, vg):
        if out.setdefault(a, b) != b:
            return None
    return {a: b for a, b in out.items() if a != b}


def transferred(candidate: Graph, sizes: dict[int, int]) -> Graph | None:
    """``candidate`` at the new sizes, or None where it becomes inconsistent there."""
    try:
        return candidate.generalize(sizes)
    except PrismError:
        return None
