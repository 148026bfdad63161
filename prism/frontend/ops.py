"""Which PyTorch operators Prism captures, and how each becomes Prism operators.

Every FX node (Dynamo's torch-level graphs, ``torch.fx.symbolic_trace``, ``torch.export``'s ATen graphs)
is normalized to a *canonical name* (``operator.add``, ``torch.add``, ``Tensor.add``, ``aten.add.Tensor``
-> ``add``) and its arguments are bound by position and name. A converter then returns a
:class:`Lowered`: the tensor operands, whether it is *compute* or *layout*, and an ``emit`` function that
builds the Prism operators on any builder (the whole captured graph, or one piece). A converter that
cannot express a call raises :class:`Unsupported` with the reason; the node then stays in PyTorch.

``SUPPORTED`` lists the canonical names (``prism.frontend.SUPPORTED``).
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from prism.errors import PrismError
from prism.frontend.symbolic import integral, to_dim
from prism.ir import dims as D
from prism.ir.builder import OpMethods, Tensor
from prism.ir.dims import DimLike
from prism.ir.ops import OPS, OpDef, Torch

Emit = Callable[[OpMethods, list[Tensor]], Any]
_REQUIRED = object()


class Unsupported(Exception):
    """A call Prism cannot express; ``str(e)`` is the reason (shown in the fallback log line)."""


@dataclass(frozen=True)
class Operand:
    """A tensor operand: an FX node, optionally transposed by ``perm`` before use. A transposed piece
    input that is module state (a weight) is transposed once in PyTorch and cached."""

    node: Any
    perm: tuple[int, ...] | None = None
    bias: bool = False   # a bool mask from PyTorch read as an additive bias (0 / -inf; the runner converts it)


@dataclass
class Lowered:
    op: str                                   # canonical name, for reports and logs
    kind: str                                 # "compute" | "layout"
    operands: list[Operand]
    emit: Emit
    sig: tuple = ()                           # normalized form for pattern fusion (see capture.py)
    members: list[Any] = field(default_factory=list)   # extra FX nodes absorbed (patterns)
    # attention with a bool mask: the same unit reading the mask as an additive bias (capture._masks uses
    # it where the mask comes from PyTorch: converted per call, two operators fewer for the search)
    as_bias: Lowered | None = None
    # a piece of its own: nothing joins it and it joins nothing (capture._fuse_grouped_linear: with a neighbour
    # the search found no verified kernel in its time limit)
    alone: bool = False


def meta_value(node: Any) -> Any:
    m = node.meta
    for k in ("val", "example_value"):
        if k in m:
            return m[k]
    tm = m.get("tensor_meta")
    return tm


def is_tensor_meta(v: Any) -> bool:
    return hasattr(v, "shape") and hasattr(v, "dtype") and not isinstance(v, tuple)


def static_shape(node: Any) -> tuple[int, ...] | None:
    """The captured shape of ``node``'s tensor when every size is a plain int (None: symbolic or no tensor)."""
    v = meta_value(node)
    if not is_tensor_meta(v) or not all(isinstance(s, int) for s in v.shape):
        return None
    return tuple(int(s) for s in v.shape)


# the torch dtypes a Prism program stores (prism.ir.dtypes); a bool tensor is a mask, float 0/1 inside Prism
FLOAT_DTYPES = {"torch.float32": "float32", "torch.bfloat16": "bfloat16", "torch.float16": "float16"}


STORED = {**FLOAT_DTYPES, "torch.int8": "int8"}   # int8: quantized weights and values (a cast), only ever cast back


def prism_dtype(v: Any) -> str:
    """The Prism dtype of a tensor meta value (bool masks: float32); '' when Prism does not store it."""
    name = str(v.dtype)
    return "float32" if name == "torch.bool" else STORED.get(name, "")


_WIDTH = {"float16": 1, "bfloat16": 1, "float32": 2}


def _torch_result_dtype(node: Any) -> str:
    """The Prism dtype of PyTorch's result of ``node`` ('' when it is not a tensor Prism stores)."""
    mv = meta_value(node)
    return prism_dtype(mv) if is_tensor_meta(mv) else ""


def emit_unit(low: Lowered, node: Any, g: OpMethods, operands: list[Any]) -> Any:
    """``low.emit`` under Prism's mixed-precision rule (prism.ir.dtypes). A value Prism computes is exact
    float32 arithmetic whatever its dtype, so a cast that widens it (``h.to(torch.float32)`` in a bfloat16
    model's RMSNorm) is no operator at all; mixed float operands promote in the IR as in PyTorch. Where
    PyTorch's result is narrower than Prism's promotion gives (``bf16 * f32 0-dim tensor`` is bfloat16), the
    result is cast to PyTorch's dtype: that is a rounding PyTorch makes too. The dtype of a value may thus
    be narrower than PyTorch's where a widening cast was dropped; :func:`as_torch_dtype` restores it where
    the value leaves a piece."""
    if low.sig[:1] == ("cast",) and low.sig[1] == "float32":
        (t,) = [t for t in operands if isinstance(t, Tensor)]
        if t.dtype is not None and t.dtype.name in _WIDTH:   # (an int8 weight is cast: it does not compute)
            return t
    res = low.emit(g, operands)
    want = _torch_result_dtype(node)
    if (want and isinstance(res, Tensor) and res.dtype is not None and res.dtype.name in _WIDTH
            and _WIDTH[res.dtype.name] > _WIDTH[want]):
        res = g.cast(res, want)
    return res


def as_torch_dtype(g: OpMethods, t: Any, node: Any) -> Any:
    """``t`` with the dtype PyTorch gives ``node`` (a value leaving a piece, or a program's result): a cast
    where a dropped widening cast left it narrower."""
    want = _torch_result_dtype(node)
    if want and isinstance(t, Tensor) and t.dtype is not None and t.dtype.name != want:
        return g.cast(t, want)
    return t


# --- argument binding ---------------------------------------------------------------------------

SIGS: dict[str, tuple[str, ...]] = {
    "linear": ("input", "weight", "bias"),
    "matmul": ("input", "other"), "mm": ("input", "other"), "bmm": ("input", "other"),
    "addmm": ("input", "mat1", "mat2", "beta", "alpha"),
    "add": ("input", "other", "alpha"), "sub": ("input", "other", "alpha"), "rsub": ("input", "other", "alpha"),
    "mul": ("input", "other"), "div": ("input", "other", "rounding_mode"), "maximum": ("input", "other"),
    "pow": ("input", "exponent"),
    "max": ("input", "dim", "keepdim"), "min": ("input", "dim", "keepdim"),
    "values": ("input", "attr"), "indices": ("input", "attr"),
    "logsumexp": ("input", "dim", "keepdim"),
    "var": ("input", "dim", "unbiased", "keepdim"), "std": ("input", "dim", "unbiased", "keepdim"),
    "log_softmax": ("input", "dim", "_third", "dtype"), "_log_softmax": ("input", "dim", "half_to_float"),
    "layer_norm": ("input", "normalized_shape", "weight", "bias", "eps", "cudnn_enable"),
    "norm": ("input", "p", "dim", "keepdim", "dtype"), "vector_norm": ("input", "ord", "dim", "keepdim", "dtype"),
    "normalize": ("input", "p", "dim", "eps", "out"),
    "cosine_similarity": ("x1", "x2", "dim", "eps"),
    "log_sigmoid": ("input",), "logsigmoid": ("input",), "softsign": ("input",),
    "mse_loss": ("input", "target", "size_average", "reduce", "reduction"),
    "l1_loss": ("input", "target", "size_average", "reduce", "reduction"),
    "smooth_l1_loss": ("input", "target", "size_average", "reduce", "reduction", "beta"),
    "huber_loss": ("input", "target", "reduction", "delta"),
    "cross_entropy": ("input", "target", "weight", "size_average", "ignore_index", "reduce", "reduction",
                      "label_smoothing"),
    "cross_entropy_loss": ("input", "target", "weight", "reduction", "ignore_index", "label_smoothing"),
    "binary_cross_entropy_with_logits": ("input", "target", "weight", "size_average", "reduce", "reduction",
                                         "pos_weight"),
    **{k: ("input", "other") for k in ("gt", "ge", "lt", "le", "eq", "ne")},
    "where": ("condition", "input", "other"), "masked_fill": ("input", "mask", "value"),
    "logical_not": ("input",), "bitwise_not": ("input",), "logical_and": ("input", "other"),
    "bitwise_and": ("input", "other"), "logical_or": ("input", "other"), "bitwise_or": ("input", "other"),
    "softmax": ("input", "dim", "_third", "dtype"), "_softmax": ("input", "dim", "half_to_float"),
    "rms_norm": ("input", "normalized_shape", "weight", "eps"),
    "scaled_dot_product_attention": ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale",
                                     "enable_gqa"),
    "view": ("input", "*shape"), "reshape": ("input", "*shape"), "_unsafe_view": ("input", "*shape"),
    "permute": ("input", "*dims"), "transpose": ("input", "dim0", "dim1"), "t": ("input",),
    "T": ("input", "attr"), "mT": ("input", "attr"),
    "unsqueeze": ("input", "dim"), "squeeze": ("input", "dim"), "expand": ("input", "*size"),
    "expand_as": ("input", "other"), "broadcast_tensors": ("*tensors",),
    "contiguous": ("input", "memory_format"), "clone": ("input", "memory_format"), "detach": ("input",),
    "alias": ("input",), "dropout": ("input", "p", "training", "inplace"), "float": ("input",), "bool": ("input",),
    "bfloat16": ("input",), "half": ("input",),
    "to": ("input", "*rest"), "type_as": ("input", "other"), "_to_copy": ("input",),
    "cat": ("tensors", "dim"), "split": ("input", "split_size_or_sections", "dim"),
    "split_with_sizes": ("input", "split_sizes", "dim"), "chunk": ("input", "chunks", "dim"),
    "getitem": ("input", "idx"), "slice": ("input", "dim", "start", "end", "step"),
    "select": ("input", "dim", "index"),
    # the element-wise operators' and reductions' spellings come from their definitions (OpDef.torch,
    # prism.ir.elementwise and prism.ir.reductions)
    **{name: spec.params for o in OPS.values() for spec in o.torch for name in spec.names},
}
ALIASES = {"truediv": "div", "__matmul__": "matmul", "true_divide": "div", "multiply": "mul", "subtract": "sub",
           "negative": "neg", "concat": "cat", "concatenate": "cat", "swapaxes": "transpose", "swapdims": "transpose",
           "linalg_vector_norm": "vector_norm", "greater": "gt", "greater_equal": "ge", "less": "lt",
           "less_equal": "le", "not_equal": "ne", "and_": "bitwise_and", "or_": "bitwise_or",
           "invert": "bitwise_not", "numpy_T": "T"}  # numpy_T: ``w.T`` in an exported (ATen) graph
_ATTRS = ("T", "mT", "values", "indices")  # attributes that are operators (transposes, a (values, indices) result)
_INPLACE = {"iadd", "isub", "imul", "itruediv", "silu_", "relu_", "div_", "add_", "mul_"}


class Call:
    """One FX call, bound to the parameter names of ``SIGS`` (``self`` is ``input``)."""

    def __init__(self, name: str, args: Sequence[Any], kwargs: dict[str, Any]) -> None:
        self.name = name
        self.values: dict[str, Any] = {}
        params = SIGS[name]
        args = list(args)
        for i, p in enumerate(params):
            if p.startswith("*"):
                rest = args[i:]
                if len(rest) == 1 and isinstance(rest[0], (list, tuple)):
                    rest = list(rest[0])
                self.values[p[1:]] = rest if rest else kwargs.get(p[1:], kwargs.get("size", []))
                args = args[:i]
                break
            if i < len(args):
                self.values[p] = args[i]
        if len(args) > len(params):
            raise Unsupported(f"{name}: {len(args)} positional arguments, expected at most {len(params)}")
        for k, v in kwargs.items():
            k = "input" if k == "self" else k
            if k in ("out",) and v is not None:
                raise Unsupported(f"{name}: out= is not supported")
            self.values[k] = v

    def get(self, key: str, default: Any = _REQUIRED) -> Any:
        if key in self.values:
            return self.values[key]
        if default is _REQUIRED:
            raise Unsupported(f"{self.name}: missing argument {key!r}")
        return default


# --- canonical names --------------------------------------------------------------------------------

# in-place operators (operator.iadd, Tensor.add_, aten.add_) are not here: a Prism kernel returns a new
# tensor, and the mutation of the operand (possibly the caller's) must happen; they stay in PyTorch
_OPERATOR = {operator.add: "add", operator.sub: "sub", operator.mul: "mul", operator.truediv: "div",
             operator.matmul: "matmul", operator.neg: "neg", operator.pow: "pow", operator.getitem: "getitem",
             operator.gt: "gt", operator.ge: "ge", operator.lt: "lt", operator.le: "le", operator.eq: "eq",
             operator.ne: "ne", operator.invert: "bitwise_not", operator.and_: "bitwise_and",
             operator.or_: "bitwise_or"}


def canonical_name(node: Any) -> str:
    """The canonical name of an FX call (``''`` when it names nothing Prism knows), for dispatch and logs."""
    import torch

    if node.op == "call_method":
        name = str(node.target)
    elif node.op == "call_function":
        t = node.target
        if t in _OPERATOR:
            return _OPERATOR[t]
        if t is getattr:  # Dynamo records ``w.T`` / ``w.mT`` as getattr(w, "T")
            attr = node.args[1] if len(node.args) == 2 else None
            return attr if attr in _ATTRS else ""
        if isinstance(t, torch._ops.OpOverload):
            name = t.overloadpacket.__name__
            if f"aten.{name}" in SIGS:  # an ATen signature that differs from the torch-level one
                return f"aten.{name}"
        else:
            name = getattr(t, "__name__", "")
            mod = getattr(t, "__module__", None) or ""
            if not (mod.startswith("torch") or getattr(torch.Tensor, name, None) is t):
                return ""
    else:
        return ""
    if _in_place(name):
        return ""  # in-place mutation: leave to PyTorch
    name = ALIASES.get(name, name)
    return name if name in SIGS else ""


def _in_place(name: str) -> bool:
    return name in _INPLACE or (name.endswith("_") and not name.startswith("_"))


def mutates(node: Any) -> bool:
    """Whether the FX call ``node`` changes a tensor in place: an operand (``Tensor.add_``, ``operator.iadd``,
    ``aten.add_``, ``x[i] = v``: ``operator.setitem``) or its ``out=`` tensor."""
    import torch

    t = node.target
    if node.op not in ("call_method", "call_function"):
        return False
    if "out" in node.kwargs or t is operator.setitem:
        return True
    if node.op == "call_method":
        return _in_place(str(t))
    return _in_place(t.overloadpacket.__name__ if isinstance(t, torch._ops.OpOverload) else getattr(t, "__name__", ""))


def display_name(node: Any) -> str:
    """How a node's operator is named in logs: ``aten.cumsum.default``, ``torch.cumsum``, ``Tensor.cumsum``."""
    import torch

    t = node.target
    if node.op == "call_method":
        return f"Tensor.{t}"
    if node.op == "call_module":
        return f"module {t}"
    if isinstance(t, torch._ops.OpOverload):
        return str(t)
    mod = getattr(t, "__module__", None) or ""
    name = getattr(t, "__qualname__", getattr(t, "__name__", str(t)))
    short = getattr(t, "__name__", "")
    if short and getattr(torch, short, None) is t:
        return f"torch.{short}"
    if mod in ("_operator", "operator"):
        return f"operator.{name}"
    if mod.startswith("torch._C._nn") or mod.startswith("torch.nn.functional"):
        return f"torch.nn.functional.{name}"
    return f"{mod}.{name}" if mod and mod != "builtins" else name


# --- the conversion context ---------------------------------------------------------------------------

class Conv:
    """Reads one call's arguments and collects its operands (see ``convert``)."""

    def __init__(self, call: Call, node: Any) -> None:
        self.call = call
        self.node = node
        self.operands: list[Operand] = []

    def get(self, key: str, default: Any = _REQUIRED) -> Any:
        return self.call.get(key, default)

    def is_tensor(self, v: Any) -> bool:
        return _is_node(v) and is_tensor_meta(meta_value(v))

    def tensor(self, v: Any, perm: tuple[int, ...] | None = None) -> int:
        if not self.is_tensor(v):
            raise Unsupported(f"{self.call.name}: expected a tensor operand, got {_describe(v)}")
        op = Operand(v, perm)
        if op not in self.operands:
            self.operands.append(op)
        return self.operands.index(op)

    def shape(self, v: Any) -> tuple:
        return tuple(meta_value(v).shape)

    def rank(self, v: Any) -> int:
        return len(meta_value(v).shape)

    def number(self, v: Any, what: str = "") -> float:
        if _is_node(v):  # a size computation (math.sqrt(x.shape[-1])) whose value is static
            mv = meta_value(v)
            if isinstance(mv, (int, float)) and not isinstance(mv, bool):
                return float(mv)
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise Unsupported(f"{self.call.name}: {what or 'operand'} must be a constant number, got {_describe(v)}")
        return float(v)

    def integer(self, v: Any, what: str = "") -> int:
        if isinstance(v, bool) or not isinstance(v, int):
            raise Unsupported(f"{self.call.name}: {what or 'argument'} must be a constant int, got {_describe(v)}")
        return v

    def dim(self, v: Any) -> DimLike:
        if _is_node(v):
            mv = meta_value(v)
            if mv is None or is_tensor_meta(mv):
                raise Unsupported(f"{self.call.name}: expected a size, got {_describe(v)}")
            return to_dim(mv)
        return to_dim(v)

    def sizes(self, v: Any) -> list[Any]:
        if _is_node(v):
            mv = meta_value(v)
            if isinstance(mv, (tuple, list)):
                return [to_dim(x) for x in mv]
            raise Unsupported(f"{self.call.name}: expected a list of sizes, got {_describe(v)}")
        if isinstance(v, (list, tuple)):
            return list(v)
        return [v]


def _is_node(v: Any) -> bool:
    return type(v).__name__ == "Node" and hasattr(v, "meta")


def _describe(v: Any) -> str:
    if _is_node(v):
        mv = meta_value(v)
        return f"{v.name} ({type(mv).__name__})"
    return f"{type(v).__name__} {v!r}"


def _ndim(d: int, rank: int, what: str) -> int:
    if not isinstance(d, int) or isinstance(d, bool):
        raise Unsupported(f"{what}: dim must be a constant int, got {d!r}")
    if not -rank <= d < max(rank, 1):
        raise Unsupported(f"{what}: dim {d} out of range for rank {rank}")
    return d % rank if rank else 0


CONVERTERS: dict[str, Callable[[Conv], Lowered]] = {}


def _conv(*names: str) -> Callable[[Callable[[Conv], Lowered]], Callable[[Conv], Lowered]]:
    def deco(fn: Callable[[Conv], Lowered]) -> Callable[[Conv], Lowered]:
        for n in names:
            CONVERTERS[n] = fn
        return fn
    return deco


def convert(node: Any) -> Lowered:
    """The :class:`Lowered` of one FX call; raises :class:`Unsupported` with the reason."""
    name = canonical_name(node)
    if not name or name not in CONVERTERS:
        raise Unsupported("not supported by Prism")
    try:
        call = Call(name, node.args, dict(node.kwargs))
        return CONVERTERS[name](Conv(call, node))
    except (PrismError, ValueError, TypeError) as e:
        raise Unsupported(f"{name}: {e}") from None


# --- contractions -------------------------------------------------------------------------------------

def _check_rank2(c: Conv, *vs: Any) -> None:
    for v in vs:
        if c.rank(v) < 2:
            raise Unsupported(f"{c.call.name}: operands of rank < 2 (vector products) are not supported")
        if c.is_tensor(v) and str(meta_value(v).dtype) not in FLOAT_DTYPES:
            raise Unsupported(f"{c.call.name}: a product of {meta_value(v).dtype} operands (PyTorch's own integer "
                              "matmul; cast the operands to a float dtype, as a dequantization does)")


@_conv("matmul", "mm", "bmm")
def _matmul(c: Conv) -> Lowered:
    a, b = c.get("input"), c.get("other")
    _check_rank2(c, a, b)
    i, j = c.tensor(a), c.tensor(b)
    return Lowered("matmul", "compute", c.operands, lambda g, t: g.matmul(t[i], t[j]), ("matmul",))


@_conv("linear")
def _linear(c: Conv) -> Lowered:
    x, w, bias = c.get("input"), c.get("weight"), c.get("bias", None)
    if c.rank(w) != 2 or c.rank(x) < 2:
        raise Unsupported(f"linear: needs a 2-D weight and an input of rank >= 2, got ranks {c.rank(x)}, {c.rank(w)}")
    i, j = c.tensor(x), c.tensor(w, perm=(1, 0))
    k = c.tensor(bias) if bias is not None else None

    def emit(g: OpMethods, t: list[Tensor]) -> Tensor:
        y = g.matmul(t[i], t[j])
        return g.add(y, t[k]) if k is not None else y
    return Lowered("linear", "compute", c.operands, emit, ("linear",))


@_conv("addmm")
def _addmm(c: Conv) -> Lowered:
    bias, a, b = c.get("input"), c.get("mat1"), c.get("mat2")
    beta, alpha = c.number(c.get("beta", 1), "beta"), c.number(c.get("alpha", 1), "alpha")
    i, j, k = c.tensor(a), c.tensor(b), c.tensor(bias)

    def emit(g: OpMethods, t: list[Tensor]) -> Tensor:
        y = g.matmul(t[i], t[j])
        y = y if alpha == 1 else g.mul_scalar(y, alpha)
        return g.add(y, t[k] if beta == 1 else g.mul_scalar(t[k], beta))
    return Lowered("addmm", "compute", c.operands, emit)


# --- element-wise -------------------------------------------------------------------------------------

def _constant(c: Conv, v: Any) -> Any:
    """A call argument as a Python value (a size computation whose value is static becomes its value)."""
    if _is_node(v):
        mv = meta_value(v)
        if isinstance(mv, (int, float)) and not isinstance(mv, bool):
            return mv
        raise Unsupported(f"{c.call.name}: argument {_describe(v)} must be a constant")
    return v


def _elementwise(op: OpDef, spec: Torch) -> Callable[[Conv], Lowered]:
    """The converter of a unary element-wise operator's PyTorch spelling (from its definition)."""
    def fn(c: Conv) -> Lowered:
        try:
            attrs = spec.attrs(lambda k, d: _constant(c, c.get(k, d))) if spec.attrs else ()
        except ValueError as e:
            raise Unsupported(f"{c.call.name}: {e}") from None
        i = c.tensor(c.get("input"))
        sig = (op.name, *attrs) if op.group == "unary" else (op.name,)
        return Lowered(op.name, "compute", c.operands, lambda g, t: getattr(g, op.name)(t[i], *attrs), sig)
    return fn


for _op in OPS.values():
    if _op.group == "unary":
        for _spec in _op.torch:
            for _name in _spec.names:
                CONVERTERS[_name] = _elementwise(_op, _spec)


@_conv("pow")
def _pow(c: Conv) -> Lowered:
    x, e = c.get("input"), c.get("exponent")
    if not c.is_tensor(x):
        # a constant base b > 0 to a tensor power: 2^(e log2 b) (exp2 keeps 2^e exact at integer e)
        if not c.is_tensor(e):
            raise Unsupported("pow: no tensor operand")
        b = c.number(x, "the base")
        if not b > 0 or math.isinf(b):
            raise Unsupported(f"pow: a tensor power of the base {b:g} (supported: a finite base > 0)")
        j, l2 = c.tensor(e), math.log2(b)
        return Lowered("pow", "compute", c.operands,
                       lambda g, t: g.exp2(t[j] if l2 == 1.0 else g.mul_scalar(t[j], l2)), ("exp2",))
    p = c.number(e, "the exponent")
    i = c.tensor(x)
    table: dict[float, Callable[[OpMethods, Tensor], Tensor]] = {
        2.0: lambda g, v: g.square(v), 0.5: lambda g, v: g.sqrt(v), -0.5: lambda g, v: g.rsqrt(v),
        1.0: lambda g, v: v, 3.0: lambda g, v: g.mul(v, g.square(v)), 4.0: lambda g, v: g.square(g.square(v)),
        -1.0: lambda g, v: g.reciprocal(v), -2.0: lambda g, v: g.reciprocal(g.square(v))}
    if p not in table:
        raise Unsupported(f"pow: exponent {p:g} (supported: 4, 3, 2, 1, 0.5, -0.5, -1, -2)")
    f = table[p]
    return Lowered("pow", "compute", c.operands, lambda g, t: f(g, t[i]), ("square",) if p == 2.0 else ())


def _binary(c: Conv, name: str) -> Lowered:
    a, b = c.get("input"), c.get("other")
    al = c.number(c.get("alpha", 1), "alpha")
    if name == "div" and c.get("rounding_mode", None) is not None:
        raise Unsupported(f"div: rounding_mode={c.get('rounding_mode')!r}")
    ta, tb = c.is_tensor(a), c.is_tensor(b)
    if not ta and not tb:
        raise Unsupported(f"{name}: no tensor operand")
    if name == "rsub":  # rsub(a, b, alpha) = b - alpha * a
        a, b, ta, tb, name, scaled_first = b, a, tb, ta, "sub", True
    else:
        scaled_first = False

    def scaled(g: OpMethods, v: Tensor, f: float) -> Tensor:
        return v if f == 1 else g.mul_scalar(v, f)
    if ta and tb:
        i, j = c.tensor(a), c.tensor(b)
        method = name
        sig = (name,) if al == 1 else ()

        def emit(g: OpMethods, t: list[Tensor]) -> Tensor:
            if scaled_first:
                return getattr(g, method)(t[i], scaled(g, t[j], al))
            return getattr(g, method)(t[i], scaled(g, t[j], al) if name in ("add", "sub") else t[j])
        return Lowered(name, "compute", c.operands, emit, sig)
    # one constant operand: (tensor x, constant v); `first` when the constant is the left operand
    first = not ta
    x, v = (b, c.number(a, "the constant operand")) if first else (a, c.number(b, "the constant operand"))
    i = c.tensor(x)
    if scaled_first:       # rsub: v - alpha*x (constant left) or x_b - alpha*v (constant right)
        fx_, fv = (-al, 1.0) if first else (1.0, -al)
    elif name in ("add", "sub"):
        sign = -1.0 if name == "sub" else 1.0
        fx_, fv = ((sign * al, 1.0) if first else (1.0, sign * al))
    if name in ("add", "sub"):
        return Lowered(name, "compute", c.operands, lambda g, t: g.add_scalar(scaled(g, t[i], fx_), fv * v),
                       ("add_scalar", fv * v) if fx_ == 1 else ())
    if name == "mul":
        return Lowered("mul", "compute", c.operands, lambda g, t: g.mul_scalar(t[i], v), ("mul_scalar", v))
    if name == "div":
        if first:
            raise Unsupported("div: a constant divided by a tensor (Prism has no reciprocal operator)")
        if v == 0:
            raise Unsupported("div: division by the constant 0")
        return Lowered("div", "compute", c.operands, lambda g, t: g.mul_scalar(t[i], 1.0 / v), ("mul_scalar", 1 / v))
    raise Unsupported(f"{name}: a constant operand")


for _n in ("add", "sub", "mul", "div", "maximum", "minimum", "rsub"):
    CONVERTERS[_n] = (lambda name: lambda c: _binary(c, name))(_n)


# --- reductions and row-wise operators -------------------------------------------------------------------

def _reduce_dims(c: Conv, x: Any, dim: Any) -> list[int]:
    r = c.rank(x)
    if dim is None or (isinstance(dim, (list, tuple)) and len(dim) == 0):
        return list(range(r))
    ds = list(dim) if isinstance(dim, (list, tuple)) else [dim]
    out = sorted({_ndim(d, r, c.call.name) for d in ds})
    return out


def _mean_over(g: OpMethods, y: Tensor, dims: list[int]) -> Tensor:
    """The mean of ``y`` over ``dims`` (keepdim). Over several dims of static size, the sums' total scaled
    once: the search finds kernels for chained sums, not for a mean of means (measured: NoVerifiedKernelError
    for ((a - b) ** 2).mean()); otherwise one mean per dim."""
    n = D.product([y.shape[d] for d in dims])
    if len(dims) > 1 and isinstance(n, int):
        for d in dims:
            y = g.sum(y, d)
        return g.mul_scalar(y, 1.0 / n)
    for d in dims:
        y = g.mean(y, d)
    return y


def _reduction(prism_op: str) -> Callable[[Conv], Lowered]:
    """The converter of a reduction's PyTorch spellings (OpDef.torch): over one dim, several or all."""
    mean = OPS[prism_op].mean

    def fn(c: Conv) -> Lowered:
        x = c.get("input")
        if c.get("dtype", None) is not None:
            raise Unsupported(f"{c.call.name}: dtype= conversion")
        keep = bool(c.get("keepdim", False))
        if not isinstance(c.get("keepdim", False), bool):
            raise Unsupported(f"{c.call.name}: keepdim must be a constant bool")
        dims = _reduce_dims(c, x, c.get("dim", None))
        i = c.tensor(x)

        def emit(g: OpMethods, t: list[Tensor]) -> Tensor:
            y = t[i]
            if mean:
                y = _mean_over(g, y, dims)
            else:
                for d in dims:
                    y = getattr(g, prism_op)(y, d)
            if not keep:
                y = g.reshape(y, tuple(s for k, s in enumerate(t[i].shape) if k not in dims))
            return y
        r = c.rank(x)
        sig = (prism_op, dims[0] - r, keep) if len(dims) == 1 else ()
        return Lowered(c.call.name, "compute", c.operands, emit, sig)
    return fn


for _op in OPS.values():
    if _op.group == "reduction":
        for _spec in _op.torch:
            for _name in _spec.names:
                CONVERTERS[_name] = _reduction(_op.name)


# --- composites: each PyTorch operator below is stated once as Prism operators (its decomposition);
# every stage then sees only those operators --------------------------------------------------------------

def _one_dim(c: Conv, x: Any, dim: Any) -> int:
    dims = _reduce_dims(c, x, dim)
    if len(dims) != 1:
        raise Unsupported(f"{c.call.name}: over {len(dims)} dims (one dim is supported)")
    return dims[0]


def _drop(g: OpMethods, y: Tensor, d: int, keep: bool) -> Tensor:
    return y if keep else g.reshape(y, tuple(s for k, s in enumerate(y.shape) if k != d))


def _keepdim(c: Conv) -> bool:
    keep = c.get("keepdim", False)
    if not isinstance(keep, bool):
        raise Unsupported(f"{c.call.name}: keepdim must be a constant bool")
    return keep


def _no_dtype(c: Conv) -> None:
    if c.get("dtype", None) is not None or c.get("half_to_float", False) is True:
        raise Unsupported(f"{c.call.name}: dtype= conversion")


def logsumexp(g: OpMethods, x: Tensor, d: int) -> Tensor:
    """log(sum(exp(x), d)) = m + log(sum(exp(x - m), d)) with m = max(x, d) (keepdim)."""
    m = g.max(x, d)
    return g.add(m, g.log(g.sum(g.exp(g.sub(x, m)), d)))


def log_softmax(g: OpMethods, x: Tensor, d: int) -> Tensor:
    """x - logsumexp(x, d) = (x - m) - log(sum(exp(x - m), d))."""
    s = g.sub(x, g.max(x, d))
    return g.sub(s, g.log(g.sum(g.exp(s), d)))


def l2_norm(g: OpMethods, x: Tensor, d: int) -> Tensor:
    return g.sqrt(g.sum(g.square(x), d))


@_conv("max", "min")
def _max_min(c: Conv) -> Lowered:
    """torch.max(x) (every element), torch.max(x, dim) ((values, indices): the values only; a use of the
    indices stays in PyTorch) and torch.max(a, b) (element-wise)."""
    x, dim = c.get("input"), c.get("dim", None)
    name = c.call.name
    if c.is_tensor(dim):  # torch.max(a, b)
        i, j = c.tensor(x), c.tensor(dim)
        fn = "maximum" if name == "max" else "minimum"
        return Lowered(name, "compute", c.operands, lambda g, t: getattr(g, fn)(t[i], t[j]))
    keep = _keepdim(c)
    i = c.tensor(x)
    r = c.rank(x)

    def red(g: OpMethods, y: Tensor, d: int) -> Tensor:
        return g.max(y, d) if name == "max" else g.min(y, d)
    if dim is None:
        def emit_all(g: OpMethods, t: list[Tensor]) -> Tensor:
            y = t[i]
            for d in range(r):
                y = red(g, y, d)
            return g.reshape(y, ())
        return Lowered(name, "compute", c.operands, emit_all)
    d = _ndim(dim, r, name)
    return Lowered(name, "compute", c.operands, lambda g, t: (_drop(g, red(g, t[i], d), d, keep), None))


@_conv("values", "indices")
def _result_attr(c: Conv) -> Lowered:
    """x.values / x.indices of a (values, indices) result."""
    x = c.get("input")
    k = 0 if c.call.name == "values" else 1
    if k == 1:
        raise Unsupported("indices of max/min (Prism computes the values only)")
    op = Operand(x)
    c.operands.append(op)
    return Lowered(c.call.name, "layout", c.operands, lambda g, t: t[0][k])


@_conv("var", "std")
def _var_std(c: Conv) -> Lowered:
    """``var``/``std`` over one or several dims: the mean of the squared deviations from the mean (centred,
    not E[x^2] - mean^2), times n / (n - correction); ``unbiased=`` or ``correction=`` (default 1)."""
    x, name = c.get("input"), c.call.name
    unbiased, corr = c.get("unbiased", None), c.get("correction", None)
    if unbiased is not None and not isinstance(unbiased, bool):
        raise Unsupported(f"{name}: unbiased must be a constant bool")
    corr = c.number(corr, "correction") if corr is not None else (0.0 if unbiased is False else 1.0)
    dims, keep = _reduce_dims(c, x, c.get("dim", None)), _keepdim(c)
    i = c.tensor(x)

    def emit(g: OpMethods, t: list[Tensor]) -> Tensor:
        y = t[i]
        n = D.product([y.shape[d] for d in dims])
        if len(dims) > 1 and not isinstance(n, int):
            raise Unsupported(f"{name}: over several dims of symbolic size")
        v = _mean_over(g, g.square(g.sub(y, _mean_over(g, y, dims))), dims)
        if corr:
            if not isinstance(n, int):
                raise Unsupported(f"{name}: correction={corr:g} over a dim of symbolic size")
            if n <= corr:
                raise Unsupported(f"{name}: correction={corr:g} over {n} elements (PyTorch gives NaN or inf)")
            v = g.mul_scalar(v, n / (n - corr))
        v = g.sqrt(v) if name == "std" else v
        if not keep:
            v = g.reshape(v, tuple(s for k, s in enumerate(y.shape) if k not in dims))
        return v
    sig = (name, dims[0] - c.rank(x), keep, corr) if len(dims) == 1 else ()
    return Lowered(name, "compute", c.operands, emit, sig)


@_conv("logsumexp")
def _logsumexp(c: Conv) -> Lowered:
    x = c.get("input")
    d, keep = _one_dim(c, x, c.get("dim")), _keepdim(c)
    i = c.tensor(x)
    return Lowered("logsumexp", "compute", c.operands, lambda g, t: _drop(g, logsumexp(g, t[i], d), d, keep))


@_conv("log_softmax", "_log_softmax")
def _log_softmax(c: Conv) -> Lowered:
    x = c.get("input")
    _no_dtype(c)
    if c.get("dim", None) is None:
        raise Unsupported("log_softmax: dim=None")
    d = _ndim(c.get("dim"), c.rank(x), "log_softmax")
    i = c.tensor(x)
    return Lowered("log_softmax", "compute", c.operands, lambda g, t: log_softmax(g, t[i], d))


@_conv("layer_norm")
def _layer_norm(c: Conv) -> Lowered:
    x, shape = c.get("input"), c.sizes(c.get("normalized_shape"))
    w, b = c.get("weight", None), c.get("bias", None)
    if len(shape) != 1:
        raise Unsupported(f"layer_norm: normalized_shape {list(shape)} (only the last dim is supported)")
    e = c.number(c.get("eps", 1e-5), "eps")
    i = c.tensor(x)
    k = c.tensor(w) if w is not None else None
    m = c.tensor(b) if b is not None else None

    def emit(g: OpMethods, t: list[Tensor]) -> Tensor:
        y = g.layer_norm(t[i], e, -1)   # one row-wise operator (prism.ir.ops): one pass per row in C
        y = g.mul(y, t[k]) if k is not None else y
        return g.add(y, t[m]) if m is not None else y
    return Lowered("layer_norm", "compute", c.operands, emit)


@_conv("norm", "vector_norm")
def _norm(c: Conv) -> Lowered:
    x = c.get("input")
    _no_dtype(c)
    p = c.get("p" if c.call.name == "norm" else "ord", 2 if c.call.name == "vector_norm" else "fro")
    if p not in (2, 2.0, "fro", 1, 1.0):
        raise Unsupported(f"{c.call.name}: p={p!r} (supported: 2, 'fro', 1)")
    d, keep = _one_dim(c, x, c.get("dim", None)), _keepdim(c)
    i = c.tensor(x)
    one = p in (1, 1.0)

    def emit(g: OpMethods, t: list[Tensor]) -> Tensor:
        y = g.sum(g.abs(t[i]), d) if one else l2_norm(g, t[i], d)
        return _drop(g, y, d, keep)
    return Lowered(c.call.name, "compute", c.operands, emit)


@_conv("normalize")
def _normalize(c: Conv) -> Lowered:
    x = c.get("input")
    if c.get("out", None) is not None:
        raise Unsupported("normalize: out=")
    if c.get("p", 2.0) not in (2, 2.0):
        raise Unsupported(f"normalize: p={c.get('p')!r} (supported: 2)")
    d = _ndim(c.get("dim", 1), c.rank(x), "normalize")
    e = c.number(c.get("eps", 1e-12), "eps")
    i = c.tensor(x)
    return Lowered("normalize", "compute", c.operands,
                   lambda g, t: g.div(t[i], g.clamp(l2_norm(g, t[i], d), e, math.inf)))


@_conv("cosine_similarity")
def _cosine_similarity(c: Conv) -> Lowered:
    a, b = c.get("x1"), c.get("x2")
    if c.shape(a) != c.shape(b):
        raise Unsupported("cosine_similarity: operands of different shapes (broadcasting)")
    d = _ndim(c.get("dim", 1), c.rank(a), "cosine_similarity")
    e = c.number(c.get("eps", 1e-8), "eps")
    i, j = c.tensor(a), c.tensor(b)

    def emit(g: OpMethods, t: list[Tensor]) -> Tensor:
        # sum(a*b) / (max(|a|, eps) * max(|b|, eps)), as PyTorch (each norm clamped)
        na = g.clamp(l2_norm(g, t[i], d), e, math.inf)
        nb = g.clamp(l2_norm(g, t[j], d), e, math.inf)
        return _drop(g, g.div(g.sum(g.mul(t[i], t[j]), d), g.mul(na, nb)), d, False)
    return Lowered("cosine_similarity", "compute", c.operands, emit)


@_conv("softsign")
def _softsign(c: Conv) -> Lowered:
    i = c.tensor(c.get("input"))
    return Lowered("softsign", "compute", c.operands, lambda g, t: g.div(t[i], g.add_scalar(g.abs(t[i]), 1.0)))


# --- masks: bool tensors are float 0/1 inside Prism (capture keeps a mask PyTorch computes or uses in
# PyTorch: see capture._masks) -----------------------------------------------------------------------------

_FLIP = {"gt": "lt", "ge": "le", "lt": "gt", "le": "ge", "eq": "eq", "ne": "ne"}


def _is_bool(c: Conv, v: Any) -> bool:
    return c.is_tensor(v) and str(meta_value(v).dtype) == "torch.bool"


@_conv("gt", "ge", "lt", "le", "eq", "ne")
def _compare(c: Conv) -> Lowered:
    a, b = c.get("input"), c.get("other")
    kind = c.call.name
    if c.is_tensor(a) and c.is_tensor(b):
        raise Unsupported(f"{kind}: two tensor operands (comparisons with a constant are supported)")
    if not c.is_tensor(a):
        a, b, kind = b, a, _FLIP[kind]
    if _is_bool(c, a):
        raise Unsupported(f"{kind}: comparison of a bool tensor")
    v = c.number(_constant(c, b), "the compared constant")
    i = c.tensor(a)
    return Lowered(c.call.name, "compute", c.operands, lambda g, t: g.compare(t[i], kind, v))


@_conv("logical_not", "bitwise_not")
def _logical_not(c: Conv) -> Lowered:
    x = c.get("input")
    if not _is_bool(c, x):
        raise Unsupported(f"{c.call.name}: of a non-bool tensor")
    i = c.tensor(x)
    return Lowered(c.call.name, "compute", c.operands, lambda g, t: g.compare(t[i], "eq", 0.0))


@_conv("logical_and", "bitwise_and", "logical_or", "bitwise_or")
def _logical(c: Conv) -> Lowered:
    a, b = c.get("input"), c.get("other")
    if not (_is_bool(c, a) and _is_bool(c, b)):
        raise Unsupported(f"{c.call.name}: operands must be bool tensors")
    i, j = c.tensor(a), c.tensor(b)
    both = "and" in c.call.name
    return Lowered(c.call.name, "compute", c.operands,
                   lambda g, t: g.mul(t[i], t[j]) if both else g.maximum(t[i], t[j]))


def _select(g: OpMethods, m: Tensor, v: Tensor | float) -> Tensor:
    """v where the mask m is set, else 0 (v a tensor or a number)."""
    return g.mask_select(m, v) if isinstance(v, Tensor) else g.mask_scalar(m, float(v))


@_conv("where")
def _where(c: Conv) -> Lowered:
    cond, a, b = c.get("condition"), c.get("input", None), c.get("other", None)
    if a is None or b is None:
        raise Unsupported("where: the one-argument form (indices)")
    if not _is_bool(c, cond):
        raise Unsupported("where: a condition that is not a bool tensor")
    k = c.tensor(cond)
    ia = c.tensor(a) if c.is_tensor(a) else None
    ib = c.tensor(b) if c.is_tensor(b) else None
    va = None if ia is not None else c.number(_constant(c, a), "input")
    vb = None if ib is not None else c.number(_constant(c, b), "other")

    def emit(g: OpMethods, t: list[Tensor]) -> Tensor:
        m = t[k]
        x = _select(g, m, t[ia] if ia is not None else va)       # type: ignore[arg-type]
        y = _select(g, g.compare(m, "eq", 0.0), t[ib] if ib is not None else vb)  # type: ignore[arg-type]
        return g.add(x, y)
    return Lowered("where", "compute", c.operands, emit)


@_conv("masked_fill")
def _masked_fill(c: Conv) -> Lowered:
    x, mask, value = c.get("input"), c.get("mask"), c.get("value")
    if not _is_bool(c, mask):
        raise Unsupported("masked_fill: a mask that is not a bool tensor")
    v = c.number(_constant(c, value), "value")
    i, k = c.tensor(x), c.tensor(mask)
    return Lowered("masked_fill", "compute", c.operands,
                   lambda g, t: g.add(g.mask_select(g.compare(t[k], "eq", 0.0), t[i]), g.mask_scalar(t[k], v)))


# --- losses: the element-wise loss stated once, then PyTorch's reduction ('mean' over every element) -----

def _reduced(g: OpMethods, y: Tensor, reduction: str) -> Tensor:
    if reduction == "none":
        return y
    n = D.product(y.shape)
    for d in range(len(y.shape)):
        y = g.sum(y, d)
    if reduction == "mean":
        if not isinstance(n, int):
            raise Unsupported("a mean loss over a symbolic number of elements")
        y = g.mul_scalar(y, 1.0 / n)
    return g.reshape(y, ())


def _loss(c: Conv, elementwise: Callable[[OpMethods, Tensor, Tensor], Tensor]) -> Lowered:
    a, b = c.get("input"), c.get("target")
    if c.get("size_average", None) is not None or c.get("reduce", None) is not None:
        raise Unsupported(f"{c.call.name}: the deprecated size_average/reduce arguments")
    reduction = c.get("reduction", "mean")
    if reduction not in ("none", "mean", "sum"):
        raise Unsupported(f"{c.call.name}: reduction={reduction!r}")
    if c.shape(a) != c.shape(b):
        raise Unsupported(f"{c.call.name}: input and target of different shapes")
    i, j = c.tensor(a), c.tensor(b)
    return Lowered(c.call.name, "compute", c.operands, lambda g, t: _reduced(g, elementwise(g, t[i], t[j]), reduction))


def _huber(g: OpMethods, d: Tensor, delta: float, scale: float) -> Tensor:
    """where(|d| < delta, 0.5 d^2, delta (|d| - 0.5 delta)) * scale, with masks."""
    ad = g.abs(d)
    small = g.compare(ad, "lt", delta)
    quad = g.mul_scalar(g.square(d), 0.5 * scale)
    lin = g.mul_scalar(g.add_scalar(ad, -0.5 * delta), delta * scale)
    return g.add(g.mask_select(small, quad), g.mask_select(g.compare(small, "eq", 0.0), lin))


@_conv("mse_loss")
def _mse_loss(c: Conv) -> Lowered:
    return _loss(c, lambda g, a, b: g.square(g.sub(a, b)))


@_conv("l1_loss")
def _l1_loss(c: Conv) -> Lowered:
    return _loss(c, lambda g, a, b: g.abs(g.sub(a, b)))


@_conv("smooth_l1_loss", "huber_loss")
def _smooth_l1(c: Conv) -> Lowered:
    if c.call.name == "huber_loss":
        delta = c.number(c.get("delta", 1.0), "delta")
        return _loss(c, lambda g, a, b: _huber(g, g.sub(a, b), delta, 1.0))
    beta = c.number(c.get("beta", 1.0), "beta")
    if beta <= 0:
        raise Unsupported("smooth_l1_loss: beta <= 0")
    return _loss(c, lambda g, a, b: _huber(g, g.sub(a, b), beta, 1.0 / beta))


@_conv("binary_cross_entropy_with_logits")
def _bce_logits(c: Conv) -> Lowered:
    if c.get("weight", None) is not None or c.get("pos_weight", None) is not None:
        raise Unsupported("binary_cross_entropy_with_logits: weight/pos_weight")
    # (1 - y) x + log(1 + e^(-x)) = softplus(x) - x y
    return _loss(c, lambda g, x, y: g.sub(g.softplus(x), g.mul(x, y)))


_REDUCTION_ENUM = {0: "none", 1: "mean", 2: "sum"}   # aten's reduction argument


def ce_reduction(call: Call) -> str:
    """The reduction of a cross_entropy call (``F.cross_entropy``'s string or ``aten.cross_entropy_loss``'s
    enum), or raises Unsupported."""
    r = call.get("reduction", 1 if call.name == "cross_entropy_loss" else "mean")
    r = _REDUCTION_ENUM.get(r, r) if isinstance(r, int) and not isinstance(r, bool) else r
    if r not in ("none", "mean", "sum"):
        raise Unsupported(f"cross_entropy: reduction={r!r}")
    return r


@_conv("cross_entropy", "cross_entropy_loss")
def _cross_entropy(c: Conv) -> Lowered:
    """Cross entropy with a target distribution (float probabilities over the classes, dim 1 of ``[N, C]``):
    ``-(p * log_softmax(x, 1)).sum(1)``, then the reduction ('mean': over the N rows). Class-index targets
    reach this as a distribution built in PyTorch (:func:`class_target`, capture's ``lower_cross_entropy``)."""
    x, p = c.get("input"), c.get("target")
    name = c.call.name
    if c.get("size_average", None) is not None or c.get("reduce", None) is not None:
        raise Unsupported(f"{name}: the deprecated size_average/reduce arguments")
    if c.get("weight", None) is not None:
        raise Unsupported(f"{name}: class weights")
    if c.get("label_smoothing", 0.0) not in (0, 0.0):
        raise Unsupported(f"{name}: label_smoothing")
    reduction = ce_reduction(c.call)
    if not c.is_tensor(p) or c.shape(p) != c.shape(x) or c.rank(x) not in (1, 2):
        raise Unsupported(f"{name}: a target that is not a distribution over the classes of [N, C] or [C] logits "
                          "(class indices are turned into one when captured; other layouts stay in PyTorch)")
    i, j = c.tensor(x), c.tensor(p)
    d = c.rank(x) - 1

    def emit(g: OpMethods, t: list[Tensor]) -> Tensor:
        rows = g.neg(g.sum(g.mul(t[j], log_softmax(g, t[i], d)), d))          # [N, 1] (or [1])
        if reduction == "none":
            return g.reshape(rows, tuple(t[i].shape[:-1]))
        return _reduced(g, rows, "sum" if reduction == "sum" or d == 0 else "mean")
    return Lowered(name, "compute", c.operands, emit)


def class_target(target: Any, input: Any, ignore_index: int = -100, reduction: str = "mean",
                 check: bool = True) -> Any:
    """The target distribution of ``cross_entropy(input, target)`` for class indices ``target`` ([N]): one-hot
    rows over ``input``'s classes, zero for ``ignore_index``, divided by the number of kept targets when the
    reduction is 'mean' (so that a 'sum' over the distribution is PyTorch's mean; every target ignored gives
    NaN, as PyTorch). Built in PyTorch on every call (integer ids: Prism stores no int64). A kept target
    outside the classes raises IndexError, as PyTorch's loss does (``check``; off only for shape propagation,
    where the values are not known)."""
    import torch
    n_cls = input.shape[-1]
    keep = target != ignore_index
    if check and bool((keep & ((target < 0) | (target >= n_cls))).any()):
        raise IndexError(f"cross_entropy: a target is out of bounds for {n_cls} classes")
    value = keep.to(input.dtype)
    if reduction == "mean":
        value = value / keep.sum().to(input.dtype)
    # zeros and one scatter of N values ([128, 1000]: 183 -> 41 µs with the check, against a compare of every
    # class and a mask)
    return torch.zeros((*target.shape, n_cls), dtype=input.dtype, device=input.device).scatter_(
        -1, torch.where(keep, target, 0).unsqueeze(-1), value.unsqueeze(-1))


@_conv("log_sigmoid", "logsigmoid")
def _log_sigmoid(c: Conv) -> Lowered:
    i = c.tensor(c.get("input"))
    return Lowered("log_sigmoid", "compute", c.operands, lambda g, t: g.neg(g.softplus(g.neg(t[i]))))


@_conv("softmax", "_softmax")
def _softmax(c: Conv) -> Lowered:
    x = c.get("input")
    if c.get("dtype", None) is not None or c.get("half_to_float", False) is True:
        raise Unsupported("softmax: dtype conversion")
    d = _ndim(c.get("dim"), c.rank(x), "softmax")
    i = c.tensor(x)
    return Lowered("softmax", "compute", c.operands, lambda g, t: g.softmax(t[i], d), ("softmax",))


@_conv("rms_norm")
def _rms_norm(c: Conv) -> Lowered:
    x, shape, w, eps = c.get("input"), c.get("normalized_shape"), c.get("weight", None), c.get("eps", None)
    shape = c.sizes(shape)
    if len(shape) != 1:
        raise Unsupported(f"rms_norm: normalized_shape {list(shape)} (only the last dim is supported)")
    e = float(eps) if eps is not None else 1.1920928955078125e-07  # torch.finfo(float32).eps, torch's default
    i = c.tensor(x)
    k = c.tensor(w) if w is not None else None

    def emit(g: OpMethods, t: list[Tensor]) -> Tensor:
        y = g.rms_norm(t[i], e, -1)
        return g.mul(y, t[k]) if k is not None else y
    return Lowered("rms_norm", "compute", c.operands, emit, ("rms_norm",))


@_conv("scaled_dot_product_attention")
def _sdpa(c: Conv) -> Lowered:
    """Attention, with grouped KV heads and an optional mask. ``is_causal=True`` arrives here as a float
    mask: capture's normalize step gives the call the causal bias built in PyTorch
    (:func:`causal_bias`). A float mask is added to the scaled scores, a bool one (a float 0/1 inside Prism)
    masks them to -inf; with a mask other than the causal one, a query whose scores are all -inf gets 0, as
    PyTorch's attention gives (not softmax's NaN). Without a mask the query heads of one KV head are
    stacked as rows (one product per KV head: decode reads each KV head once); with a mask the group is a
    dim of its own, so that a mask shared by the heads broadcasts over it."""
    q, k, v = c.get("query"), c.get("key"), c.get("value")
    mask = c.get("attn_mask", None)
    if c.get("is_causal", False):
        raise Unsupported("scaled_dot_product_attention: is_causal=True with a mask given as well")
    if c.number(c.get("dropout_p", 0.0), "dropout_p") != 0.0:
        raise Unsupported("scaled_dot_product_attention: dropout_p > 0")
    gqa = bool(c.get("enable_gqa", False))
    qs, ks = c.shape(q), c.shape(k)
    if len(qs) < 3 or len(qs) != len(ks) or len(c.shape(v)) != len(qs):
        raise Unsupported("scaled_dot_product_attention: query, key and value must have the same rank >= 3")
    e = qs[-1]
    if not isinstance(e, int):
        raise Unsupported("scaled_dot_product_attention: a symbolic head dim")
    scale = c.get("scale", None)
    scale = 1.0 / math.sqrt(e) if scale is None else c.number(scale, "scale")
    group = 1
    if gqa:
        hq, hk = qs[-3], ks[-3]
        if not isinstance(hq, int) or not isinstance(hk, int):
            raise Unsupported("scaled_dot_product_attention: enable_gqa with symbolic head counts")
        if hq % hk:
            raise Unsupported(f"scaled_dot_product_attention: {hq} query heads are not a multiple of {hk} KV heads")
        group = hq // hk
    i, j, m = c.tensor(q), c.tensor(k), c.tensor(v)
    mi, bool_mask, mask_heads = None, False, 1
    if mask is not None:
        if not c.is_tensor(mask):
            raise Unsupported(f"scaled_dot_product_attention: attn_mask must be a tensor, got {_describe(mask)}")
        ms = c.shape(mask)
        if len(ms) > len(qs):
            raise Unsupported(f"scaled_dot_product_attention: attn_mask of rank {len(ms)} > the query's")
        mask_heads = ms[-3] if len(ms) >= 3 else 1
        if group > 1 and not (isinstance(mask_heads, int) and mask_heads in (1, qs[-3])):
            raise Unsupported(f"scaled_dot_product_attention: a mask with {mask_heads} heads and grouped KV heads")
        bool_mask = str(meta_value(mask).dtype) == "torch.bool"
        mi = c.tensor(mask)
    # PyTorch's attention gives 0, not NaN, for a query whose keys are all masked (a padded position of a
    # batch: its softmax over -inf only); the causal mask always leaves the diagonal
    safe = mask is not None and not (_is_node(mask) and mask.op == "call_function" and mask.target is causal_bias)

    def emit(g: OpMethods, t: list[Tensor], bool_mask: bool = bool_mask) -> Tensor:
        qq, kk, vv = t[i], t[j], t[m]
        lead, (hq, rows, dh) = qq.shape[:-3], qq.shape[-3:]
        hk = D.div_exact(hq, group)

        def by_group(x: Tensor) -> Tensor:  # [.., heads, L, S] -> [.., KV heads, group, L, S] (shared: [.., 1, 1, ..])
            xs = x.shape
            return g.reshape(x, (*xs[:-3], hk, group, *xs[-2:]) if mask_heads != 1 else (*xs[:-3], 1, 1, *xs[-2:]))
        bias = None if mi is None else t[mi]
        attends = None  # 1 where a query attends to some key (bool masks: the mask's row max)
        if bias is not None and bool_mask:  # True: attend; False: -inf
            attends = g.max(bias, -1) if safe else None
            bias = g.mask_scalar(g.compare(bias, "eq", 0.0), float("-inf"))
        if group > 1 and bias is None:  # query head h uses KV head h // group: its group's rows are contiguous
            qq = g.reshape(qq, (*lead, hk, rows * group, dh))
        elif group > 1:  # the group a dim of its own, over which KV heads and a shared mask broadcast
            qq = g.reshape(qq, (*lead, hk, group, rows, dh))
            kk = g.reshape(kk, (*kk.shape[:-2], 1, *kk.shape[-2:]))
            vv = g.reshape(vv, (*vv.shape[:-2], 1, *vv.shape[-2:]))
            if len(bias.shape) >= 3:
                bias = by_group(bias)
        s = g.mul_scalar(g.matmul(qq, g.transpose(kk, -1, -2)), scale)
        if bias is not None:
            s = g.add(s, bias)
        o = g.matmul(g.softmax(s, -1), vv)
        if safe:  # rows of -inf only: 0 (a NaN score stays NaN: NaN != -inf)
            if attends is None:
                attends = g.compare(g.max(s, -1), "ne", float("-inf"))
            elif group > 1 and len(attends.shape) >= 3:  # [.., heads, L, 1] as the scores' [.., hk, group, L, 1]
                attends = by_group(attends)
            o = g.mask_select(attends, o)
        if group > 1:
            o = g.reshape(o, (*lead, hq, rows, o.shape[-1]))
        return o
    low = Lowered("scaled_dot_product_attention", "compute", c.operands, emit, ("sdpa",))
    if bool_mask:
        ops = [Operand(o.node, o.perm, bias=k == mi) for k, o in enumerate(c.operands)]
        low.as_bias = Lowered("scaled_dot_product_attention", "compute", ops,
                              lambda g, t: emit(g, t, bool_mask=False), ("sdpa",))
    return low


def causal_bias(query: Any, key: Any) -> Any:
    """The additive mask of ``scaled_dot_product_attention(..., is_causal=True)``: ``[L, S]``, 0 where key
    ``j <= i`` (PyTorch aligns the triangle top-left), -inf above. Built in PyTorch on every call (L x S
    floats); capture's normalize step passes it as ``attn_mask`` (a float mask: the same result)."""
    import torch
    return torch.full((query.shape[-2], key.shape[-2]), float("-inf"), dtype=query.dtype,
                      device=query.device).triu(1)


# --- layout ---------------------------------------------------------------------------------------------

CASTS = ("to", "type_as", "_to_copy", "float", "bool", "bfloat16", "half")


def _identity_conv(c: Conv) -> Lowered:
    x = c.get("input")
    name = c.call.name
    if name == "dropout" and c.get("training", True) and c.number(c.get("p", 0.5), "p") != 0.0:
        raise Unsupported("dropout in training mode")
    if name in CASTS:
        want = meta_value(c.node)
        got = meta_value(x) if c.is_tensor(x) else None
        if got is None or str(got.device) != str(want.device):
            raise Unsupported(f"{name}: a device conversion")
        kinds = (str(got.dtype), str(want.dtype))
        i = c.tensor(x)
        if kinds == ("torch.float32", "torch.bool"):  # x.bool(): a mask, x != 0
            return Lowered(name, "compute", c.operands, lambda g, t: g.compare(t[i], "ne", 0.0))
        if kinds[0] in FLOAT_DTYPES and kinds[1] == "torch.int8":   # a quantizer's x.to(torch.int8)
            return Lowered(name, "compute", c.operands, lambda g, t: g.cast(t[i], "int8"), ("cast", "int8"))
        if kinds[0] != kinds[1] and kinds[0] != "torch.bool":
            if kinds[0] not in STORED or kinds[1] not in FLOAT_DTYPES:
                raise Unsupported(f"{name}: a conversion from {kinds[0]} to {kinds[1]} (Prism stores "
                                  f"{sorted(STORED)} and computes in {sorted(FLOAT_DTYPES)})")
            target = FLOAT_DTYPES[kinds[1]]   # x.to(torch.bfloat16), x.float(), x.type_as(w): a cast
            return Lowered(name, "compute", c.operands, lambda g, t: g.cast(t[i], target), ("cast", target))
        # a mask is already float 0/1 inside Prism: mask.float() is the identity (mask.bfloat16() too: its
        # users cast it to their dtype)
    i = c.tensor(x)
    return Lowered(name, "layout", c.operands, lambda g, t: t[i], ("identity",))


for _n in ("contiguous", "clone", "detach", "alias", "dropout", *CASTS):
    CONVERTERS[_n] = _identity_conv


def _target_shape(c: Conv, x: Any, raw: list[Any]) -> tuple[DimLike, ...]:
    dims = [c.dim(v) if not (isinstance(v, int) and v == -1) else -1 for v in raw]
    if dims.count(-1) > 1:
        raise Unsupported("view: more than one -1")
    if -1 in dims:
        total = D.product(to_dim(s) for s in c.shape(x))
        rest = D.product(d for d in dims if not (isinstance(d, int) and d == -1))
        inferred = D.div_exact(total, rest)
        if not integral(inferred):
            raise Unsupported(f"view: the -1 dim {inferred} is not an integer for every size")
        dims[dims.index(-1)] = inferred
    return tuple(dims)


@_conv("view", "reshape", "_unsafe_view")
def _view(c: Conv) -> Lowered:
    x = c.get("input")
    raw = c.get("shape")
    if len(raw) == 1 and _is_node(raw[0]):
        raw = c.sizes(raw[0])
    if any(not isinstance(v, (int,)) and not _is_node(v) and type(v).__name__ != "SymInt" for v in raw):
        raise Unsupported(f"view: unsupported shape {raw!r}")
    shape = _target_shape(c, x, list(raw))
    i = c.tensor(x)
    return Lowered(c.call.name, "layout", c.operands, lambda g, t: g.reshape(t[i], shape))


@_conv("permute")
def _permute(c: Conv) -> Lowered:
    x = c.get("input")
    r = c.rank(x)
    perm = tuple(_ndim(c.integer(p, "a permutation entry"), r, "permute") for p in c.get("dims"))
    i = c.tensor(x)
    return Lowered("permute", "layout", c.operands, lambda g, t: g.permute(t[i], perm), ("permute", perm))


@_conv("transpose", "t")
def _transpose(c: Conv) -> Lowered:
    x = c.get("input")
    r = c.rank(x)
    if c.call.name == "t":
        if r < 2:
            return _identity_conv(c)
        d0, d1 = 0, 1
    else:
        d0, d1 = _ndim(c.get("dim0"), r, "transpose"), _ndim(c.get("dim1"), r, "transpose")
    i = c.tensor(x)
    perm = list(range(r))
    perm[d0], perm[d1] = perm[d1], perm[d0]
    return Lowered("transpose", "layout", c.operands, lambda g, t: g.transpose(t[i], d0, d1), ("permute", tuple(perm)))


@_conv("T", "mT")
def _attr_transpose(c: Conv) -> Lowered:
    """``x.T`` (every dim reversed; a transpose for a matrix) and ``x.mT`` (the last two dims swapped)."""
    x = c.get("input")
    r = c.rank(x)
    if c.call.name == "mT":
        if r < 2:
            raise Unsupported(f"mT: needs a tensor of rank >= 2, got rank {r}")
        perm = (*range(r - 2), r - 1, r - 2)
    elif r < 2:
        return _identity_conv(c)
    else:
        perm = tuple(reversed(range(r)))
    i = c.tensor(x)
    return Lowered("permute", "layout", c.operands, lambda g, t: g.permute(t[i], perm), ("permute", perm))


@_conv("unsqueeze")
def _unsqueeze(c: Conv) -> Lowered:
    x = c.get("input")
    r = c.rank(x)
    d = _ndim(c.integer(c.get("dim"), "dim"), r + 1, "unsqueeze")
    i = c.tensor(x)
    return Lowered("unsqueeze", "layout", c.operands,
                   lambda g, t: g.reshape(t[i], (*t[i].shape[:d], 1, *t[i].shape[d:])))


@_conv("squeeze")
def _squeeze(c: Conv) -> Lowered:
    x = c.get("input")
    shape = [to_dim(s) for s in c.shape(x)]
    dim = c.get("dim", None)
    ds = range(len(shape)) if dim is None else ([dim] if not isinstance(dim, (list, tuple)) else list(dim))
    drop = {_ndim(d, len(shape), "squeeze") for d in ds}
    drop = {d for d in drop if isinstance(shape[d], int) and shape[d] == 1}
    i = c.tensor(x)
    return Lowered("squeeze", "layout", c.operands,
                   lambda g, t: g.reshape(t[i], tuple(s for k, s in enumerate(t[i].shape) if k not in drop)))


def _expand_plan(src: list[DimLike], want: list[Any], what: str) -> tuple[int, list[tuple[int, int]]]:
    """How ``src`` becomes ``want`` (``-1``: keep): (leading dims to add, (dim, copies) per size-1 dim
    broadcast). A size-1 dim broadcast to a constant n is n copies concatenated; anything else is Unsupported.
    An expand read by one broadcasting element-wise operator is not made at all: capture._fold_broadcasts
    gives the operator the unexpanded tensor."""
    lead = len(want) - len(src)
    if lead < 0:
        raise Unsupported(f"{what}: to fewer dims ({len(want)}) than the tensor has ({len(src)})")
    reps: list[tuple[int, int]] = []
    for d, b in enumerate(want):
        a = src[d - lead] if d >= lead else 1
        if (isinstance(b, int) and b == -1 and d >= lead) or D.structurally_equal(a, b):
            continue
        if isinstance(a, int) and a == 1 and isinstance(b, int) and b >= 1:
            reps.append((d, b))
        else:
            raise Unsupported(f"{what}: dim {d} from {a} to {b} (only a size-1 dim to a constant size)")
    return lead, reps


def _expand_emit(g: OpMethods, y: Tensor, lead: int, reps: list[tuple[int, int]]) -> Tensor:
    if lead:
        y = g.reshape(y, (1,) * lead + tuple(y.shape))
    for d, n in reps:
        y = g.concat([y] * n, d) if n > 1 else y
    return y


@_conv("expand")
def _expand(c: Conv) -> Lowered:
    """``x.expand(*sizes)``: see _expand_plan."""
    x = c.get("input")
    src = [to_dim(s) for s in c.shape(x)]
    raw = c.get("size")
    if len(raw) == 1 and _is_node(raw[0]):
        raw = c.sizes(raw[0])
    want = [v if isinstance(v, int) and v == -1 else c.dim(v) for v in raw]
    lead, reps = _expand_plan(src, want, "expand")
    i = c.tensor(x)
    return Lowered("expand", "layout", c.operands, lambda g, t: _expand_emit(g, t[i], lead, reps))


@_conv("expand_as")
def _expand_as(c: Conv) -> Lowered:
    """``x.expand_as(other)``: expand to ``other``'s shape (F.normalize in an exported graph)."""
    x, other = c.get("input"), c.get("other")
    lead, reps = _expand_plan([to_dim(s) for s in c.shape(x)], [to_dim(s) for s in c.shape(other)], "expand_as")
    i = c.tensor(x)
    return Lowered("expand_as", "layout", c.operands, lambda g, t: _expand_emit(g, t[i], lead, reps))


@_conv("broadcast_tensors")
def _broadcast_tensors(c: Conv) -> Lowered:
    """``torch.broadcast_tensors(*xs)``: each expanded to the common shape, as a tuple (its items are taken
    by getitem; F.mse_loss in an exported graph)."""
    xs = list(c.get("tensors"))
    if not xs or not all(c.is_tensor(x) for x in xs):
        raise Unsupported("broadcast_tensors: operands other than tensors")
    shapes = [[to_dim(s) for s in c.shape(x)] for x in xs]
    r = max(len(sh) for sh in shapes)
    want: list[DimLike] = []
    for d in range(r):
        sizes = [sh[d - (r - len(sh))] for sh in shapes if d >= r - len(sh)]
        big = [s for s in sizes if not (isinstance(s, int) and s == 1)]
        if any(not D.structurally_equal(big[0], s) for s in big[1:]):
            raise Unsupported(f"broadcast_tensors: sizes {sizes} in dim {d} do not broadcast")
        want.append(big[0] if big else 1)
    plans = [_expand_plan(sh, list(want), "broadcast_tensors") for sh in shapes]
    idx = [c.tensor(x) for x in xs]
    return Lowered("broadcast_tensors", "layout", c.operands,
                   lambda g, t: tuple(_expand_emit(g, t[i], lead, reps) for i, (lead, reps) in zip(idx, plans)))


@_conv("cat")
def _cat(c: Conv) -> Lowered:
    xs = list(c.get("tensors"))
    # PyTorch skips 1-D empty operands whatever the dim (a cache's first update: cat((tensor([]), k), -2))
    xs = [x for x in xs if not (c.is_tensor(x) and c.rank(x) == 1 and _is_zero(c.shape(x)[0]))]
    if not xs:
        raise Unsupported("cat: no operands (or only empty 1-D ones)")
    r = c.rank(xs[0]) if c.is_tensor(xs[0]) else 0
    d = _ndim(c.get("dim", 0), r, "cat")
    idx = [c.tensor(x) for x in xs]
    order = [idx[k] for k in range(len(xs))]

    def emit(g: OpMethods, t: list[Tensor]) -> Tensor:
        parts = [t[k] for k in order]
        return parts[0] if len(parts) == 1 else g.concat(parts, d)
    return Lowered("cat", "layout", c.operands, emit, ("cat", d, len(xs)))


def _is_zero(size: Any) -> bool:
    return isinstance(size, int) and not isinstance(size, bool) and size == 0


def _split_sizes(total: DimLike, size: Any, what: str) -> list[DimLike]:
    if isinstance(size, int):
        if not isinstance(total, int):
            raise Unsupported(f"{what}: an int split size of a symbolic dim")
        return [min(size, total - k) for k in range(0, total, size)]
    return [to_dim(s) for s in size]


def _split_lowered(c: Conv, x: Any, d: int, sizes: list[DimLike]) -> Lowered:
    i = c.tensor(x)
    return Lowered(c.call.name, "layout", c.operands,
                   lambda g, t: g.split(t[i], sizes, d) if len(sizes) > 1 else (t[i],))


@_conv("split", "split_with_sizes")
def _split(c: Conv) -> Lowered:
    x = c.get("input")
    r = c.rank(x)
    d = _ndim(c.get("dim", 0), r, "split")
    size = c.get("split_size_or_sections", None) if c.call.name == "split" else c.get("split_sizes")
    return _split_lowered(c, x, d, _split_sizes(to_dim(c.shape(x)[d]), size, "split"))


@_conv("chunk")
def _chunk(c: Conv) -> Lowered:
    x = c.get("input")
    r = c.rank(x)
    d = _ndim(c.get("dim", 0), r, "chunk")
    n = c.integer(c.get("chunks"), "chunks")
    total = to_dim(c.shape(x)[d])
    if not isinstance(total, int):
        raise Unsupported("chunk: of a symbolic dim")
    step = -(-total // n)
    return _split_lowered(c, x, d, _split_sizes(total, step, "chunk"))


@_conv("slice")
def _slice(c: Conv) -> Lowered:
    x = c.get("input")
    r = c.rank(x)
    d = _ndim(c.get("dim", 0), r, "slice")
    return _slice_lowered(c, x, d, slice(c.get("start", None), c.get("end", None), c.get("step", 1)))


def _slice_bounds(total: DimLike, s: slice) -> tuple[int, int]:
    if s.step not in (None, 1):
        raise Unsupported("slicing with a step")
    if not isinstance(total, int):
        if s.start in (None, 0) and (s.stop is None or (isinstance(s.stop, int) and s.stop >= 2 ** 62)):
            return 0, -1  # the whole dim
        raise Unsupported("slicing a symbolic dim")
    start, stop, _ = s.indices(total)
    if stop <= start:
        raise Unsupported("an empty slice")
    return start, stop


def _slice_lowered(c: Conv, x: Any, d: int, s: slice) -> Lowered:
    total = to_dim(c.shape(x)[d])
    start, stop = _slice_bounds(total, s)
    i = c.tensor(x)
    if stop == -1 or (start == 0 and stop == total):
        return Lowered("slice", "layout", c.operands, lambda g, t: t[i])
    assert isinstance(total, int)
    sizes = [n for n in (start, stop - start, total - stop) if n > 0]
    part = 1 if start > 0 else 0
    return Lowered("slice", "layout", c.operands, lambda g, t: g.split(t[i], sizes, d)[part],
                   ("slice", d, start, stop, total))


def _select_lowered(c: Conv, x: Any, d: int, k: int, op: str) -> Lowered:
    """``x[:, k]`` / ``x.select(d, k)``: the slice ``k:k+1`` of dim ``d``, then the dim dropped."""
    total = c.shape(x)[d]
    if not isinstance(total, int) or not -total <= k < total:
        raise Unsupported(f"index {k} of a dim of size {total}")
    k %= total
    inner = _slice_lowered(c, x, d, slice(k, k + 1))
    return Lowered(op, "layout", inner.operands,
                   lambda g, t: g.reshape(v := inner.emit(g, t), tuple(s for j, s in enumerate(v.shape) if j != d)))


@_conv("select")
def _select_index(c: Conv) -> Lowered:
    """``torch.select`` / ``Tensor.select`` / ``aten.select.int`` (an exported graph's ``x[:, k]``)."""
    x, d, k = c.get("input"), c.get("dim"), c.get("index")
    if not c.is_tensor(x) or not isinstance(d, int) or not isinstance(k, int) or isinstance(k, bool):
        raise Unsupported("select with a symbolic dim or index")
    return _select_lowered(c, x, d % c.rank(x), k, "select")


@_conv("getitem")
def _getitem(c: Conv) -> Lowered:
    x, idx = c.get("input"), c.get("idx")
    mv = meta_value(x) if _is_node(x) else None
    if isinstance(mv, (list, tuple)) and isinstance(idx, int):  # one result of split/chunk/max(dim)
        if not is_tensor_meta(mv[idx]) or str(mv[idx].dtype) != "torch.float32":
            raise Unsupported(f"result {idx} of {_describe(x)} is not a float32 tensor (indices stay in PyTorch)")
        op = Operand(x)
        c.operands.append(op)
        return Lowered("getitem", "layout", c.operands, lambda g, t: t[0][idx])
    if not c.is_tensor(x):
        raise Unsupported(f"getitem of {_describe(x)}")
    items = list(idx) if isinstance(idx, tuple) else [idx]
    r = c.rank(x)
    if items.count(Ellipsis) > 1:
        raise Unsupported("indexing with two ellipses")
    if Ellipsis in items:
        k = items.index(Ellipsis)
        used = sum(it is not None for it in items) - 1   # (None adds a dim, it reads none)
        items = items[:k] + [slice(None)] * (r - used) + items[k + 1:]
    if any(it is None for it in items):  # x[None, :], x[:, None], x[..., None]: size-1 dims inserted
        rest = [it for it in items if it is not None]
        if len(rest) > r or any(not (isinstance(it, slice) and it == slice(None)) for it in rest):
            raise Unsupported("indexing with None beside anything but full slices ':'")
        if static_shape(x) is None:
            # measured: transformers' repeat_kv (cache[:, :, None].expand(..., kv_len, ...)) converted here
            # gave the keys the cache's size symbol and the padding mask the expand's, which the attention
            # could not identify (the batch-with-padding test lost its attention pieces)
            raise Unsupported("indexing with None on a tensor of symbolic size (its expand names the size "
                              "another way)")
        i = c.tensor(x)

        def unsqueeze(g: OpMethods, t: list[Tensor]) -> Tensor:
            dims, shape = iter(t[i].shape), []
            for it in items:
                shape.append(1 if it is None else next(dims))
            return g.reshape(t[i], (*shape, *dims))
        return Lowered("getitem", "layout", c.operands, unsqueeze)
    ints = [(d, it) for d, it in enumerate(items) if isinstance(it, int) and not isinstance(it, bool)]
    if len(ints) == 1 and len(items) <= r and all(isinstance(it, slice) and it == slice(None)
                                                  for d, it in enumerate(items) if d != ints[0][0]):
        return _select_lowered(c, x, *ints[0], "getitem")
    if len(items) > r or any(not isinstance(it, slice) for it in items):
        raise Unsupported("indexing other than slices, one integer and None (tensors, several integers)")
    cut = [(d, it) for d, it in enumerate(items) if it != slice(None)]
    if len(cut) > 1:
        raise Unsupported("slicing more than one dim at once")
    if not cut:
        i = c.tensor(x)
        return Lowered("getitem", "layout", c.operands, lambda g, t: t[i])
    d, s = cut[0]
    return _slice_lowered(c, x, d, s)


SUPPORTED: tuple[str, ...] = tuple(sorted(CONVERTERS))
