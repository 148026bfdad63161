"""Chains: consecutive pieces of a rewritten graph called as one.

A decode step of a Hugging Face Llama calls ~10 pieces per layer, each kernel a few hundred µs at most and
each call from the graph's Python code ~10-20 µs beyond its kernel: in a decode step the weight stream has
evicted the caches the Python and PyTorch code of a call run from (docs/frontend.md, "Per-call cost";
measured on llama-small bfloat16: 3.5 µs of input checks, 3 µs of output allocation and 3.5 µs of launch per
piece call, ~10 µs, against 3.6 µs for the same call in a loop). A *chain* is a run of such pieces that the
graph calls one after the other with nothing in between that reads their values; it becomes one call:

* the chain's **external inputs** (graph values and module state its pieces read) are checked once per call,
  as a piece checks its inputs (tensor, captured dtype and shape, CPU, contiguous, no autograd);
* a value made and used inside the chain (**internal**) is written to a buffer the chain owns and reuses
  on every call: no allocation, no check; the values the graph uses after the chain are fresh tensors;
* the kernels run one after the other from C with the GIL released once (``prism/runtime/fastcall.py``,
  ``Chain``), under the chain's lock: one call of a chain at a time, so its buffers are never shared.

Only pieces whose every input and output has a static shape join a chain (the launchers are bound once, on
the first call that ran every piece on Prism, and a call with other shapes takes the pieces one by one), and
only where their outputs are small (``MAX_ELEMENTS``): chains are for calls whose cost is the call, not the
kernel, and a buffer per internal value of a 128-token prefill would hold megabytes for nothing. A call the
C path does not take (another shape or dtype, autograd, a piece that left to PyTorch) runs the pieces through
their own runners, with their checks, fallbacks and messages: the chain changes no result, only the cost.
"""

from __future__ import annotations

import logging
import operator
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
                             torch.permute, torch.squeeze, torch.sym_sum))

# a chain's argument source: ("x", j) the chain's argument j, ("v", i) the output of its piece i
Source = tuple[str, int]


class PieceChain(torch.nn.Module):
    """Consecutive pieces called as one (module docstring). ``wiring[i]``: the sources of piece ``i``'s
    arguments; ``results``: the pieces whose outputs the call returns, in order."""

    def __init__(self, label: str, runners: list[PieceRunner], wiring: list[tuple[Source, ...]],
                 results: tuple[int, ...]) -> None:
        super().__init__()
        self.label = label
        # a plain list, not submodules: the runners stay registered under their own names in the graph module
        self.__dict__["runners"] = list(runners)
        self.wiring = wiring
        self.results = results
        self._fast: Any = None
        self._why_not = ""        # why the C path is not bound (explain())

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
        """The pieces through their runners (their checks, fallbacks and messages); the first call on which
        every piece ran on Prism binds the C path."""
        before = [(r.prism_calls, r.fallback_calls) for r in self.runners]
        vals: list[Any] = []
        piece_args: list[tuple] = []
        for r, wires in zip(self.runners, self.wiring):
            a = tuple(args[k] if kind == "x" else vals[k] for kind, k in wires)
            piece_args.append(a)
            vals.append(r(*a))
        if self._fast is None and not self._why_not:
            ran = all(r.prism_calls == p + 1 and r.fallback_calls == f
                      for r, (p, f) in zip(self.runners, before))
            if ran:
                try:
                    self._bind(args, piece_args, vals)
                except _NotChained as e:
                    self._why_not = str(e)
                    log.debug("prism: chain %s runs its pieces one by one: %s", self.label, e)
        return tuple(vals[i] for i in self.results)

    def _bind(self, args: tuple, piece_args: list[tuple], vals: list[Any]) -> None:
        chain_type, launcher_type = fastcall.chain_type(), fastcall.launcher_type()
        if chain_type is None or launcher_type is None:
            raise _NotChained("no C launcher (prism.runtime.fastcall.WHY_NOT)")
        ext: list[tuple[int, torch.dtype, tuple[int, ...]]] = []
        ext_index: dict[int, int] = {}
        steps = []
        escaping = set(self.results)
        for i, (r, wires, a) in enumerate(zip(self.runners, self.wiring, piece_args)):
            ins = [a[k] for k, *_ in r._active]
            hit = r._compiled.get(tuple(x.shape for x in ins))
            if hit is None or not isinstance(hit[0], launcher_type):
                raise _NotChained(f"piece {r.label} has no C launcher for its shapes")
            launch, order = hit
            kernel_args = [r._active[j][0] for j in (range(len(ins)) if order is None else order)]
            srcs = []
            for k in kernel_args:
                kind, j = wires[k]
                if kind == "v":
                    srcs.append(-1 - j)
                    continue
                x = args[j]
                if j not in ext_index:
                    ext_index[j] = len(ext)
                    ext.append((j, x.dtype, tuple(x.shape)))
                srcs.append(ext_index[j])
            out = vals[i]
            if not isinstance(out, torch.Tensor) or not out.is_contiguous():
                raise _NotChained(f"piece {r.label}'s output is not one contiguous tensor")
            steps.append((launch, tuple(srcs), None if i in escaping else out))
        counters = tuple(r.__dict__ for r in self.runners) + (self.__dict__,)
        for d in counters[-1:]:
            d.setdefault("prism_calls", 0)
        self._fast = chain_type(tuple(ext), torch.Tensor, torch.is_grad_enabled, tuple(steps),
                                tuple(self.results), counters)

    @property
    def prism_calls(self) -> int:
        return int(self.__dict__.get("prism_calls", 0))

    def extra_repr(self) -> str:
        return f"{self.label!r}, pieces={len(self.runners)}, replays={self.prism_calls}"


class _NotChained(Exception):
    pass


def _runner(gm: Any, node: Any) -> PieceRunner | None:
    if node.op != "call_module":
        return None
    r = gm.__dict__.get(str(node.target)) or getattr(gm, str(node.target), None)
    return r if isinstance(r, PieceRunner) else None


def _small_static(node: Any) -> bool:
    shape = O.static_shape(node)
    if shape is None:
        return False
    n = 1
    for s in shape:
        n *= s
    return n <= MAX_ELEMENTS


def _eligible(gm: Any, node: Any) -> bool:
    """A piece that may join a chain: Prism's C fast path takes it (no input transposed or converted here),
    one output, and static, small shapes in and out."""
    r = _runner(gm, node)
    if (r is None or r._fast is None or r.out_slots is not None or len(r.kernel.program.outputs) != 1
            or any(bias for *_, bias in r._active) or node.kwargs):
        return False
    if not _small_static(node):
        return False
    active = {i for i, *_ in r._active}
    for k, a in enumerate(node.args):
        if k in active:
            if not isinstance(a, torch.fx.Node) or O.static_shape(a) is None:
                return False
        elif isinstance(a, torch.fx.Node):
            return False  # an argument the kernel does not read (a size): keep the piece's own call
    return True


def _pure(node: Any) -> bool:
    if node.op == "call_method":
        return node.target in _PURE_METHODS
    if node.op == "call_function":
        return node.target in _PURE_FUNCTIONS
    return node.op in ("placeholder", "get_attr")


def form_chains(gm: Any, prefix: str) -> list[PieceChain]:
    """Replace each run of two or more chainable pieces in ``gm``'s graph by one :class:`PieceChain` call
    (module docstring); returns the chains."""
    if fastcall.chain_type() is None:
        return []
    g = gm.graph
    runs: list[list[Any]] = []
    cur: list[Any] = []
    for n in list(g.nodes):
        inside = set(cur)
        if _eligible(gm, n):
            cur.append(n)
            continue
        if any(isinstance(a, torch.fx.Node) and a in inside for a in n.all_input_nodes) or not _pure(n):
            if len(cur) > 1:
                runs.append(cur)
            cur = []
    if len(cur) > 1:
        runs.append(cur)
    return [_replace_run(gm, members, f"{prefix}_{k}") for k, members in enumerate(runs)]


def _replace_run(gm: Any, members: list[Any], name: str) -> PieceChain:
    g = gm.graph
    index = {m: i for i, m in enumerate(members)}
    externals: list[Any] = []
    wiring: list[tuple[Source, ...]] = []
    for m in members:
        wires: list[Source] = []
        for a in m.args:
            if isinstance(a, torch.fx.Node) and a in index:
                wires.append(("v", index[a]))
            else:
                if a not in externals:
                    externals.append(a)
                wires.append(("x", externals.index(a)))
        wiring.append(tuple(wires))
    results = tuple(i for i, m in enumerate(members) if any(u not in index for u in m.users))
    runners = [_runner(gm, m) for m in members]
    chain = PieceChain(f"{name} ({', '.join(r.label for r in runners if r is not None)})",
                       [r for r in runners if r is not None], wiring, results)
    gm.add_submodule(name, chain)
    gm.__dict__[name] = chain   # found by the generated forward without nn.Module.__getattr__ (compiler._replace)
    last = members[-1]
    with g.inserting_after(last):
        call = g.call_module(name, tuple(externals))
    call.meta = {}
    prev = call
    for k, i in enumerate(results):
        with g.inserting_after(prev):
            item = g.call_function(operator.getitem, (call, k))
        item.meta = dict(members[i].meta)
        members[i].replace_all_uses_with(item, delete_user_cb=lambda u: u not in index)
        prev = item
    for m in reversed(members):
        g.erase_node(m)
    return chain
