"""The well-formedness checker.

Invariants of a kernel graph (each violation raises GraphError naming the node and printing the IR
around it):

1. it has at least one output, and output names are unique;
2. every node reachable from the outputs is an input declared in this graph or an operator whose
   shape and dtype equal what its rule infers from its operands (nothing stale or hand-forged);
3. every customized operator's block graph has 1-3 grid dims, a for-loop range >= 1, at least one
   saver, maps within range, phases consistent with the structural rules (accumulators take no
   post-loop values, loop values are saved only with an fmap, no value mixes loop and post-loop
   operands), and every concrete division exact;
4. the graph serializes and reloads to the same structural key.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from prism.errors import GraphError
from prism.ir import ops as O
from prism.ir.block import BlockGraph, _rebuild
from prism.ir.dims import structurally_equal
from prism.ir.node import Node

if TYPE_CHECKING:
    from prism.ir.graph import Graph


def _context(g: Graph, bad: Node) -> str:
    text = str(g).splitlines()
    return "\n".join(text[:40]) + ("\n  ..." if len(text) > 40 else "")


def check_block_graph(bg: BlockGraph) -> None:
    """Re-derive the block graph through the builder (which enforces invariant 3) and compare."""
    again = _rebuild(bg, {})
    if again != bg:
        raise GraphError(f"block graph does not re-derive to itself (stale shapes or phases):\n{bg}")


def check_graph(g: Graph) -> None:
    if not g.outputs:
        raise GraphError("the graph has no outputs; mark results with g.output(tensor)")
    names = g.output_names
    if len(set(names)) != len(names):
        raise GraphError(f"duplicate output names {names}")
    declared = set(g.inputs.values())
    for n in g.nodes:
        if n.op == "input":
            if n not in declared:
                raise GraphError(f"input {n.arg[0]!r} {n.describe()} is not declared in this graph "
                                 f"(a foreign tensor):\n{_context(g, n)}")
            continue
        if n.op in ("output", "result"):
            continue
        if n.op == "customized":
            check_block_graph(n.arg[0])
            continue
        shape, dtype = O.infer(O.get(n.op), tuple(s.shape for s in n.src), tuple(s.dtype for s in n.src), n.arg)
        if len(shape) != len(n.shape) or not all(structurally_equal(a, b) for a, b in zip(shape, n.shape)) \
                or dtype != n.dtype:
            raise GraphError(f"node {n.describe()} disagrees with its rule ({shape}, {dtype}):\n{_context(g, n)}")
    from prism.ir.serialize import graph_from_json, graph_to_json
    if graph_from_json(graph_to_json(g)).key != g.key:
        raise GraphError("graph does not survive a serialization round trip")
