"""The program as search sees it: boundary layout operators peeled off, casts to float32 dropped, inputs
read through views.

A ``reshape`` applied directly to a program input (and its only use), or producing a program
output, moves no data that a fused kernel could save (a contiguous reshape is a view) and is invisible
to abstract expressions. Search works on the *core* between them and re-attaches them around every
result, so they neither cost kernel operators nor multiply the space.

An input read only through a transpose (``x @ w.T``: a Linear's weight as stored, ``[out, in]``) is an
:class:`InputView`: the core sees the transposed tensor as its input, and every block graph built from a
result reads the stored tensor with the transposed maps (a strided read, what the search's free permute of
an iterator is). Measured need: searched with the permute, a Linear-layout W1 generated 124k block states
(12 s) and W2 677k (52 s) against 1.3k and 16k in ``[in, out]`` layout -- layout is invisible to the
abstract test, so every intermediate was tried in both layouts. A per-channel scale applied to the product
of such an input (``(x @ cast(q).T) * s.T``, int8 weight-only) belongs to the view too: the core reads
``(q * s).T`` and the built block graphs apply ``s`` after the product (:mod:`prism.search.build`); kept in
the core, the two scales of an int8 W2 needed 10 block operators and 5 block inputs, beyond the limits.
Nothing here depends on which program it is.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from prism.errors import UnsupportedError
from prism.ir import dims as D
from prism.ir.builder import Tensor
from prism.ir.elementwise import is_exact_cast
from prism.ir.graph import Graph
from prism.ir.node import Node

LAYOUT = ("reshape",)  # a permute moves data (a transpose); only reshapes are views
FLOAT_CASTS = ("float32", "float64")


def identity_cast(n: Node) -> bool:
    """A cast the search drops: to float32 (every operator computes in float32, prism.ir.dtypes) or one that
    holds every value of its operand (``dtypes.exact_cast``: int8 -> bfloat16 of int8 weight-only on a
    bfloat16 model). Kept, the int8 -> bfloat16 cast of a bfloat16 Linear was a kernel of its own writing a
    bfloat16 copy of the weight every call (``Linear(2048, 5632)`` at one row: 2735 us against eager's 2429;
    476 us without it)."""
    return n.op == "cast" and (n.arg[0] in FLOAT_CASTS or is_exact_cast(n))


@dataclass(frozen=True)
class InputView:
    """How a core input reads the program input of the same name ``R``: ``permute(R, perm)`` (``perm`` None:
    as stored), times the program input ``scale`` -- one factor per index of ``R``'s dim ``axis``, broadcast
    along the other dims -- when given. Casts to float32 between are dropped, as everywhere in the search."""

    perm: tuple[int, ...] | None = None
    scale: str | None = None
    axis: int = 0


@dataclass
class CoreProgram:
    program: Graph                                   # what the user wrote
    core: Graph                                      # what search works on
    prologue: dict[str, list[tuple[str, tuple]]] = field(default_factory=dict)   # core input -> layout ops
    epilogue: list[list[tuple[str, tuple]]] = field(default_factory=list)         # per output: layout ops
    views: dict[str, InputView] = field(default_factory=dict)                    # core input -> its view

    def declare_inputs(self, g: Graph) -> dict[str, Tensor]:
        """Declare the program's inputs in ``g``: name -> tensor."""
        return {node.arg[0]: g.input(*node.arg) for node in self.program.inputs.values()}

    def core_input(self, g: Graph, handles: dict[str, Tensor], name: str) -> Tensor:
        """Core input ``name`` as a tensor of ``g`` (prologue or view applied at the kernel level: a view becomes
        a materialized transpose / dequantization, which only a predefined operator reading it needs)."""
        t = handles[name]
        for op, arg in self.prologue.get(name, ()):
            t = g._apply(op, [t], arg)
        v = self.views.get(name)
        if v is not None:
            if v.scale is not None:
                shape = tuple(d if i == v.axis else 1 for i, d in enumerate(t.shape))
                s = handles[v.scale]
                t = g.mul(t, s if s.shape == shape else g.reshape(s, shape))
            if v.perm is not None:
                t = g.permute(t, v.perm)
        return t

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
    views, skip, alias = _input_views(program, users, set(cores), set(prologue))
    for name, (node, _) in views.items():
        replace[node] = (name, program.inputs[name])
    core = Graph(program.name)
    new: dict[Node, Tensor] = {}
    for name, inp in program.inputs.items():
        if inp in skip:
            continue
        repl = next((u for u, (nm, _) in replace.items() if nm == name), None)
        shape = repl.shape if repl is not None else inp.shape
        t = core.input(name, shape, inp.dtype)
        new[repl if repl is not None else inp] = t
    for n in nodes:
        if n in new or n in skip or n.op in ("input", "output"):
            continue
        if n in alias:  # the scale multiply of a view: the product itself (the view carries the scale)
            new[n] = new[alias[n]]
            continue
        if identity_cast(n):
            # the identity on values (prism.ir.dtypes): operators promote, build_graph casts the outputs. Kept,
            # it separated an int8 weight's permute from its input (a Linear of int8 weights: 500k block
            # states and the time limit, against 7.6k and 2.6 s for the same Linear in float32)
            new[n] = new[n.src[0]]
            continue
        new[n] = core._apply(n.op, [new[s] for s in n.src], n.arg)
    for o, c in zip(program.outputs, cores):
        core.output(new[c], o.arg[0])
    return CoreProgram(program, core, prologue, epilogue, {k: v for k, (_, v) in views.items()})


def _only_user(users: dict[Node, list[Node]], n: Node) -> Node | None:
    us = users.get(n, [])
    return us[0] if len(us) == 1 else None


def _input_views(program: Graph, users: dict[Node, list[Node]], cores: set[Node], taken: set[str]
                 ) -> tuple[dict[str, tuple[Node, InputView]], set[Node], dict[Node, Node]]:
    """The inputs read through a view (see the module docstring): name -> (the node the core input stands for,
    the view); the nodes the views absorb (casts, the scales' inputs and layout ops); and, per absorbed scale
    multiply, the product it stands for."""
    chains: dict[str, tuple[list[Node], tuple[int, ...] | None, Node, Node | None]] = {}
    for name, inp in program.inputs.items():
        if name in taken:
            continue
        chain: list[Node] = []
        x, u = inp, _only_user(users, inp)
        while u is not None and identity_cast(u) and u not in cores:
            chain.append(u)
            x, u = u, _only_user(users, u)
        perm = None
        if u is not None and u.op == "permute" and u not in cores:
            chain.append(u)
            perm, x, u = tuple(u.arg[0]), u, _only_user(users, u)
        if chain:
            chains[name] = (chain, perm, x, u)
    views: dict[str, tuple[Node, InputView]] = {}
    skip: set[Node] = set()
    alias: dict[Node, Node] = {}
    scales: set[str] = set()
    for name, (chain, perm, x, u) in chains.items():   # scaled views first: they claim their scales
        inp = program.inputs[name]
        found = _scale_of(users, inp, x, u, scales | {name})
        if found is None:
            continue
        s_inp, s_nodes, mul = found
        scales.add(s_inp.arg[0])
        views[name] = (x, InputView(perm, s_inp.arg[0], perm[-1] if perm is not None else len(inp.shape) - 1))
        skip.update(s_nodes)
        skip.update(chain[:-1])
        alias[mul] = u  # type: ignore[index]
    for name, (chain, perm, x, _) in chains.items():
        if name not in views and name not in scales and perm is not None:
            views[name] = (x, InputView(perm))
            skip.update(chain[:-1])
    return views, skip, alias


def _scale_of(users: dict[Node, list[Node]], raw: Node, x: Node, mm: Node | None, taken: set[str]
              ) -> tuple[Node, list[Node], Node] | None:
    """``(s, its layout nodes, the multiply)`` when ``x`` (a 2-D view of input ``raw``) is only the right operand
    of a product whose only use is ``product * s'``, ``s'`` a view of program input ``s`` (used nowhere else)
    holding one factor per column of the product, broadcast along its rows -- the per-output-channel scale of
    int8 weight-only, ``(a @ cast(q).T) * s.T``. Else None."""
    if mm is None or mm.op != "matmul" or mm.src[1] is not x or mm.src[0] is x or len(x.shape) != 2 or \
            len(raw.shape) != 2:
        return None
    mul = _only_user(users, mm)  # (the multiply may be a program output: the core's output is then the product)
    if mul is None or mul.op != "mul" or len(mul.src) != 2:
        return None
    t = mul.src[1] if mul.src[0] is mm else mul.src[0]
    if t is mm:
        return None
    m = x.shape[-1]
    if not isinstance(m, int) or not all(isinstance(d, int) for d in t.shape):
        return None
    if len(t.shape) > len(mm.shape) or list(t.shape) != [1] * (len(t.shape) - 1) + [m]:
        return None
    nodes: list[Node] = []
    s = t
    while s.op in ("permute", "reshape") and _only_user(users, s) is not None:
        nodes.append(s)
        s = s.src[0]
    if s.op != "input" or _only_user(users, s) is None or s.arg[0] in taken or s.dtype != mul.dtype:
        return None
    if [d for d in s.shape if d != 1] not in ([m], []) or math.prod(s.shape) != m:  # type: ignore[arg-type]
        return None
    return s, [s, *nodes], mul


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
