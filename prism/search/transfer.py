"""Search results shared by programs that differ only in their sizes.

A model's Linear layers are one program at several weight shapes (llama-1b: ``[2048, 2048]``, ``[512, 2048]``,
``[5632, 2048]``, ``[2048, 5632]``, ``[32000, 2048]``), and each shape was searched apart although every search
returned the same structures: from empty caches, llama-1b with int8 weights in groups of 32 spent 5-13 s per
grouped Linear shape in the search, 25 searches in an 85.9 s start-up against inductor's 39.1 s.

Two programs are of one *family* when their nodes are identical once every size that
:meth:`prism.Graph.generalize` replaces (input shapes, reshape shapes, split sizes) is a placeholder, except
sizes of 1 (they broadcast). A program searched before (the *donor*) serves any other of its family:
:func:`size_map` gives each size of the donor the program's sizes at its places -- one where the donor's pattern
of equal sizes is as fine as the program's (``[5632, 2048]`` serving ``[512, 2048]`` or ``[2048, 2048]``),
several where one size of the donor stands for two (``[2048, 2048]`` serving ``[512, 2048]``). A candidate of the
donor is rebuilt on the program's inputs (:func:`transferred`): block graphs take their operands' new shapes,
every tile and constraint derived again, and each operator's sizes (a reshape's shape) their images, where a size
has several the first that keeps the graph consistent (the weight's ``[2048, 64, 32]`` becomes ``[512, 64, 32]``:
its element count decides). The driver then verifies every transferred candidate against the new program like a
candidate of its own search (formal proof and numeric check): nothing is served on the strength of the donor's
proof, and a candidate whose own sizes only coincide with the program's fails there and is dropped.

A program with a size of 1 where a donor has more (a decode step's one row against a prompt's 128) is of the
donor's *wide family* (:func:`family` with ``wide=True``: sizes of 1 are placeholders too) and is served by it
only in that direction (:func:`narrows`): a structure for many rows, taken at one row, keeps every structure
that does not split the rows; one found for one row may lack the row tiling a bigger program needs. Measured
need: the LM head at one row (``logits_to_keep=1``) and every decode-step Linear were a family of their own,
searched apart from the prompt's (3.6-5.4 s of llama-1b int8w-g32's start-up).

What a transfer does not give: the new program's own ranking (the candidates keep the first program's order
and cost reports; each shape is still ranked and measured by the tuner) and structures the first program's
search pruned by its sizes. ``PRISM_SEARCH_TRANSFER=0`` turns it off.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping

from prism.errors import PrismError
from prism.ir import ops as O
from prism.ir.dims import DimLike, structurally_equal
from prism.ir.graph import Graph
from prism.ir.node import toposort
from prism.ir.serialize import encode

# Sizes up to this stay literal in the family: a size of 1 broadcasts, any other is a placeholder.
FAMILY_MIN = 1


Family = tuple[str, list[DimLike]]   # (canonical text, sizes at their places): family()


def enabled() -> bool:
    """Whether searches may be answered by transfer (``PRISM_SEARCH_TRANSFER=0`` turns it off)."""
    return os.environ.get("PRISM_SEARCH_TRANSFER", "1").strip().lower() not in ("0", "off", "false", "no")


def family(graph: Graph, wide: bool = False, symbols: bool = False) -> Family:
    """``(the family's canonical text, the graph's sizes at their places in it)``: the graph's nodes with every
    size above FAMILY_MIN that :meth:`prism.Graph.generalize` would replace (input shapes, the size attributes of
    operators: reshape shapes, split sizes) made a placeholder. Everything else stays as it is: axes, symbolic
    dims, constants, operators' other attributes (RoPE's ``half``), block graphs. ``wide``: sizes of 1 are
    placeholders too (the wide family; served only as :func:`narrows` allows). ``symbols``: symbolic dims are
    placeholders too (a symbolic program's *fixed family*: the programs at fixed sizes it generalizes)."""
    sizes: list[DimLike] = []
    least = 0 if wide else FAMILY_MIN

    def size(d: DimLike) -> DimLike:
        if (isinstance(d, int) and not isinstance(d, bool) and d > least) or (symbols and not isinstance(d, int)):
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


def size_map(donor: Family, program: Family) -> dict[int, tuple[DimLike, ...]] | None:
    """Each size of the donor with the program's sizes at its places (:func:`family` of each; in order of first
    occurrence; one where the donor's pattern of equal sizes is as fine as the program's, several where one of the
    donor's sizes stands for two of the program's), None when the two are not of one family."""
    fd, vd = donor
    fg, vg = program
    if fd != fg:
        return None
    out: dict[int, list[DimLike]] = {}
    for a, b in zip(vd, vg):
        if not isinstance(a, int):   # a donor's own symbols have no image (fixed families: donors at fixed sizes)
            return None
        images = out.setdefault(a, [])
        if not any(structurally_equal(b, x) for x in images):   # (a symbol's == with a number is undecided)
            images.append(b)
    return {a: tuple(b) for a, b in out.items()}


def narrows(sizes: Mapping[int, tuple[int, ...]]) -> bool:
    """Whether a wide family's size map (:func:`size_map` of two ``family(..., wide=True)``) takes the donor to
    the program only by narrowing sizes to 1: every donor size of 1 stays 1 (a donor with a broadcast axis is not
    widened), and some size above 1 becomes 1 (otherwise the two are of one plain family)."""
    return all(images == (1,) for size, images in sizes.items() if size == 1) and any(
        1 in images for size, images in sizes.items() if size > 1)


def transferred(candidate: Graph, sizes: Mapping[int, tuple[int, ...]], inputs: Mapping[str, tuple[DimLike, ...]]
                ) -> Graph | None:
    """``candidate`` rebuilt on inputs of the shapes ``inputs`` (the program's): each operator's sizes take
    their images under ``sizes`` (:func:`size_map`; where a size has several, the first that keeps the graph
    consistent: a reshape's element count, a split's parts; ``Graph.generalize``'s ``images``), block graphs
    their operands' new shapes, every tile and constraint derived again. None where no choice is consistent."""
    if any(name not in inputs for name in candidate.inputs):
        return None
    axes = {(name, i): d for name in candidate.inputs for i, d in enumerate(inputs[name])}
    try:
        return candidate.generalize({}, axes, images=sizes)
    except PrismError:
        return None
