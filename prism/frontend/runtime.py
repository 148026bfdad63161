"""Running one piece: the Prism kernel when it can, the piece's own PyTorch code otherwise.

A :class:`PieceRunner` replaces the piece's nodes in the rewritten FX graph. Per call it checks, before
any native code runs, that every input is a float32 CPU tensor and that autograd does not need the
result (Prism kernels have no backward); otherwise it runs the piece's original operators (the
``fallback`` module) and says so once in the ``prism`` log. Non-contiguous inputs are copied to
contiguous ones; inputs the piece uses transposed (a linear layer's weight) are transposed here, and for
module state (parameters, buffers) the copy is cached until the tensor changes (its version counter,
data pointer and strides are the key).
"""

from __future__ import annotations

import logging
import threading
import weakref
from dataclasses import dataclass
from typing import Any

import torch

log = logging.getLogger("prism")


@dataclass(frozen=True)
class InputSpec:
    name: str                          # the Prism kernel's input name
    perm: tuple[int, ...] | None       # transposition applied here before the call
    persistent: bool                   # module state: cache the prepared copy


class _PreparedCache:
    """Prepared (transposed/contiguous) copies of module state, keyed by the tensor object's identity
    (a weak reference: an entry dies with its tensor) and checked against its version and layout."""

    def __init__(self) -> None:
        self._map: dict[int, tuple[weakref.ref, tuple, torch.Tensor]] = {}
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    def get(self, t: torch.Tensor, perm: tuple[int, ...] | None) -> torch.Tensor:
        try:
            key = (perm, t._version, t.data_ptr(), tuple(t.shape), t.stride(), t.storage_offset())
        except RuntimeError:  # inference tensors have no version counter: no caching
            return _prepare(t, perm)
        slot = (id(t), perm)
        with self._lock:
            hit = self._map.get(slot)  # type: ignore[call-overload]
            if hit is not None and hit[0]() is t and hit[1] == key:
                self.hits += 1
                return hit[2]
        out = _prepare(t, perm)
        try:
            ref = weakref.ref(t, lambda _r, s=slot, m=self._map: m.pop(s, None))  # type: ignore[misc]
        except TypeError:  # not weak-referenceable: no caching
            return out
        with self._lock:
            self.misses += 1
            self._map[slot] = (ref, key, out)  # type: ignore[index]
        return out


PREPARED = _PreparedCache()


def _prepare(t: torch.Tensor, perm: tuple[int, ...] | None) -> torch.Tensor:
    if perm is not None:
        t = t.permute(perm)
    return t.contiguous()


class PieceRunner(torch.nn.Module):
    """Calls a piece's Prism kernel (see the module docstring); ``prism_calls`` / ``fallback_calls``
    count what ran."""

    def __init__(self, label: str, kernel: Any, inputs: list[InputSpec | None], fallback: torch.nn.Module) -> None:
        super().__init__()
        self.label = label
        self.kernel = kernel
        self.specs = inputs
        self.fallback = fallback
        self.prism_calls = 0
        self.fallback_calls = 0
        self._said: set[str] = set()
        self._bad_shapes: dict[tuple, str] = {}
        self._compiled: dict[tuple, Any] = {}   # input shapes -> the tuned, compiled prism Kernel

    def _once(self, key: str, msg: str) -> None:
        if key not in self._said:
            self._said.add(key)
            log.warning("prism: piece %s runs in PyTorch: %s", self.label, msg)

    def _why_not(self, args: tuple) -> str:
        for spec, a in zip(self.specs, args):
            if spec is None:
                continue
            if not isinstance(a, torch.Tensor):
                return f"input {spec.name} is a {type(a).__name__}, not a tensor"
            if a.dtype != torch.float32:
                return f"input {spec.name} has dtype {a.dtype} (Prism computes in float32)"
            if a.device.type != "cpu":
                return f"input {spec.name} is on {a.device} (Prism's kernels run on the CPU)"
        if torch.is_grad_enabled() and any(isinstance(a, torch.Tensor) and a.requires_grad for a in args):
            return "autograd is recording (an input requires grad; Prism kernels have no backward)"
        return ""

    def forward(self, *args: Any) -> Any:
        why = self._why_not(args)
        if not why:
            shapes = tuple(tuple(a.shape) for s, a in zip(self.specs, args) if s is not None)
            why = self._bad_shapes.get(shapes, "")
        if why:
            self._once(why, why)
            self.fallback_calls += 1
            return self.fallback(*args)
        ins = {}
        for spec, a in zip(self.specs, args):
            if spec is None:
                continue
            if spec.persistent and (spec.perm is not None or not a.is_contiguous()):
                ins[spec.name] = PREPARED.get(a, spec.perm)
            elif spec.perm is not None or not a.is_contiguous():
                ins[spec.name] = _prepare(a, spec.perm)
            else:
                ins[spec.name] = a
        try:
            compiled = self._compiled.get(shapes)
            if compiled is None:  # a new shape: bind the dims, tune (or read the tuning cache), compile
                env = self.kernel.program.bind({k: tuple(v.shape) for k, v in ins.items()})
                compiled = self._compiled[shapes] = self.kernel.specialize(**env).kernel
            out = compiled.call(ins)
        except Exception as e:  # e.g. no verified sGraph tiles this shape: it stays in PyTorch
            msg = f"at input shapes {list(shapes)}: {type(e).__name__}: {str(e).splitlines()[0]}"
            self._bad_shapes[shapes] = msg
            self._once(msg, msg)
            self.fallback_calls += 1
            return self.fallback(*args)
        self.prism_calls += 1
        return out

    def extra_repr(self) -> str:
        return f"{self.label!r}, prism_calls={self.prism_calls}, fallback_calls={self.fallback_calls}"
