"""Text form of kernel and block graphs (what ``print(graph)`` and ``explain()`` show)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from prism.ir import ops as O
from prism.ir.dims import format_dim, format_shape
from prism.ir.node import Node, toposort

if TYPE_CHECKING:
    from prism.ir.block import BlockGraph
    from prism.ir.graph import Graph


def _fmt_arg(v: object) -> str:
    if isinstance(v, tuple):
        return "(" + ", ".join(_fmt_arg(x) for x in v) + ("," if len(v) == 1 else "") + ")"
    if isinstance(v, float):
        return repr(v)
    return format_dim(v) if not isinstance(v, str) else repr(v)  # type: ignore[arg-type]


def _map(m: tuple) -> str:
    return "(" + ", ".join("_" if e is None else repr(e) for e in m) + ("," if len(m) == 1 else "") + ")"


def format_block_graph(bg: BlockGraph, indent: str = "") -> str:
    lines = [f"{indent}block_graph grid={_fmt_arg(bg.grid)} forloop={format_dim(bg.forloop)}"]
    names: dict[Node, str] = {}
    for n in toposort(bg.outputs):
        nm = f"t{len(names)}"
        names[n] = nm
        ph = bg.phase.get(n, "?")
        srcs = ", ".join(names[s] for s in n.src)
        if n.op == "iter":
            idx, im, fm = n.arg
            spec = bg.inputs[idx]
            rhs = f"iter in{idx}{'(' + spec.name + ')' if spec.name else ''} imap={_map(im)} " \
                  f"fmap={'_' if fm is None else fm}"
        elif n.op == "acc":
            kind, params = n.arg
            rhs = f"acc.{kind}({srcs}{''.join(f', {p}' for p in params)})"
        elif n.op == "save":
            k, om, fm = n.arg
            rhs = f"save out{k} <- {srcs} omap={_map(om)} fmap={'_' if fm is None else fm} " \
                  f"-> {format_shape(bg.output_shapes[k])}"
        else:
            attrs = O.attrs_dict(O.OPS[n.op], n.arg)
            rhs = f"{n.op}({srcs}{''.join(f', {k}={_fmt_arg(v)}' for k, v in attrs.items())})"
        lines.append(f"{indent}  {nm:>4} = {rhs:<60} {format_shape(n.shape)} [{ph}]")
    if bg.constraints:
        lines.append(f"{indent}  constraints: " + "; ".join(str(c) for c in bg.constraints))
    return "\n".join(lines)


def format_graph(g: Graph) -> str:
    lines = [f"graph {g.name or ''}".rstrip()]
    names: dict[Node, str] = {}
    for n in g.nodes:
        nm = f"%{len(names)}"
        names[n] = nm
        srcs = ", ".join(names[s] for s in n.src)
        if n.op == "input":
            lines.append(f"  {nm} = input {n.arg[0]!r} {format_shape(n.shape)} {n.dtype}")
        elif n.op == "output":
            lines.append(f"  output {n.arg[0]!r} = {srcs}")
        elif n.op == "customized":
            lines.append(f"  {nm} = customized({srcs})")
            lines.append(format_block_graph(n.arg[0], indent="    "))
        else:
            attrs = O.attrs_dict(O.OPS[n.op], n.arg)
            a = "".join(f", {k}={_fmt_arg(v)}" for k, v in attrs.items())
            lines.append(f"  {nm} = {n.op}({srcs}{a}) {format_shape(n.shape)} {n.dtype}")
    return "\n".join(lines)
