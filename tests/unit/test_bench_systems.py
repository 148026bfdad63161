"""The baselines compute the program: IR -> JAX / ONNX translations of every operator, and the PyTorch
programs as written for W1-W7, all against the NumPy reference (skipped where a library is missing)."""

from __future__ import annotations

import numpy as np
import pytest

from prism.bench.data import case_inputs, check_outputs, reference
from prism.ir.graph import Graph
from prism.workloads import WORKLOADS

pytestmark = pytest.mark.unit


def every_op_graph() -> Graph:
    """A small program that uses every predefined operator the translators lower."""
    g = Graph("every op")
    x = g.input("X", (4, 8))
    w = g.input("W", (8, 6))
    y = g.matmul(g.rms_norm(x, eps=1e-6), w)                                     # [4, 6]
    s = g.softmax(g.mul_scalar(y, 0.5), 1)
    a = g.add(g.silu(y), g.sub(g.sigmoid(y), g.tanh(y)))
    b = g.div(g.gelu(y), g.sqrt(g.add_scalar(g.square(y), 1.0)))
    c = g.mul(g.rsqrt(g.add_scalar(g.exp(g.neg(y)), 1.0)), g.relu(g.gelu(y, approximate="tanh")))
    m = g.maximum(a, b)
    r = g.add(g.add(g.sum(m, 1), g.max(c, 1)), g.mean(s, 1))                      # [4, 1]
    t = g.reshape(g.permute(g.mul(m, r), (1, 0)), (3, 8))                         # [3, 8]
    lo, hi = g.split(t, (1, 2), dim=0)
    g.output(g.concat([hi, lo], 0), "Z")
    g.output(c, "C")
    return g


def _inputs(rng: np.random.Generator) -> dict[str, np.ndarray]:
    return {"X": rng.standard_normal((4, 8)).astype(np.float32),
            "W": rng.standard_normal((8, 6)).astype(np.float32)}


def test_jax_translation_of_every_op(rng: np.random.Generator) -> None:
    pytest.importorskip("jax")
    from prism.bench.systems.jax_system import graph_to_jax
    g = every_op_graph()
    x = _inputs(rng)
    got = dict(zip(g.output_names, (np.asarray(v) for v in graph_to_jax(g)(*x.values()))))
    c = check_outputs(got, g.evaluate(x, dtype=np.float64), rtol=1e-5)
    assert c.ok, c.reason


def test_onnx_translation_of_every_op(rng: np.random.Generator) -> None:
    ort = pytest.importorskip("onnxruntime")
    pytest.importorskip("onnx")
    from prism.bench.systems.ort_system import graph_to_onnx
    g = every_op_graph()
    x = _inputs(rng)
    sess = ort.InferenceSession(graph_to_onnx(g).SerializeToString(), providers=["CPUExecutionProvider"])
    got = dict(zip([o.name for o in sess.get_outputs()], sess.run(None, x)))
    c = check_outputs(got, g.evaluate(x, dtype=np.float64), rtol=1e-5)
    assert c.ok, c.reason


@pytest.mark.parametrize("wid", sorted(WORKLOADS))
def test_torch_programs_as_written(wid: str) -> None:
    torch = pytest.importorskip("torch")
    from prism.bench.systems import torch_programs as tp
    w = WORKLOADS[wid]
    shape = w.shapes[0]
    x = case_inputs(w, shape)
    ref = reference(w, shape, x)
    (name,) = ref
    args = [torch.from_numpy(x[k]) for k in w.input_shapes(shape)]
    assert all(a.data_ptr() % 64 == 0 for a in args)  # zero-copy views of the aligned arrays
    for fn in (tp.PROGRAMS[wid], tp.SDPA.get(wid)):
        if fn is not None:
            c = check_outputs({name: fn(*args).numpy()}, ref)
            assert c.ok, f"{fn.__name__}: {c.reason}"
