"""FX graph -> captured units and one Prism kernel graph of everything Prism supports.

Steps (``capture``):

1. **Normalize**: leaf modules of ``torch.fx.symbolic_trace`` graphs (``nn.Linear``, activations,
   ``nn.Softmax``, ``nn.RMSNorm``, dropout, identity) become functional calls on ``get_attr`` nodes.
2. **Shapes**: every node needs its fake value (``meta["val"]`` from ``torch.export`` and fake-tensor
   propagation, ``meta["example_value"]`` from Dynamo). Without it the graph is propagated here, with the
   input dims named in ``dynamic`` symbolic.
3. **Units**: each call whose values are CPU tensors Prism stores (float32, bfloat16, float16; int8
   weights) goes through :mod:`prism.frontend.ops`;
   any other becomes a :class:`Fallback` with the reason (dtype, unsupported operator, ...). Size
   computations (``x.size(0)``, ``s0 * 8``) are not operators: their values are Prism dims.
4. **Patterns**: a written-out RMSNorm ``x * rsqrt(mean(x*x, -1, keepdim=True) + eps)`` (or
   ``x / sqrt(...)``) whose intermediates have no other use becomes one ``rms_norm`` unit.
5. **Trial**: all units are emitted into one Prism graph (``Captured.graph``) whose inputs are the values
   PyTorch computes (graph inputs, parameters, results of unsupported operators). A unit whose emission
   fails, or whose Prism shape differs from PyTorch's, becomes a fallback: the graph stays correct.
"""

from __future__ import annotations

import contextlib
import dataclasses
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from prism.errors import InconclusiveDimError, PrismError
from prism.frontend import ops as O
from prism.frontend.ops import (
    Lowered,
    Operand,
    Unsupported,
    display_name,
    is_tensor_meta,
    meta_value,
    static_shape,
)
from prism.frontend.symbolic import SymbolEnv, identify, symbol_env, to_shape
from prism.ir import dims as D
from prism.ir.builder import Tensor
from prism.ir.dtypes import as_dtype
from prism.ir.elementwise import is_exact_cast
from prism.ir.graph import Graph
from prism.ir.node import Node
from prism.ir.ops import OPS
from prism.search.program import identity_cast

# the operators that make a unit worth a kernel of its own: contractions, reductions and row-wise composites
HEAVY = frozenset(n for n, o in OPS.items() if o.group in ("contraction", "reduction", "composite"))


@dataclass
class Unit:
    id: int
    node: Any                      # the FX node whose value the unit produces
    lowered: Lowered
    members: list[Any]             # FX nodes it replaces (node last)
    ops: int = 0
    matmuls: int = 0
    heavy: bool = False
    norm: bool = False             # an RMS normalization (partition: never after a contraction in one piece)

    @property
    def alone(self) -> bool:
        return self.lowered.alone

    @property
    def kind(self) -> str:
        return self.lowered.kind

    @property
    def op(self) -> str:
        return self.lowered.op


@dataclass
class Fallback:
    node: Any
    op: str
    reason: str


@dataclass
class Captured:
    gm: Any
    units: list[Unit]
    fallbacks: list[Fallback]
    graph: Graph                                     # the whole supported program (see module docstring)
    unit_of: dict[Any, Unit] = field(default_factory=dict)       # every member node -> its unit
    persistent: set[Any] = field(default_factory=set)            # module state (parameters, buffers)
    inputs: dict[str, Any] = field(default_factory=dict)         # graph input name -> FX node
    symbols: SymbolEnv = field(default_factory=SymbolEnv)       # sizes identified (symbolic.identify)

    @property
    def layout_units(self) -> list[Unit]:
        return [u for u in self.units if u.kind == "layout"]


# --- 1. normalize leaf modules ---------------------------------------------------------------------------

# nn module class name -> (the functional call's canonical name, module attributes passed as keywords),
# from the element-wise operators' definitions (OpDef.torch)
MODULES: dict[str, tuple[str, tuple[str, ...]]] = {
    cls: (spec.names[0], attrs) for o in OPS.values() for spec in o.torch for cls, attrs in spec.modules}


def lower_modules(gm: Any) -> None:
    """Rewrite calls of known leaf modules into functional calls on ``get_attr`` nodes (in place)."""
    import torch
    import torch.nn.functional as F

    nn = torch.nn
    g = gm.graph
    changed = False
    for node in list(g.nodes):
        if node.op != "call_module":
            continue
        mod = gm.get_submodule(node.target)
        fn, extra = None, {}
        if type(mod) is nn.Linear:
            fn = F.linear
        elif type(mod).__name__ in MODULES and type(mod) is getattr(nn, type(mod).__name__, None):
            name, attrs = MODULES[type(mod).__name__]  # an element-wise operator's module (OpDef.torch)
            fn = getattr(F, name, None) or getattr(torch, name)
            extra = {a: getattr(mod, a) for a in attrs}
        elif type(mod) in (nn.Identity, nn.Dropout, nn.Softmax):
            fn = {nn.Identity: torch.Tensor.contiguous, nn.Dropout: F.dropout, nn.Softmax: F.softmax}[type(mod)]
            if type(mod) is nn.Softmax:
                if mod.dim is None:
                    continue
                extra = {"dim": mod.dim}
            elif type(mod) is nn.Dropout:
                extra = {"p": mod.p, "training": mod.training}
            elif type(mod) is nn.Identity:
                continue  # identity: leave as is (no arithmetic to capture)
        elif hasattr(nn, "RMSNorm") and type(mod) is nn.RMSNorm:
            fn = F.rms_norm
        elif type(mod) is nn.LayerNorm:
            fn = F.layer_norm
        if fn is None or len(node.args) != 1 or node.kwargs:
            continue
        with g.inserting_before(node):
            if fn is F.linear:
                w = g.get_attr(f"{node.target}.weight")
                b = g.get_attr(f"{node.target}.bias") if mod.bias is not None else None
                new = g.call_function(F.linear, (node.args[0], w, b))
            elif fn is F.rms_norm:
                w = g.get_attr(f"{node.target}.weight") if mod.weight is not None else None
                new = g.call_function(F.rms_norm, (node.args[0], tuple(mod.normalized_shape), w, mod.eps))
            elif fn is F.layer_norm:
                w = g.get_attr(f"{node.target}.weight") if mod.weight is not None else None
                b = g.get_attr(f"{node.target}.bias") if mod.bias is not None else None
                new = g.call_function(F.layer_norm, (node.args[0], tuple(mod.normalized_shape), w, b, mod.eps))
            else:
                new = g.call_function(fn, (node.args[0],), extra)
        new.meta = dict(node.meta)
        for a in new.all_input_nodes:
            if a.op == "get_attr" and "val" not in a.meta:
                a.meta["val"] = _attr(gm, a.target)
        node.replace_all_uses_with(new)
        g.erase_node(node)
        changed = True
    if changed:
        gm.recompile()


def _insert_helper(node: Any, fn: Callable[..., Any], args: tuple, fake_args: tuple, fake_kwargs: dict[str, Any],
                   mode: Any) -> Any:
    """Insert the call ``fn(*args)`` before ``node``, to run in PyTorch, with its value from ``fn(*fake_args,
    **fake_kwargs)`` under fake mode ``mode`` (None: as given) as the node's meta; None (nothing inserted)
    where that value cannot be computed."""
    try:
        if mode is None:
            val = fn(*fake_args, **fake_kwargs)
        else:
            with mode:
                val = fn(*fake_args, **fake_kwargs)
    except Exception:
        return None
    with node.graph.inserting_before(node):
        new = node.graph.call_function(fn, args)
    new.meta["val"] = val
    if "example_value" in node.meta:
        new.meta["example_value"] = val
    return new


def _split_parts(node: Any, total: int, rank: int) -> list[int] | None:
    """The static part sizes of ``node`` when it is ``split``/``split_with_sizes``/``chunk`` of a tensor of
    rank ``rank`` along its last dim of size ``total`` (any spelling: method, ``torch.``, ``aten.``), else None."""
    name = O.canonical_name(node)
    if name not in ("split", "split_with_sizes", "chunk"):
        return None
    try:
        call = O.Call(name, node.args, dict(node.kwargs))
        d = call.get("dim", 0)
        size = call.get({"split": "split_size_or_sections", "split_with_sizes": "split_sizes",
                         "chunk": "chunks"}[name])
    except Unsupported:
        return None
    if not isinstance(d, int) or d % rank != rank - 1:
        return None
    if name == "chunk":
        if not isinstance(size, int) or size < 1:
            return None
        size = -(-total // size)
    if isinstance(size, int) and not isinstance(size, bool) and size > 0:
        return [min(size, total - k) for k in range(0, total, size)]
    if isinstance(size, (list, tuple)) and all(isinstance(v, int) and v >= 0 for v in size) and sum(size) == total:
        return list(size)
    return None


def _fake_mode_of(v: Any) -> Any:
    """The context to compute on ``v`` in: its fake mode for a fake tensor, nothing for a real one."""
    mode = getattr(v, "fake_mode", None)
    return mode if mode is not None else contextlib.nullcontext()


def lower_split_linear(gm: Any) -> None:
    """Parts of a linear layer's output along its features -> linear layers of the parts of its weight (in
    place): ``a, b = linear(x, W, c).chunk(2, -1)`` (any split of the last dim, and ``glu(linear(...), -1)`` =
    ``a * sigmoid(b)``) -> ``a = linear(x, W[:h], c[:h])``, ``b = linear(x, W[h:], c[h:])``. A row range of
    ``W`` ([out, in]) is a contiguous view, so no copy is made, and the parts' users join the products in one
    piece: gated MLPs written with ``chunk`` (SwiGLU, GEGLU) and ``F.glu``. Before, the split of the product
    was a layout operator in PyTorch between two pieces, whose strided halves each piece copied. Left as is:
    a product used elsewhere too, a split of another dim or of a symbolic size, parts taken other than by
    a constant index."""
    import operator

    import torch
    import torch.nn.functional as F

    linears = {F.linear, torch._C._nn.linear, torch.ops.aten.linear.default}
    glus = {F.glu, torch.ops.aten.glu.default}
    g = gm.graph
    changed = False
    for node in list(g.nodes):
        if node.op != "call_function" or node.target not in linears or len(node.users) != 1:
            continue
        try:
            call = O.Call("linear", node.args, dict(node.kwargs))
            x, w, bias = call.get("input"), call.get("weight"), call.get("bias", None)
        except Unsupported:
            continue
        yv, wv = meta_value(node), meta_value(w) if type(w).__name__ == "Node" else None
        if not (is_tensor_meta(yv) and is_tensor_meta(wv) and wv.dim() == 2 and isinstance(wv.shape[0], int)):
            continue
        (user,) = node.users
        total, rank = int(wv.shape[0]), yv.dim()
        glu = user.op == "call_function" and user.target in glus
        if glu:
            d = user.args[1] if len(user.args) > 1 else user.kwargs.get("dim", -1)
            if not isinstance(d, int) or d % rank != rank - 1 or total % 2:
                continue
            parts, takes = [total // 2, total // 2], [(0, None), (1, None)]
        else:
            parts = _split_parts(user, total, rank)
            gets = list(user.users)
            if parts is None or not gets or not all(
                    u.op == "call_function" and u.target is operator.getitem and isinstance(u.args[1], int)
                    and -len(parts) <= u.args[1] < len(parts) for u in gets):
                continue
            takes = [(u.args[1] % len(parts), u) for u in gets]
        starts = [sum(parts[:k]) for k in range(len(parts))]
        made: dict[int, Any] = {}
        with g.inserting_before(user):
            for k, _ in takes:
                if k in made:
                    continue
                a, e = starts[k], starts[k] + parts[k]
                pieces = []
                for t in (w, bias):
                    if t is None:
                        pieces.append(None)
                        continue
                    view = g.call_function(operator.getitem, (t, slice(a, e)))
                    tv = meta_value(t)
                    with _fake_mode_of(tv):
                        view.meta["val"] = tv[a:e]
                    pieces.append(view)
                lin = g.call_function(node.target, (x, pieces[0], pieces[1]))
                with _fake_mode_of(yv):
                    lin.meta["val"] = yv[..., a:e]
                made[k] = lin
            if glu:
                gate = g.call_function(torch.sigmoid, (made[1],))
                out = g.call_function(operator.mul, (made[0], gate))
                with _fake_mode_of(yv):
                    gate.meta["val"] = torch.sigmoid(made[1].meta["val"])
                    out.meta["val"] = made[0].meta["val"] * gate.meta["val"]
                user.replace_all_uses_with(out)
        for k, get in takes:
            if get is not None:
                get.replace_all_uses_with(made[k])
                g.erase_node(get)
        g.erase_node(user)
        g.erase_node(node)
        changed = True
    if changed:
        gm.recompile()


def drop_metadata_asserts(gm: Any) -> None:
    """Remove ``aten._assert_tensor_metadata`` calls (in place): ``torch.export`` puts one after each ``.to`` to
    check the dtype and device of a value the graph computes, whose dtype and device the graph fixes anyway (and
    the pieces check their inputs). As a user of the value it ended pieces there: the quantizer of int8 dynamic
    activations became ``div+round+clamp`` and a lone ``.to(torch.int8)`` left to PyTorch, because its input and
    its output each had a user (the assert) outside the piece."""
    import torch
    target = getattr(torch.ops.aten, "_assert_tensor_metadata", None)
    if target is None:
        return
    targets = {target, getattr(target, "default", None)} - {None}
    changed = False
    for node in list(gm.graph.nodes):
        if node.op == "call_function" and node.target in targets and not node.users:
            gm.graph.erase_node(node)
            changed = True
    if changed:
        gm.recompile()


_NOT_MERGED = frozenset({"dropout", "scaled_dot_product_attention"})   # random in training (dropout_p)


def _int8_cast(node: Any, name: str) -> bool:
    """A cast of an int8 value (a W8A8 quantizer's ``xq.float()``): not merged. Inside each product's piece it is
    free and the piece reads the int8 row; merged, it would be one unit with several users, which joins none of
    their pieces, so the products would read its float32 copy instead of the int8 row (an int8 x int8 product no
    more)."""
    if name not in O.CASTS or not node.args or type(node.args[0]).__name__ != "Node":
        return False
    v = meta_value(node.args[0])
    return is_tensor_meta(v) and str(v.dtype) == "torch.int8"


# operators whose result may share its first operand's memory (views, no-op casts)
_ALIASING = frozenset({"view", "reshape", "_unsafe_view", "expand", "expand_as", "transpose", "permute", "T", "mT",
                       "t", "unsqueeze", "squeeze", "select", "slice", "getitem", "alias", "detach", "contiguous",
                       "split", "chunk", "split_with_sizes", "broadcast_tensors", "values", "indices", *O.CASTS})


def _returned(g: Any) -> set[Any]:
    """The nodes whose memory the graph may return: its outputs and, through views and casts, what they view."""
    out: set[Any] = set()
    todo = [a for n in g.nodes if n.op == "output" for a in n.all_input_nodes]
    while todo:
        n = todo.pop()
        if n in out:
            continue
        out.add(n)
        if n.op in ("call_function", "call_method") and O.canonical_name(n) in _ALIASING and n.all_input_nodes:
            todo.append(n.all_input_nodes[0])
    return out


def _merge_key(v: Any) -> Any:
    """A hashable stand-in for an FX argument (nodes are hashable; lists, slices and dicts are not)."""
    if isinstance(v, (list, tuple)):
        return (type(v).__name__, *map(_merge_key, v))
    if isinstance(v, slice):
        return ("slice", _merge_key(v.start), _merge_key(v.stop), _merge_key(v.step))
    if isinstance(v, dict):
        return ("dict", *sorted((k, _merge_key(x)) for k, x in v.items()))
    hash(v)   # raises TypeError for what cannot be compared (the call is then kept)
    return (type(v).__name__, v)   # 1 and 1.0 and True hash alike but are different arguments


def merge_common(gm: Any) -> None:
    """Calls of one operator on the same arguments become one (in place): common subexpression elimination.

    Only the operators Prism knows (``ops.CONVERTERS``: pure functions of their arguments) are merged, never a
    random one (dropout) or a cast of an int8 value (``_int8_cast``); not two values the graph may both return
    (the caller would get one tensor twice, and changing one in place would change the other); and nothing at
    all in a graph that changes a tensor in place (``ops.mutates``: a value read before and after the change would
    be merged across it). Measured need: a W8A8 Linear quantizes its input rows itself, so a decoder layer's q, k
    and v projections quantized the same row three times, each quantizer a piece of its own (llama-1b w8a8 decode:
    181 pieces per step). The rewritten graph's layout calls left in PyTorch are shared again, per call, also in a
    graph that changes tensors (``compiler._share_repeated_views``: views see the change either way)."""
    g = gm.graph
    if any(O.mutates(n) for n in g.nodes):
        return
    returned = _returned(g)
    seen: dict[Any, Any] = {}
    merged = False
    for node in list(g.nodes):
        if node.op not in ("call_function", "call_method"):
            continue
        name = O.canonical_name(node)
        if not name or name not in O.CONVERTERS or name in _NOT_MERGED or _int8_cast(node, name):
            continue
        try:
            key = (node.op, node.target, _merge_key(node.args), _merge_key(dict(node.kwargs)))
        except TypeError:
            continue
        first = seen.setdefault(key, node)
        if first is not node and not (first in returned and node in returned):
            node.replace_all_uses_with(first)
            g.erase_node(node)
            merged = True
    if merged:
        gm.recompile()


def lower_causal(gm: Any) -> None:
    """``scaled_dot_product_attention(q, k, v, is_causal=True)`` -> the same call with
    ``attn_mask=causal_bias(q, k)`` (in place): Prism has no operator that depends on an element's
    position, so the causal mask is built in PyTorch (``L x S`` floats per call) and the attention, its
    mask added to the scores, runs on Prism. The rewritten call means the same in PyTorch, should the
    piece run there. Calls that also pass a mask, or whose operands have no fake values, are left as is."""
    import torch.nn.functional as F
    from torch._guards import detect_fake_mode

    g = gm.graph
    changed = False
    for node in list(g.nodes):
        if node.op != "call_function" or node.target is not F.scaled_dot_product_attention:
            continue
        call = O.Call("scaled_dot_product_attention", node.args, dict(node.kwargs))
        try:
            q, k = call.get("query"), call.get("key")
            causal, mask = call.get("is_causal", False), call.get("attn_mask", None)
        except Unsupported:
            continue
        if causal is not True or mask is not None or not all(
                type(x).__name__ == "Node" and is_tensor_meta(meta_value(x)) for x in (q, k)):
            continue
        qv, kv = meta_value(q), meta_value(k)
        bias = _insert_helper(node, O.causal_bias, (q, k), (qv, kv), {}, detect_fake_mode([qv, kv]))
        if bias is None:  # no fake value for the mask: leave the call as PyTorch wrote it
            continue
        args = tuple(node.args[:3])
        kwargs = {key: x for key, x in call.values.items() if key not in ("query", "key", "value")}
        kwargs.update(attn_mask=bias, is_causal=False)
        node.args, node.kwargs = args, kwargs
        changed = True
    if changed:
        gm.recompile()


def _repeated_kv(node: Any) -> tuple[Any, int] | None:
    """(x, group) where ``node`` is ``x[:, :, None].expand(b, h, group, s, d).reshape(b, h * group, s, d)`` of a
    [b, h, s, d] tensor x of static sizes -- transformers' ``repeat_kv``, each KV head copied for its group of query
    heads --, else None."""
    import operator

    if not (_is_call(node, "reshape") and _is_call(node.args[0], "expand")):
        return None
    ex = node.args[0]
    idx = ex.args[0]
    if not (type(idx).__name__ == "Node" and idx.op == "call_function" and idx.target is operator.getitem
            and len(idx.args) == 2 and type(idx.args[0]).__name__ == "Node"):
        return None
    x, key = idx.args
    full = slice(None, None, None)
    if not (isinstance(key, tuple) and len(key) == 5 and key[2] is None
            and all(isinstance(k, slice) and k == full for i, k in enumerate(key) if i != 2)):
        return None
    xv, ev, rv = (meta_value(n) for n in (x, ex, node))
    if not all(is_tensor_meta(v) for v in (xv, ev, rv)) or xv.dim() != 4 or ev.dim() != 5 or rv.dim() != 4:
        return None
    b, h, s, d = xv.shape
    group = ev.shape[2]
    # static sizes only: with a symbolic KV length, a mask's length that Dynamo named apart from the keys' (a padded
    # batch's decode: 1 + s53 against e0) must then be proved equal in the grouped form, and is not (the repeated
    # keys' own size stood between them before); a static cache's decode has every size static
    if not all(isinstance(n, int) for n in (b, h, s, d, group)) or group < 2:
        return None
    if tuple(ev.shape) != (b, h, group, s, d) or tuple(rv.shape) != (b, h * group, s, d):
        return None
    return x, group


def _is_call(node: Any, method: str) -> bool:
    return type(node).__name__ == "Node" and node.op == "call_method" and node.target == method and bool(node.args)


def absorb_repeat_kv(gm: Any) -> None:
    """``scaled_dot_product_attention(q, repeat_kv(k), repeat_kv(v), ...)`` -> the same call on ``k`` and ``v`` with
    ``enable_gqa=True`` (in place). transformers repeats each KV head for its group of query heads (an ``expand``
    and a ``reshape``: a copy of the whole KV cache per call) wherever the attention has a mask -- its SDPA path
    uses ``enable_gqa`` only without one: a static KV cache's decode, a padded batch --; PyTorch's ``enable_gqa``
    gives query head ``i`` the KV head ``i // group``, the same pairing, so the call means the same in PyTorch,
    and on Prism the attention reads each KV head once per group instead of a copy per query head. Measured need:
    llama-1b w8a8 at batch 8 with the static cache spent 4.7 ms per decode step outside Prism against 1.5 with the
    dynamic one, most of it these copies (docs/frontend.md, "Known weaknesses"). Calls that pass ``enable_gqa``
    already, or whose key and value are not both repeated by one group, are left as they are."""
    import torch.nn.functional as F

    g = gm.graph
    dropped: set[Any] = set()   # the rewritten calls' reshapes, expands and indexings
    for node in list(g.nodes):
        if node.op != "call_function" or node.target is not F.scaled_dot_product_attention:
            continue
        call = O.Call("scaled_dot_product_attention", node.args, dict(node.kwargs))
        try:
            k, v, gqa = call.get("key"), call.get("value"), call.get("enable_gqa", False)
        except Unsupported:
            continue
        rk, rv = _repeated_kv(k), _repeated_kv(v)
        if gqa or rk is None or rv is None or rk[1] != rv[1]:
            continue
        args = (node.args[0], rk[0], rv[0])
        kwargs = {key: x for key, x in call.values.items() if key not in ("query", "key", "value")}
        kwargs["enable_gqa"] = True
        node.args, node.kwargs = args, kwargs
        for r in (k, v):
            dropped.update((r, r.args[0], r.args[0].args[0]))
    if dropped:   # the repeats nothing else reads (not a dead-code pass: the graph's in-place calls have no users)
        for node in reversed(list(g.nodes)):
            if node in dropped and not node.users:
                g.erase_node(node)
        gm.recompile()


def lower_cross_entropy(gm: Any) -> None:
    """``cross_entropy(x, t)`` with class indices ``t`` ([N] int64 for [N, C] logits) -> the same loss of the
    target distribution ``class_target(t, x, ignore_index, reduction)`` built in PyTorch (in place): the
    one-hot rows, zero for ignored targets and divided by the number kept for 'mean', whose reduction
    becomes 'sum'. Prism stores no integers, so the ids stay in PyTorch (N x C floats per call) and the loss
    (log_softmax, product, sums) runs on Prism; the rewritten call means the same in PyTorch. Left as is:
    class weights, label smoothing, other layouts, calls without fake values."""
    import torch
    import torch.nn.functional as F
    from torch._guards import detect_fake_mode

    aten = getattr(getattr(torch.ops.aten, "cross_entropy_loss", None), "default", None)
    g = gm.graph
    changed = False
    for node in list(g.nodes):
        if node.op != "call_function" or (node.target is not F.cross_entropy and node.target is not aten):
            continue
        name = "cross_entropy" if node.target is F.cross_entropy else "cross_entropy_loss"
        try:
            call = O.Call(name, node.args, dict(node.kwargs))
            x, t = call.get("input"), call.get("target")
            reduction = O.ce_reduction(call)
            ignore = call.get("ignore_index", -100)
            plain = (call.get("weight", None) is None and call.get("label_smoothing", 0.0) in (0, 0.0)
                     and call.get("size_average", None) is None and call.get("reduce", None) is None)
        except Unsupported:
            continue
        if not plain or not isinstance(ignore, int) or not all(
                type(v).__name__ == "Node" and is_tensor_meta(meta_value(v)) for v in (x, t)):
            continue
        xv, tv = meta_value(x), meta_value(t)
        if str(tv.dtype) != "torch.int64" or xv.dim() != 2 or tv.dim() != 1:
            continue
        mode = getattr(tv, "fake_mode", None) or detect_fake_mode([xv, tv])   # (the tensors' own mode)
        dist = _insert_helper(node, O.class_target, (t, x, ignore, reduction), (tv, xv, ignore, reduction),
                              {"check": False}, mode)
        if dist is None:  # no fake value for the distribution: leave the call as PyTorch wrote it
            continue
        red = "sum" if reduction == "mean" else reduction
        if name == "cross_entropy":
            node.args, node.kwargs = (x, dist), {"reduction": red}
        else:
            node.args, node.kwargs = (x, dist, None, {"none": 0, "mean": 1, "sum": 2}[red]), {}
        changed = True
    if changed:
        gm.recompile()


def _attr(gm: Any, target: str) -> Any:
    obj = gm
    for part in target.split("."):
        obj = getattr(obj, part)
    return obj


# --- 2. shapes ------------------------------------------------------------------------------------------------

def needs_meta(gm: Any) -> bool:
    return any(n.op in ("call_function", "call_method", "call_module", "placeholder") and
               meta_value(n) is None and n.users for n in gm.graph.nodes)


def dynamic_dims(example_inputs: list[Any], dynamic: Any) -> list[set[int]]:
    """Per example input, the dims to make symbolic: ``dynamic`` is True (all), False/None (none), or a
    list/tuple aligned with the inputs (or a dict input index -> dims) whose entries are a dim, a list of
    dims, or True."""
    n = len(example_inputs)
    out: list[set[int]] = [set() for _ in range(n)]
    if dynamic is None or dynamic is False:
        return out
    if dynamic is True:
        return [set(range(getattr(x, "ndim", 0))) for x in example_inputs]
    items = dynamic.items() if isinstance(dynamic, dict) else enumerate(dynamic)
    for i, spec in items:
        if not isinstance(i, int) or not 0 <= i < n:
            raise PrismError(f"dynamic: input index {i!r} out of range for {n} example inputs")
        x = example_inputs[i]
        rank = getattr(x, "ndim", 0)
        if spec is None or spec is False:
            continue
        dims = range(rank) if spec is True else ([spec] if isinstance(spec, int) else list(spec))
        for d in dims:
            if not isinstance(d, int) or not -rank <= d < rank:
                raise PrismError(f"dynamic: dim {d!r} of input {i} is out of range for its shape "
                                 f"{tuple(getattr(x, 'shape', ()))}")
            out[i].add(d % rank)
    return out


def propagate_meta(gm: Any, example_inputs: list[Any], dynamic: Any) -> None:
    """Fake-tensor propagation with the ``dynamic`` dims symbolic (fills ``meta["val"]``)."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import DimDynamic, ShapeEnv, StatelessSymbolicContext
    from torch.fx.passes.fake_tensor_prop import FakeTensorProp

    dyn = dynamic_dims(example_inputs, dynamic)
    mode = FakeTensorMode(shape_env=ShapeEnv(), allow_non_fake_inputs=True)
    fakes = []
    for x, ds in zip(example_inputs, dyn):
        if isinstance(x, torch.Tensor):
            ctx = StatelessSymbolicContext(
                dynamic_sizes=[DimDynamic.DYNAMIC if d in ds else DimDynamic.STATIC for d in range(x.ndim)],
                constraint_sizes=[None] * x.ndim)
            fakes.append(mode.from_tensor(x, symbolic_context=ctx))
        else:
            fakes.append(x)
    FakeTensorProp(gm, mode).propagate_dont_convert_inputs(*fakes)
    for n in gm.graph.nodes:
        if n.op == "get_attr" and "val" not in n.meta:
            n.meta["val"] = _attr(gm, n.target)


# --- 3-5. units, patterns, trial ----------------------------------------------------------------------------

def _is_sym_value(v: Any) -> bool:
    if isinstance(v, (list, tuple)):
        return all(_is_sym_value(x) for x in v)
    return (isinstance(v, int) and not isinstance(v, bool)) or type(v).__name__ in ("SymInt", "SymFloat",
                                                                                     "SymBool", "float")


def _tensor_metas(v: Any) -> list[Any]:
    if is_tensor_meta(v):
        return [v]
    if isinstance(v, (list, tuple)):
        return [x for x in v if is_tensor_meta(x)]
    return []


def _used_metas(node: Any) -> list[Any]:
    """The node's tensor results that are used: of a (values, indices) result whose users all take the
    values (``[0]`` / ``.values``), only the values count."""
    mv = meta_value(node)
    if isinstance(mv, (list, tuple)) and len(mv) == 2 and node.users and all(
            u.op == "call_function" and len(u.args) == 2 and u.args[0] is node and (
                u.args[1] == 0 or u.args[1] == "values") for u in node.users):
        return _tensor_metas(mv[:1])
    return _tensor_metas(mv)


def _dtype_problem(node: Any) -> str:
    """Why the node's values or tensor operands are not float CPU tensors Prism stores (float32, bfloat16,
    float16; bool masks) ('' if they all are)."""
    vals = _used_metas(node)
    for a in node.all_input_nodes:
        vals += _used_metas(a)
    for v in vals:
        if not O.prism_dtype(v):  # bool: a mask (see _masks)
            return (f"dtype {str(v.dtype).removeprefix('torch.')} (Prism stores "
                    f"{', '.join(d.removeprefix('torch.') for d in O.STORED)})")
        dev = getattr(v, "device", None)
        if dev is not None and str(dev) != "cpu" and getattr(dev, "type", "cpu") != "cpu":
            return f"device {dev} (Prism's kernels run on the CPU)"
    return ""


class _Builder:
    """Emits units into one Prism graph; values PyTorch computes become inputs named after their node."""

    def __init__(self, name: str) -> None:
        self.g = Graph(name)
        self.values: dict[Any, Any] = {}
        self.inputs: dict[str, Any] = {}
        self.fresh: dict[Any, Any] = {}
        self.seen: dict[Node, int] = {}   # every node of the graph so far -> the _new_ops call that first met it
        self.tick = 0

    def dims(self, shape: Any) -> tuple:
        out = []
        for d in to_shape(shape):
            if isinstance(d, int) or (D.symbols(d) and d is D.sym(min(D.symbols(d)))):
                out.append(d)
            else:  # an expression (s0 + 1): a fresh symbol of its own
                if d not in self.fresh:
                    self.fresh[d] = D.sym(f"e{len(self.fresh)}")
                out.append(self.fresh[d])
        return tuple(out)

    def value(self, node: Any) -> Any:
        v = self.values.get(node)
        if v is not None:
            return v
        mv = meta_value(node)
        if not is_tensor_meta(mv):
            raise Unsupported(f"operand {node.name} is not a tensor")
        name = re.sub(r"\W", "_", node.name)
        name = name if name[:1].isalpha() else f"t_{name}"
        while name in self.inputs:
            name += "_"
        t = self.g.input(name, self.dims(mv.shape), O.prism_dtype(mv) or "float32")
        self.inputs[name] = node
        self.values[node] = t
        return t

    def operand(self, op: Operand) -> Any:
        v = self.value(op.node)
        return self.g.permute(v, op.perm) if op.perm is not None else v


def _new_ops(b: _Builder, result: Any, operands: list[Any]) -> list[Node]:
    """The Prism nodes a unit created (in no particular order): reachable from its result, not from its
    operands.

    Walked from the result down to the operands only, not through the whole graph above them (that was
    quadratic in a model's graph: 1.1 s of a warm-cache llama-small start-up). Exact: every ancestor of an
    operand is in ``b.seen`` (the nodes of the earlier units and their operands), so when no node reached
    here is, none is such an ancestor. An interned node met again (two units computing the same expression:
    W8A8's q, k and v projections each quantize the same rows) may be an ancestor of an operand: those are
    found by a walk up from the operands that only visits nodes met no earlier than the oldest such node
    (a node's sources are met no later than the node itself). The whole-graph walk this replaces took 4.1 s of
    llama-1b W8A8's batch-8 start-up (5060 units)."""
    res = result if isinstance(result, tuple) else (result,)
    roots = [r.node for r in res if isinstance(r, Tensor)]
    stop = {o.node for o in operands if isinstance(o, Tensor)}
    reached: list[Node] = []
    stack, visited = list(roots), set(stop)
    while stack:
        n = stack.pop()
        if n in visited:
            continue
        visited.add(n)
        reached.append(n)
        stack.extend(n.src)
    seen = b.seen
    met = {n for n in reached if n in seen}
    if met:
        lo = min(seen[n] for n in met)
        above: set[Node] = set()   # the nodes met again that are ancestors of an operand
        walk, up = list(stop), set(stop)
        while walk:
            n = walk.pop()
            if n in met:
                above.add(n)
            for x in n.src:
                if x not in up and seen.get(x, -1) >= lo:
                    up.add(x)
                    walk.append(x)
        new = [n for n in reached if n not in above]
    else:
        new = reached   # (not in dependency order: the callers count them)
    tick = b.tick = b.tick + 1
    for n in reached:
        seen.setdefault(n, tick)
    for n in stop:
        seen.setdefault(n, tick)
    return [n for n in new if n.op not in ("input", "output")]


def _sig(unit: Unit | None) -> tuple:
    return unit.lowered.sig if unit is not None else ()


def _src(u: Unit | None, k: int = 0) -> Any:
    """The FX node of operand ``k`` of ``u`` read as it is (None: no such operand, or it is transposed)."""
    if u is None or len(u.lowered.operands) <= k or u.lowered.operands[k].perm is not None:
        return None
    return u.lowered.operands[k].node


def _fuse_units(units: list[Unit], match: Callable[[Unit], tuple[Lowered, list[Unit]] | None]) -> list[Unit]:
    """Each unit ``match`` recognizes as the head of a pattern (``(lowered, parts)``) becomes one unit that
    absorbs the parts' members; the parts leave the list. A unit already absorbed heads nothing."""
    out: list[Unit] = []
    absorbed: set[Any] = set()
    for u in units:
        m = None if u.node in absorbed else match(u)
        if m is None:
            out.append(u)
            continue
        low, parts = m
        out.append(Unit(u.id, u.node, low, [x for p in parts for x in p.members] + u.members))
        absorbed.update(p.node for p in parts)
    return [u for u in out if u.node not in absorbed]


def _only_user(n: Any, user: Any) -> bool:
    """Whether FX node ``user`` is ``n``'s one user (a pattern may absorb ``n``)."""
    return list(n.users) == [user]


def _fuse_rms(units: list[Unit], by_node: dict[Any, Unit]) -> list[Unit]:
    """x * rsqrt(mean(square(x), -1, keepdim) + eps) / x / sqrt(...) -> one rms_norm unit."""
    def match(u: Unit) -> tuple[Lowered, list[Unit]] | None:
        if u.lowered.sig[:1] not in (("mul",), ("div",)) or len(u.lowered.operands) != 2:
            return None
        for k in (0, 1):
            x, r = _src(u, k), _src(u, 1 - k)
            if u.lowered.sig == ("div",) and k != 0:
                continue
            ru = by_node.get(r)
            want = ("sqrt",) if u.lowered.sig == ("div",) else ("rsqrt",)
            if ru is None or _sig(ru) != want or not _only_user(r, u.node):
                continue
            a = _src(ru)
            au = by_node.get(a)
            if au is None or _sig(au)[:1] != ("add_scalar",) or not _only_user(a, r):
                continue
            m = _src(au)
            mu = by_node.get(m)
            if mu is None or _sig(mu) != ("mean", -1, True) or not _only_user(m, a):
                continue
            s = _src(mu)
            su = by_node.get(s)
            if su is None or not _only_user(s, m):
                continue
            if not ((_sig(su) == ("square",) and _src(su) is x) or (_sig(su) == ("mul",) and _src(su) is x
                    and len(su.lowered.operands) == 1)):
                continue
            eps = _sig(au)[1]
            return (Lowered("rms_norm", "compute", [Operand(x)], lambda g, t, e=eps: g.rms_norm(t[0], e, -1),
                            ("rms_norm",)), [su, mu, au, ru])
        return None
    return _fuse_units(units, match)


def _fuse_layer_norm(units: list[Unit], by_node: dict[Any, Unit]) -> list[Unit]:
    """A layer norm written out -> one layer_norm unit:
    ``(x - mean(x, d)) / sqrt(mean((x - mean(x, d))^2, d) + eps)`` (or ``* rsqrt(...)``), the centred value
    computed once or twice, its square as ``square``/``pow(2)``/``c * c``, or the variance as
    ``x.var(d, keepdim=True, unbiased=False)``; every mean over the same dim with keepdim (the biased
    variance, as ``F.layer_norm``). Only where no intermediate has a use outside the
    pattern: a layer norm written out is 9 operators with its weight and bias, one more than a block holds
    (two kernels reading x three times), and one row-wise operator as a unit."""
    def centred(c: Any) -> tuple[Any, Any, int] | None:
        """(x, the mean node, its dim) when ``c`` is ``x - mean(x, d, keepdim)``."""
        cu = by_node.get(c)
        if cu is None or _sig(cu) != ("sub",) or len(cu.lowered.operands) != 2:
            return None
        x, m = _src(cu, 0), _src(cu, 1)
        mu = by_node.get(m)
        sig = _sig(mu)
        if x is None or mu is None or len(sig) != 3 or sig[0] != "mean" or sig[2] is not True or _src(mu) is not x:
            return None
        return x, m, sig[1]

    def match(u: Unit) -> tuple[Lowered, list[Unit]] | None:
        sig = u.lowered.sig
        if sig[:1] not in (("mul",), ("div",)) or len(u.lowered.operands) != 2:
            return None
        for k in ((0,) if sig == ("div",) else (0, 1)):
            c, r = _src(u, k), _src(u, 1 - k)
            ru = by_node.get(r)
            if ru is None or _sig(ru) != (("sqrt",) if sig == ("div",) else ("rsqrt",)):
                continue
            cx = centred(c)
            au = by_node.get(_src(ru))
            if cx is None or au is None or _sig(au)[:1] != ("add_scalar",):
                continue
            x, _, d = cx
            vu = by_node.get(_src(au))
            if vu is not None and _sig(vu) == ("var", d, True, 0.0) and _src(vu) is x:
                var_parts = [vu]            # x.var(d, keepdim=True, unbiased=False)
            else:
                if vu is None or _sig(vu) != ("mean", d, True):
                    continue
                su = by_node.get(_src(vu))
                if su is None:
                    continue
                c2 = _src(su)
                if not (_sig(su) == ("square",) or (_sig(su) == ("mul",) and len(su.lowered.operands) == 1)):
                    continue
                cx2 = centred(c2)
                if cx2 is None or cx2[0] is not x or cx2[2] != d:
                    continue
                var_parts = [by_node[c2], by_node[cx2[1]], su, vu]
            byid = {p.id: p for p in [by_node[c], by_node[cx[1]], *var_parts, au, ru]}
            parts = sorted(byid.values(), key=lambda p: p.id)
            inside = {p.node for p in parts} | {u.node}
            if any(user not in inside for p in parts for user in p.node.users):
                continue  # an intermediate is used elsewhere: it stays computed where it is
            eps = _sig(au)[1]
            return (Lowered("layer_norm", "compute", [Operand(x)],
                            lambda g, t, e=eps, dd=d: g.layer_norm(t[0], e, dd), ("layer_norm",)), parts)
        return None
    return _fuse_units(units, match)


def _fuse_rotate(units: list[Unit], by_node: dict[Any, Unit]) -> list[Unit]:
    """RoPE's ``rotate_half`` written out -> one rotate_half unit: ``cat((-x[..., h:], x[..., :h]), d)``, the
    halves sliced (``x[..., a:b]`` or ``torch.ops.aten.slice``) from the same tensor along the concatenated
    dim of static size 2h (``transformers``' spelling; ``x.chunk(2, -1)`` is not matched). Only where the
    slices and the negation have no other use. As layout operators the slices and the cat would end pieces
    and leave the negation alone in PyTorch: four PyTorch operators per rotation, two rotations per decoder
    layer (0.13-0.15 ms of a 4-layer Llama's decode step in an A/B, docs/frontend.md)."""
    def match(u: Unit) -> tuple[Lowered, list[Unit]] | None:
        sig = u.lowered.sig
        if sig[:1] != ("cat",) or sig[2] != 2 or len(u.lowered.operands) != 2:
            return None
        d = sig[1]
        neg, first = by_node.get(_src(u, 0)), by_node.get(_src(u, 1))
        second = by_node.get(_src(neg)) if neg is not None and _sig(neg) == ("neg",) else None
        if second is None or first is None:
            return None
        s1, s2 = _sig(first), _sig(second)
        x = _src(first)
        ok = (len(s1) == 5 and len(s2) == 5 and s1[0] == s2[0] == "slice" and s1[1] == s2[1] == d
              and x is not None and _src(second) is x and s1[4] == s2[4] and s1[4] % 2 == 0
              and (s1[2], s1[3]) == (0, s1[4] // 2) and (s2[2], s2[3]) == (s1[4] // 2, s1[4])
              and list(neg.node.users) == [u.node] and list(second.node.users) == [neg.node]
              and list(first.node.users) == [u.node])
        if not ok:
            return None
        return (Lowered("rotate_half", "compute", [Operand(x)], lambda g, t, dd=d: g.rotate_half(t[0], dd),
                        ("rotate_half", d)), sorted((first, second, neg), key=lambda p: p.id))
    return _fuse_units(units, match)


_HALF_SCALES = ("torch.float16", "torch.bfloat16")


def _fuse_grouped_linear(units: list[Unit], by_node: dict[Any, Unit]) -> list[Unit]:
    """A linear layer of int8 weights with a scale per group of G input features, written as its weight
    dequantized -- ``linear(x, (q.view(N, Gn, G).float() * s.unsqueeze(-1)).view(N, K), bias)`` with ``q`` int8
    [N, K] and ``s`` float32 [N, Gn] (or [N, Gn, 1]; or float16 / bfloat16 widened by ``.float()``), as
    ``Int8Linear(group_size=G)`` and dequantize-then-linear code write it; float32 or bfloat16 ``x`` -- -> one unit
    computing the same product as a sum of per-group products:
    ``y[m, n] = sum_g s[n, g] * sum_k x[m, g*G + k] q[n, g*G + k]`` (``x @ (q * s)^T`` with the sum over K cut at
    the group boundaries and each group's scale taken out of its sum), which the search fuses into one block over
    the int8 weight as stored (codegen: ``matmul.emit_grouped``). Written out, the dequantized weight is an
    element-wise piece of its own whose float32 result (4x the int8 bytes) the product reads back: a view between
    the two ends the piece. Only where the intermediates have no other use and the weight's sizes are static; the
    FX graph is unchanged (PyTorch, running a piece Prism leaves, dequantizes as written). A bfloat16 model's layer
    (bfloat16 ``x``, scale and bias, the weight cast to bfloat16) is the same sum computed in float32 and rounded to
    bfloat16 once, where eager rounds each dequantized weight to bfloat16 before the product too."""
    f32 = as_dtype("float32")
    def match(u: Unit) -> tuple[Lowered, list[Unit]] | None:
        ops = u.lowered.operands
        if u.lowered.op != "linear" or len(ops) not in (2, 3) or ops[1].perm != (1, 0) or ops[0].perm is not None:
            return None
        w = ops[1].node
        wu = by_node.get(w)
        if wu is None or wu.kind != "layout" or wu.lowered.op not in ("view", "reshape") or not _only_user(w, u.node):
            return None
        m = _src(wu)
        mu = by_node.get(m)
        if mu is None or _sig(mu) != ("mul",) or len(mu.lowered.operands) != 2 or not _only_user(m, w):
            return None
        for k in (0, 1):
            c, sn = _src(mu, k), _src(mu, 1 - k)
            cu = by_node.get(c)
            if cu is None or _sig(cu)[:1] != ("cast",) or sn is None or not _only_user(c, m):
                continue
            q3 = _src(cu)
            q3u = by_node.get(q3)
            if (q3u is None or q3u.kind != "layout" or q3u.lowered.op not in ("view", "reshape")
                    or not _only_user(q3, c)):
                continue
            q = _src(q3u)
            qv = meta_value(q) if q is not None else None
            if not is_tensor_meta(qv) or str(qv.dtype) != "torch.int8":
                continue
            qs, q3s, wv = static_shape(q), static_shape(q3), static_shape(w)
            if qs is None or q3s is None or len(qs) != 2 or len(q3s) != 3 or wv != qs or q3s[0] != qs[0] \
                    or q3s[1] * q3s[2] != qs[1]:
                continue
            n_out, gn, g = q3s
            # float32 or bfloat16 activations, the weight cast to their dtype. A bfloat16 model's layer is computed in
            # float32 from the bfloat16 x and scales (exact widenings) and rounded to bfloat16 once, at the end: the
            # eager form rounds each dequantized weight to bfloat16 first (a relative 2^-9 per weight, below the
            # output's own rounding). Written in bfloat16 throughout, every candidate was rejected by the search's
            # checks ([1, 2048] x [1024, 2048]: 92 rejected); with the casts at its ends the search ran to its time
            # limit until the kept-axes rule (prism.search.axes): now 0.7 s, three verified candidates
            xv = meta_value(ops[0].node)
            act = str(getattr(xv, "dtype", "")).removeprefix("torch.")
            if not (is_tensor_meta(xv) and act in ("float32", "bfloat16") and str(_sig(cu)[1]) == act):
                continue
            parts = [q3u, cu]
            su = by_node.get(sn)
            if su is not None and su.kind == "layout" and su.lowered.op in ("unsqueeze", "view", "reshape") \
                    and _only_user(sn, m) and _src(su) is not None:
                parts.append(su)
                sn = _src(su)
            su = by_node.get(sn)
            s_wide = False   # a float16 / bfloat16 scale widened to float32 (exact), as Int8Linear's are stored
            if su is not None and _sig(su) == ("cast", "float32") and _only_user(sn, parts[-1].node) \
                    and _src(su) is not None and str(getattr(meta_value(_src(su)), "dtype", "")) in _HALF_SCALES:
                parts.append(su)
                sn, s_wide = _src(su), True
            sv = meta_value(sn)
            scales = ("torch.float32",) + (_HALF_SCALES if s_wide else ()) if act == "float32" else ("torch." + act,)
            if static_shape(sn) not in ((n_out, gn), (n_out, gn, 1)) or str(getattr(sv, "dtype", "")) not in scales:
                continue
            bias = ops[2] if len(ops) == 3 else None

            def emit(gr: Any, t: list[Any], n_out: int = n_out, gn: int = gn, g: int = g,
                     has_bias: bool = bias is not None, act: str = act) -> Any:
                x = t[0]
                lead = x.shape[:-1]
                rows = lead[0]
                for d in lead[1:]:
                    rows = rows * d
                xg = gr.permute(gr.reshape(x, (rows, gn, g)), (1, 0, 2))
                qg = gr.cast(gr.permute(gr.reshape(t[1], (n_out, gn, g)), (1, 2, 0)), f32)
                # (a float16 scale without its widening: the product promotes it, exactly; with the cast the search
                # found no block in its time limit, [1, 256] x [96, 256]^T. So do bfloat16 x, scale and bias: the
                # float32 weight makes the product and everything after it float32; a bias cast explicitly was
                # reshaped inside the program, where the search has no block operator for it)
                sc = gr.permute(gr.reshape(t[2], (n_out, gn, 1)), (1, 2, 0))
                y = gr.sum(gr.mul(gr.matmul(xg, qg), sc), 0)   # [1, rows, N]
                if has_bias:   # (added before the reshape: after it, the search found no block in 60 s)
                    y = gr.add(y, gr.reshape(t[3], (1, 1, n_out)))
                if act != "float32":   # rounded once, before the view back (a boundary reshape the search peels)
                    y = gr.cast(y, act)
                return gr.reshape(y, (*lead, n_out))
            operands = [ops[0], Operand(q), Operand(sn)] + ([bias] if bias is not None else [])
            parts += [mu, wu]
            # alone: llama-1b's up projection and SwiGLU's product (linear+mul) had 400 candidates rejected and none
            # verified in the search's 60 s; the grouped product alone searches in 1-5 s
            return (Lowered("linear", "compute", operands, emit, ("grouped_linear", g), alone=True),
                    sorted(parts, key=lambda p: p.id))
        return None
    return _fuse_units(units, match)


def _compose(inner: tuple[int, ...] | None, outer: tuple[int, ...] | None) -> tuple[int, ...] | None:
    """``permute(permute(x, inner), outer) == permute(x, result)`` (None: no permutation)."""
    if inner is None:
        return outer
    p = inner if outer is None else tuple(inner[k] for k in outer)
    return None if p == tuple(range(len(p))) else p


def _fold_transposes(units: list[Unit]) -> list[Unit]:
    """A transpose or permute whose only user is one compute unit becomes that unit's operand permutation
    (``x @ w.T``, ``q @ k.transpose(-1, -2)``): the piece then reads the tensor in its stored layout and the
    search places the permutation (a strided view in the generated code, no copy). It would otherwise stay
    in PyTorch as a layout operator and its non-contiguous result be copied on every call. No-op
    conversions (``x.to(torch.float32)`` of a float32 ``x``, ``contiguous``, ``clone``) fold the same way:
    a norm's ``.to(input_dtype)`` no longer separates it from its weight's multiply. Not folded:
    several transposes that would become the same permuted operand (``x @ w.T`` written twice): the
    search handles two products of distinct inputs, not two of one (measured: no verified kernel)."""
    by_node = {u.node: u for u in units}

    def folded(u: Unit, k: int) -> tuple[Operand, list[Any]] | None:
        op = u.lowered.operands[k]
        extra: list[Any] = []
        t, user = by_node.get(op.node), u.node
        if any(o.node is op.node for j, o in enumerate(u.lowered.operands) if j != k):
            return None  # the unit reads the transposed value twice: keep it one value
        while (t is not None and t.kind == "layout" and (_sig(t)[:1] == ("permute",) or _same_dtype_identity(t))
               and len(t.lowered.operands) == 1 and list(t.node.users) == [user]):
            inner = t.lowered.operands[0]
            step = _sig(t)[1] if _sig(t)[0] == "permute" else None  # identity: no permutation
            op = Operand(inner.node, _compose(_compose(inner.perm, step), op.perm))
            extra = t.members + extra
            t, user = by_node.get(op.node), t.node
        return (op, extra) if extra else None

    plans = {(u.id, k): f for u in units if u.kind == "compute" for k in range(len(u.lowered.operands))
             if (f := folded(u, k)) is not None}
    targets: dict[Any, int] = {}
    for op, _ in plans.values():
        targets[(op.node, op.perm)] = targets.get((op.node, op.perm), 0) + 1
    absorbed: set[Any] = set()
    out: list[Unit] = []
    for u in units:
        operands = list(u.lowered.operands)
        extra: list[Any] = []
        for k in range(len(operands)):
            f = plans.get((u.id, k))
            if f is None or (f[0].perm is not None and targets[(f[0].node, f[0].perm)] > 1):
                continue
            operands[k] = f[0]
            extra = f[1] + extra
            absorbed.update(m for m in f[1])
        if extra:
            u = Unit(u.id, u.node, dataclasses.replace(u.lowered, operands=operands), extra + u.members,
                     u.ops, u.matmuls, u.heavy, u.norm)
        out.append(u)
    return [u for u in out if u.node not in absorbed]


BROADCASTING = frozenset({"add", "sub", "mul", "div", "maximum", "minimum"})


def _broadcast(a: tuple[int, ...], b: tuple[int, ...]) -> tuple[int, ...] | None:
    r = max(len(a), len(b))
    pa, pb = (1,) * (r - len(a)) + a, (1,) * (r - len(b)) + b
    if any(x != y and 1 not in (x, y) for x, y in zip(pa, pb)):
        return None
    return tuple(max(x, y) for x, y in zip(pa, pb))


def _fold_broadcasts(units: list[Unit]) -> list[Unit]:
    """An expand (``expand``, ``expand_as``, the items of ``broadcast_tensors``) read only by one compute unit
    is read unexpanded where it changes no shape (any unit), or where the unit is a broadcasting binary
    element-wise operator (``BROADCASTING``) whose own broadcasting gives the same result shape. The copies
    the expand would be (ops._expand_plan) are then not made, and it no longer stays in PyTorch as a layout
    operator between pieces (an exported ``F.normalize``: ``x / norm.expand_as(x)``; an exported
    ``F.mse_loss``: ``broadcast_tensors(a, b)`` then ``mse_loss``). Static shapes only."""
    by_node = {u.node: u for u in units}

    def source(n: Any, user: Any) -> tuple[Any, list[Unit]] | None:
        t = by_node.get(n)
        if t is None or t.kind != "layout" or list(n.users) != [user]:
            return None
        if t.lowered.op in ("expand", "expand_as") and t.lowered.operands[0].perm is None:
            return t.lowered.operands[0].node, [t]
        b = by_node.get(t.lowered.operands[0].node) if t.lowered.op == "getitem" and t.lowered.operands else None
        if b is None or b.lowered.op != "broadcast_tensors" or not isinstance(n.args[1], int):
            return None
        items = list(b.node.users)
        if not all(by_node.get(i) is not None and list(i.users) == [user] for i in items):
            return None
        op = b.lowered.operands[n.args[1]]
        return (op.node, [t, b]) if op.perm is None else None

    absorbed: set[Any] = set()
    out: list[Unit] = []
    for u in units:
        if u.kind != "compute":
            out.append(u)
            continue
        operands = list(u.lowered.operands)
        extra: list[Unit] = []
        identity = True  # every folded expand keeps its operand's shape (broadcast_tensors of equal shapes)
        for k, op in enumerate(operands):
            f = source(op.node, u.node) if op.perm is None else None
            if f is not None:
                src = static_shape(f[0])
                identity = identity and src is not None and src == static_shape(op.node)
                operands[k] = Operand(f[0])
                extra += [t for t in f[1] if t not in extra]
        if not extra:
            out.append(u)
            continue
        if not identity:
            want, shapes = static_shape(u.node), [static_shape(o.node) for o in operands]
            if (u.lowered.op not in BROADCASTING or len(operands) != 2 or want is None or shapes[0] is None
                    or shapes[1] is None or _broadcast(shapes[0], shapes[1]) != want):
                out.append(u)
                continue
        members = [m for t in sorted(extra, key=lambda t: t.id) for m in t.members]
        absorbed.update(members)
        out.append(Unit(u.id, u.node, dataclasses.replace(u.lowered, operands=operands), members + u.members,
                        u.ops, u.matmuls, u.heavy, u.norm))
    return [u for u in out if u.node not in absorbed]


def _same_dtype_identity(t: Unit) -> bool:
    """A no-op conversion (``to``/``contiguous``/``clone`` keeping the dtype); not ``mask.float()``, whose bool
    operand must stay behind a unit of its own (``_masks``)."""
    if _sig(t) != ("identity",) or len(t.lowered.operands) != 1:
        return False
    a, b = meta_value(t.lowered.operands[0].node), meta_value(t.node)
    return is_tensor_meta(a) and is_tensor_meta(b) and a.dtype == b.dtype


def capture(gm: Any, example_inputs: list[Any] | None = None, dynamic: Any = None,
            persistent_inputs: set[int] | None = None) -> Captured:
    """Capture ``gm`` (see the module docstring). ``example_inputs`` are needed only when the graph has
    no fake values yet (``symbolic_trace``); ``persistent_inputs``: placeholder indices that are module
    state (Dynamo's lifted parameters and buffers).

    A unit that fails only because two sizes PyTorch named differently cannot be proved equal, while their
    example values agree, makes the capture run again with the one read as the other
    (:func:`prism.frontend.symbolic.identify`; ``Captured.symbols`` keeps the identifications, which
    ``build_piece`` must read sizes through)."""
    lower_modules(gm)
    if needs_meta(gm):
        if example_inputs is None:
            raise PrismError("this FX graph has no shape information (meta['val']); pass example_inputs so "
                             "that Prism can propagate fake tensors through it")
        propagate_meta(gm, list(example_inputs), dynamic)
    merge_common(gm)
    lower_split_linear(gm)
    absorb_repeat_kv(gm)
    lower_causal(gm)
    lower_cross_entropy(gm)
    drop_metadata_asserts(gm)
    env = SymbolEnv()
    for _ in range(_MAX_IDENTIFY + 1):
        with symbol_env(env):
            cap, identified = _capture_once(gm, persistent_inputs, env)
        if not identified:
            break
    cap.symbols = env
    return cap


_MAX_IDENTIFY = 16  # captures run again at most this often (each run identifies at least one symbol)


def _capture_once(gm: Any, persistent_inputs: set[int] | None, env: SymbolEnv) -> tuple[Captured, bool]:
    units: list[Unit] = []
    fallbacks: list[Fallback] = []
    persistent: set[Any] = set()
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    for i, n in enumerate(placeholders):
        if persistent_inputs and i in persistent_inputs:
            persistent.add(n)
    for n in gm.graph.nodes:
        if n.op == "get_attr":
            persistent.add(n)
        if n.op not in ("call_function", "call_method", "call_module"):
            continue
        mv = meta_value(n)
        if not _tensor_metas(mv):
            if not n.users or _is_sym_value(mv) or mv is None:
                continue  # size arithmetic, guards, prints: PyTorch computes them, nothing to capture
            fallbacks.append(Fallback(n, display_name(n), f"produces {type(mv).__name__}, not a tensor"))
            continue
        kept = _kept_in_pytorch(n)
        if kept:
            fallbacks.append(Fallback(n, display_name(n), kept))
            continue
        problem = _dtype_problem(n)
        if problem:
            fallbacks.append(Fallback(n, display_name(n), problem))
            continue
        try:
            low = O.convert(n)
        except Unsupported as e:
            fallbacks.append(Fallback(n, display_name(n), str(e)))
            continue
        units.append(Unit(len(units), n, low, [n]))
    units = _masks(units, fallbacks)
    by_node = {u.node: u for u in units}
    units = _fuse_rotate(_fuse_rms(_fuse_layer_norm(units, by_node), by_node), by_node)
    units = _fuse_grouped_linear(units, by_node)
    units = _fold_broadcasts(_fold_transposes(units))
    graph, units, failed, names, identified = _trial(gm, units, env)
    fallbacks += failed
    order = {n: i for i, n in enumerate(gm.graph.nodes)}
    fallbacks.sort(key=lambda f: order[f.node])
    for k, u in enumerate(units):
        u.id = k
    cap = Captured(gm, units, fallbacks, graph, persistent=persistent, inputs=names)
    cap.unit_of = {m: u for u in units for m in u.members}
    return cap, identified


# operators that stay in PyTorch by design, with the reason explain() gives (by their display_name)
_CONSTANT = "builds a constant tensor: PyTorch creates it"
_KEPT = {
    "torch.nn.functional.embedding": "a lookup of rows by integer ids (the token embedding): PyTorch gathers them",
    "torch.tensor": "builds a tensor from Python values (cache bookkeeping): PyTorch creates it",
    "torch.arange": "builds a tensor of positions: PyTorch creates it",
    "torch.zeros": _CONSTANT, "torch.ones": _CONSTANT, "torch.full": _CONSTANT,
    "torch.empty": "allocates a tensor: PyTorch creates it",
}


def _kept_in_pytorch(n: Any) -> str:
    if n.op == "call_function" and n.target is O.causal_bias:
        return ("the causal mask of scaled_dot_product_attention(is_causal=True), built in PyTorch (L x S floats "
                "per call; no Prism operator depends on an element's position)")
    if n.op == "call_function" and n.target is O.class_target:
        return ("cross_entropy's class indices as one-hot target rows, built in PyTorch (N x C floats per call; "
                "Prism stores no integers)")
    return _KEPT.get(display_name(n), "")


def _is_bool(node: Any) -> bool:
    return any(str(v.dtype) == "torch.bool" for v in _tensor_metas(meta_value(node)))


def _masks(units: list[Unit], fallbacks: list[Fallback]) -> list[Unit]:
    """A bool tensor (a mask) is float 0/1 inside Prism. A mask PyTorch computes (or a bool input) enters a
    piece as an input the piece's runner converts at each call (``InputSpec.given``): to float32 0/1, or, for
    attention, to the additive bias 0 / -inf (``Lowered.as_bias``: two operators fewer in the searched
    program, which the search of a grouped-KV attention did not finish in 60 s with them). A batch's padding
    mask, built by ``transformers`` from integer positions, no longer keeps attention in PyTorch. A unit
    whose mask PyTorch uses stays in PyTorch (a piece returns float32, not bool), and so does a mask made from
    a mask PyTorch computes (its users read the finished mask: attention then takes it as a bias), repeated
    until no such unit is left."""
    units = list(units)
    while True:
        nodes = {u.node for u in units}
        bad: list[tuple[Unit, str]] = []
        for u in units:
            if _is_bool(u.node) and any(user not in nodes for user in u.node.users):
                bad.append((u, "its bool result (a mask) is used outside Prism; Prism keeps masks as float 0/1"))
                continue
            outside = [a for a in u.node.all_input_nodes if _is_bool(a) and a not in nodes]
            if outside and _is_bool(u.node):
                bad.append((u, f"a mask made from the mask {outside[0].name} that PyTorch computes: made in "
                               "PyTorch too (its users read it as an input)"))
        if not bad:
            break
        for u, why in bad:
            units.remove(u)
            fallbacks.append(Fallback(u.node, display_name(u.node), why))
    # attention reads a bool mask from PyTorch as an additive bias, converted per call (ops.Lowered.as_bias)
    nodes = {u.node for u in units}
    for k, u in enumerate(units):
        alt = u.lowered.as_bias
        if alt is not None and all(o.node not in nodes for o in alt.operands if o.bias):
            units[k] = dataclasses.replace(u, lowered=alt)
    return units


def _undecided(e: BaseException) -> Any:
    """The undecided difference ``a - b`` of an ``a == b`` somewhere in ``e``'s chain (None if none)."""
    seen: set[int] = set()
    x: BaseException | None = e
    while x is not None and id(x) not in seen:
        seen.add(id(x))
        if isinstance(x, InconclusiveDimError) and x.diff is not None:
            return x.diff
        x = x.__cause__ or x.__context__
    return None


def _trial(gm: Any, units: list[Unit], env: SymbolEnv
           ) -> tuple[Graph, list[Unit], list[Fallback], dict[str, Any], bool]:
    b = _Builder("captured")
    ok: list[Unit] = []
    failed: list[Fallback] = []
    identified = False
    for u in units:
        try:
            operands = [b.operand(op) for op in u.lowered.operands]
            res = O.emit_unit(u.lowered, u.node, b.g, operands)
            _check_shape(b, u, res)
        except (PrismError, Unsupported) as e:
            diff = _undecided(e)
            if diff is not None and not identified:  # one at a time: the next capture reads sizes through it
                diff = D.subs(diff, {str(D.symbols(v).pop()): k for k, v in b.fresh.items()})
                identified = identify(diff, env, f"needed by {display_name(u.node)}") is not None
            failed.append(Fallback(u.node, display_name(u.node), f"{u.op}: {e}"))
            continue
        new = _new_ops(b, res, operands)
        # (the exact cast of a quantizer's int8 value back to a float is no operator the search keeps: it counted
        # against the piece's budget and left the W8A8 linear's last scale to PyTorch. The int8 weight's own cast
        # still counts: not counting it would change every int8 weight-only model's pieces, unmeasured. A piece of
        # its own counts what the search keeps, without the casts it drops: a bfloat16 model's grouped Linear with
        # its bias is 9 operators with the weight's cast, 8 without; above the block limit (8) a piece is "wide" and
        # searched with that limit raised to its count (with 12, its casts written out: the 20 s limit, no kernel)
        u.ops = sum(1 for n in new if n.op != "reshape" and not (is_exact_cast(n) and n.src[0].op == "cast")
                    and not (u.lowered.alone and identity_cast(n)))
        u.matmuls = sum(1 for n in new if n.op == "matmul")
        u.heavy = any(n.op in HEAVY for n in new)
        u.norm = any(n.op == "rms_norm" for n in new)
        b.values[u.node] = res
        ok.append(u)
    out = next(n for n in gm.graph.nodes if n.op == "output")
    import torch.utils._pytree as pytree
    k = 0
    for v in pytree.tree_leaves(out.args[0]):
        if type(v).__name__ == "Node" and v in b.values and isinstance(b.values[v], Tensor):
            b.g.output(b.values[v], f"out{k}")
            k += 1
    return b.g, ok, failed, b.inputs, identified


def _check_shape(b: _Builder, u: Unit, res: Any) -> None:
    """A converter must reproduce PyTorch's shape exactly; a mismatch is a converter bug, never silent."""
    mv = meta_value(u.node)
    got = list(res) if isinstance(res, tuple) else [res]
    want = list(mv) if isinstance(mv, (list, tuple)) else [mv]
    if len(got) != len(want):
        raise Unsupported(f"internal error: {len(got)} results, PyTorch has {len(want)}")
    for r, w in zip(got, want):
        if r is None:  # a result Prism does not compute (the indices of max(x, dim)); its uses stay in PyTorch
            continue
        ws, raw = b.dims(w.shape), to_shape(w.shape)
        if len(r.shape) != len(ws) or not all(D.structurally_equal(x, y) or D.structurally_equal(x, z) or _equal(x, y)
                                              for x, y, z in zip(r.shape, ws, raw)):
            raise Unsupported(f"internal error: Prism shape {D.format_shape(r.shape)} differs from PyTorch's "
                              f"{D.format_shape(ws)}")


def _equal(a: Any, b: Any) -> bool:
    try:
        return D.dims_equal(a, b)
    except PrismError:
        return False
