"""Block graphs (graph-defined kernels) and sGraphs (block graphs with symbolic parameters).

Semantics (DESIGN.md §4.3), for every block index ``b`` of the grid ``(g0[, g1[, g2]])``:

* ``iter`` (input iterator) over input ``T`` with ``imap`` (per grid dim ``p``: the data dim of ``T``
  it splits, or None = replicate) and ``fmap`` (the data dim the for-loop splits, or None). In
  iteration ``i`` the block sees, along data dim ``d``, chunk ``c`` of size
  ``D_d / (prod of g_p with imap[p] == d) / (F if fmap == d)``, where the chunk index ``c`` is the
  mixed-radix number of the block coordinates of the grid dims that split ``d`` (lower grid dim
  outermost) followed by ``i`` when the for-loop splits ``d`` (innermost).
* tile operators: any operator of ``prism.ir.ops.TILE_OPS`` on tiles.
* ``acc`` (for-loop accumulator) of kind ``sum | sum_last | rms | max | softmax_sum |
  softmax_matmul`` (see ``ACCUMULATORS``): consumes a per-iteration tile, yields one tile after the
  loop. Operators that use an accumulator run once per block, after the loop.
* ``save`` (output saver) with ``omap`` (per grid dim: the output data dim the blocks' tiles are
  concatenated along, or None = the blocks' tiles are partial sums added together) and ``fmap``
  (written inside the loop: iteration ``i`` writes its chunk along that dim). Chunk order as above.

Every node has a *phase*: ``inv`` (loop-invariant: computed once per block before the loop),
``loop`` (recomputed each iteration) or ``post`` (after the loop). The builder enforces the structural
rules: no accumulating a post-loop value, no mixing loop and post-loop values, loop values are saved
only with an fmap.

Maps may be symbolic: a :class:`MapVar` is a categorical map symbol whose value is a data dim or None;
the boolean symbol ``m[T, d, p]`` of DESIGN.md §4.5 is ``MapVar == d``. Grid sizes and ``F`` may be
size symbols. Tile shapes are then symbolic dims (with selectors), and every division is recorded as a
:class:`~prism.ir.dims.Divisible` constraint that :meth:`BlockGraph.instantiate` checks.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Union

from prism.errors import GraphError, MapError, ShapeError
from prism.ir import dims as D
from prism.ir import ops as O
from prism.ir.builder import OpMethods, Tensor
from prism.ir.dims import DimLike, Divisible, format_shape
from prism.ir.dtypes import DType, as_dtype
from prism.ir.node import Node, toposort


@dataclass(frozen=True)
class MapVar:
    """A symbolic map entry: takes the value of one data dim (or None) at instantiation."""

    name: str

    def __repr__(self) -> str:
        return f"?{self.name}"


MapEntry = Union[int, None, MapVar]


@dataclass(frozen=True)
class InputSpec:
    """A block graph input: the device tensor's shape and dtype (and a name for printing)."""

    shape: tuple[DimLike, ...]
    dtype: DType
    name: str = ""


@dataclass(frozen=True)
class AccDef:
    name: str
    arity: int
    params: tuple[str, ...]
    shape_rule: Callable[[tuple[O.Shape, ...], O.ShapeCtx], O.Shape]
    doc: str


def _row(shapes: tuple[O.Shape, ...], ctx: O.ShapeCtx) -> O.Shape:
    return shapes[0][:-1] + (1,)


def _acc_matmul(shapes: tuple[O.Shape, ...], ctx: O.ShapeCtx) -> O.Shape:
    return O.infer(O.OPS["matmul"], shapes, (None, None), (), ctx)[0]  # type: ignore[arg-type]


ACCUMULATORS: dict[str, AccDef] = {a.name: a for a in (
    AccDef("sum", 1, (), lambda s, ctx: s[0], "sum_i x_i (element-wise over iterations)"),
    AccDef("sum_last", 1, (), _row, "sum_i sum(x_i, -1)"),
    AccDef("rms", 1, ("eps",), _row,
           "sqrt(sum_i sum(x_i**2, -1) / (x.shape[-1] * F) + eps): the root-mean-square for rms_norm"),
    AccDef("max", 1, (), _row, "max_i max(x_i, -1)"),
    AccDef("softmax_sum", 1, (), _row,
           "sum_i sum(exp(x_i - M), -1) with M the final row max, computed online: "
           "s <- s*exp(m_old - m_new) + sum(exp(x_i - m_new))"),
    AccDef("softmax_matmul", 2, (), _acc_matmul,
           "sum_i exp(x_i - M) @ v_i with M the final row max of x, computed online with the same rescaling"),
)}


def _check_entry(e: object, rank: int, what: str) -> MapEntry:
    if e is None or isinstance(e, MapVar):
        return e
    if isinstance(e, int) and not isinstance(e, bool):
        if not -rank <= e < rank:
            raise MapError(f"{what}: data dim {e} is out of range for rank {rank}")
        return e % rank
    raise MapError(f"{what}: a map entry must be a data dim (int), None or a MapVar, got {e!r}")


def _factor(entry: MapEntry, d: int, size: DimLike) -> DimLike:
    """How much parallel dim (with map ``entry`` and ``size``) divides data dim ``d``."""
    if entry is None:
        return 1
    if isinstance(entry, MapVar):
        if isinstance(size, int) and size == 1:
            return 1
        return D.sel(entry.name, d, size)
    return size if entry == d else 1


class BlockGraph:
    """An immutable block graph. Build with :class:`BlockBuilder`; instantiate with :meth:`instantiate`."""

    __slots__ = (
        "_hash",
        "_key",
        "constraints",
        "forloop",
        "grid",
        "inputs",
        "output_shapes",
        "outputs",
        "phase",
        "splits",
    )

    def __init__(self, grid: tuple[DimLike, ...], forloop: DimLike, inputs: tuple[InputSpec, ...],
                 outputs: tuple[Node, ...], output_shapes: tuple[tuple[DimLike, ...], ...],
                 constraints: tuple[Divisible | D.DimEq, ...], phase: dict[Node, str],
                 splits: frozenset[str] = frozenset()) -> None:
        self.grid, self.forloop, self.inputs, self.outputs = grid, forloop, inputs, outputs
        self.output_shapes, self.constraints, self.phase = output_shapes, constraints, phase
        self.splits = splits  # grid size symbols that count the parts of a split reduction (see BlockBuilder)
        self._key = (tuple(_skey(g) for g in grid), _skey(forloop),
                     tuple((tuple(_skey(d) for d in s.shape), s.dtype) for s in inputs), outputs, tuple(sorted(splits)))
        self._hash = hash(self._key)

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:
        return isinstance(other, BlockGraph) and (self is other or self._key == other._key)

    @property
    def nodes(self) -> list[Node]:
        return toposort(self.outputs)

    @property
    def output_dtypes(self) -> tuple[DType, ...]:
        return tuple(n.dtype for n in self.outputs)  # type: ignore[misc]

    def symbols(self) -> set[str]:
        """Names of all size symbols and map symbols still free in this block graph."""
        out: set[str] = set()
        for d in (*self.grid, self.forloop):
            out |= D.symbols(d)
        for n in self.nodes:
            for s in n.shape:
                out |= D.symbols(s)
            if n.op in ("iter", "save"):
                for e in (*n.arg[1], n.arg[2]):
                    if isinstance(e, MapVar):
                        out.add(e.name)
        for s in self.inputs:
            for d in s.shape:
                out |= D.symbols(d)
        return out

    def one_trip_key(self) -> tuple[tuple, tuple[str, ...]] | None:
        """(a key, the for-loop's range symbols): the structure this block graph has with its for-loop run once
        -- iterators and saves without their loop maps, a ``sum`` accumulator its operand, no phases or tile
        shapes --, equal for a graph written without a loop and one whose loop range is a symbol set to 1; None
        where the range is a constant above 1. Two graphs with one such key compute the same values once the
        symbols are set to 1 (a heuristic match for choosing parameters: prism.api.SuperKernel._twin; whoever
        runs the result still verifies it)."""
        if isinstance(self.forloop, int) and self.forloop != 1:
            return None
        memo: dict[Node, tuple] = {}

        def sig(n: Node) -> tuple:
            if n not in memo:
                if n.op == "acc" and n.arg[0] == "sum":
                    memo[n] = sig(n.src[0])
                else:
                    arg = n.arg[:2] if n.op in ("iter", "save") else n.arg
                    memo[n] = (n.op, arg, str(n.dtype), tuple(sig(x) for x in n.src))
            return memo[n]

        key = (tuple(_skey(g) for g in self.grid), tuple(s.dtype for s in self.inputs),
               tuple(sig(o) for o in self.outputs), tuple(sorted(self.splits)))
        return key, tuple(sorted(D.symbols(self.forloop)))

    def map_symbols(self) -> set[str]:
        return {e.name for n in self.nodes if n.op in ("iter", "save") for e in (*n.arg[1], n.arg[2])
                if isinstance(e, MapVar)}

    def is_concrete(self) -> bool:
        return not self.symbols()

    def instantiate(self, env: Mapping[str, object]) -> BlockGraph:
        """Substitute size symbols (name -> int) and map symbols (name -> data dim or None).

        Every division that becomes concrete is checked (MapError if it is not exact).
        """
        return _rebuild(self, env)

    def generalize(self, sizes: Mapping[int, DimLike],
                   shapes: Sequence[tuple[DimLike, ...]] | None = None) -> BlockGraph:
        """A copy whose inputs' fixed sizes (and reshape/split sizes) in ``sizes`` are replaced (``{2048: K}``),
        every tile and constraint derived again (see :meth:`prism.Graph.generalize`). ``shapes``: the inputs'
        shapes instead (their operands', where single axes of the kernel graph's inputs were generalized)."""
        if shapes is not None and len(shapes) != len(self.inputs):
            raise MapError(f"generalize: {len(shapes)} input shapes for a block graph of {len(self.inputs)} inputs")
        return _rebuild(self, {}, sizes, shapes)

    def __str__(self) -> str:
        from prism.ir.printer import format_block_graph
        return format_block_graph(self)

    __repr__ = __str__


def _skey(d: DimLike) -> object:
    return ("D", d.terms) if isinstance(d, D.Dim) else d


class BlockBuilder(OpMethods):
    """Builds a block graph.

    >>> bb = BlockBuilder(grid=("G",), forloop="F", inputs=[((8, 1024), "float32"), ((1024, 4096), "float32")])
    >>> x = bb.iter(0, imap=(None,), fmap=1)     # X: replicated over the grid, loop walks its columns
    >>> w = bb.iter(1, imap=(1,), fmap=0)        # W: grid splits its columns, loop walks its rows
    >>> y = bb.div(bb.accumulate("sum", bb.matmul(x, w)), bb.accumulate("rms", x, eps=1e-6))
    >>> bb.save(y, omap=(1,))
    0
    >>> bg = bb.build()
    """

    def __init__(self, grid: Sequence[DimLike | str], forloop: DimLike | str = 1,
                 inputs: Sequence[InputSpec | tuple | Tensor] = (), splits: Sequence[str] = ()) -> None:
        if not 1 <= len(grid) <= 3:
            raise GraphError(f"a block graph has 1 to 3 grid dims, got {len(grid)}: {tuple(grid)}")
        self.grid: tuple[DimLike, ...] = tuple(_pos_dim(g, f"grid dim {i}") for i, g in enumerate(grid))
        # ``splits``: grid size symbols that count the parts of a split reduction (prism.search.splitk);
        # the tuner never gives them 1 when more fits (one part is the base sGraph plus a useless combine)
        grid_syms = {s for g in self.grid for s in D.symbols(g)}
        bad = sorted(set(splits) - grid_syms)
        if bad:
            raise GraphError(f"splits {bad} are not size symbols of the grid {self.grid}")
        self.splits = frozenset(splits)
        self.forloop: DimLike = _pos_dim(forloop, "for-loop range")
        self.inputs: tuple[InputSpec, ...] = tuple(_as_spec(x, i) for i, x in enumerate(inputs))
        self.ctx = O.ShapeCtx()
        self.phase: dict[Node, str] = {}
        self.saves: list[Node] = []

    # --- block-level nodes ------------------------------------------------------------------
    def iter(self, index: int, imap: Sequence[MapEntry] | Mapping[int, MapEntry] = (), fmap: MapEntry = None
             ) -> Tensor:
        """An input iterator over input ``index``. ``imap``: per grid dim, a data dim or None (a dict
        {grid_dim: data_dim} also works; missing grid dims replicate)."""
        if not isinstance(index, int) or not 0 <= index < len(self.inputs):
            raise GraphError(f"iter: input index {index!r} out of range; this block graph has "
                             f"{len(self.inputs)} input(s)")
        spec = self.inputs[index]
        rank = len(spec.shape)
        what = f"input {index} ({spec.name or 'unnamed'} {format_shape(spec.shape)})"
        im = _norm_map(imap, len(self.grid), rank, f"imap of {what}")
        fm = _check_entry(fmap, rank, f"fmap of {what}")
        tile = tuple(self._split(spec.shape[d], [(e, g) for e, g in zip(im, self.grid)] + [(fm, self.forloop)],
                                 d, what) for d in range(rank))
        node = Node("iter", (), (index, im, fm), tile, spec.dtype)
        self.phase[node] = "loop" if fm is not None else "inv"
        return Tensor(self, node)

    def _split(self, size: DimLike, parts: list[tuple[MapEntry, DimLike]], d: int, what: str) -> DimLike:
        den = D.product(_factor(e, d, g) for e, g in parts)
        if isinstance(den, int) and den == 1:
            return size
        try:
            q = D.div_exact(size, den)
        except D.DimError:
            splitters = ", ".join(f"{'grid dim ' + str(i) if i < len(parts) - 1 else 'for-loop'}={g}"
                                  for i, (e, g) in enumerate(parts) if _factor(e, d, g) != 1)
            raise MapError(f"{what}: dim {d} of size {size} is split by {splitters}, but {den} does not "
                           f"divide {size}; choose sizes whose product divides {size}") from None
        if not _always_integral(q):
            self.ctx.constraints.append(Divisible(size, den, f"{what} dim {d}"))
        return q

    def accumulate(self, kind: str, x: Tensor, *more: Tensor, **params: float) -> Tensor:
        """A for-loop accumulator (see ``ACCUMULATORS``); e.g. ``accumulate("rms", x, eps=1e-6)``."""
        a = ACCUMULATORS.get(kind)
        if a is None:
            raise GraphError(f"unknown accumulator {kind!r}; supported: {sorted(ACCUMULATORS)}")
        srcs = (x, *more)
        if len(srcs) != a.arity:
            raise GraphError(f"accumulator {kind} takes {a.arity} operand(s), got {len(srcs)}")
        if set(params) != set(a.params):
            raise GraphError(f"accumulator {kind} takes parameters {list(a.params)}, got {sorted(params)}")
        nodes = tuple(self._own(s, f"accumulate {kind}").node for s in srcs)
        for n in nodes:
            if self.phase[n] == "post":
                raise GraphError(f"accumulate {kind}: operand {n.describe()} is already computed after the loop "
                                 "(it depends on an accumulator); accumulating it again is not allowed")
        try:
            shape = a.shape_rule(tuple(n.shape for n in nodes), self.ctx)
        except ShapeError as e:
            raise ShapeError(f"accumulate {kind}: {e}") from None
        arg = (kind, tuple(float(params[p]) for p in a.params))
        node = Node("acc", nodes, arg, shape, nodes[0].dtype)
        self.phase[node] = "post"
        return Tensor(self, node)

    def save(self, x: Tensor, omap: Sequence[MapEntry] | Mapping[int, MapEntry] = (), fmap: MapEntry = None
             ) -> int:
        """Save ``x`` as the next output; returns its output index. ``omap``: per grid dim, the output
        dim the blocks' tiles are concatenated along, or None (partial sums, added together)."""
        n = self._own(x, "save").node
        what = f"output {len(self.saves)}"
        om = _norm_map(omap, len(self.grid), n.rank, f"omap of {what}")
        fm = _check_entry(fmap, n.rank, f"fmap of {what}")
        ph = self.phase[n]
        if ph == "loop" and fm is None:
            raise GraphError(f"save: {what} is computed inside the for-loop ({n.describe()}) but has no fmap; "
                             "accumulate it, or give an fmap so each iteration writes its own chunk")
        if ph != "loop" and fm is not None:
            raise GraphError(f"save: {what} has an fmap but is not computed inside the for-loop")
        node = Node("save", (n,), (len(self.saves), om, fm), n.shape, n.dtype)
        self.phase[node] = ph
        self.saves.append(node)
        return len(self.saves) - 1

    def build(self) -> BlockGraph:
        if not self.saves:
            raise GraphError("block graph has no outputs; call save(tensor, omap=...) at least once")
        out_shapes = []
        for s in self.saves:
            _, om, fm = s.arg
            parts = [(e, g) for e, g in zip(om, self.grid)] + [(fm, self.forloop)]
            out_shapes.append(tuple(D.product([t, *(_factor(e, d, g) for e, g in parts)])
                                    for d, t in enumerate(s.shape)))
        # keep only constraints that are still symbolic, deduplicated
        seen: dict[tuple, Divisible | D.DimEq] = {}
        for c in self.ctx.constraints:
            k = (_skey(c.num), _skey(c.den)) if isinstance(c, Divisible) else ("eq", _skey(c.a), _skey(c.b))
            seen.setdefault(k, c)
        phase = {n: self.phase[n] for n in toposort(tuple(self.saves))}
        return BlockGraph(self.grid, self.forloop, self.inputs, tuple(self.saves), tuple(out_shapes),
                          tuple(seen.values()), phase, self.splits)

    # --- tile operators ------------------------------------------------------------------------
    def _apply(self, op: str, srcs: Sequence[Tensor], arg: tuple = ()) -> Tensor:
        if op not in O.TILE_OPS:
            raise GraphError(f"operator {op!r} cannot be used inside a block graph; tile operators: "
                             f"{sorted(O.TILE_OPS)}")
        nodes = tuple(self._own(s, op).node for s in srcs)
        phases = {self.phase[n] for n in nodes}
        if "loop" in phases and "post" in phases:
            raise GraphError(f"{op}: mixes values computed inside the for-loop with values computed after it "
                             f"({', '.join(f'{n.describe()} [{self.phase[n]}]' for n in nodes)}); "
                             "accumulate the loop value first")
        shape, dtype = O.infer(O.OPS[op], tuple(n.shape for n in nodes), tuple(n.dtype for n in nodes), arg,
                               self.ctx)
        node = Node(op, nodes, arg, shape, dtype)
        self.phase[node] = "post" if "post" in phases else "loop" if "loop" in phases else "inv"
        return Tensor(self, node)


def _always_integral(q: DimLike) -> bool:
    """True if ``q`` is an integer for every value of its symbols (integer coefficients, no division)."""
    if isinstance(q, int):
        return True
    return all(isinstance(c, int) and all(k > 0 for _a, k in m) for m, c in q.terms)


def _pos_dim(x: DimLike | str, what: str) -> DimLike:
    d = D.as_dim(x)
    if isinstance(d, int) and d < 1:
        raise GraphError(f"{what} must be >= 1, got {d}")
    return d


def _as_spec(x: InputSpec | tuple | Tensor, i: int) -> InputSpec:
    if isinstance(x, InputSpec):
        return x
    if isinstance(x, Tensor):
        name = x.node.arg[0] if x.node.op == "input" else f"in{i}"
        return InputSpec(tuple(x.shape), x.dtype, name)
    if isinstance(x, tuple) and len(x) in (2, 3):
        shape, dtype = x[0], x[1]
        name = x[2] if len(x) == 3 else f"in{i}"
        return InputSpec(tuple(D.as_dim(s) for s in shape), as_dtype(dtype), name)
    raise GraphError(f"block graph input {i}: expected an InputSpec, a (shape, dtype[, name]) tuple or a "
                     f"kernel-graph tensor, got {x!r}")


def _norm_map(m: Sequence[MapEntry] | Mapping[int, MapEntry], ngrid: int, rank: int, what: str
              ) -> tuple[MapEntry, ...]:
    if isinstance(m, Mapping):
        bad = [k for k in m if not (isinstance(k, int) and 0 <= k < ngrid)]
        if bad:
            raise MapError(f"{what}: grid dims {bad} do not exist (the grid has {ngrid} dims)")
        m = [m.get(p) for p in range(ngrid)]
    m = tuple(m)
    if len(m) == 0:
        m = (None,) * ngrid
    if len(m) != ngrid:
        raise MapError(f"{what}: has {len(m)} entries but the grid has {ngrid} dims")
    return tuple(_check_entry(e, rank, f"{what}, grid dim {p}") for p, e in enumerate(m))


def _subs_arg(a: Any, env: Mapping[str, object]) -> Any:
    if isinstance(a, D.Dim):
        return D.subs(a, env)
    if isinstance(a, MapVar):
        if a.name in env:
            return env[a.name]
        return a
    if isinstance(a, tuple):
        return tuple(_subs_arg(x, env) for x in a)
    return a


def generalized_size(sizes: Mapping[int, DimLike]) -> Callable[[DimLike], DimLike]:
    """``d -> sizes[d]`` for a fixed size ``d`` in ``sizes``, every other size unchanged."""
    def fn(d: DimLike) -> DimLike:
        return sizes.get(d, d) if isinstance(d, int) and not isinstance(d, bool) else d
    return fn


def _rebuild(bg: BlockGraph, env: Mapping[str, object], sizes: Mapping[int, DimLike] | None = None,
             shapes: Sequence[tuple[DimLike, ...]] | None = None) -> BlockGraph:
    for name in bg.map_symbols():
        if name in env and env[name] is not None and not isinstance(env[name], int):
            raise MapError(f"map symbol {name} must be set to a data dim (int) or None, got {env[name]!r}")
    try:
        grid = tuple(D.subs(g, env) for g in bg.grid)
        free = {s for g in grid for s in D.symbols(g)}
        size = generalized_size(sizes or {})
        bb = BlockBuilder(grid, D.subs(bg.forloop, env),
                          tuple(InputSpec(tuple(shapes[i]) if shapes is not None else
                                          tuple(size(D.subs(d, env)) for d in s.shape), s.dtype, s.name)
                                for i, s in enumerate(bg.inputs)), sorted(bg.splits & free))
    except D.DimError as e:
        raise MapError(f"cannot instantiate block graph: {e}") from None
    new: dict[Node, Tensor] = {}
    for n in bg.nodes:
        if n.op == "iter":
            idx, im, fm = _subs_arg(n.arg, env)
            new[n] = bb.iter(idx, im, fm)
        elif n.op == "acc":
            kind, vals = n.arg
            params = dict(zip(ACCUMULATORS[kind].params, vals))
            new[n] = bb.accumulate(kind, *(new[s] for s in n.src), **params)
        elif n.op == "save":
            _, om, fm = _subs_arg(n.arg, env)
            bb.save(new[n.src[0]], om, fm)
        else:
            arg = _subs_arg(n.arg, env)
            if sizes and n.op in O.OPS:
                arg = O.map_sizes(O.OPS[n.op], arg, size)
            new[n] = bb._apply(n.op, [new[s] for s in n.src], arg)
    return bb.build()
