"""ONNX Runtime baseline: the program built op by op from Prism's IR with the ``onnx`` helper API.

Composites are spelled out as a user's exported model would have them (rms_norm = Mul, ReduceMean, Add,
Sqrt, Div; silu = x * Sigmoid(x)). Weights are graph inputs, not initializers, so nothing is pre-packed.
Inputs and outputs are bound once with IO binding to the shared aligned arrays and a preallocated output
buffer, so a timed call is one ``run_with_iobinding``.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from typing import Any

import numpy as np

from prism.bench.systems.base import Prepared, System, Unavailable
from prism.bench.systems.jax_system import _ints
from prism.ir.graph import Graph
from prism.workloads import Workload
from prism.workloads.base import Shape

OPSET = 18  # reductions take their axes as an input from here on, uniformly
_UNARY = {"exp": "Exp", "sqrt": "Sqrt", "relu": "Relu", "sigmoid": "Sigmoid", "tanh": "Tanh", "neg": "Neg"}
_BINARY = {"add": "Add", "sub": "Sub", "mul": "Mul", "div": "Div", "maximum": "Max", "matmul": "MatMul"}
_REDUCE = {"sum": "ReduceSum", "max": "ReduceMax", "mean": "ReduceMean"}


class _Builder:
    def __init__(self) -> None:
        from onnx import helper, numpy_helper
        self.helper, self.numpy_helper = helper, numpy_helper
        self.nodes: list[Any] = []
        self.inits: list[Any] = []
        self._k = 0

    def name(self) -> str:
        self._k += 1
        return f"t{self._k}"

    def const(self, value: np.ndarray) -> str:
        n = self.name()
        self.inits.append(self.numpy_helper.from_array(value, n))
        return n

    def op(self, kind: str, ins: list[str], out: str | None = None, **attrs: Any) -> str:
        out = out or self.name()
        self.nodes.append(self.helper.make_node(kind, ins, [out], **attrs))
        return out

    def reduce(self, kind: str, x: str, dim: int) -> str:
        return self.op(kind, [x, self.const(np.array([dim], dtype=np.int64))], keepdims=1)


def _lower(b: _Builder, op: str, ins: list[str], arg: tuple) -> str:
    if op in _UNARY:
        return b.op(_UNARY[op], ins)
    if op in _BINARY:
        return b.op(_BINARY[op], ins)
    if op in _REDUCE:
        return b.reduce(_REDUCE[op], ins[0], arg[0])
    if op == "square":
        return b.op("Mul", [ins[0], ins[0]])
    if op == "rsqrt":
        return b.op("Reciprocal", [b.op("Sqrt", ins)])
    if op == "silu":
        return b.op("Mul", [ins[0], b.op("Sigmoid", ins)])
    if op in ("mul_scalar", "add_scalar"):
        return b.op("Mul" if op == "mul_scalar" else "Add", [ins[0], b.const(np.array(arg[0], dtype=np.float32))])
    if op == "rms_norm":
        dim, eps = arg
        ms = b.reduce("ReduceMean", b.op("Mul", [ins[0], ins[0]]), dim)
        return b.op("Div", [ins[0], b.op("Sqrt", [b.op("Add", [ms, b.const(np.array(eps, dtype=np.float32))])])])
    if op == "softmax":
        return b.op("Softmax", ins, axis=arg[0])
    if op == "permute":
        return b.op("Transpose", ins, perm=list(arg[0]))
    if op == "reshape":
        return b.op("Reshape", [ins[0], b.const(np.array(_ints(arg[0]), dtype=np.int64))])
    if op == "concat":
        return b.op("Concat", ins, axis=arg[0])
    if op == "split":
        dim, sizes, index = arg
        start = sum(_ints(sizes[:index]))
        bounds = [b.const(np.array([v], dtype=np.int64)) for v in (start, start + _ints(sizes)[index], dim)]
        return b.op("Slice", [ins[0], *bounds])
    if op == "gelu":
        return _gelu(b, ins[0], bool(arg) and arg[0] == "tanh")
    raise Unavailable(f"no ONNX lowering for operator {op!r}")


def _gelu(b: _Builder, x: str, tanh: bool) -> str:
    def c(v: float) -> str:
        return b.const(np.array(v, dtype=np.float32))
    if tanh:  # 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
        cube = b.op("Mul", [b.op("Mul", [x, x]), x])
        inner = b.op("Mul", [c(math.sqrt(2.0 / math.pi)), b.op("Add", [x, b.op("Mul", [c(0.044715), cube])])])
        t = b.op("Tanh", [inner])
    else:     # 0.5 x (1 + erf(x / sqrt(2)))
        t = b.op("Erf", [b.op("Div", [x, c(math.sqrt(2.0))])])
    return b.op("Mul", [b.op("Mul", [c(0.5), x]), b.op("Add", [c(1.0), t])])


def graph_to_onnx(g: Graph) -> Any:
    """An ONNX ModelProto of the concrete graph ``g`` (inputs and outputs keep their names)."""
    try:
        from onnx import TensorProto, checker, helper
    except ImportError as e:
        raise Unavailable(f"onnx is not installed ({e}); pip install 'prism-superopt[bench]'") from None
    b = _Builder()
    vals: dict[Any, str] = {}
    outputs = []
    for n in g.nodes:
        if n.op == "input":
            vals[n] = n.arg[0]
        elif n.op == "output":
            vals[n] = b.op("Identity", [vals[n.src[0]]], out=n.arg[0])
            outputs.append(helper.make_tensor_value_info(n.arg[0], TensorProto.FLOAT, list(_ints(n.shape))))
        else:
            vals[n] = _lower(b, n.op, [vals[s] for s in n.src], n.arg)
    inputs = [helper.make_tensor_value_info(k, TensorProto.FLOAT, list(_ints(v.shape))) for k, v in g.inputs.items()]
    graph = helper.make_graph(b.nodes, g.name or "prism", inputs, outputs, b.inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="prism.bench")
    model.ir_version = 9  # readable by every onnxruntime since 1.16
    checker.check_model(model)
    return model


def prepare_ort(w: Workload, shape: Shape, inputs: Mapping[str, np.ndarray], threads: int) -> Prepared:
    try:
        import onnxruntime as ort
    except ImportError as e:
        raise Unavailable(f"onnxruntime is not installed ({e}); pip install 'prism-superopt[bench]'") from None
    from prism.bench.data import aligned
    g = w.program(shape).instantiate(w.env(shape))
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    opts.log_severity_level = 3
    t0 = time.perf_counter()
    sess = ort.InferenceSession(graph_to_onnx(g).SerializeToString(), opts, providers=["CPUExecutionProvider"])
    io = sess.io_binding()
    feeds = {k: ort.OrtValue.ortvalue_from_numpy(inputs[k]) for k in g.inputs}  # zero-copy views
    for k, v in feeds.items():
        io.bind_ortvalue_input(k, v)
    outs = {n.arg[0]: aligned(np.empty(_ints(n.shape), dtype=np.float32)) for n in g.outputs}
    for k, a in outs.items():
        io.bind_output(k, "cpu", 0, np.float32, list(a.shape), a.ctypes.data)

    def call() -> object:
        sess.run_with_iobinding(io)
        return outs

    def fetch(res: object) -> dict[str, np.ndarray]:
        return {k: np.array(v) for k, v in outs.items()}

    call()
    return Prepared(call, fetch, {"first_call_s": time.perf_counter() - t0}, keep=feeds)


SYSTEMS = (System("ort", "ONNX Runtime", "baseline", prepare_ort),)
