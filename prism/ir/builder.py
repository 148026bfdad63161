"""One builder method per operator, shared by kernel graphs (``Graph``) and block graphs
(``BlockBuilder``). Each method only normalizes its arguments and calls ``_apply``; the shape and
dtype rules live in ``prism.ir.ops``. The element-wise operators whose arguments need no normalizing
get their methods from their definitions (``prism.ir.elementwise.unary``/``binary``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from prism.errors import GraphError, ShapeError
from prism.ir.dims import DimLike, as_dim, format_shape
from prism.ir.node import Node

if TYPE_CHECKING:
    pass


class Tensor:
    """A handle to a node inside one graph or block builder. Supports ``+ - * / @`` and unary ``-``."""

    __slots__ = ("node", "owner")

    def __init__(self, owner: OpMethods, node: Node) -> None:
        self.owner = owner
        self.node = node

    @property
    def shape(self) -> tuple[DimLike, ...]:
        return self.node.shape

    @property
    def dtype(self) -> Any:
        return self.node.dtype

    @property
    def rank(self) -> int:
        return len(self.node.shape)

    def __repr__(self) -> str:
        return f"Tensor({self.node.op} {format_shape(self.shape)} {self.dtype})"

    def __add__(self, o: Tensor | float) -> Tensor:
        return self.owner.add(self, o)

    def __radd__(self, o: float) -> Tensor:
        return self.owner.add(self, o)

    def __sub__(self, o: Tensor | float) -> Tensor:
        return self.owner.sub(self, o)

    def __rsub__(self, o: float) -> Tensor:
        return self.owner.add_scalar(self.owner.neg(self), float(o))

    def __mul__(self, o: Tensor | float) -> Tensor:
        return self.owner.mul(self, o)

    def __rmul__(self, o: float) -> Tensor:
        return self.owner.mul(self, o)

    def __truediv__(self, o: Tensor | float) -> Tensor:
        return self.owner.div(self, o)

    def __matmul__(self, o: Tensor) -> Tensor:
        return self.owner.matmul(self, o)

    def __neg__(self) -> Tensor:
        return self.owner.neg(self)


def _norm_dim(dim: int, rank: int, what: str) -> int:
    if not isinstance(dim, int) or isinstance(dim, bool):
        raise ShapeError(f"{what}: dim must be an int, got {dim!r}")
    if not -rank <= dim < rank:
        raise ShapeError(f"{what}: dim {dim} is out of range for rank {rank}")
    return dim % rank


class OpMethods:
    """Builder methods, one per operator of DESIGN.md §4.2 (names as there)."""

    def _apply(self, op: str, srcs: Sequence[Tensor], arg: tuple = ()) -> Tensor:
        raise NotImplementedError

    def _own(self, t: object, op: str) -> Tensor:
        if not isinstance(t, Tensor):
            raise GraphError(f"{op}: expected a tensor of this graph, got {type(t).__name__} {t!r}")
        if t.owner is not self:
            raise GraphError(f"{op}: operand {t!r} belongs to another graph; tensors cannot be shared "
                             "between graphs (build the operand in this graph)")
        return t

    # contraction
    def matmul(self, a: Tensor, b: Tensor) -> Tensor:
        return self._apply("matmul", (a, b))

    # unary (the operators without attributes get their methods from prism.ir.elementwise)
    def gelu(self, x: Tensor, approximate: str = "none") -> Tensor:
        if approximate not in ("none", "tanh"):
            raise ShapeError(f"gelu: approximate must be 'none' or 'tanh', got {approximate!r}")
        return self._apply("gelu", (x,), (approximate,))

    def mul_scalar(self, x: Tensor, c: float) -> Tensor:
        return self._apply("mul_scalar", (x,), (float(c),))

    def add_scalar(self, x: Tensor, c: float) -> Tensor:
        return self._apply("add_scalar", (x,), (float(c),))

    def cast(self, x: Tensor, dtype: Any) -> Tensor:
        """``x`` stored as ``dtype`` (``"bfloat16"``, ``"float16"``, ``"float32"``): rounded to its precision
        where it narrows, exact where it widens (an int8 weight cast to float32, then scaled)."""
        from prism.ir.dtypes import as_dtype
        return self._apply("cast", (x,), (as_dtype(dtype).name,))

    # binary (a Python number as one operand becomes the scalar form)
    def add(self, a: Tensor, b: Tensor | float) -> Tensor:
        if isinstance(b, (int, float)):
            return self.add_scalar(a, b)
        return self._apply("add", (a, b))

    def sub(self, a: Tensor, b: Tensor | float) -> Tensor:
        if isinstance(b, (int, float)):
            return self.add_scalar(a, -float(b))
        return self._apply("sub", (a, b))

    def mul(self, a: Tensor, b: Tensor | float) -> Tensor:
        if isinstance(b, (int, float)):
            return self.mul_scalar(a, b)
        return self._apply("mul", (a, b))

    def div(self, a: Tensor, b: Tensor | float) -> Tensor:
        if isinstance(b, (int, float)):
            if b == 0:
                raise ShapeError("div: division by the constant 0")
            return self.mul_scalar(a, 1.0 / float(b))
        return self._apply("div", (a, b))

    def maximum(self, a: Tensor, b: Tensor) -> Tensor:
        return self._apply("maximum", (a, b))

    # reductions (keepdim): generated by prism.ir.reductions

    # composite
    def rms_norm(self, x: Tensor, eps: float = 1e-6, dim: int = -1) -> Tensor:
        return self._apply("rms_norm", (x,), (_norm_dim(dim, self._own(x, "rms_norm").rank, "rms_norm"),
                                              float(eps)))

    def layer_norm(self, x: Tensor, eps: float = 1e-5, dim: int = -1) -> Tensor:
        return self._apply("layer_norm", (x,), (_norm_dim(dim, self._own(x, "layer_norm").rank, "layer_norm"),
                                                float(eps)))

    def softmax(self, x: Tensor, dim: int = -1) -> Tensor:
        return self._apply("softmax", (x,), (_norm_dim(dim, self._own(x, "softmax").rank, "softmax"),))

    def rotate_half(self, x: Tensor, dim: int = -1) -> Tensor:
        """RoPE's rotation: ``concat(-x[..., h:], x[..., :h])`` along ``dim`` of even size 2h."""
        t = self._own(x, "rotate_half")
        d = _norm_dim(dim, t.rank, "rotate_half")
        n = t.shape[d]
        half = n // 2 if isinstance(n, int) else n
        return self._apply("rotate_half", (x,), (d, half))

    # layout
    def permute(self, x: Tensor, perm: Sequence[int]) -> Tensor:
        r = self._own(x, "permute").rank
        return self._apply("permute", (x,), (tuple(_norm_dim(p, r, "permute") for p in perm),))

    def transpose(self, x: Tensor, dim0: int = -2, dim1: int = -1) -> Tensor:
        r = self._own(x, "transpose").rank
        d0, d1 = _norm_dim(dim0, r, "transpose"), _norm_dim(dim1, r, "transpose")
        perm = list(range(r))
        perm[d0], perm[d1] = perm[d1], perm[d0]
        return self.permute(x, perm)

    def reshape(self, x: Tensor, shape: Sequence[DimLike | str]) -> Tensor:
        return self._apply("reshape", (x,), (tuple(as_dim(d) for d in shape),))

    def concat(self, xs: Sequence[Tensor], dim: int = 0) -> Tensor:
        xs = list(xs)
        if not xs:
            raise ShapeError("concat: no operands")
        r = self._own(xs[0], "concat").rank
        return self._apply("concat", xs, (_norm_dim(dim, r, "concat"),))

    def split(self, x: Tensor, sizes: Sequence[DimLike | str], dim: int = 0) -> tuple[Tensor, ...]:
        r = self._own(x, "split").rank
        d = _norm_dim(dim, r, "split")
        sz = tuple(as_dim(s) for s in sizes)
        return tuple(self._apply("split", (x,), (d, sz, i)) for i in range(len(sz)))
