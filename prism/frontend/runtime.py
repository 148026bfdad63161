"""Running one piece: the Prism kernel when it can, the piece's own PyTorch code otherwise.

A :class:`PieceRunner` replaces the piece's nodes in the rewritten FX graph. Per call it checks, before
any native code runs, that every input is a CPU tensor of the dtype it was captured with and that autograd
does not need the result (Prism kernels have no backward); otherwise it runs the piece's original operators (the
``fallback`` module) and says so once in the ``prism`` log (autograd recording: once per process).
Inputs are passed as stored: a piece that reads a tensor transposed (a linear layer's weight) has the
permute inside its program. Non-contiguous inputs are copied to contiguous ones; a piece that was
searched again in the transposed form (no kernel read its input as stored; compiler.compile_graph) gets
those inputs transposed here. For module state (parameters, buffers) the copy is cached until the
tensor changes (its version counter, data pointer and strides are the key).
"""

from __future__ import annotations

import logging
import os
import threading
import time
import weakref
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from prism.ir import dims as D
from prism.runtime import fastcall, memory

log = logging.getLogger("prism")


def _plan_ahead_count() -> int:
    raw = os.environ.get("PRISM_PLAN_AHEAD", "").strip()
    try:
        return max(0, int(raw)) if raw else 16
    except ValueError:
        log.warning("prism: PRISM_PLAN_AHEAD=%r is not a count; planning 16 values ahead", raw)
        return 16


# values of a dim that moves by one per call (a decode's KV length) planned at once (PieceRunner._plan_ahead)
PLAN_AHEAD = _plan_ahead_count()
_grad_enabled = torch.is_grad_enabled


@dataclass(frozen=True)
class InputSpec:
    name: str                          # the Prism kernel's input name
    perm: tuple[int, ...] | None       # transposition applied here before the call
    persistent: bool                   # module state: cache the prepared copy
    dtype: torch.dtype = torch.float32  # what the program stores it as (its dtype when captured)
    given: torch.dtype | None = None   # the dtype the argument arrives in, where it differs (a bool mask from
    #                                    PyTorch: converted to float32 0/1 at each call)
    bias: bool = False                 # a bool mask converted to the additive bias 0 (True) / -inf (False)


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

AUTOGRAD = "autograd is recording (an input requires grad; Prism kernels have no backward)"
_warned: set[str] = set()


def _autograd_once() -> None:
    """The common mistake -- calling an optimized model without ``torch.no_grad()`` -- leaves every piece
    of every graph to PyTorch: said once per process, as a warning that names the fix, not once per
    piece (a decoder has dozens)."""
    if AUTOGRAD in _warned:
        return
    _warned.add(AUTOGRAD)
    log.warning("prism: autograd is recording (an input requires grad), so every Prism piece runs in PyTorch: "
                "Prism kernels have no backward. For inference, call the model under torch.no_grad() or "
                "torch.inference_mode() (said once per process)")


def reset_warnings() -> None:
    """Forget which once-per-process warnings were given (tests)."""
    _warned.clear()


def _prepare(t: torch.Tensor, perm: tuple[int, ...] | None) -> torch.Tensor:
    if perm is not None:
        t = t.permute(perm)
    return t.contiguous()


class PieceRunner(torch.nn.Module):
    """Calls a piece's Prism kernel (see the module docstring); ``prism_calls`` / ``fallback_calls``
    count what ran."""

    def __init__(self, label: str, kernel: Any, inputs: list[InputSpec | None], fallback: Any,
                 out_slots: tuple[int | None, ...] | None = None, huge_pages: bool = False) -> None:
        super().__init__()
        self.label = label
        # module state the kernel reads moves into huge pages when a shape is first planned (runtime/memory.py)
        self.huge_pages = huge_pages
        self.kernel = kernel
        self.specs = inputs
        self.fallback = fallback
        self.prism_calls = 0
        self.fallback_calls = 0
        self._said: set[str] = set()
        self._bad_shapes: dict[tuple, str] = {}
        # input shapes -> (the compiled variant's launcher, the order of its inputs or None)
        self._compiled: dict[tuple, Any] = {}
        self._names = tuple(s.name for s in inputs if s is not None)
        # (argument index, dtype, transposition, module state) of each input the kernel reads
        self._active = tuple((i, s.dtype, s.perm, s.persistent, s.given, s.bias) for i, s in enumerate(inputs)
                             if s is not None)
        self._out_names: tuple[str, ...] = ()
        self._last_env: dict[str, int] | None = None   # the dims of the last shape planned (_plan_ahead)
        self.out_slots = out_slots  # a tuple result (values, indices): the kernel computes the slots not None
        # the shape the single output is allocated in, where the graph's one use of it was a reshape (the
        # rewritten graph then reads the output as it comes: compiler._absorb_output_reshapes)
        self.out_view: tuple[int, ...] | None = None
        # the checks and the launch of a call in one C call (runtime/fastcall.py), where the extension is built
        # and no input is transposed here; it answers None for anything but the plain case, which forward()
        # then takes through the Python path below (the same checks, with their messages)
        piece = (fastcall.piece_type() if all(s.perm is None and s.given is None for s in inputs if s is not None)
                 else None)
        self._fast = None if piece is None else piece(
            tuple(i for i, *_ in self._active), tuple(d for _, d, *_ in self._active), Tensor, _grad_enabled,
            self._compiled, self.__dict__)

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
            if a.dtype != (spec.given or spec.dtype):
                return (f"input {spec.name} has dtype {a.dtype} (the program was captured with "
                        f"{spec.given or spec.dtype})")
            if a.device.type != "cpu":
                return f"input {spec.name} is on {a.device} (Prism's kernels run on the CPU)"
        if torch.is_grad_enabled() and any(isinstance(a, torch.Tensor) and a.requires_grad for a in args):
            return AUTOGRAD
        return ""

    def forward(self, *args: Any) -> Any:
        fast = self._fast
        if fast is not None:
            outs = fast(args)
            if outs is not None:
                return outs[0] if len(outs) == 1 and self.out_slots is None else self._result(outs)
        if fastcall.PROFILING[0]:  # the C path accounts its own calls; this one is the Python path's
            t0 = time.perf_counter()
            try:
                return self._checked(args)
            finally:
                fastcall.add_piece_time(time.perf_counter() - t0)
        return self._checked(args)

    def _result(self, outs: list) -> Any:
        if self.out_slots is not None:
            return tuple(outs[k] if k is not None else None for k in self.out_slots)
        return outs[0] if len(outs) == 1 else dict(zip(self._out_names, outs))

    def _checked(self, args: tuple) -> Any:
        # one pass over the inputs: CPU tensors of the captured dtypes, no autograd recording (else the slow
        # path says why); transposed or non-contiguous ones are prepared (module state: cached). Per call
        # this is the whole Python cost of a piece besides the kernel (docs/frontend.md, "Per-call cost")
        grad = _grad_enabled()
        ins: list[torch.Tensor] = []
        for i, dtype, perm, persistent, given, bias in self._active:
            a = args[i]
            if (not isinstance(a, Tensor) or a.dtype is not (given or dtype) or not a.is_cpu
                    or (grad and a.requires_grad)):
                return self._in_pytorch(self._why_not(args), args)
            if bias:  # a bool attention mask: 0 where it attends, -inf elsewhere
                a = torch.zeros(a.shape, dtype=dtype).masked_fill_(~a, float("-inf"))
            elif given is not None:  # a bool mask: float 0/1, as masks are inside Prism
                a = a.to(dtype)
            if perm is not None or not a.is_contiguous():
                a = PREPARED.get(a, perm) if persistent else _prepare(a, perm)
            ins.append(a)
        shapes = tuple([a.shape for a in ins])
        hit = self._compiled.get(shapes)
        try:
            if hit is None:  # a new shape: bind the dims, tune (or read the tuning cache), compile
                hit = self._plan(shapes, args)
                if isinstance(hit, str):
                    return self._in_pytorch(hit, args)
            launch, order = hit
            outs = launch(ins if order is None else [ins[i] for i in order])
        except Exception as e:  # e.g. no verified sGraph tiles this shape: it stays in PyTorch
            msg = f"at input shapes {[tuple(s) for s in shapes]}: {type(e).__name__}: {str(e).splitlines()[0]}"
            self._bad_shapes[shapes] = msg
            self._compiled.pop(shapes, None)
            return self._in_pytorch(msg, args)
        # counted through __dict__: nn.Module.__setattr__ checks parameters, buffers and submodules on every
        # assignment (measured 6.7 µs per call under cProfile, ~2 µs without)
        self.__dict__["prism_calls"] += 1
        return self._result(outs)

    # a piece is called from the rewritten graph's generated code: skip nn.Module.__call__ (its hook
    # dispatch measured ~3 µs per call on a 2-core EPYC); a PieceRunner has no hooks
    __call__ = forward

    def _plan(self, shapes: tuple, args: tuple) -> tuple[Any, tuple[int, ...] | None] | str:
        """What a call with input ``shapes`` runs: the kernel's launcher and the order of its inputs
        (None: the piece's order), or why this shape stays in PyTorch."""
        bad = self._bad_shapes.get(shapes)
        if bad is not None:
            return bad
        shapes = tuple(tuple(s) for s in shapes)
        if self.huge_pages:  # args is () when a chain plans a new shape from C: its inputs were seen before
            for i, _, _, persistent, *_ in self._active:
                if persistent and i < len(args):
                    memory.collapse(args[i])
        env = self.kernel.program.bind({n: s for n, s in zip(self._names, shapes)})
        spec = self.kernel.specialize(**env)
        hit = self._launch(shapes, spec.kernel)
        last, self._last_env = self._last_env, env
        if last is not None and PLAN_AHEAD > 0:
            moved = [d for d in env if env[d] != last.get(d)]
            if len(moved) == 1 and env[moved[0]] == last.get(moved[0], 0) + 1:
                self._plan_ahead(env, moved[0], spec.kernel)
        return hit

    def _launch(self, shapes: tuple, k: Any) -> tuple[Any, tuple[int, ...] | None]:
        order = tuple(self._names.index(n) for n in k.input_names)
        launch = k.torch_launcher(tuple(shapes[i] for i in order), self.out_view)
        self._out_names = tuple(k.output_names)
        hit = self._compiled[shapes] = (launch, None if order == tuple(range(len(order))) else order)
        return hit

    def _plan_ahead(self, env: dict[str, int], dim: str, kernel: Any) -> None:
        """Plan the next PLAN_AHEAD values of ``dim`` now, where this call's shape was the last one's with ``dim``
        one more: a decode step's KV length, which the next steps take one by one. Only values that the kernel just
        planned serves with no compile and no numeric check of their own (``SuperKernel.plans_cheaply``: a
        template whose guards hold there and which has had its checks): anything else is left to its own call, so
        nothing here compiles or checks on speculation (a prompt one token longer than the last is no reason to
        check 16 longer ones).
        Why ahead: a new KV length cost ~0.8 ms of Python per decode step of llama-1b w8a8 (its eight attention
        pieces: the first derives the length -- ~0.5 ms -- and each plans a launcher), though the same work takes
        a tenth of that run back to back -- each decode step streams a gigabyte of weights through the caches, and
        the planning code ran cold every time (the tuning entry's path took 14 µs in a loop, 126 µs in a step).
        ``PRISM_PLAN_AHEAD=0`` turns it off; a value there is the count."""
        names = self._names
        inputs = self.kernel.program.inputs
        for i in range(1, PLAN_AHEAD + 1):
            nxt = {**env, dim: env[dim] + i}
            try:
                shapes = tuple(tuple(int(D.evaluate(d, nxt)) for d in inputs[n].shape) for n in names)
            except Exception:   # a dim this piece's shapes do not evaluate at: plan nothing ahead
                return
            if shapes in self._compiled or shapes in self._bad_shapes:
                continue
            try:
                if not self.kernel.plans_cheaply(nxt, kernel):
                    return
                spec = self.kernel.specialize(**nxt)
                self._launch(shapes, spec.kernel)
            except Exception as e:   # its own call will meet it again and say why
                log.debug("prism: piece %s: planning ahead at %s stopped: %s", self.label, nxt, e)
                return
            self._last_env = nxt
            if spec.kernel is not kernel:   # the derivation took another kernel there: the next values are its own
                return

    def _in_pytorch(self, why: str, args: tuple) -> Any:
        if why == AUTOGRAD:
            _autograd_once()
        else:
            self._once(why, why)
        self.__dict__["fallback_calls"] += 1
        out = self.fallback(*args)
        return out if self.out_view is None else out.reshape(self.out_view)

    def extra_repr(self) -> str:
        return f"{self.label!r}, prism_calls={self.prism_calls}, fallback_calls={self.fallback_calls}"
