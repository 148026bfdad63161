"""Capture -> pieces -> ``prism.superoptimize`` per piece -> the FX graph with pieces replaced.

``compile_graph(gm, ...)`` rewrites ``gm`` in place: each piece that Prism superoptimized becomes one
``call_module`` of a :class:`~prism.frontend.runtime.PieceRunner`; everything else (layout operators,
unsupported operators, pieces too small to search, pieces whose search or verification failed) stays the
original PyTorch code. Every fallback is logged on the ``prism`` logger: one line per unsupported
operator (with a count), one per piece that failed to superoptimize, with the reason.

A piece is a Prism kernel graph of its own: inputs ``x0, x1, ...`` (first use), symbolic dims renamed
``d0, d1, ...`` in order of appearance (so equal pieces share a program key and one search), an input
dim that is an expression of PyTorch's symbols (``s0 + 1`` after a ``cat``) becomes a symbol of its own.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import operator
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from prism.errors import PrismError
from prism.frontend import ops as O
from prism.frontend.capture import Captured, Unit, capture
from prism.frontend.chain import MAX_ELEMENTS as CHAIN_MAX_ELEMENTS
from prism.frontend.chain import form_chains
from prism.frontend.ops import Operand, meta_value
from prism.frontend.partition import Budget, Piece, PlanUnit, plan
from prism.frontend.report import Fallback, GraphReport, PieceReport, new_report
from prism.frontend.runtime import InputSpec, PieceRunner
from prism.frontend.symbolic import symbol_env, to_shape
from prism.ir import dims as D
from prism.ir.graph import Graph
from prism.tune import ahead
from prism.tune.tuner import TOP_K

log = logging.getLogger("prism")

Progress = Callable[[str, int, int, str], None]   # (event, piece index, pieces to search, label)


@dataclass
class Options:
    """How pieces are superoptimized. ``limits``: a ``prism.search.Limits`` per piece (default: one
    kernel operator, 60 s, 3 results — pieces are cut to fit one kernel); ``time_limit`` overrides its
    budget. ``top_k``, ``tune_budget_s``, ``measure_machine``, ``verbose``: as ``prism.superoptimize``.
    ``budget``: the piece size bounds (:class:`~prism.frontend.partition.Budget`). ``progress``: a
    callback ``(event, index, total, label)`` with events "search", "done", "failed". ``derive``: a new
    value of a dynamic dim within a factor of 2 of a tuned one takes that tuning's winner, compiled and
    checked at the new shape, not measured (``prism.superoptimize(derive=...)``; a decoder's KV length is
    new at every step). ``chains``: runs of consecutive pieces with small static shapes are called as one
    (``prism.frontend.chain``: a decode step's per-call cost). ``huge_pages``: module state (weights) a
    piece reads is moved into huge pages on its first call (``prism.runtime.memory``: bandwidth-bound
    decode reads them faster; a one-time copy)."""

    limits: Any = None
    time_limit: float | None = None
    top_k: int = TOP_K
    tune_budget_s: float | None = None
    measure_machine: bool | None = None
    verbose: int = 0
    budget: Budget = field(default_factory=Budget)
    progress: Progress | None = None
    derive: bool = True
    chains: bool = True   # consecutive small static-shape pieces called as one (frontend/chain.py)
    huge_pages: bool = False   # module state pieces read moves into huge pages (prism/runtime/memory.py)

    @classmethod
    def from_any(cls, options: Any) -> Options:
        if options is None:
            return cls()
        if isinstance(options, cls):
            return options
        if isinstance(options, dict):
            unknown = sorted(set(options) - set(cls.__dataclass_fields__))
            if unknown:
                raise TypeError(f"unknown prism options {unknown}; known: {sorted(cls.__dataclass_fields__)}")
            return cls(**options)
        raise TypeError(f"prism options must be a dict or prism.frontend.Options, got {type(options).__name__}")

    def search_limits(self) -> Any:
        import dataclasses

        from prism.search import Limits
        lim = self.limits if self.limits is not None else Limits(max_kernel_ops=1, time_limit=60.0, max_results=3)
        if self.time_limit is not None:
            lim = dataclasses.replace(lim, time_limit=float(self.time_limit))
        return lim


# --- planning ----------------------------------------------------------------------------------------

def _src_key(cap: Captured, op: Operand) -> Any:
    u = cap.unit_of.get(op.node)
    if u is not None and u.node is op.node:
        return u.id
    return op.node  # a tensor PyTorch computes: one piece input, however many views of it the piece reads


def plan_pieces(cap: Captured, budget: Budget, only: set[int] | None = None) -> list[Piece]:
    """The pieces of the capture's units (``only``: of those unit ids alone; the others count as outside)."""
    units = [PlanUnit(u.id, u.kind, tuple(_src_key(cap, o) for o in u.lowered.operands), u.ops, u.matmuls,
                      u.heavy, u.norm, u.alone) for u in cap.units if only is None or u.id in only]
    users: dict[int, list[Any]] = {}
    for u in cap.units:
        us: list[Any] = []
        for user in u.node.users:
            v = cap.unit_of.get(user)
            if v is not None and v.id != u.id:
                us.append(v.id)  # transposed or not: a permute inside the piece
            elif v is None:
                us.append(("ext", user.name))
        users[u.id] = us
    return plan(units, users, budget)


# --- one piece as a Prism program -----------------------------------------------------------------------

@dataclass
class PieceProgram:
    graph: Graph
    units: list[Unit]
    args: list[Any]                  # FX nodes the runner receives (every value its fallback reads)
    specs: list[InputSpec | None]    # per runner argument: the Prism input it feeds (None: fallback only)
    input_shapes: list[str]
    output: Any                      # the FX node whose value the piece produces
    out_slots: tuple[int | None, ...] | None = None  # a tuple-valued node: which slots Prism computes
    transposed_inputs: int = 0       # inputs read through a permute inside the program (hoist False)
    example: dict[str, int] = field(default_factory=dict)   # the program's symbolic dims at the example inputs


class _Dims:
    """Piece-local symbol names: d0, d1, ... in order of first appearance; an expression is one symbol."""

    def __init__(self) -> None:
        self.map: dict[Any, Any] = {}

    def __call__(self, shape: Any) -> tuple:
        out = []
        for d in to_shape(shape):
            if isinstance(d, int):
                out.append(d)
                continue
            if d not in self.map:
                self.map[d] = D.sym(f"d{len(self.map)}")
            out.append(self.map[d])
        return tuple(out)


def build_piece(cap: Captured, piece: Piece, hoist: bool = False) -> PieceProgram:
    """The piece's Prism program, its sizes read through the capture's identifications."""
    with symbol_env(cap.symbols):
        return _build_piece(cap, piece, hoist)


def _build_piece(cap: Captured, piece: Piece, hoist: bool) -> PieceProgram:
    units = [cap.units[i] for i in piece.members]
    members = {m for u in units for m in u.members}
    label = "+".join(u.op for u in units)
    g = Graph(f"torch: {label}")
    dims = _Dims()
    values: dict[Any, Any] = {}
    inputs: dict[tuple, Any] = {}
    arg_index: dict[Any, int] = {}
    args: list[Any] = []
    specs: list[Any] = []
    shapes: list[str] = []
    transposed: set[Any] = set()

    def arg(node: Any) -> int:
        if node not in arg_index:
            arg_index[node] = len(args)
            args.append(node)
            specs.append(None)
        return arg_index[node]

    def operand(op: Operand) -> Any:
        if op.node in values:
            v = values[op.node]
            return g.permute(v, op.perm) if op.perm is not None else v
        # stored layout (hoist False): a transposed operand stays a permute inside the program and the
        # kernel reads the tensor as stored (a Linear weight [out, in]: no transposed copy). hoist True:
        # the runner passes it transposed (module state: one cached copy)
        lift = hoist and op.perm is not None
        if op.perm is not None and not hoist:
            transposed.add(op.node)
        key = (op.node, op.perm if lift else None, op.bias)
        if key not in inputs:
            mv = meta_value(op.node)
            shape = dims(mv.shape)
            if lift:
                shape = tuple(shape[p] for p in op.perm)  # type: ignore[union-attr]
            name = f"x{len(inputs)}"
            dt = O.prism_dtype(mv) or "float32"
            inputs[key] = g.input(name, shape, dt)
            shapes.append(D.format_shape(shape))
            spec = InputSpec(name, op.perm if lift else None, op.node in cap.persistent, getattr(torch, dt),
                             torch.bool if str(mv.dtype) == "torch.bool" else None, op.bias)
            if lift or op.bias or specs[arg(op.node)] is not None:  # another view of the tensor: its own argument
                args.append(op.node)
                specs.append(spec)
            else:
                specs[arg(op.node)] = spec
        v = inputs[key]
        return g.permute(v, op.perm) if op.perm is not None and not lift else v

    for u in units:
        values[u.node] = O.emit_unit(u.lowered, u.node, g, [operand(o) for o in u.lowered.operands])
    out_unit = cap.units[piece.output]
    out = values[out_unit.node]
    slots = None
    if isinstance(out, tuple):  # max(x, dim): (values, None); the indices' users stay in PyTorch (capture)
        slots = tuple(0 if v is not None else None for v in out)
        if slots.count(0) != 1:
            raise PrismError(f"piece {label}: a tuple result with {slots.count(0)} computed values")
        out = next(v for v in out if v is not None)
    if slots is None:
        out = O.as_torch_dtype(g, out, out_unit.node)
    g.output(out, "y")
    g = sink_reshapes(g)
    # every other value the original nodes read (sizes, constants' nodes) is a fallback-only argument
    for m in sorted(members, key=_order(cap)):
        for a in m.all_input_nodes:
            if a not in members:
                arg(a)
    example = {}
    for expr, sym in dims.map.items():   # PyTorch's size expression -> the piece's symbol: its example value
        try:
            example[next(iter(D.symbols(sym)))] = int(D.evaluate(expr, cap.symbols.hints))
        except (PrismError, KeyError, TypeError, ValueError, StopIteration):
            continue
    return PieceProgram(g, units, args, specs, shapes, out_unit.node, slots, len(transposed), example)


def _squeeze_dims(src: tuple, dst: tuple) -> dict[int, int] | None:
    """For a reshape that only inserts or removes extent-1 dims (a squeeze, an unsqueeze): each dim of
    ``dst`` whose extent is not the integer 1 -> its dim in ``src``; None for any other reshape."""
    def big(shape: tuple) -> list[int]:
        return [i for i, s in enumerate(shape) if not (isinstance(s, int) and s == 1)]
    a, b = big(src), big(dst)
    if len(a) != len(b) or not all(D.structurally_equal(src[i], dst[j]) for i, j in zip(a, b)):
        return None
    return dict(zip(b, a))


def sink_reshapes(g: Graph) -> Graph:
    """``unary(reshape(x)) -> reshape(unary(x))`` (element-wise unary operators commute with reshapes), and
    ``reduce(squeeze(x), d) -> reshape(reduce(x, d'))`` (a keepdim reduction over a dim that a squeeze or
    unsqueeze only renumbers), to a fixpoint: a reshape that reaches the program's output is peeled off by
    the search instead of splitting the program (GQA attention's regrouping followed by a scale; a mean of
    row means, ``x.mean(-1).mean()``, whose squeeze sat between the two reductions)."""
    from prism.ir.ops import OPS
    while True:
        users: Counter[Any] = Counter(x for n in g.nodes for x in n.src)
        ng = Graph(g.name)
        vals: dict[Any, Any] = {}
        for name, node in g.inputs.items():
            vals[node] = ng.input(name, node.shape, node.dtype)
        changed = False
        for n in g.nodes:
            if n.op == "input":
                continue
            if n.op == "output":
                ng.output(vals[n.src[0]], n.arg[0])
                continue
            src = n.src[0] if n.src else None
            dims = (_squeeze_dims(src.src[0].shape, src.shape) if OPS[n.op].group == "reduction" and src is not None
                    and src.op == "reshape" and users[src] == 1 else None)
            if (OPS[n.op].group == "unary" and src is not None and src.op == "reshape" and users[src] == 1):
                inner = ng._apply(n.op, [vals[src.src[0]]], n.arg)
                vals[n] = ng.reshape(inner, src.arg[0])
                changed = True
            elif dims is not None and n.arg[0] in dims:
                inner = ng._apply(n.op, [vals[src.src[0]]], (dims[n.arg[0]],))
                vals[n] = ng.reshape(inner, n.shape)
                changed = True
            else:
                vals[n] = ng._apply(n.op, [vals[x] for x in n.src], n.arg)
        g = ng
        if not changed:
            return g


def _order(cap: Captured) -> Callable[[Any], int]:
    pos = {n: i for i, n in enumerate(cap.gm.graph.nodes)}
    return pos.__getitem__


class LazyFallback:
    """A piece's PyTorch code: its nodes copied now (the rewrite erases them from the graph), the
    ``GraphModule`` -- whose construction generates and compiles Python code, ~1-2 ms -- made at the first call
    that falls back, which most pieces never see (132 of them in a warm start of llama-small)."""

    def __init__(self, root: Any, graph: Any) -> None:
        self.root, self.graph = root, graph
        self.module: torch.nn.Module | None = None

    def __call__(self, *args: Any) -> Any:
        if self.module is None:
            self.module = torch.fx.GraphModule(self.root, self.graph)
            self.root = None
        return self.module(*args)


def _fallback_module(cap: Captured, prog: PieceProgram) -> LazyFallback:
    g = torch.fx.Graph()
    env: dict[Any, Any] = {}
    for k, node in enumerate(prog.args):
        ph = g.placeholder(f"a{k}")
        env.setdefault(node, ph)
    members = sorted({m for u in prog.units for m in u.members}, key=_order(cap))
    for m in members:
        env[m] = g.node_copy(m, lambda a: env[a])
    g.output(env[prog.output])
    return LazyFallback(cap.gm, g)


# --- the whole graph ----------------------------------------------------------------------------------

def copy_module(gm: Any) -> Any:
    """A GraphModule with a copy of ``gm``'s graph (node meta kept) sharing its parameters and submodules:
    rewriting it leaves ``gm`` untouched."""
    g = torch.fx.Graph()
    g._codegen = gm.graph._codegen  # how forward's signature is generated (pytree for exported modules)
    val_map: dict[Any, Any] = {}
    got = g.graph_copy(gm.graph, val_map, return_output_node=True)
    if isinstance(got, tuple):
        rv, out_node = got
        new_out = g.output(rv, type_expr=out_node.type)
        new_out.meta = dict(out_node.meta)
    new = torch.fx.GraphModule(gm, g, class_name=type(gm).__name__)
    for k in ("meta", "_in_spec", "_out_spec"):
        if hasattr(gm, k):
            setattr(new, k, getattr(gm, k))
    return new


def compile_graph(gm: Any, example_inputs: list[Any] | None = None, *, source: str = "fx",
                  options: Options | None = None, dynamic: Any = None,
                  persistent_inputs: set[int] | None = None) -> tuple[Any, GraphReport]:
    """Rewrite ``gm`` in place (see the module docstring); returns it and its report."""
    opts = options or Options()
    nodes = sum(1 for n in gm.graph.nodes if n.op in ("call_function", "call_method", "call_module"))
    report = new_report(source, nodes)
    cap = capture(gm, example_inputs, dynamic, persistent_inputs)
    _log_fallbacks(report, cap)
    report.assumptions = cap.symbols.assumptions()
    for a in report.assumptions:
        log.info("prism: graph %d assumes %s", report.index, a)
    report.layout = len(cap.layout_units)
    ahead.forget()   # compiled ahead for an earlier graph and not taken by its tunings
    # an earlier graph's first call held work for later shapes (its pre-builds): it runs beside these searches, which
    # measure nothing, and the drain below finishes it
    ahead.release()
    try:
        _search_pieces(gm, cap, report, opts)
    finally:
        # nothing compiles in the background once the graph is returned: its first call's tunings time kernels
        ahead.drain()
    _drop_identity_casts(gm.graph)
    _drop_identity_slices(gm.graph)
    _share_repeated_views(gm.graph)
    _collapse_layout_chains(gm.graph)
    _absorb_output_reshapes(gm)
    gm.graph.eliminate_dead_code(is_impure_node=_kept)
    if opts.chains:
        report.chains = form_chains(gm, f"prism_chain_{report.index}")
    gm.graph.lint()
    gm.recompile()
    log.info("prism: %s", report.summary())
    return gm, report


# Unused results the rewritten graph need not compute: Dynamo's graphs keep size arithmetic whose values no
# operator reads (``torch.sym_sum([1, s40])`` after a cache update, ``keys.numel()``): ~50 µs of a decode
# step of a 4-layer Llama (7 such calls, each a Python call in the graph's code). Only these are removed:
# FX counts every method call as pure, in-place ones (``add_``, ``copy_``) included.
_DEAD_IF_UNUSED = frozenset(("sym_sum", "sym_size", "sym_numel", "sym_stride"))
_DEAD_METHODS_IF_UNUSED = frozenset(("numel", "size", "dim", "stride"))


def _search_pieces(gm: Any, cap: Captured, report: GraphReport, opts: Options) -> None:
    """Search every piece of the capture and put the ones with a kernel into ``gm`` (compile_graph)."""
    pieces = plan_pieces(cap, opts.budget)
    built = [b for k, piece in enumerate(pieces)
             if (b := _build(cap, report, k, piece, joins=opts.chains)) is not None]
    replaced: dict[Any, Any] = {}
    order = _order(cap)
    total = len(built)
    done = 0
    while built:  # a wide piece that found nothing puts its re-planned parts at the front
        pr, prog, fallback, piece = built.pop(0)
        done += 1
        if opts.progress:
            opts.progress("search", done, total, pr.label)
        wide = piece.ops > opts.budget.max_ops and len(piece.members) > 1
        kernel = _superoptimize(prog.graph, opts, pr, last=not prog.transposed_inputs and not wide,
                                ops=piece.ops, example=prog.example)
        if kernel is None and prog.transposed_inputs:
            # the search found nothing with the transposes inside the program: search the program whose
            # transposed inputs the runner passes transposed (a copy per call; module state: one cached copy)
            log.warning("prism: piece %d (%s): no kernel reading its inputs as stored (%s); searching again with "
                        "its %d transposed input(s) copied transposed before each call", pr.index, pr.label,
                        pr.reason.removeprefix("prism.superoptimize raised "), prog.transposed_inputs)
            prog = build_piece(cap, piece, hoist=True)
            fallback = _fallback_module(cap, prog)
            pr.inputs, pr.program_key = prog.input_shapes, prog.graph.key
            kernel = _superoptimize(prog.graph, opts, pr, last=not wide, ops=piece.ops, example=prog.example)
        if kernel is None and wide:
            # more operators than a piece with a contraction may have, and no kernel: its operators planned
            # again within that bound, each part searched like any other piece
            parts = plan_pieces(cap, dataclasses.replace(opts.budget, max_ops_no_matmul=opts.budget.max_ops),
                                only=set(piece.members))
            why = pr.reason.removeprefix("prism.superoptimize raised ")
            pr.status = "split"
            first = len(report.pieces)
            again = [b for part in parts
                     if (b := _build(cap, report, len(report.pieces), part, joins=opts.chains)) is not None]
            pr.reason = (f"no kernel as one piece of {piece.ops} operators ({why}); planned again as piece(s) "
                         + ", ".join(str(k) for k in range(first, len(report.pieces))))
            log.warning("prism: piece %d (%s): %s", pr.index, pr.label, pr.reason)
            built[:0] = again
            total += len(again)
            continue
        if kernel is None:
            if opts.progress:
                opts.progress("failed", done, total, pr.label)
            continue
        pr.status, pr.reason = "prism", ""
        # its first call's tuning compiled on the other core while the next pieces are searched (tune.ahead); an
        # optimization only: a failure here leaves that work to the first call
        try:
            kernel.compile_ahead({k: v for k, v in prog.example.items() if k in kernel.symbols()})
        except Exception as e:
            log.debug("prism: piece %d (%s): nothing compiled ahead: %s: %s", pr.index, pr.label, type(e).__name__, e)
        runner = PieceRunner(f"{pr.index} ({pr.label})", kernel, list(prog.specs), fallback, prog.out_slots,
                             huge_pages=opts.huge_pages)
        pr.runner = runner
        pr.structure = kernel.implementations[0].structure if kernel.implementations else ""
        _replace(gm, prog, runner, f"prism_piece_{report.index}_{pr.index}", replaced, order)
        if opts.progress:
            opts.progress("done", done, total, pr.label)


def _identity_cast_input(node: Any) -> Any:
    """The tensor node ``x`` when ``node`` is ``x.to(dtype[, device])`` or ``x.float()`` whose captured result has
    ``x``'s dtype and device (as the cast converter decides, ``ops._identity_conv``; Dynamo's guards and the
    export's input checks hold every input's dtype, and the graph's operators fix the rest), else None.
    ``Tensor.to`` then returns ``x`` itself: the call can go, aliasing included. Only plain forms (no ``copy``,
    no ``memory_format``)."""
    if node.op != "call_method" or node.target not in ("to", "float") or not node.args:
        return None
    x, rest = node.args[0], node.args[1:]
    if node.target == "float" and (rest or node.kwargs):
        return None
    if set(node.kwargs) - {"dtype", "device", "non_blocking"} or not all(
            isinstance(a, (torch.dtype, torch.device, str)) for a in rest):
        return None
    got, want = (meta_value(x) if isinstance(x, torch.fx.Node) else None), meta_value(node)
    if not (O.is_tensor_meta(got) and O.is_tensor_meta(want)) or (got.dtype, str(got.device)) != (
            want.dtype, str(want.device)):
        return None
    return x


def _drop_identity_casts(g: Any) -> None:
    """Remove ``.to`` calls that return their input (``_identity_cast_input``). Model code casts to a dtype its
    tensors already have: Llama's RMSNorm ``hidden_states.to(torch.float32)`` after a float32 residual, RoPE's
    ``cos.to(dtype=x.dtype)``, ``inv_freq.to(device, torch.float32)`` -- 11 Python calls per decode step of a
    float32 4-layer Llama, ~5-9 µs each, between Prism's pieces."""
    for n in list(g.nodes):
        x = _identity_cast_input(n)
        if x is not None:
            n.replace_all_uses_with(x)
            g.erase_node(n)


def _identity_slice_input(n: Any) -> Any:
    """The input of ``x[...]`` when the indexing is basic slicing that keeps every element of a static shape
    (``h[:, -1:, :]`` of a decode step's [1, 1, d] hidden state), else None."""
    if n.op != "call_function" or n.target is not operator.getitem or len(n.args) != 2:
        return None
    x, idx = n.args
    v = O.meta_value(x) if isinstance(x, torch.fx.Node) else None
    if not O.is_tensor_meta(v) or not all(isinstance(d, int) for d in v.shape):
        return None
    idx = idx if isinstance(idx, tuple) else (idx,)
    if sum(i is Ellipsis for i in idx) > 1 or not all(i is Ellipsis or isinstance(i, slice) for i in idx):
        return None
    k = idx.index(Ellipsis) if Ellipsis in idx else len(idx)
    rest = [i for i in idx if i is not Ellipsis]
    if len(rest) > v.dim():
        return None
    dims = list(range(k)) + list(range(v.dim() - (len(rest) - k), v.dim()))
    for d, sl in zip(dims, rest):
        if not all(b is None or isinstance(b, int) for b in (sl.start, sl.stop, sl.step)):
            return None
        if range(*sl.indices(v.shape[d])) != range(v.shape[d]):
            return None
    return x


def _drop_identity_slices(g: Any) -> None:
    """Remove slicings that keep the whole tensor (``_identity_slice_input``) where no graph output is the
    slice: a decode step's LM head reads ``norm(h)[:, -1:, :]``, which kept it out of the step's chain."""
    for n in list(g.nodes):
        x = _identity_slice_input(n)
        if x is not None and not any(u.op == "output" for u in n.users):
            n.replace_all_uses_with(x)
            g.erase_node(n)


# Tensor methods that only re-lay out their input (a view, or a copy in another order); a chain of them is
# collapsed when it keeps the row-major order (_collapse_layout_chains).
_LAYOUT_CALLS = frozenset(("view", "reshape", "transpose", "permute", "unsqueeze", "squeeze", "contiguous", "flatten",
                           "t"))
# Layout methods whose repeated calls on the same tensor with the same arguments the rewritten graph computes
# once: Llama's decoder layers each call ``cos.unsqueeze(1)`` and ``sin.unsqueeze(1)`` on the same cos/sin
# (16 calls per decode step of an 8-layer model, ~7 µs each, where 2 do). (expand: shared, never in a chain,
# it changes the element count.)
_SHARED_VIEWS = _LAYOUT_CALLS | {"expand"}


def _hashable(v: Any) -> bool:
    try:
        hash(v)
    except TypeError:
        return False
    return True


def _mutated(node: Any, returned: bool = True) -> bool:
    """Whether a user of ``node`` may change it or expose it: an in-place call (``ops.mutates``: ``add_``,
    ``operator.iadd``, ``x[i] = v``, ``out=``), or (``returned``) the graph's output (a caller could mutate what it
    gets)."""
    return any((returned and u.op == "output") or O.mutates(u) for u in node.users)


def _share_repeated_views(g: Any) -> None:
    """Replace a layout call by an earlier identical one (same method, same tensor, same arguments) when no
    user of either may mutate or return it: both are the same view of the same memory (``reshape`` or
    ``contiguous`` may copy: then one copy serves both readers, which only read it)."""
    seen: dict[tuple, Any] = {}
    for n in list(g.nodes):
        if n.op != "call_method" or n.target not in _SHARED_VIEWS:
            continue
        key = (n.target, n.args, tuple(sorted(n.kwargs.items())))
        if not _hashable(key):
            continue
        first = seen.get(key)
        if first is None:
            seen[key] = n
        elif not _mutated(n) and not _mutated(first):
            n.replace_all_uses_with(first)
            g.erase_node(n)


# the chain test runs the chain on an int32 arange of the input's size: at most 4 MiB of it (the per-head
# reshapes of a decode step have a few thousand elements; a weight's chain is left alone)
_CHAIN_MAX_ELEMENTS = 1 << 20
_CHAIN = _LAYOUT_CALLS


def _collapse_layout_chains(g: Any) -> None:
    """Replace a chain of two or more layout calls whose result is its input's elements in their row-major
    order by one ``reshape``: a decode step reshapes each projection to heads and transposes a size-1 dim
    (``q.view(1, 1, H, D).transpose(1, 2)``), and attention's output goes back through ``reshape``,
    ``transpose``, ``contiguous`` and ``reshape`` -- 6 of these 8 Python calls per layer do nothing to the
    element order. Decided on the captured static shapes by applying the chain to ``arange`` (a chain with a
    symbolic size is left alone); only chains whose intermediate results have no other user, whose result no
    user mutates or returns (the ``reshape`` may alias where the chain copied) and whose input nothing mutates
    in place (the chain's views would see it where the ``reshape`` may have copied). A single call is replaced
    where its input is a piece's output, whose reshape the piece then absorbs (``_absorb_output_reshapes``)."""
    for end in list(g.nodes):
        if end.op != "call_method" or end.target not in _CHAIN or any(
                u.op == "call_method" and u.target in _CHAIN for u in end.users) or _mutated(end):
            continue
        chain = [end]
        base = end.args[0]
        while (isinstance(base, torch.fx.Node) and base.op == "call_method" and base.target in _CHAIN
               and len(base.users) == 1):
            chain.append(base)
            base = base.args[0]
        if not isinstance(base, torch.fx.Node) or _mutated(base, returned=False):
            continue   # an in-place user of the base: the chain's views see it, a copying reshape would not
        # one call is worth replacing only where the reshape then goes into the piece that makes its input
        # (_absorb_output_reshapes): Qwen3's QK-norm output `.transpose(1, 2)` of a size-1 dim
        if len(chain) < 2 and (chain[0].target in ("reshape", "view") or base.op != "call_module"):
            continue
        shape_in, shape_out = O.static_shape(base), O.static_shape(end)
        if shape_in is None or shape_out is None:
            continue
        if any(isinstance(a, torch.fx.Node) for n in chain for a in (*n.args[1:], *n.kwargs.values())):
            continue
        size = math.prod(shape_in)
        if size > _CHAIN_MAX_ELEMENTS:
            continue
        t = torch.arange(size, dtype=torch.int32).reshape(shape_in)
        try:
            for n in reversed(chain):
                t = getattr(t, n.target)(*n.args[1:], **n.kwargs)
        except (RuntimeError, TypeError, ValueError):
            continue
        if tuple(t.shape) != shape_out or not torch.equal(t.reshape(-1), torch.arange(size, dtype=torch.int32)):
            continue
        with g.inserting_before(end):
            one = g.call_method("reshape", (base, shape_out))
        one.meta = dict(end.meta)
        end.replace_all_uses_with(one)
        for n in chain:
            g.erase_node(n)


def _absorb_output_reshapes(gm: Any) -> None:
    """A piece whose single output's one use is a ``reshape``/``view`` to a static shape allocates its output
    in that shape (``PieceRunner.out_view``: a contiguous result has the same elements in the same order), and
    the call goes: the per-head reshapes of q/k/v and of attention's output in a decode step (32 calls per
    step of an 8-layer Llama)."""
    g = gm.graph
    for n in list(g.nodes):
        if n.op != "call_method" or n.target not in ("reshape", "view"):
            continue
        src = n.args[0]
        if not isinstance(src, torch.fx.Node) or src.op != "call_module" or len(src.users) != 1:
            continue
        runner = getattr(gm, str(src.target), None)
        shape = O.static_shape(n)
        if (not isinstance(runner, PieceRunner) or runner.out_slots is not None or runner.out_view is not None
                or shape is None or len(runner.kernel.program.outputs) != 1):
            continue
        runner.out_view = shape
        src.meta = dict(n.meta)
        n.replace_all_uses_with(src)
        g.erase_node(n)


def _kept(node: Any) -> bool:
    """Whether ``node`` stays in the graph when nothing uses its value (see ``_DEAD_IF_UNUSED``)."""
    if node.op == "call_function":
        return getattr(node.target, "__name__", "") not in _DEAD_IF_UNUSED
    if node.op == "call_method":
        return node.target not in _DEAD_METHODS_IF_UNUSED
    return node.op != "get_attr"


def _between_pieces(cap: Captured, piece: Piece) -> bool:
    """Whether a lone element-wise operator (a piece too small to search) reads a value another compute unit
    makes and has one as a user, at a static shape a chain takes (``chain.MAX_ELEMENTS``): a decode step's
    residual add between two pieces that could not absorb it (measured: llama-1b W8A8, whose quantizing products
    are 9 operators, more than a piece with a contraction may have with the add; the 16 adds in PyTorch cut the
    decode graph into 17 chains, each return to Python ~10-50 µs in a step whose weight stream evicts the
    caches). Searched, it is one more piece, and the chain runs on through it."""
    if len(piece.members) != 1:
        return False
    u = cap.units[piece.members[0]]
    shape = O.static_shape(u.node)
    if shape is None or not 0 < math.prod(shape) <= CHAIN_MAX_ELEMENTS:
        return False

    def compute(n: Any, up: bool, depth: int = 0) -> bool:
        # a compute unit's value, seen through a few views or identity casts (a layout unit or none: one tensor
        # in, such as the slice before a model's last norm)
        v = cap.unit_of.get(n)
        if v is not None and v.kind == "compute":
            return v.id != u.id
        if depth >= 4:
            return False
        if up:
            ins = [a for a in n.all_input_nodes if O.is_tensor_meta(O.meta_value(a))]
            return len(ins) == 1 and compute(ins[0], up, depth + 1)
        return any(compute(c, up, depth + 1) for c in n.users)
    return (any(compute(o.node, True) for o in u.lowered.operands)
            and any(compute(c, False) for c in u.node.users))


def _build(cap: Captured, report: GraphReport, k: int, piece: Piece, joins: bool = False
           ) -> tuple[PieceReport, PieceProgram, Any, Piece] | None:
    """Piece ``k``'s report (appended to ``report``) and, when it is searched and its program forms, its
    program and PyTorch fallback module. Called for every piece before the graph changes (a wide piece's
    re-planned parts later: their members are still in the graph). ``joins``: chains are formed, so a lone
    element-wise operator between pieces is searched too (:func:`_between_pieces`)."""
    units = [cap.units[i] for i in piece.members]
    pr = PieceReport(k, [u.op for u in units], piece.ops, [], "small")
    report.pieces.append(pr)
    if not piece.searched and not (joins and _between_pieces(cap, piece)):
        pr.reason = "a single element-wise operator: nothing to fuse"
        return None
    try:
        prog = build_piece(cap, piece)
        fallback = _fallback_module(cap, prog)
    except Exception as e:  # the piece stays in PyTorch, loudly
        pr.status, pr.reason = "failed", f"cannot form its Prism program: {type(e).__name__}: {e}"
        log.warning("prism: piece %d (%s) left to PyTorch: %s", k, pr.label, pr.reason)
        return None
    pr.inputs, pr.program_key = prog.input_shapes, prog.graph.key
    return pr, prog, fallback, piece


# the search time of a piece wider than the search's block limit (Budget.max_ops_no_matmul): the corpus's wide
# pieces (a Huber loss, a KL divergence, a layer norm with its weight expression) searched in 0.1-0.5 s, and one
# that finds nothing costs this much more than cutting it at once would have
WIDE_SEARCH_S = 20.0


def search_dims(graph: Graph, example: dict[str, int]) -> dict[str, int] | None:
    """The values the search ranks a piece's symbolic dims at: each dim's example value (the size Dynamo
    compiled the graph at) rounded to a power of two, at least api.SEARCH_DIM; None where none is known.
    Rounded so that the search cache serves other first lengths of the same order. Measured need: ranked at
    SEARCH_DIM (8) for every dim, the prefill attention's symbolic search kept three sGraphs that materialize
    the L x L scores (at 8 rows they cost least) and dropped the online-softmax ones it had found: under
    ``dynamic=True`` a 1024-token prompt of llama-1b bf16 spent 40.8 ms per layer in attention, and its prefill
    was 0.88x inductor's."""
    from prism.api import SEARCH_DIM
    out = {k: max(SEARCH_DIM, 1 << max(0, round(math.log2(v)))) for k, v in example.items()
           if k in graph.symbols() and v > 0}
    return out or None


def _superoptimize(graph: Graph, opts: Options, pr: PieceReport, last: bool = True, ops: int = 0,
                   example: dict[str, int] | None = None) -> Any:
    """The piece's kernel, or None with ``pr`` marked failed (logged as a warning when ``last``, the last
    attempt for this piece). ``ops``: the piece's Prism operators; a piece of more than the search's block
    limit (a wide piece without a contraction, ``Budget.max_ops_no_matmul``) is searched with that limit
    raised to its size and for at most ``WIDE_SEARCH_S``, unless the caller gave ``limits``. ``example``: the
    program's symbolic dims at the example inputs (:func:`search_dims`)."""
    from prism.api import NoVerifiedKernelError, superoptimize
    t0 = time.perf_counter()
    limits = opts.search_limits()
    sdims = search_dims(graph, example or {})
    if opts.limits is None and ops > limits.max_block_ops:
        # at most WIDE_SEARCH_S of it: should the wide piece find nothing, its parts are searched after it
        limits = dataclasses.replace(limits, max_block_ops=ops, time_limit=min(limits.time_limit, WIDE_SEARCH_S))
    try:
        try:
            k = superoptimize(graph, limits=limits, top_k=opts.top_k, tune_budget_s=opts.tune_budget_s,
                              verbose=opts.verbose, measure_machine=opts.measure_machine, derive=opts.derive,
                              search_dims=sdims, prebuild="later")
        except NoVerifiedKernelError:
            if opts.limits is not None or limits.max_kernel_ops != 1:
                raise
            # one kernel per piece cannot express a piece whose reductions depend on each other (row
            # means, then their mean): search again with two kernels before leaving it to PyTorch
            k = superoptimize(graph, limits=dataclasses.replace(limits, max_kernel_ops=2), top_k=opts.top_k,
                              tune_budget_s=opts.tune_budget_s, verbose=opts.verbose,
                              measure_machine=opts.measure_machine, derive=opts.derive, search_dims=sdims,
                              prebuild="later")
    except Exception as e:  # any failure leaves the piece to PyTorch, loudly
        msg = str(e).splitlines()[0] if str(e) else ""
        pr.status, pr.reason = "failed", f"prism.superoptimize raised {type(e).__name__}: {msg}"
        if last:
            log.warning("prism: piece %d (%s) left to PyTorch: %s", pr.index, pr.label, pr.reason)
        return None
    log.info("prism: piece %d (%s) superoptimized in %.1f s", pr.index, pr.label, time.perf_counter() - t0)
    return k


def _replace(gm: Any, prog: PieceProgram, runner: PieceRunner, name: str, replaced: dict[Any, Any],
             order: Callable[[Any], int]) -> None:
    gm.add_submodule(name, runner)
    # also in the instance dict: the generated forward's ``self.<name>`` is then found there, not through
    # nn.Module.__getattr__ (a Python call per piece per call, ~0.5-1 µs); registration stays in _modules,
    # and nn.Module.__setattr__ removes the entry if the name is ever reassigned
    gm.__dict__[name] = runner
    g = gm.graph
    with g.inserting_before(prog.output):
        call = g.call_module(name, tuple(replaced.get(a, a) for a in prog.args))
    call.meta = dict(prog.output.meta)
    prog.output.replace_all_uses_with(call)
    replaced[prog.output] = call
    members = sorted({m for u in prog.units for m in u.members}, key=order)
    for m in reversed(members):
        g.erase_node(m)


def _log_fallbacks(report: GraphReport, cap: Captured) -> None:
    counts: Counter[tuple[str, str]] = Counter((f.op, f.reason) for f in cap.fallbacks)
    for (op, reason), n in counts.items():
        report.fallbacks.append(Fallback(op, reason, n))
        log.warning("prism: %s left to PyTorch%s: %s", op, f" (x{n})" if n > 1 else "", reason)
