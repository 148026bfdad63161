"""ONNX Runtime baseline: the program built op by op from Prism's IR with the ``onnx`` helper API.

Composites are spelled out as a user's exported model would have them (rms_norm = Mul, ReduceMean, Add,
Sqrt, Div; silu = x * Sigmoid(x)). Weights are graph inputs, not initializers, so nothing is pre-packed.
Inputs and outputs are bound once with IO binding to the shared aligned arrays and a preallocated output
buffer, so a timed call is one ``run_with_iobinding``.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import numpy as np

from prism.bench.systems.base import Prepared, System, Unavailable
from prism.bench.systems.jax_system import _ints
from prism.ir.graph import Graph
from prism.ir.ops import OPS, decompose
from prism.workloads import Workload
from prism.workloads.base import Shape

OPSET = 18  # reductions take their axes as an input from here on, uniformly


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

    def scalar(self, value: float) -> str:
        return self.const(np.array(value, dtype=np.float32))

    def reduce(self, kind: str, x: str, dim: int) -> str:
        return self.op(kind, [x, self.const(np.array([dim], dtype=np.int64))], keepdims=1)


def _lower(b: _Builder, op: str, ins: list[str], arg: tuple) -> str:
    d = OPS.get(op)
    if d is not None and d.onnx is not None:  # element-wise and reductions: from the definition (OpDef.onnx)
        return d.onnx(b, ins, tuple(arg))
    if op == "matmul":
        return b.op("MatMul", ins)
    if op == "rms_norm":
        dim, eps = arg
        ms = b.reduce("ReduceMean", b.op("Mul", [ins[0], ins[0]]), dim)
        return b.op("Div", [ins[0], b.op("Sqrt", [b.op("Add", [ms, b.const(np.array(eps, dtype=np.float32))])])])
    if op == "layer_norm":  # spelled out (ONNX's LayerNormalization needs a scale tensor of the row's size)
        dim, eps = arg
        c = b.op("Sub", [ins[0], b.reduce("ReduceMean", ins[0], dim)])
        var = b.reduce("ReduceMean", b.op("Mul", [c, c]), dim)
        return b.op("Div", [c, b.op("Sqrt", [b.op("Add", [var, b.const(np.array(eps, dtype=np.float32))])])])
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
    if d is not None and d.decomp is not None:  # other composites (rotate_half): their decomposition
        return decompose(op, lambda o, s, r: _lower(b, o, s, r), ins, tuple(arg))
    raise Unavailable(f"no ONNX lowering for operator {op!r}")


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
    kinds = {"float32": TensorProto.FLOAT, "int8": TensorProto.INT8}
    bad = sorted({v.dtype.name for v in g.inputs.values()} - set(kinds))
    if bad:
        raise Unavailable(f"no {', '.join(bad)} inputs here: ONNX Runtime's CPU provider has no bfloat16 or float16 "
                          "kernels for MatMul and the reductions (a bfloat16 model runs in float32 there)")
    inputs = [helper.make_tensor_value_info(k, kinds[v.dtype.name], list(_ints(v.shape))) for k, v in g.inputs.items()]
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
