"""W1-W7 at other precisions: the same programs over low-precision storage (prism.ir.dtypes).

``bfloat16`` / ``float16``: every input stored in that dtype, as a model moved with
``model.to(torch.bfloat16)`` (``torch.float16``) has it (the outputs are too). ``int8w``: int8 weight-only (the
workloads with weights: W1-W3, W7; W7's LoRA adapters stay float32). Each weight W [d, m] of ``X @ W`` is
stored as a Linear layer stores it, [out, in] = [m, d], quantized per output channel:
``q = round(W^T / s)``, ``s = max |W^T| / 127`` per row (torchao's int8 weight-only layout), and the program reads
``(X @ cast(q)^T) * s^T`` (= ``X @ (q * s)^T``, what ``torch._weight_int8pack_mm`` computes); activations and
outputs stay float32. ``int8w-bf16``: the same int8 weights in a bfloat16 model (``prism.quantize_weights`` then
``model.to(torch.bfloat16)``, torchao's int8 weight-only on a bfloat16 checkpoint): every other input and the
scales bfloat16, the weight cast to bfloat16 (exact) in the program.

The variant keeps its workload's id and shapes; its inputs are the float32 workload's inputs rounded or
quantized, so every system sees exactly the same values, and the float64 reference is of those values.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Collection, Mapping

import numpy as np

from prism.errors import PrismError
from prism.ir.dtypes import as_dtype, quantize_int8
from prism.ir.graph import Graph
from prism.ir.node import Node
from prism.workloads.base import Shape, Workload

PRECISIONS = ("float32", "bfloat16", "float16", "int8w", "int8w-bf16")
HALF = ("bfloat16", "float16")   # every tensor stored in a 16-bit float
INT8W = ("int8w", "int8w-bf16")   # int8 weight-only: float32 or bfloat16 activations
W8A8 = "w8a8"   # int8 weights and dynamically quantized int8 activations: models only (prism bench --models)
INT8W_G32 = "int8w-g32"   # int8 weight-only with a scale per group of 32 input features (q8_0's weights): models only
INT8W_G32_BF16 = "int8w-g32-bf16"   # the same int8 weights and group scales in a bfloat16 model: models only
MODEL_PRECISIONS = (*PRECISIONS, W8A8, INT8W_G32, INT8W_G32_BF16)
SCALE = "_scale"   # suffix of an int8 weight's scale input


def activation_dtype(precision: str) -> str:
    """The dtype of a precision's activations (every input but an int8 weight): what eager PyTorch rounds to."""
    return {"int8w": "float32", "int8w-bf16": "bfloat16", W8A8: "float32",
            INT8W_G32: "float32", INT8W_G32_BF16: "bfloat16"}.get(precision, precision)


def precision_of(w: Workload) -> str:
    return str(w.extra.get("precision", "float32"))


def _rebuild(g: Graph, inputs: Mapping[str, Callable[[Graph], object]],
             rule: Callable[[Graph, Node, list[object]], object | None] | None = None) -> Graph:
    """``g`` with each input named in ``inputs`` replaced by ``inputs[name](new_graph)`` (a tensor of the new
    graph); every other node re-applied (so dtypes propagate by the IR's rules), unless ``rule(new_graph,
    node, operands)`` returns its replacement."""
    ng = Graph(g.name)
    vals: dict[Node, object] = {}
    for n in g.nodes:
        if n.op == "input":
            make = inputs.get(n.arg[0])
            vals[n] = make(ng) if make is not None else ng.input(n.arg[0], n.shape, n.dtype)
        elif n.op == "output":
            ng.output(vals[n.src[0]], n.arg[0])  # type: ignore[arg-type]
        else:
            srcs = [vals[x] for x in n.src]
            got = rule(ng, n, srcs) if rule is not None else None
            vals[n] = got if got is not None else ng._apply(n.op, srcs, n.arg)  # type: ignore[arg-type]
    return ng


def _inputs_as(g: Graph, dtype: str, skip: Collection[str] = ()) -> dict[str, Callable[[Graph], object]]:
    """For _rebuild: each input of ``g`` (but ``skip``) declared as ``dtype``."""
    return {name: (lambda ng, n=node: ng.input(n.arg[0], n.shape, dtype))
            for name, node in g.inputs.items() if name not in skip}


def _half_program(base: Workload, s: Shape, dtype: str) -> Graph:
    g = base.program(s)
    return _rebuild(g, _inputs_as(g, dtype))


def _int8_program(base: Workload, s: Shape, act: str = "float32") -> Graph:
    """Every ``A @ W`` of a quantized weight becomes ``(A @ cast(q)^T) * s^T``: the per-channel scale applied to
    the product (equal to ``A @ (q * s)^T``; one multiply per output instead of one per weight, what
    ``torch._weight_int8pack_mm`` computes). ``act``: the dtype of every other input, the scales and the cast."""
    g = base.program(s)
    weights = _quantized(base)
    scales: dict[str, object] = {}

    def weight(ng: Graph, name: str, d: int, m: int) -> object:
        q = ng.permute(ng.cast(ng.input(name, (m, d), "int8"), act), (1, 0))
        scales[name] = ng.permute(ng.input(name + SCALE, (m, 1), act), (1, 0))
        return q

    def rule(ng: Graph, n: Node, srcs: list[object]) -> object | None:
        quantized = [x.arg[0] for x in n.src if x.op == "input" and x.arg[0] in weights]
        if not quantized:
            return None
        right = n.src[-1].arg[0] if n.src[-1].op == "input" else None
        if n.op != "matmul" or quantized != [right]:
            raise PrismError(f"{base.id}: quantized weight {quantized[0]} is used by {n.op}, not only as a "
                             "matmul's right operand")
        return ng.mul(ng.matmul(*srcs), scales[quantized[0]])  # type: ignore[arg-type]

    others = _inputs_as(g, act, weights) if act != "float32" else {}
    return _rebuild(g, {**others, **{name: (lambda ng, name=name: weight(ng, name, *g.inputs[name].shape))
                                     for name in weights}}, rule)


def _quantized(base: Workload) -> tuple[str, ...]:
    """The weights stored as int8: every weight, except LoRA's small adapters (W7 quantizes W only)."""
    return tuple(base.extra.get("int8_weights", base.extra["weights"]))


def _int8_shapes(base: Workload, s: Shape) -> dict[str, tuple[int, ...]]:
    out: dict[str, tuple[int, ...]] = {}
    for name, shp in base.input_shapes(s).items():
        if name in _quantized(base):
            d, m = shp
            out[name] = (m, d)
            out[name + SCALE] = (m, 1)
        else:
            out[name] = shp
    return out


@dataclasses.dataclass(frozen=True)
class PrecisionWorkload(Workload):
    """A workload at another precision (see the module docstring); ``base`` is the float32 workload."""

    base: Workload | None = None

    def inputs(self, shape: Shape, kind: str = "normal", seed: int = 0, dtype: object = np.float32
               ) -> dict[str, np.ndarray]:
        """The float32 workload's inputs, rounded to bfloat16 / float16 or with the weights quantized to int8."""
        assert self.base is not None
        x = self.base.inputs(shape, kind, seed, np.float32)
        act = as_dtype(activation_dtype(precision_of(self))).np
        if precision_of(self) in HALF:
            return {k: v.astype(act) for k, v in x.items()}
        out: dict[str, np.ndarray] = {}
        for name, v in x.items():
            if name in _quantized(self.base):
                out[name], scale = quantize_int8(v.T)
                out[name + SCALE] = scale.astype(act)   # (a bfloat16 model's .to() rounds the scales)
            else:
                out[name] = v.astype(act, copy=False)
        return out


def _no_hand(w: Workload, precision: str):  # type: ignore[no-untyped-def]
    def hand(s: Shape) -> Graph:
        raise PrismError(f"{w.id} has no hand-written structure at {precision} (the reference column is float32)")
    return hand


def variant(w: Workload, precision: str) -> Workload:
    """``w`` at ``precision`` (one of :data:`PRECISIONS`)."""
    if precision not in PRECISIONS:
        raise PrismError(f"unknown precision {precision!r}; choose from {list(PRECISIONS)}")
    if precision == "float32":
        return w
    if precision in INT8W and not w.extra.get("weights"):
        raise PrismError(f"{w.id} ({w.name}) has no weights: int8 weight-only applies to the workloads with "
                         "weights (W1, W2, W3, W7)")
    if precision in HALF:
        program, shapes = (lambda s: _half_program(w, s, precision)), w.input_shapes
        formula = f"{w.formula} ({precision})"
    else:
        act = activation_dtype(precision)
        program, shapes = (lambda s: _int8_program(w, s, act)), (lambda s: _int8_shapes(w, s))
        formula = f"{w.formula} with W = (int8 q * per-channel s)^T" + (f", {act} activations" if act != "float32"
                                                                        else "")
    fields = {f.name: getattr(w, f.name) for f in dataclasses.fields(Workload)}
    fields.update(name=f"{w.name}[{precision}]", formula=formula, program=program, input_shapes=shapes,
                  hand_written=_no_hand(w, precision), extra={**w.extra, "precision": precision})
    return PrecisionWorkload(**fields, base=w)
