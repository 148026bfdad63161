"""The operator registry: one :class:`OpDef` per operator, carrying what every stage needs.

An element-wise operator is defined in one place (``prism.ir.elementwise``): its shape and dtype rule,
NumPy reference, e-graph term name and rewrite rules, abstract expression for search, scalar C lowering
(plus the C helpers it needs; the generated loops vectorize it), cost, PyTorch spellings for the
frontend and the JAX and ONNX translations the bench uses. Each stage reads those fields; nothing keys
on lists of operator names. Reductions likewise (``prism.ir.reductions``: a monoid and a ``reduction(...)``
call). The other structural operators (matmul, row-wise composites, layout, I/O) are registered here with
their shape rules; their per-stage rules are written in the stages
because each needs its own code there (loop nests, accumulators, term constructors), and
``tests/unit/test_op_coverage.py`` checks that every stage covers every operator.
Attributes live in ``Node.arg`` as a tuple in the order of ``OpDef.attrs``.

Block-graph-only operators (input iterators, accumulators, savers) are defined in ``prism.ir.block``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

from prism.errors import DTypeError, InconclusiveDimError, ShapeError
from prism.ir.dims import Dim, DimEq, DimLike, Divisible, dims_equal, format_shape, has_selectors, product
from prism.ir.dtypes import DType, float32

Shape = tuple[DimLike, ...]


@dataclass
class ShapeCtx:
    """Collects constraints that shape rules cannot check while dims are symbolic: divisibility, and
    equalities that depend on map symbols (symbolic dimension matching)."""

    constraints: list[Divisible | DimEq] = field(default_factory=list)
    op: str = ""


_CTX: ContextVar[ShapeCtx | None] = ContextVar("prism_shape_ctx", default=None)


ShapeRule = Callable[[ShapeCtx, tuple[Shape, ...], tuple], Shape]
NumpyImpl = Callable[[Sequence[Any], tuple], Any]           # (arrays, arg) -> array
CLowering = Callable[[list[str], tuple, Callable[[float], str]], str]  # (C args, arg, float literal) -> C expr
Translation = Callable[..., Any]


@dataclass(frozen=True)
class Torch:
    """How PyTorch spells an operator, for the frontend.

    ``names``: canonical call names (``F.x``, ``torch.x``, ``Tensor.x`` and ``aten.x.*`` all normalize to
    ``x``; a name ``aten.x`` is used for ATen overloads whose signature differs). ``params``: the
    signature the call is bound to (``input`` first). ``attrs(get)``: the operator's attributes from the
    bound call (``get(param, default)``), or raises ``ValueError`` naming what is not supported.
    ``modules``: ``nn`` module classes and the module attributes passed as keyword arguments.
    """

    names: tuple[str, ...]
    params: tuple[str, ...] = ("input",)
    attrs: Callable[[Callable[[str, Any], Any]], tuple] | None = None
    modules: tuple[tuple[str, tuple[str, ...]], ...] = ()


@dataclass(frozen=True)
class OpRule:
    """A rewrite rule an operator brings to the verifier (egglog pattern text; ``(Un "name" x)`` is the
    term of a unary operator). ``both``: the rule is used in both directions. ``ex``: the self-check's
    example values of the pattern's variables beyond ``x``/``a``/``b`` ([m, n] tensors), as pairs
    (a dim variable: ``("d", -1)``)."""

    name: str
    lhs: str
    rhs: str
    both: bool = True
    ex: tuple[tuple[str, Any], ...] = ()


@dataclass(frozen=True)
class OpDef:
    name: str
    group: str          # io | contraction | unary | binary | reduction | composite | layout | custom
    arity: int | None   # None: variadic
    attrs: tuple[str, ...]
    shape_rule: ShapeRule
    doc: str
    elementwise: bool = False
    size_attrs: tuple[str, ...] = ()    # attributes that hold sizes (a shape, split sizes): Graph.generalize
    # --- per-stage rules of element-wise operators (prism.ir.elementwise) ---
    defaults: tuple = ()                 # attribute defaults (builder methods, term names)
    numpy: NumpyImpl | None = None       # reference (float32 or float64 arrays in, same dtype out)
    c: CLowering | None = None           # scalar C expression; generated loops vectorize it
    c_defs: str = ""                     # C helper functions the expression calls (prelude)
    flops: int = 1                       # cost model: flops per element (a transcendental counts its polynomial)
    linear: bool = False                 # f(a*x) == a*f(x) for a scalar a (search: splitting a reduction past it)
    steps: bool = False                  # piecewise constant (round, floor, ...): a float32 rounding of its operand
    #                                      can move its value by a whole step (verify.numeric.steps)
    term_head: str = ""                  # binary: the verifier's term constructor ("Add", ...)
    abstract: Callable[..., Any] | None = None  # (alg, arg, srcs) -> abstract value; default: opaque by name
    rules: tuple[OpRule, ...] = ()
    torch: tuple[Torch, ...] = ()       # PyTorch spellings (frontend)
    jax: Translation | None = None       # (jax module, arrays, arg) -> array
    # --- composites ---
    decomp: Callable[..., Any] | None = None  # (g, *operands, *attrs) -> value, g with one method per operator
    onnx: Translation | None = None      # (builder, input names, arg) -> output name
    # --- reductions (prism.ir.reductions) ---
    monoid: str = ""                     # the fold: a key of prism.ir.reductions.MONOIDS
    mean: bool = False                   # the fold divided by the reduced dim's extent
    # --- dtypes ---
    dtype_fn: Callable[[tuple[DType, ...], tuple], DType] | None = None  # result dtype (default: the operands')

    def term_name(self, arg: tuple) -> str:
        """The name of a unary operator in the verifier's terms: ``name``, or ``name(a,b)`` when an
        attribute differs from its default (``gelu(tanh)``, ``leaky_relu(0.2)``)."""
        if not arg or tuple(arg) == tuple(self.defaults):
            return self.name
        return f"{self.name}({','.join(_attr_str(a) for a in arg)})"

    def dtype_rule(self, dtypes: tuple[DType, ...], arg: tuple) -> DType:
        """The result's dtype: operands of one dtype give that dtype (a matmul of bfloat16 operands is
        bfloat16; it accumulates in float32, see ``prism.ir.dtypes``); float operands of different dtypes
        give the wider (:func:`promote`). Computing operators take float operands only: an int8 tensor (a
        quantized weight) is cast first; layout operators take any."""
        if not dtypes:
            raise DTypeError(f"{self.name}: no operands")
        if self.dtype_fn is not None:
            return self.dtype_fn(dtypes, arg)
        first = dtypes[0]
        if all(d == first for d in dtypes[1:]):
            if self.group == "contraction" and getattr(first, "name", "") == "int8":
                # int8 values on both sides (quantized activations and weights, whose casts to float the search
                # drops as exact): every product is exact in float32 and the sum accumulates as any matmul's; the
                # result is float32. (The frontend refuses PyTorch's own integer matmuls, which wrap at int8.)
                return float32
            if not getattr(first, "is_float", True) and self.group not in ("layout", "io"):  # (search: dtype-free)
                raise DTypeError(f"{self.name}: operands of dtype {first} hold integers; cast them to a float "
                                 f"dtype first (g.cast(q, 'float32'), then multiply by the scale)")
            return first
        promoted = promote(dtypes) if self.group not in ("layout", "io") else None
        if promoted is None:
            raise DTypeError(f"{self.name}: operands have different dtypes {[str(x) for x in dtypes]}; "
                             "cast them to one dtype first (g.cast(x, 'float32'))")
        return promoted


# Operands of different dtypes compute in float32 anyway (prism.ir.dtypes): the result is stored as the widest
# float among them, as PyTorch promotes (bfloat16 with float32 is float32; bfloat16 with float16 is float32;
# an int8 weight times a float32 scale is float32: int8 values are exact in float32). Integers alone never
# compute (the dtype rule refuses them): a quantized weight meets a float scale or is cast.
_RANK = {"int8": 0, "float16": 1, "bfloat16": 1, "float32": 2, "float64": 3}


def promote(dtypes: tuple[DType, ...]) -> DType | None:
    """The dtype operands of ``dtypes`` give (None: no float among them, or an unknown dtype)."""
    names = {getattr(d, "name", "") for d in dtypes}
    if not names <= set(_RANK) or names == {"int8"} or ("float64" in names and len(names) > 1):
        return None   # (float64 is the reference's type: a program mixing it in is a mistake to report)
    if names == {"bfloat16", "float16"}:
        return float32
    return max(dtypes, key=lambda d: _RANK[d.name])


def _attr_str(a: Any) -> str:
    return repr(float(a)) if isinstance(a, (int, float)) and not isinstance(a, bool) else str(a)


def parse_term_name(s: str) -> tuple[str, tuple]:
    """Inverse of :meth:`OpDef.term_name`: ``(operator, arg)``."""
    if "(" not in s:
        op = get(s)
        return s, tuple(op.defaults)
    name, rest = s.split("(", 1)
    parts = rest.rstrip(")").split(",")
    arg: list[Any] = []
    for p in parts:
        try:
            arg.append(float(p))
        except ValueError:
            arg.append(p)
    get(name)
    return name, tuple(arg)


OPS: dict[str, OpDef] = {}


def register(name: str, group: str, arity: int | None, attrs: tuple[str, ...], rule: ShapeRule, doc: str,
             elementwise: bool = False, **stages: Any) -> OpDef:
    if name in OPS:
        raise ValueError(f"operator {name!r} registered twice")
    op = OpDef(name, group, arity, attrs, rule, doc, elementwise, **stages)
    OPS[name] = op
    return op


def map_sizes(op: OpDef, arg: tuple, fn: Callable[[DimLike], DimLike]) -> tuple:
    """``arg`` with ``fn`` applied to every size its :attr:`OpDef.size_attrs` hold."""
    if not op.size_attrs:
        return arg
    return tuple(tuple(fn(d) for d in a) if name in op.size_attrs else a for name, a in zip(op.attrs, arg))


def get(name: str) -> OpDef:
    try:
        return OPS[name]
    except KeyError:
        from prism.errors import UnsupportedError
        raise UnsupportedError(f"unknown operator {name!r}; supported: {sorted(OPS)}") from None


# --- shape rules -------------------------------------------------------------------------------

def _same(a: DimLike, b: DimLike) -> bool:
    """Sound equality; when only map symbols make it undecidable, record a DimEq and assume it."""
    try:
        return dims_equal(a, b)
    except InconclusiveDimError:
        ctx = _CTX.get()
        if ctx is None or not (has_selectors(a) or has_selectors(b)):
            raise
        ctx.constraints.append(DimEq(a, b, f"operands of {ctx.op}" if ctx.op else ""))
        return True


def broadcast_shapes(a: Shape, b: Shape) -> Shape:
    """NumPy broadcasting, right-aligned. A symbolic dim is never assumed to be 1."""
    n = max(len(a), len(b))
    pa = (1,) * (n - len(a)) + tuple(a)
    pb = (1,) * (n - len(b)) + tuple(b)
    out = []
    for i, (x, y) in enumerate(zip(pa, pb)):
        if isinstance(x, int) and x == 1:
            out.append(y)
        elif isinstance(y, int) and y == 1:
            out.append(x)
        elif _same(x, y):
            out.append(x)
        else:
            raise ShapeError(f"cannot broadcast {format_shape(a)} with {format_shape(b)}: "
                             f"dim {i - n} is {x} vs {y} (broadcasting needs equal sizes or a 1)")
    return tuple(out)


def _unary(ctx: ShapeCtx, shapes: tuple[Shape, ...], arg: tuple) -> Shape:
    return shapes[0]


def _binary(ctx: ShapeCtx, shapes: tuple[Shape, ...], arg: tuple) -> Shape:
    return broadcast_shapes(shapes[0], shapes[1])


def _matmul(ctx: ShapeCtx, shapes: tuple[Shape, ...], arg: tuple) -> Shape:
    a, b = shapes
    if len(a) < 2 or len(b) < 2:
        raise ShapeError(f"matmul needs operands of rank >= 2, got {format_shape(a)} @ {format_shape(b)}; "
                         "reshape a vector to [1, n] or [n, 1]")
    if not _same(a[-1], b[-2]):
        raise ShapeError(f"inner dims differ: {format_shape(a)} @ {format_shape(b)} "
                         f"(a.shape[-1] = {a[-1]}, b.shape[-2] = {b[-2]})")
    try:
        batch = broadcast_shapes(a[:-2], b[:-2])
    except ShapeError as e:
        raise ShapeError(f"batch dims do not broadcast: {e}") from None
    return batch + (a[-2], b[-1])


def _check_dim(shape: Shape, dim: int, op: str) -> None:
    if not 0 <= dim < len(shape):
        raise ShapeError(f"dim {dim} is out of range for a tensor of rank {len(shape)} {format_shape(shape)}")


def _reduce(ctx: ShapeCtx, shapes: tuple[Shape, ...], arg: tuple) -> Shape:
    (dim,) = arg
    s = shapes[0]
    _check_dim(s, dim, "reduce")
    return s[:dim] + (1,) + s[dim + 1:]


def _rowwise(ctx: ShapeCtx, shapes: tuple[Shape, ...], arg: tuple) -> Shape:
    _check_dim(shapes[0], arg[0], "rowwise")
    return shapes[0]


def _rotate(ctx: ShapeCtx, shapes: tuple[Shape, ...], arg: tuple) -> Shape:
    dim, half = arg
    s = shapes[0]
    _check_dim(s, dim, "rotate_half")
    if not (isinstance(s[dim], int) and isinstance(half, int) and half > 0 and s[dim] == 2 * half):
        raise ShapeError(f"rotate_half swaps two halves of {half} along dim {dim}, which has {s[dim]} elements "
                         "(a known even size is needed)")
    return s


def _permute(ctx: ShapeCtx, shapes: tuple[Shape, ...], arg: tuple) -> Shape:
    (perm,) = arg
    s = shapes[0]
    if sorted(perm) != list(range(len(s))):
        raise ShapeError(f"permutation {perm} is not a permutation of the {len(s)} dims of {format_shape(s)}")
    return tuple(s[p] for p in perm)


def _reshape(ctx: ShapeCtx, shapes: tuple[Shape, ...], arg: tuple) -> Shape:
    (new,) = arg
    s = shapes[0]
    try:
        ok = _same(product(s), product(new))
    except InconclusiveDimError as e:
        raise ShapeError(f"cannot prove reshape {format_shape(s)} -> {format_shape(new)} keeps the number "
                         f"of elements ({e})") from None
    if not ok:
        raise ShapeError(f"cannot reshape {format_shape(s)} ({product(s)} elements) to "
                         f"{format_shape(new)} ({product(new)} elements)")
    return tuple(new)


def _concat(ctx: ShapeCtx, shapes: tuple[Shape, ...], arg: tuple) -> Shape:
    (dim,) = arg
    if len(shapes) < 2:
        raise ShapeError(f"concat needs at least 2 operands, got {len(shapes)}")
    first = shapes[0]
    for s in shapes:
        _check_dim(s, dim, "concat")
        if len(s) != len(first):
            raise ShapeError(f"operands have different ranks: {[format_shape(x) for x in shapes]}")
        for i, (x, y) in enumerate(zip(first, s)):
            if i != dim and not _same(x, y):
                raise ShapeError(f"operands differ in dim {i} (only dim {dim} may differ): "
                                 f"{[format_shape(x) for x in shapes]}")
    total: DimLike = 0
    for s in shapes:
        total = total + s[dim]
    return first[:dim] + (total,) + first[dim + 1:]


def _split(ctx: ShapeCtx, shapes: tuple[Shape, ...], arg: tuple) -> Shape:
    dim, sizes, index = arg
    s = shapes[0]
    _check_dim(s, dim, "split")
    total: DimLike = 0
    for x in sizes:
        total = total + x
    if not _same(total, s[dim]):
        raise ShapeError(f"split sizes {list(sizes)} add up to {total}, but dim {dim} of {format_shape(s)} "
                         f"is {s[dim]}")
    if not 0 <= index < len(sizes):
        raise ShapeError(f"split part {index} out of range for {len(sizes)} parts")
    return s[:dim] + (sizes[index],) + s[dim + 1:]


def _input(ctx: ShapeCtx, shapes: tuple[Shape, ...], arg: tuple) -> Shape:
    return arg[1]


def _customized(ctx: ShapeCtx, shapes: tuple[Shape, ...], arg: tuple) -> Shape:
    return ()  # a tuple-valued node; its results are `result` nodes


def _result(ctx: ShapeCtx, shapes: tuple[Shape, ...], arg: tuple) -> Shape:
    raise AssertionError("result shapes come from the block graph")  # handled in graph.py


# --- the registry ------------------------------------------------------------------------------

register("input", "io", 0, ("name", "shape", "dtype"), _input, "A device tensor given by the caller.",
         size_attrs=("shape",))
register("output", "io", 1, ("name",), _unary, "Marks a tensor as a program output.")
register("matmul", "contraction", 2, (), _matmul,
         "Matrix product over the last two dims; leading dims broadcast as batch.")
# element-wise operators: prism.ir.elementwise (imported at the end of this module)
from prism.ir import reductions as _reductions  # noqa: E402,F401  (registers the reductions, in this order)


def _rms_norm(g: Any, x: Any, dim: int, eps: float) -> Any:
    return g.div(x, g.sqrt(g.add_scalar(g.mean(g.square(x), dim), eps)))


def _layer_norm(g: Any, x: Any, dim: int, eps: float) -> Any:
    c = g.sub(x, g.mean(x, dim))
    return g.mul(c, g.rsqrt(g.add_scalar(g.mean(g.square(c), dim), eps)))


def _softmax(g: Any, x: Any, dim: int) -> Any:
    e = g.exp(g.sub(x, g.max(x, dim)))
    return g.div(e, g.sum(e, dim))


def _rotate_half(g: Any, x: Any, dim: int, half: int) -> Any:
    first, second = g.split(x, dim, (half, half), 0), g.split(x, dim, (half, half), 1)
    return g.concat([g.neg(second), first], dim)


# Row-wise composites: IR operators (their kernels need dedicated accumulators or row passes: online
# softmax, the rms statistic, layer_norm's centred variance) whose meaning is stated once, as a
# decomposition into other operators; the reference, the verifier's terms, the search's abstract value
# and the JAX translation are derived from it (see decompose).
register("rms_norm", "composite", 1, ("dim", "eps"), _rowwise, "x / sqrt(mean(x*x, dim) + eps)", decomp=_rms_norm)
register("layer_norm", "composite", 1, ("dim", "eps"), _rowwise,
         "(x - mean(x, dim)) * rsqrt(mean((x - mean)^2, dim) + eps) (biased variance; no weight or bias)",
         decomp=_layer_norm)
register("softmax", "composite", 1, ("dim",), _rowwise, "exp(x - max) / sum(exp(x - max)) over dim",
         decomp=_softmax)
# RoPE's rotation (``transformers``' rotate_half): the two halves of dim swapped, the new first one negated.
# Position-dependent, so not element-wise: searched as a row-wise operator (the grid never splits dim),
# verified through its decomposition (split, neg, concat), lowered as two copy loops (codegen/loops.py)
register("rotate_half", "composite", 1, ("dim", "half"), _rotate,
         "concat(-x[half:], x[:half]) along dim (RoPE's rotation of the two halves)", decomp=_rotate_half)
register("permute", "layout", 1, ("perm",), _permute, "Reorders dims (transpose is a permute).")
register("reshape", "layout", 1, ("shape",), _reshape, "Row-major reshape; the element count must match.",
         size_attrs=("shape",))
register("concat", "layout", None, ("dim",), _concat, "Concatenation along dim.")
register("split", "layout", 1, ("dim", "sizes", "index"), _split, "Part `index` of a split along dim.",
         size_attrs=("sizes",))
register("customized", "custom", None, ("block_graph",), _customized,
         "A graph-defined kernel: a block graph run over a grid (its results are `result` nodes).")
register("result", "custom", 1, ("index",), _result, "Result `index` of a customized operator.")

from prism.ir import elementwise as _elementwise  # noqa: E402,F401  (registers the element-wise operators)

# Operators a block graph may use on tiles (everything but I/O and customized).
TILE_OPS = frozenset(n for n, o in OPS.items() if o.group not in ("io", "custom"))
ELEMENTWISE = frozenset(n for n, o in OPS.items() if o.elementwise)


def infer(op: OpDef, src_shapes: tuple[Shape, ...], src_dtypes: tuple[DType, ...], arg: tuple,
          ctx: ShapeCtx | None = None) -> tuple[Shape, DType]:
    """Run the op's shape and dtype rules, wrapping failures with the operator and its operands."""
    ctx = ctx or ShapeCtx()
    if op.arity is not None and len(src_shapes) != op.arity:
        raise ShapeError(f"{op.name} takes {op.arity} operand(s), got {len(src_shapes)}")
    def operands() -> str:   # for the message only: formatting every shape cost a warm start ~0.15 s
        return ", ".join(f"{format_shape(s)} {d}" for s, d in zip(src_shapes, src_dtypes))

    ctx.op = op.name
    token = _CTX.set(ctx)
    try:
        shape = op.shape_rule(ctx, src_shapes, arg)
        dtype = op.dtype_rule(src_dtypes, arg) if src_dtypes else arg[2]
    except InconclusiveDimError as e:
        raise InconclusiveDimError(f"{op.name}({operands()}): {e}", e.diff) from None
    except ShapeError as e:
        raise ShapeError(f"{op.name}({operands()}): {e}") from None
    except DTypeError as e:
        raise DTypeError(f"{op.name}({operands()}): {e}") from None
    finally:
        _CTX.reset(token)
    return shape, dtype


class _Stage:
    """Applies a decomposition with one stage's rule per operator: ``g.mean(x, dim)`` calls
    ``apply("mean", [x], (dim,))``."""

    def __init__(self, apply: Callable[[str, list, tuple], Any]) -> None:
        self._apply = apply

    def __getattr__(self, op: str) -> Callable[..., Any]:
        n = get(op).arity
        if n is None:  # variadic (concat): the list of operands, then the attributes
            return lambda xs, *a: self._apply(op, list(xs), tuple(a))
        return lambda *a: self._apply(op, list(a[:n]), tuple(a[n:]))


def decompose(op: str, apply: Callable[[str, list, tuple], Any], srcs: Sequence[Any], arg: tuple) -> Any:
    """The value of composite ``op`` computed by a stage: its decomposition with ``apply(op, srcs, arg)``
    as the stage's rule for each operator it is made of."""
    d = get(op)
    if d.decomp is None:
        raise ValueError(f"operator {op!r} has no decomposition")
    return d.decomp(_Stage(apply), *srcs, *arg)


def attrs_dict(op: OpDef, arg: Any) -> dict[str, Any]:
    return dict(zip(op.attrs, arg)) if arg is not None else {}


__all__ = [
    "ELEMENTWISE",
    "OPS",
    "TILE_OPS",
    "Dim",
    "OpDef",
    "OpRule",
    "ShapeCtx",
    "Torch",
    "broadcast_shapes",
    "decompose",
    "get",
    "infer",
    "parse_term_name",
    "register",
]
