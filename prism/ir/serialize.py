"""JSON form of kernel graphs (with their block graphs): the basis of structural keys and caches.

Loading replays every node through the builders, so a loaded graph is checked exactly like a built
one (shape rules, maps, phases); a node list with a cycle or a dangling reference is rejected.
"""

from __future__ import annotations

import json
from fractions import Fraction
from typing import Any

from prism.errors import GraphError
from prism.ir import dims as D
from prism.ir.block import ACCUMULATORS, BlockBuilder, BlockGraph, InputSpec, MapVar
from prism.ir.builder import Tensor
from prism.ir.dtypes import DType, as_dtype
from prism.ir.node import Node, toposort

FORMAT = "prism-graph/1"


def _enc(v: Any) -> Any:
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    if isinstance(v, Fraction):
        return {"frac": [v.numerator, v.denominator]}
    if isinstance(v, tuple):
        return {"t": [_enc(x) for x in v]}
    if isinstance(v, D.Dim):
        return {"dim": _enc(v.terms)}
    if isinstance(v, MapVar):
        return {"mv": v.name}
    if isinstance(v, DType):
        return {"dtype": v.name}
    if isinstance(v, BlockGraph):
        return {"bg": _enc_bg(v)}
    raise TypeError(f"cannot serialize {type(v).__name__}: {v!r}")


def encode(v: Any) -> Any:
    """A node argument as JSON-able data (as graph files store it)."""
    return _enc(v)


def _dec(v: Any) -> Any:
    if isinstance(v, dict):
        if "t" in v:
            return tuple(_dec(x) for x in v["t"])
        if "frac" in v:
            return Fraction(*v["frac"])
        if "dim" in v:
            return D.Dim(_dec(v["dim"]))
        if "mv" in v:
            return MapVar(v["mv"])
        if "dtype" in v:
            return as_dtype(v["dtype"])
        if "bg" in v:
            return _dec_bg(v["bg"])
        raise GraphError(f"unknown encoded value {v!r}")
    if isinstance(v, list):
        return [_dec(x) for x in v]
    return v


def _enc_nodes(roots: tuple[Node, ...]) -> tuple[list[dict], dict[Node, int]]:
    ids: dict[Node, int] = {}
    out = []
    for n in toposort(roots):
        ids[n] = len(out)
        out.append({"op": n.op, "src": [ids[s] for s in n.src], "arg": _enc(n.arg)})
    return out, ids


def _enc_bg(bg: BlockGraph) -> dict:
    nodes, ids = _enc_nodes(bg.outputs)
    return {"grid": [_enc(g) for g in bg.grid], "forloop": _enc(bg.forloop),
            "inputs": [[_enc(s.shape), s.dtype.name, s.name] for s in bg.inputs],
            "nodes": nodes, "outputs": [ids[o] for o in bg.outputs], "splits": sorted(bg.splits)}


def _order(nodes: list[dict]) -> list[int]:
    """A topological order of the node list; GraphError naming the cycle or the dangling reference."""
    state = [0] * len(nodes)  # 0 new, 1 on stack, 2 done
    order: list[int] = []
    for root in range(len(nodes)):
        stack = [(root, 0)]
        path: list[int] = []
        while stack:
            i, k = stack.pop()
            if k == 0:
                if state[i] == 2:
                    continue
                if state[i] == 1:
                    raise GraphError(f"graph has a cycle through nodes {path[path.index(i):] + [i]} "
                                     f"({' -> '.join(nodes[j]['op'] for j in path[path.index(i):] + [i])})")
                state[i] = 1
                path.append(i)
            srcs = nodes[i]["src"]
            if k < len(srcs):
                stack.append((i, k + 1))
                s = srcs[k]
                if not isinstance(s, int) or not 0 <= s < len(nodes):
                    raise GraphError(f"node {i} ({nodes[i]['op']}) refers to missing node {s}")
                if state[s] == 1:
                    raise GraphError(f"graph has a cycle through nodes {path[path.index(s):] + [s]} "
                                     f"({' -> '.join(nodes[j]['op'] for j in path[path.index(s):] + [s])})")
                if state[s] == 0:
                    stack.append((s, 0))
            else:
                state[i] = 2
                path.pop()
                order.append(i)
    return order


def _dec_bg(d: dict) -> BlockGraph:
    bb = BlockBuilder([_dec(g) for g in d["grid"]], _dec(d["forloop"]),
                      [InputSpec(_dec(s), as_dtype(dt), nm) for s, dt, nm in d["inputs"]], d.get("splits", ()))
    nodes = d["nodes"]
    built: dict[int, Tensor] = {}
    for i in _order(nodes):
        n = nodes[i]
        op, arg, src = n["op"], _dec(n["arg"]), [built[s] for s in n["src"]]
        if op == "iter":
            built[i] = bb.iter(*arg)
        elif op == "acc":
            kind, vals = arg
            built[i] = bb.accumulate(kind, *src, **dict(zip(ACCUMULATORS[kind].params, vals)))
        elif op == "save":
            _, om, fm = arg
            bb.save(src[0], om, fm)
        else:
            built[i] = bb._apply(op, src, arg)
    return bb.build()


def graph_to_json(g: Any, indent: int | None = 1) -> str:
    nodes, ids = _enc_nodes(tuple(g.outputs))
    unused = [n for n in g.inputs.values() if n not in ids]
    for n in unused:
        ids[n] = len(nodes)
        nodes.append({"op": n.op, "src": [], "arg": _enc(n.arg)})
    doc = {"format": FORMAT, "name": g.name, "inputs": [ids[n] for n in g.inputs.values()],
           "outputs": [ids[o] for o in g.outputs], "nodes": nodes}
    return json.dumps(doc, indent=indent, sort_keys=True)


def graph_from_json(text: str) -> Any:
    from prism.ir.graph import Graph
    doc = json.loads(text)
    if doc.get("format") != FORMAT:
        raise GraphError(f"not a Prism graph (format {doc.get('format')!r}, expected {FORMAT!r})")
    nodes = doc["nodes"]
    g = Graph(doc.get("name", ""))
    built: dict[int, Any] = {}
    # inputs first, in declaration order, so the graph's input order survives the round trip
    for i in doc["inputs"]:
        name, shape, dt = _dec(nodes[i]["arg"])
        built[i] = g.input(name, shape, dt)
    for i in _order(nodes):
        if i in built:
            continue
        n = nodes[i]
        op, arg, src = n["op"], _dec(n["arg"]), [built[s] for s in n["src"]]
        if op == "input":
            raise GraphError(f"node {i} is an input not listed in 'inputs'")
        if op == "output":
            continue  # added below, in the declared order
        if op == "customized":
            built[i] = g.customized(arg[0], src)
        elif op == "result":
            built[i] = src[0][arg[0]]
        else:
            built[i] = g._apply(op, src, arg)
    for i in doc["outputs"]:
        n = nodes[i]
        if n["op"] != "output":
            raise GraphError(f"output entry {i} is a {n['op']} node, not an output")
        g.output(built[n["src"][0]], _dec(n["arg"])[0])
    return g
