"""PyTorch baselines: eager (the program as written), SDPA (W4-W6), torch.compile default and max-autotune.

Inputs are torch tensors made zero-copy from the shared aligned arrays; weights are ordinary arguments
(nothing frozen or pre-packed), so every call sees them as runtime inputs.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping

import numpy as np

from prism.bench.systems.base import Prepared, System, Unavailable
from prism.workloads import Workload
from prism.workloads.base import Shape
from prism.workloads.precision import INT8W


def _torch():  # imported lazily: `prism bench --systems jax` must not pay for torch
    try:
        import torch
    except ImportError as e:
        raise Unavailable(f"torch is not installed ({e}); pip install 'prism-superopt[torch]'") from None
    return torch


def _program(w: Workload, shape: Shape, table: str) -> Callable:
    from prism.bench.systems import torch_programs as tp
    fn = getattr(tp, table).get(w.id)
    if fn is None:
        raise Unavailable(f"no PyTorch program for {w.id} in prism.bench.systems.torch_programs.{table}")
    if w.extra.get("precision") in INT8W:
        return tp.int8_weight_only(fn, list(w.input_shapes(shape)), table == "INT8MM")
    return fn


def to_torch(a: np.ndarray) -> object:
    """A zero-copy torch tensor of ``a`` (a bfloat16 array, which torch.from_numpy does not take, through
    its bits)."""
    torch = _torch()
    if a.dtype.name == "bfloat16":
        return torch.from_numpy(a.view(np.uint16)).view(torch.bfloat16)
    return torch.from_numpy(a)


def from_torch(t: object) -> np.ndarray:
    torch = _torch()
    t = t.detach().cpu()  # type: ignore[attr-defined]
    return t.float().numpy() if t.dtype == torch.bfloat16 else t.numpy()


def _prepare(fn: Callable, w: Workload, shape: Shape, inputs: Mapping[str, np.ndarray]) -> Prepared:
    args = [to_torch(inputs[name]) for name in w.input_shapes(shape)]
    out_name = w.program(shape).output_names[0]

    def call() -> object:
        return fn(*args)

    def fetch(y: object) -> dict[str, np.ndarray]:
        return {out_name: from_torch(y)}

    t0 = time.perf_counter()
    call()  # compiles when fn is a torch.compile wrapper; surfaces errors before timing
    return Prepared(call, fetch, {"first_call_s": time.perf_counter() - t0})


def prepare_eager(w: Workload, shape: Shape, inputs: Mapping[str, np.ndarray], threads: int) -> Prepared:
    return _prepare(_program(w, shape, "PROGRAMS"), w, shape, inputs)


def prepare_sdpa(w: Workload, shape: Shape, inputs: Mapping[str, np.ndarray], threads: int) -> Prepared:
    return _prepare(_program(w, shape, "SDPA"), w, shape, inputs)


def _compiled(mode: str | None) -> Callable:
    def prepare(w: Workload, shape: Shape, inputs: Mapping[str, np.ndarray], threads: int) -> Prepared:
        torch = _torch()
        # dynamic=False: one specialized graph per shape, as a user compiling for a fixed shape gets
        fn = torch.compile(_program(w, shape, "PROGRAMS"), mode=mode, dynamic=False)
        return _prepare(fn, w, shape, inputs)
    return prepare


def reset_compiled() -> None:
    """Drop dynamo's caches after a case so that shapes never pile up against its recompile limit."""
    import sys
    if "torch" in sys.modules:
        sys.modules["torch"]._dynamo.reset()


def set_threads(n: int) -> None:
    import sys
    if "torch" in sys.modules or _has_torch():
        import torch
        torch.set_num_threads(n)


def _has_torch() -> bool:
    import importlib.util
    return importlib.util.find_spec("torch") is not None


ATTENTION = ("W4", "W5", "W6")  # the workloads with an SDPA form (torch_programs.SDPA)


def prepare_int8mm(w: Workload, shape: Shape, inputs: Mapping[str, np.ndarray], threads: int) -> Prepared:
    return _prepare(_program(w, shape, "INT8MM"), w, shape, inputs)


SYSTEMS = (
    System("torch", "PyTorch eager", "baseline", prepare_eager),
    System("torch-int8mm", "PyTorch torch._weight_int8pack_mm (torchao's int8 weight-only CPU kernel)", "baseline",
           prepare_int8mm, applies=lambda w: w.extra.get("precision") in INT8W),
    System("torch-sdpa", "PyTorch F.scaled_dot_product_attention", "baseline", prepare_sdpa,
           applies=lambda w: w.id in ATTENTION),
    System("compile", "torch.compile (default)", "baseline", _compiled(None), cleanup=reset_compiled),
    System("max-autotune", 'torch.compile(mode="max-autotune")', "baseline", _compiled("max-autotune"),
           cleanup=reset_compiled),
)
