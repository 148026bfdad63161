"""Kernel graphs: the program, a DAG of operators over whole (device) tensors."""

from __future__ import annotations

import hashlib
import itertools
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from prism.errors import GraphError, InputError, PrismError
from prism.ir import dims as D
from prism.ir import ops as O
from prism.ir.block import BlockGraph, _subs_arg, generalized_size
from prism.ir.builder import OpMethods, Tensor
from prism.ir.dims import DimLike, format_shape
from prism.ir.dtypes import as_dtype
from prism.ir.node import Node, toposort

Evaluator = Callable[..., dict[str, Any]]
_EVALUATOR: Evaluator | None = None


MAX_IMAGE_CHOICES = 64   # combinations of its sizes' images tried per op (Graph.generalize's ``images``)


def _resized(op: O.OpDef, arg: tuple, images: Mapping[int, tuple[DimLike, ...]]) -> Iterator[tuple]:
    """``arg`` with each size in ``op``'s size attributes replaced by one of its images (itself where it has
    none): every combination, in order."""
    slots: list[tuple[DimLike, ...]] = []

    def note(d: DimLike) -> DimLike:
        slots.append(images.get(d, (d,)) if isinstance(d, int) and not isinstance(d, bool) else (d,))
        return d
    O.map_sizes(op, arg, note)
    for combo in itertools.product(*slots):
        it = iter(combo)
        yield O.map_sizes(op, arg, lambda _d, nxt=it.__next__: nxt())


def register_evaluator(fn: Evaluator) -> None:
    """Install the kernel-graph interpreter behind :meth:`Graph.evaluate` (done by ``prism.reference`` on
    import): the IR does not import the stage above it."""
    global _EVALUATOR
    _EVALUATOR = fn


class Graph(OpMethods):
    """A kernel graph under construction.

    >>> g = Graph()
    >>> X = g.input("X", ("B", 1024)); W = g.input("W", (1024, 4096))
    >>> g.output(g.matmul(g.rms_norm(X), W))
    >>> g.output_shapes
    {'out0': (B, 4096)}
    """

    def __init__(self, name: str = "") -> None:
        self.name = name
        self._inputs: dict[str, Node] = {}
        self._outputs: list[Node] = []

    # --- building -----------------------------------------------------------------------------
    def input(self, name: str, shape: Sequence[int | str | D.Dim], dtype: Any = "float32") -> Tensor:
        if not isinstance(name, str) or not name.isidentifier():
            raise GraphError(f"input name must be a Python identifier, got {name!r}")
        if name in self._inputs:
            raise GraphError(f"input {name!r} is declared twice")
        dims = tuple(D.as_dim(s) for s in shape)
        for i, d in enumerate(dims):
            # a lone symbol with coefficient and exponent 1 (2*n, n^2 or a selector would bind wrongly)
            if isinstance(d, D.Dim) and not (len(D.symbols(d)) == 1 and d is D.sym(min(D.symbols(d)))):
                raise GraphError(f"input {name!r}: dim {i} is the expression {d}; input dims must be ints or "
                                 "single symbols (derive expressions with reshape)")
        node = Node("input", (), (name, dims, as_dtype(dtype)), dims, as_dtype(dtype))
        self._inputs[name] = node
        return Tensor(self, node)

    def output(self, t: Tensor, name: str | None = None) -> None:
        """Mark ``t`` as an output (named ``out<k>`` unless given)."""
        t = self._own(t, "output")
        name = name if name is not None else f"out{len(self._outputs)}"
        if name in self.output_names:
            raise GraphError(f"output name {name!r} is used twice")
        self._outputs.append(Node("output", (t.node,), (name,), t.shape, t.dtype))

    def customized(self, bg: BlockGraph, inputs: Sequence[Tensor]) -> tuple[Tensor, ...]:
        """Apply a graph-defined kernel to ``inputs``; returns one tensor per block-graph output."""
        if not isinstance(bg, BlockGraph):
            raise GraphError(f"customized: expected a BlockGraph, got {type(bg).__name__}")
        nodes = tuple(self._own(t, "customized").node for t in inputs)
        if len(nodes) != len(bg.inputs):
            raise GraphError(f"customized: the block graph takes {len(bg.inputs)} inputs, got {len(nodes)}")
        for i, (n, spec) in enumerate(zip(nodes, bg.inputs)):
            same = len(n.shape) == len(spec.shape) and all(
                D.structurally_equal(a, b) for a, b in zip(n.shape, spec.shape))
            if not same or n.dtype != spec.dtype:
                raise GraphError(f"customized: input {i} is {format_shape(n.shape)} {n.dtype} but the block graph "
                                 f"expects {format_shape(spec.shape)} {spec.dtype}")
        c = Node("customized", nodes, (bg,), (), None)
        return tuple(Tensor(self, Node("result", (c,), (i,), s, dt))
                     for i, (s, dt) in enumerate(zip(bg.output_shapes, bg.output_dtypes)))

    def _apply(self, op: str, srcs: Sequence[Tensor], arg: tuple = ()) -> Tensor:
        nodes = tuple(self._own(s, op).node for s in srcs)
        shape, dtype = O.infer(O.get(op), tuple(n.shape for n in nodes), tuple(n.dtype for n in nodes), arg)
        return Tensor(self, Node(op, nodes, arg, shape, dtype))

    # --- queries --------------------------------------------------------------------------------
    @property
    def inputs(self) -> dict[str, Node]:
        return dict(self._inputs)

    @property
    def outputs(self) -> list[Node]:
        return list(self._outputs)

    @property
    def output_names(self) -> list[str]:
        return [n.arg[0] for n in self._outputs]

    @property
    def output_shapes(self) -> dict[str, tuple[DimLike, ...]]:
        return {n.arg[0]: n.shape for n in self._outputs}

    @property
    def nodes(self) -> list[Node]:
        return toposort(self._outputs)

    def symbols(self) -> set[str]:
        out: set[str] = set()
        for n in self._inputs.values():
            for d in n.shape:
                out |= D.symbols(d)
        return out

    def customized_ops(self) -> list[BlockGraph]:
        return [n.arg[0] for n in self.nodes if n.op == "customized"]

    def check(self) -> None:
        from prism.ir.check import check_graph
        check_graph(self)

    @property
    def key(self) -> str:
        """A structural hash of the program (stable across processes): drives caches and dedup."""
        from prism.ir.serialize import graph_to_json
        return hashlib.sha256(graph_to_json(self, indent=None).encode()).hexdigest()[:32]

    def __str__(self) -> str:
        from prism.ir.printer import format_graph
        return format_graph(self)

    def __repr__(self) -> str:
        return f"<prism.Graph {self.name!r}: {len(self._inputs)} inputs, {len(self._outputs)} outputs>"

    # --- semantics ----------------------------------------------------------------------------
    def evaluate(self, inputs: Mapping[str, Any], dtype: Any = None, params: Mapping[str, object] | None = None
                 ) -> dict[str, Any]:
        """Run the program op by op in NumPy (the ground truth). ``dtype=numpy.float64`` computes in
        float64; ``params`` gives values for block-graph symbols (grid sizes, for-loop range, maps)."""
        if _EVALUATOR is None:   # the interpreters sit above the IR and register themselves (prism.reference)
            raise GraphError("Graph.evaluate needs the reference interpreter: import prism (or prism.reference)")
        return _EVALUATOR(self, inputs, dtype=dtype, params=params)

    def bind(self, shapes: Mapping[str, Sequence[int]]) -> dict[str, int]:
        """Values of the graph's symbols implied by concrete input shapes (clear error on conflicts)."""
        env: dict[str, int] = {}
        missing = [n for n in self._inputs if n not in shapes]
        if missing:
            raise InputError(f"missing input(s) {missing}; the graph takes {list(self._inputs)}")
        extra = [n for n in shapes if n not in self._inputs]
        if extra:
            raise InputError(f"unknown input(s) {extra}; the graph takes {list(self._inputs)}")
        for name, node in self._inputs.items():
            got = tuple(int(s) for s in shapes[name])
            if len(got) != len(node.shape):
                raise InputError(f"input {name!r}: expected rank {len(node.shape)} {format_shape(node.shape)}, "
                                 f"got shape {got}")
            for i, (want, have) in enumerate(zip(node.shape, got)):
                if isinstance(want, int):
                    if want != have:
                        raise InputError(f"input {name!r}: dim {i} must be {want}, got shape {got} "
                                         f"(expected {format_shape(node.shape)})")
                else:
                    (s,) = D.symbols(want)
                    if s in env and env[s] != have:
                        raise InputError(f"input {name!r}: dim {i} is symbol {s}, already bound to {env[s]} by "
                                         f"another input, but got {have}")
                    env[s] = have
        return env

    def instantiate(self, env: Mapping[str, object]) -> Graph:
        """A copy with symbols substituted (kernel dims and block-graph parameters alike)."""
        return self._copy(env, {})

    def generalize(self, sizes: Mapping[int, DimLike],
                   axes: Mapping[tuple[str, int], DimLike] | None = None,
                   images: Mapping[int, tuple[DimLike, ...]] | None = None) -> Graph:
        """A copy with the fixed sizes in ``sizes`` replaced, e.g. ``{2048: D.sym("K")}``: in input shapes,
        reshape/split sizes and block-graph inputs; every other shape, tile and constraint is derived again.
        ``copy.instantiate({"K": 2048})`` computes what this graph does. A size that only coincides with a
        derived one (a reshape to ``[4096]`` of two ``[2048]`` halves, with 2048 generalized and 4096 not)
        makes the copy inconsistent: ShapeError or MapError, never a different graph.

        ``axes``: single input axes replaced, ``{("x", 2): D.sym("S")}`` -- input ``x``'s axis 2 whatever its
        size, every other occurrence of that size kept (RoPE at a prompt length equal to the head dim, 128: the
        sequence axis generalizes, the head dim that ``rotate_half`` halves cannot). Block graphs take their
        operands' new shapes; sizes inside ops are ``sizes``' only.

        ``images``: sizes inside ops (reshape shapes, split sizes) with several possible replacements, each
        combination tried in turn and the first that keeps the graph consistent taken (``[2048, 64, 32]`` of a
        ``[512, 2048]`` input, 2048's images (2048, 512): only 512 keeps the element count; at most
        ``MAX_IMAGE_CHOICES`` per op, then ShapeError as for any inconsistent copy). Images may be symbols (the
        numeric check's generalization: a reshape's 2048 as ``size2048`` or as itself)."""
        return self._copy({}, sizes, axes, images)

    def _copy(self, env: Mapping[str, object], sizes: Mapping[int, DimLike],
              axes: Mapping[tuple[str, int], DimLike] | None = None,
              images: Mapping[int, tuple[DimLike, ...]] | None = None) -> Graph:
        size = generalized_size(sizes)
        axes = axes or {}

        def arg_of(n: Node) -> tuple:
            a = _subs_arg(n.arg, env)
            return O.map_sizes(O.get(n.op), a, size) if sizes else a

        def build(n: Node, srcs: list[Tensor]) -> Node:
            op = O.get(n.op)
            if not images or not op.size_attrs:
                return g._apply(n.op, srcs, arg_of(n)).node
            error: PrismError | None = None
            for arg in itertools.islice(_resized(op, arg_of(n), images), MAX_IMAGE_CHOICES):
                try:
                    return g._apply(n.op, srcs, arg).node
                except PrismError as e:   # (ShapeError, MapError: an inconsistent combination) the next one
                    error = e
            raise error if error is not None else GraphError(f"{n.op}: no combination of its sizes' images")

        def shape_of(name: str, shape: tuple[DimLike, ...]) -> tuple[DimLike, ...]:
            return tuple(axes[name, i] if (name, i) in axes else size(D.subs(d, env)) for i, d in enumerate(shape))
        g = Graph(self.name)
        new: dict[Node, Node] = {}
        results: dict[Node, tuple[Tensor, ...]] = {}
        for n in self.nodes:
            if n.op == "input":
                name, shape, dt = n.arg
                new[n] = g.input(name, shape_of(name, shape), dt).node
            elif n.op == "output":
                g.output(Tensor(g, new[n.src[0]]), n.arg[0])
            elif n.op == "customized":
                bg = n.arg[0].instantiate(env) if env else n.arg[0]
                if axes:   # the block graph's inputs are its operands' (new) shapes
                    bg = bg.generalize(sizes, tuple(new[s].shape for s in n.src))
                elif sizes:
                    bg = bg.generalize(sizes)
                res = g.customized(bg, [Tensor(g, new[s]) for s in n.src])
                new[n] = res[0].node.src[0]
                results[n] = res
            elif n.op == "result":
                new[n] = results[n.src[0]][n.arg[0]].node
            else:
                new[n] = build(n, [Tensor(g, new[s]) for s in n.src])
        # keep declared-but-unused inputs, in declaration order
        for name, node in self._inputs.items():
            if name not in g._inputs:
                g.input(name, shape_of(name, node.shape), node.dtype)
        g._inputs = {k: g._inputs[k] for k in self._inputs}
        return g
