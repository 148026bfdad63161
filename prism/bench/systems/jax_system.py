"""JAX ``jit`` baseline: the workload's program translated op by op from Prism's IR to ``jax.numpy``.

The translation is literal (rms_norm and softmax spelled out as a user writes them in jnp), weights are
jit arguments laid out [in, out] as JAX wants, never closed-over constants. The thread count is set
through ``XLA_FLAGS`` before jax is imported (see ``prism.bench.systems.configure_threads``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from prism.bench.systems.base import Prepared, System, Unavailable
from prism.ir import dims as D
from prism.ir.graph import Graph
from prism.ir.ops import OPS, decompose
from prism.workloads import Workload
from prism.workloads.base import Shape


def _ints(shape: Sequence[object]) -> tuple[int, ...]:
    return tuple(int(D.evaluate(d, {})) if isinstance(d, D.Dim) else int(d) for d in shape)  # type: ignore[arg-type]


def _op_table(jax: Any, jnp: Any) -> dict[str, Callable[[list, tuple], Any]]:
    # the element-wise operators' and reductions' translations come from their definitions (OpDef.jax)
    defined = {n: (lambda f: lambda a, arg: f(jax, a, arg))(o.jax) for n, o in OPS.items() if o.jax}
    table = {
        **defined,
        "matmul": lambda a, arg: jnp.matmul(a[0], a[1]),
        # softmax as users write it in JAX (the library's own); the other composites from their decomposition
        "softmax": lambda a, arg: jax.nn.softmax(a[0], axis=arg[0]),
        "permute": lambda a, arg: jnp.transpose(a[0], arg[0]),
        "reshape": lambda a, arg: jnp.reshape(a[0], _ints(arg[0])),
        "concat": lambda a, arg: jnp.concatenate(a, axis=arg[0]),
        "split": lambda a, arg: jax.lax.slice_in_dim(a[0], sum(_ints(arg[1][:arg[2]])),
                                                     sum(_ints(arg[1][:arg[2] + 1])), axis=arg[0]),
    }
    for name in [k for k, o in OPS.items() if o.decomp is not None and k not in table]:  # rms_norm, layer_norm
        table[name] = (lambda c: lambda a, arg: decompose(c, lambda op, s, r: table[op](s, r), a, tuple(arg)))(name)
    return table


def graph_to_jax(g: Graph) -> Callable[..., tuple]:
    """A Python function of the graph's inputs (in declaration order) computing its outputs with jnp.
    ``g`` must be concrete (``Graph.instantiate`` the batch dims first)."""
    import jax
    import jax.numpy as jnp
    table = _op_table(jax, jnp)
    nodes = g.nodes
    bad = sorted({n.op for n in nodes if n.op not in table and n.op not in ("input", "output")})
    if bad:
        raise Unavailable(f"no JAX translation for operator(s) {bad}; translated: {sorted(table)}")
    names = list(g.inputs)

    def fn(*args: Any) -> tuple:
        vals: dict[Any, Any] = {}
        given = dict(zip(names, args))
        for n in nodes:
            if n.op == "input":
                vals[n] = given[n.arg[0]]
            elif n.op == "output":
                vals[n] = vals[n.src[0]]
            else:
                vals[n] = table[n.op]([vals[s] for s in n.src], n.arg)
        return tuple(vals[o] for o in g.outputs)
    return fn


def prepare_jax(w: Workload, shape: Shape, inputs: Mapping[str, np.ndarray], threads: int) -> Prepared:
    try:
        import jax
    except ImportError as e:
        raise Unavailable(f"jax is not installed ({e}); pip install 'prism-superopt[bench]'") from None
    g = w.program(shape).instantiate(w.env(shape))
    f = jax.jit(graph_to_jax(g))
    args = [jax.device_put(inputs[name]) for name in g.inputs]
    out_names = g.output_names

    def call() -> object:
        return jax.block_until_ready(f(*args))

    def fetch(ys: object) -> dict[str, np.ndarray]:
        return {k: np.asarray(y) for k, y in zip(out_names, ys)}  # type: ignore[call-overload]

    t0 = time.perf_counter()
    call()
    return Prepared(call, fetch, {"first_call_s": time.perf_counter() - t0})


def _clear() -> None:
    import sys
    if "jax" in sys.modules:
        sys.modules["jax"].clear_caches()


SYSTEMS = (System("jax", "JAX jit", "baseline", prepare_jax, cleanup=_clear),)
