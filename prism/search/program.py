"""The program as search sees it: boundary layout operators peeled off, casts to float32 dropped.

A ``reshape`` applied directly to a program input (and its only use), or producing a program
output, moves no data that a fused kernel could save (a contiguous reshape is a view) and is invisible
to abstract expressions. Search works on the *core* between them and re-attaches them around every
result, so they neither cost kernel operators nor multiply the space. Nothing here depends on which
program it is.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from prism.errors import UnsupportedError
from prism.ir import dims as D
from prism.ir.builder import Tensor
from prism.ir.graph import Graph
from prism.ir.node import Node

LAYOUT = ("reshape",)  # a permute moves data (a transpose); only reshapes are views


@dataclass
class CoreProgram:
    program: Graph                                   # what the user wrote
    core: Graph                                      # what search works on
    prologue: dict[str, list[tuple[str, tuple]]] = field(default_factory=dict)   # core input -> layout ops
    epilogue: list[list[tuple[str, tuple]]] = field(default_factory=list)         # per output: layout ops

    def wrap_inputs(self, g: Graph) -> list[Tensor]:
        """Declare the program's inputs in ``g`` and return the core inputs (prologue applied), in core order."""
        handles = {}
        for node in self.program.inputs.values():
            name, shape, dt = node.arg
            handles[name] = g.input(name, shape, dt)
        out = []
        for name in self.core.inputs:
            t = handles[name]
            for op, arg in self.prologue.get(name, ()):
                t = g._apply(op, [t], arg)
            out.append(t)
        return out

    def wrap_output(self, g: Graph, index: int, t: Tensor) -> Tensor:
        for op, arg in self.epilogue[index]:
            t = g._apply(op, [t], arg)
        return t


def _simple_shape(shape: tuple) -> bool:
    return all(isinstance(d, int) or (isinstance(d, D.Dim) and len(D.symbols(d)) == 1 and
                                      len(d.terms) == 1 and d.terms[0][1] == 1 and len(d.terms[0][0]) == 1 and
                                      d.terms[0][0][0][1] == 1) for d in shape)


def peel(program: Graph) -> CoreProgram:
    nodes = program.nodes
    users: dict[Node, list[Node]] = {}
    for n in nodes:
        for s in n.src:
            users.setdefault(s, []).append(n)
    # outputs: strip trailing layout ops (unless that would expose an input directly)
    cores: list[Node] = []
    epilogue: list[list[tuple[str, tuple]]] = []
    for o in program.outputs:
        x = o.src[0]
        chain: list[tuple[str, tuple]] = []
        while x.op in LAYOUT and x.src[0].op != "input":
            chain.append((x.op, x.arg))
            x = x.src[0]
        cores.append(x)
        epilogue.append(list(reversed(chain)))
    # inputs: one layout op that is the input's only use becomes the core input
    replace: dict[Node, tuple[str, Node]] = {}
    prologue: dict[str, list[tuple[str, tuple]]] = {}
    for name, inp in program.inputs.items():
        us = users.get(inp, [])
        if len(us) == 1 and us[0].op in LAYOUT and _simple_shape(us[0].shape) and us[0] not in cores:
            replace[us[0]] = (name, inp)
            prologue[name] = [(us[0].op, us[0].arg)]
    core = Graph(program.name)
    new: dict[Node, Tensor] = {}
    for name, inp in program.inputs.items():
        repl = next((u for u, (nm, _) in replace.items() if nm == name), None)
        shape = repl.shape if repl is not None else inp.shape
        t = core.input(name, shape, inp.dtype)
        new[repl if repl is not None else inp] = t
    for n in nodes:
        if n in new or n.op in ("input", "output"):
            continue
        if n.op == "cast" and n.arg[0] in ("float32", "float64"):
            # the identity on values (prism.ir.dtypes): operators promote, build_graph casts the outputs. Kept,
            # it separated an int8 weight's permute from its input (a Linear of int8 weights: 500k block
            # states and the time limit, against 7.6k and 2.6 s for the same Linear in float32)
            new[n] = new[n.src[0]]
            continue
        new[n] = core._apply(n.op, [new[s] for s in n.src], n.arg)
    for o, c in zip(program.outputs, cores):
        core.output(new[c], o.arg[0])
    return CoreProgram(program, core, prologue, epilogue)


def check_searchable_sizes(program: Graph) -> None:
    """Reject a program with a fixed zero-size dim, naming it.

    Search, its cost model and its verification assume every dim is >= 1 (as the dims module does for
    symbols): a zero-size dim makes every tensor that carries it empty, or, where it is contracted, the
    output all zeros. There is nothing to fuse or tune, and no numeric check could tell a right candidate
    from a wrong one (it would compare empty arrays), so no candidate could ever be verified.
    """
    for name, node in program.inputs.items():
        for i, d in enumerate(node.shape):
            if isinstance(d, int) and d == 0:
                raise UnsupportedError(
                    f"input {name!r} has a fixed zero-size dim (dim {i} of {D.format_shape(node.shape)}): search "
                    "and superoptimize need every dim >= 1 -- with a zero-size dim the program computes empty "
                    "tensors (or all zeros where the dim is contracted), so there is nothing to optimize and no "
                    "candidate could be verified numerically. Fix: give the dim a size >= 1, or skip the "
                    "computation when it is empty (its outputs are empty, or zeros where the dim is contracted)")
