"""Chains: consecutive pieces of a rewritten graph, and the cache's ``torch.cat`` between them, called as one.

A decode step of a Hugging Face Llama calls ~10 pieces and two ``torch.cat`` per layer. Each call from the
graph's Python code costs far more than the same call in a loop: the weight stream of the step's GEMVs
evicts the caches the Python, PyTorch and launcher code and data run from. Measured on this 2-core Zen 4 VM:
a ``torch.empty`` of 77 KB takes 1.2 µs hot and ~50 µs right after a 64 MB read, a ``torch.cat`` of the
KV cache 8 µs hot and 80-95 µs cold (~35-50 µs per cat inside a llama-1b decode step); a piece call ~10 µs
beyond its kernel (3.5 µs checks, 3 µs output allocation, 3.5 µs launch, timed inside the C path) against 3.6
µs in a loop. What costs is each return to Python between kernels, so a *chain* makes a run of them one call:

* its members are pieces (static shapes, or an input of a dynamic size such as the attention's KV length:
  their launcher is looked up per call, planned from the C path at a new size) and ``torch.cat`` calls of
  float tensors (copied by the chain), run one after the other in the graph with nothing in between that
  reads their values or changes a tensor in place;
* the **external inputs** (graph values, module state) are checked once per call, as a piece checks its
  inputs (tensor, captured dtype, shape where static, CPU, contiguous, no autograd);
* a value of static shape made and used inside the chain (**internal**) goes to a buffer the chain owns and
  reuses on every call; the values the graph reads after the chain, those of dynamic shape and the cats'
  are fresh tensors, allocated before the first kernel runs;
* then the kernels and copies run one after the other from C with the GIL released once
  (``prism/runtime/fastcall.py``, ``Chain``), under the chain's lock: one call of a chain at a time, so its
  buffers are never shared.

A Llama decode graph becomes one chain for all its layers, the RoPE table and the LM head (nn.Module's
telemetry call may sit between members; the compiler drops the whole-tensor slice before the head). Only
pieces whose output has a static shape of at most ``MAX_ELEMENTS`` join: chains are for calls whose cost is
the call, not the kernel (a 128-token prefill's pieces do not join, and keep no buffers). The C path is bound
on the first call that ran every piece on Prism; a call it does not take (another dtype, a non-contiguous
input, autograd, a size no kernel covers) runs the members one by one, the pieces through their runners with
their checks, fallbacks and messages: the chain changes no result, only the cost.
"""

from __future__ import annotations

import logging
import math
import operator
from dataclasses import dataclass
from typing import Any

import torch

from prism.frontend import ops as O
from prism.frontend.runtime import PieceRunner
from prism.runtime import fastcall

log = logging.getLogger("prism")

# the largest output (elements) of a piece that joins a chain: decode-sized values ([1, 1, 5632] of an MLP,
# 22 KB in float32) are far below it, a 128-token prefill's ([128, 2048]) above
MAX_ELEMENTS = 1 << 16

# what may run between two pieces of a chain without ending it: operators that neither read a chain's
# values (checked) nor change any tensor in place, so the chain may run after them
_PURE_METHODS = frozenset(("view", "reshape", "unsqueeze", "squeeze", "transpose", "permute", "expand",
                           "contiguous", "size", "dim", "numel", "float", "to", "t"))
_PURE_FUNCTIONS = frozenset((torch.cat, operator.getitem, torch.unsqueeze, torch.reshape, torch.transpose,
                             torch.permute, torch.squeeze, torch.sym_sum,
                             torch._C._log_api_usage_once))  # nn.Module's telemetry call: reads no tensor

# a chain's argument source: ("x", j) the chain's argument j, ("v", i) the output of its member i
Source = tuple[str, int]

# the C type's bounds (prism/runtime/fastcall.py, CHAIN_MAX_*): a longer run is cut into several chains
MAX_STEPS = 512
MAX_EXTERNAL = 512


@dataclass(frozen=True)
class Cat:
    """A ``torch.cat`` member: its dim (normalized, >= 0) and the result's dtype."""

    dim: int
    dtype: torch.dtype

    label = "cat"


class PieceChain(torch.nn.Module):
    """Consecutive pieces (and the ``torch.cat`` calls between them) called as one (module docstring).
    ``members[i]``: a :class:`PieceRunner` or a :class:`Cat`; ``dynamic[i]``: the piece has an input of a
    dynamic size (its launcher is looked up per call); ``wiring[i]``: the sources of member ``i``'s arguments
    (a cat's: its tensors); ``results``: the members whose outputs the call returns, in order;
    ``patterns[j]``: the captured shape of argument ``j`` (-1 where a size is dynamic), None for a non-tensor."""

    def __init__(self, label: str, members: list[PieceRunner | Cat], dynamic: list[bool],
                 wiring: list[tuple[Source, ...]], results: tuple[int, ...],
                 patterns: list[tuple[int, ...] | None]) -> None:
        super().__init__()
        self.label = label
        # a plain list, not submodules: the runners stay registered under their own names in the graph module
        self.__dict__["members"] = list(members)
        self.dynamic = list(dynamic)
        self.wiring = wiring
        self.results = results
        self.patterns = patterns
        self._fast: Any = None
        self._why_not = ""        # why the C path is not bound (explain())

    @property
    def runners(self) -> list[PieceRunner]:
        return [m for m in self.members if isinstance(m, PieceRunner)]

    def forward(self, *args: Any) -> Any:
        fast = self._fast
        if fast is not None:
            out = fast(args)
            if out is not None:
                return out
        return self._one_by_one(args)

    # called from the rewritten graph's generated code: no nn.Module.__call__ (as PieceRunner)
    __call__ = forward

    def _one_by_one(self, args: tuple) -> tuple:
        """The members one by one: pieces through their runners (their checks, fallbacks and messages), cats
        through ``torch.cat``; the first call on which every piece ran on Prism binds the C path."""
        runners = self.runners
        before = [(r.prism_calls, r.fallback_calls) for r in runners]
        vals: list[Any] = []
        member_args: list[tuple] = []
        for m, wires in zip(self.members, self.wiring):
            a = tuple(args[k] if kind == "x" else vals[k] for kind, k in wires)
            member_args.append(a)
            vals.append(torch.cat(a, m.dim) if isinstance(m, Cat) else m(*a))
        if self._fast is None and not self._why_not:
            if all(r.prism_calls == p + 1 and r.fallback_calls == f for r, (p, f) in zip(runners, before)):
                try:
                    self._bind(args, member_args, vals)
                except _NotChained as e:
                    self._why_not = str(e)
                    log.debug("prism: chain %s runs its members one by one: %s", self.label, e)
        return tuple(vals[i] for i in self.results)

    def _bind(self, args: tuple, member_args: list[tuple], vals: list[Any]) -> None:
        chain_type, launcher_type = fastcall.chain_type(), fastcall.launcher_type()
        if chain_type is None or launcher_type is None:
            raise _NotChained("no C launcher (prism.runtime.fastcall.WHY_NOT)")
        escaping = set(self.results)
        # per member, its C step (fastcall.Chain) with the sources it reads, in the step's order, still as
        # Sources at item 1: (kind, sources, fields...)
        plans: list[tuple] = []
        for i, (m, wires, a) in enumerate(zip(self.members, self.wiring, member_args)):
            out = vals[i]
            if not isinstance(out, torch.Tensor) or not out.is_contiguous() or out.numel() == 0:
                raise _NotChained(f"member {i}'s output is not one contiguous, non-empty tensor")
            if isinstance(m, Cat):
                plans.append((2, wires, m.dim, out.dtype))
                continue
            ins = [a[k] for k, *_ in m._active]
            hit = m._compiled.get(tuple(x.shape for x in ins))
            if hit is None or not isinstance(hit[0], launcher_type):
                raise _NotChained(f"piece {m.label} has no C launcher for its shapes")
            if self.dynamic[i]:
                plans.append((1, [wires[k] for k, *_ in m._active], m._compiled, m._plan))
                continue
            launch, order = hit
            kernel_args = [m._active[j][0] for j in (range(len(ins)) if order is None else order)]
            plans.append((0, [wires[k] for k in kernel_args], launch, None if i in escaping else out,
                          tuple(out.shape)))
        ext: list[tuple[int, torch.dtype, tuple[int, ...]]] = []
        ext_index: dict[int, int] = {}
        for _, srcs, *_ in plans:
            for kind, j in srcs:
                if kind == "x" and j not in ext_index:
                    x = args[j]
                    if not isinstance(x, torch.Tensor):
                        raise _NotChained(f"argument {j} is a {type(x).__name__}, not a tensor")
                    ext_index[j] = len(ext)
                    ext.append((j, x.dtype, self.patterns[j] or tuple(x.shape)))
        # values: the external inputs, then one per member
        steps = tuple((kind, tuple(ext_index[j] if where == "x" else len(ext) + j for where, j in srcs), *fields)
                      for kind, srcs, *fields in plans)
        counters = tuple(r.__dict__ for r in self.runners) + (self.__dict__,)
        self.__dict__.setdefault("prism_calls", 0)
        self._fast = chain_type(tuple(ext), torch.Tensor, torch.is_grad_enabled, torch.empty, steps,
                                tuple(self.results), counters)

    @property
    def prism_calls(self) -> int:
        return int(self.__dict__.get("prism_calls", 0))

    def extra_repr(self) -> str:
        return f"{self.label!r}, members={len(self.members)}, calls={self.prism_calls}"


class _NotChained(Exception):
    pass


def _runner(gm: Any, node: Any) -> PieceRunner | None:
    if node.op != "call_module":
        return None
    r = getattr(gm, str(node.target), None)   # the instance dict first (compiler._replace puts pieces there)
    return r if isinstance(r, PieceRunner) else None


def _small_static(node: Any) -> bool:
    shape = O.static_shape(node)
    return shape is not None and 0 < math.prod(shape) <= MAX_ELEMENTS


def _tensor_node(a: Any) -> bool:
    return isinstance(a, torch.fx.Node) and O.is_tensor_meta(O.meta_value(a))


def _piece_kind(gm: Any, node: Any) -> str | None:
    """"static" or "dynamic" for a piece that may join a chain: Prism's C fast path takes it (no input
    transposed or converted here), one output of a static, small shape; "dynamic" where an input has a dynamic
    size (its launcher is looked up per call). None otherwise."""
    r = _runner(gm, node)
    if (r is None or r._fast is None or r.out_slots is not None or len(r.kernel.program.outputs) != 1
            or any(bias for *_, bias in r._active) or node.kwargs or not _small_static(node)):
        return None
    active = {i for i, *_ in r._active}
    dynamic = False
    for k, a in enumerate(node.args):
        if k in active:
            if not _tensor_node(a):
                return None
            dynamic = dynamic or O.static_shape(a) is None
        elif isinstance(a, torch.fx.Node):
            return None  # an argument the kernel does not read (a size): keep the piece's own call
    return "dynamic" if dynamic else "static"


_FLOATS = (torch.float32, torch.bfloat16, torch.float16)


def _cat(node: Any) -> Cat | None:
    """A ``torch.cat`` of tensors the chain can copy: float tensors, a constant dim."""
    if node.op != "call_function" or node.target not in (torch.cat, torch.ops.aten.cat.default):
        return None
    kwargs = dict(node.kwargs)
    dim = kwargs.pop("dim", node.args[1] if len(node.args) > 1 else 0)
    if kwargs or len(node.args) > 2 or not isinstance(dim, int) or not isinstance(node.args[0], (list, tuple)):
        return None
    parts = node.args[0]
    v = O.meta_value(node)
    if not parts or not all(_tensor_node(p) for p in parts) or not O.is_tensor_meta(v) or v.dtype not in _FLOATS:
        return None
    if any(O.meta_value(p).dtype != v.dtype or O.meta_value(p).dim() != v.dim() for p in parts):
        return None
    rank = v.dim()
    if not -rank <= dim < rank or rank > 8:
        return None
    return Cat(dim % rank, v.dtype)


def _pure(node: Any) -> bool:
    if node.op == "call_method":
        return node.target in _PURE_METHODS
    if node.op == "call_function":
        return node.target in _PURE_FUNCTIONS
    return node.op in ("placeholder", "get_attr")


def form_chains(gm: Any, prefix: str) -> list[PieceChain]:
    """Replace each run of chainable members (two or more, at least one piece) in ``gm``'s graph by one
    :class:`PieceChain` call (module docstring); returns the chains."""
    if fastcall.chain_type() is None:
        return []
    g = gm.graph
    runs: list[list[tuple[Any, Any]]] = []
    cur: list[tuple[Any, Any]] = []
    ext: set[Any] = set()

    def close() -> None:
        nonlocal cur, ext
        if len(cur) > 1 and any(not isinstance(m, Cat) for _, m in cur):
            runs.append(cur)
        cur, ext = [], set()

    for n in list(g.nodes):
        inside = {node for node, _ in cur}
        kind = _piece_kind(gm, n)
        member: Any = (kind, _runner(gm, n)) if kind is not None else _cat(n)
        if member is not None:
            reads = {a for a in n.all_input_nodes if a not in inside}
            if len(cur) + 1 > MAX_STEPS or len(ext | reads) > MAX_EXTERNAL:
                close()
                reads = set(n.all_input_nodes)
            cur.append((n, member))
            ext |= reads
            continue
        if any(a in inside for a in n.all_input_nodes) or not _pure(n):
            close()
    close()
    return [_replace_run(gm, members, f"{prefix}_{k}") for k, members in enumerate(runs)]


def _pattern(a: Any) -> tuple[int, ...] | None:
    v = O.meta_value(a) if isinstance(a, torch.fx.Node) else None
    if not O.is_tensor_meta(v):
        return None
    return tuple(int(s) if isinstance(s, int) else -1 for s in v.shape)


def _replace_run(gm: Any, run: list[tuple[Any, Any]], name: str) -> PieceChain:
    g = gm.graph
    nodes = [n for n, _ in run]
    index = {n: i for i, n in enumerate(nodes)}
    externals: list[Any] = []
    wiring: list[tuple[Source, ...]] = []
    for n, member in run:
        wires: list[Source] = []
        for a in (n.args[0] if isinstance(member, Cat) else n.args):
            if isinstance(a, torch.fx.Node) and a in index:
                wires.append(("v", index[a]))
            else:
                if not any(a is e for e in externals):
                    externals.append(a)
                wires.append(("x", next(k for k, e in enumerate(externals) if e is a)))
        wiring.append(tuple(wires))
    results = tuple(i for i, n in enumerate(nodes) if any(u not in index for u in n.users))
    members = [m if isinstance(m, Cat) else m[1] for _, m in run]
    dynamic = [not isinstance(m, Cat) and m[0] == "dynamic" for _, m in run]
    chain = PieceChain(f"{name} ({', '.join(m.label for m in members)})", members, dynamic, wiring, results,
                       [_pattern(a) for a in externals])
    gm.add_submodule(name, chain)
    gm.__dict__[name] = chain   # found by the generated forward without nn.Module.__getattr__ (compiler._replace)
    last = nodes[-1]
    with g.inserting_after(last):
        call = g.call_module(name, tuple(externals))
    call.meta = {}
    prev = call
    for k, i in enumerate(results):
        with g.inserting_after(prev):
            item = g.call_function(operator.getitem, (call, k))
        item.meta = dict(nodes[i].meta)
        nodes[i].replace_all_uses_with(item, delete_user_cb=lambda u: u not in index)
        prev = item
    for n in reversed(nodes):
        g.erase_node(n)
    return chain
