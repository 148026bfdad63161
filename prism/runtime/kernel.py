"""The callable kernel ``prism.compile`` returns.

Symbolic batch dims are bound from the input shapes at call time; each new binding is instantiated,
generated, compiled (through the disk cache) and kept, so a kernel serves every batch size and pays the
compile once per size. Every check (names, array type, dtype, device, contiguity, shapes, output
buffers) happens before native code runs. Inputs are passed zero-copy: numpy arrays by their data
pointer, CPU torch tensors by ``data_ptr()`` (torch is never imported here; a tensor is recognized by
its type's module).
"""

from __future__ import annotations

import ctypes
import math
import os
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Union

import numpy as np

from prism.codegen import isa as ISA_
from prism.codegen.kernel import Generated, generate
from prism.errors import InputError, PrismError, UnsupportedError
from prism.ir import dims as D
from prism.ir.dtypes import DType, float32
from prism.ir.graph import Graph
from prism.runtime import cache, fastcall

Params = Union[Mapping[str, object], Callable[[dict[str, int]], Mapping[str, object]], None]
ALIGN_BYTES = 64
ENTRY_POINTS = ("prism_entry", "prism_max_threads")  # what every generated library exports (codegen/kernel.py)
TEMPLATE_TRIES = 3   # templates that failed (not traceable, not valid, not compilable) before a kernel stops trying
# The C launcher whose workspace and lock every C launcher of the process uses (runtime/fastcall.py): kernels
# run one at a time anyway (each takes every core through OpenMP), so one workspace, grown to the largest
# need, serves them all. One per kernel and shape kept each one's intermediates for the life of the process:
# llama-1b bf16 at batch 8 (prompt 128, warm caches) added 64 MiB beyond Dynamo's own (`backend="eager"`),
# 33 MiB of it workspaces, the largest 10 MiB (docs/bench.md, "Memory"). The cost: kernels called from two
# Python threads at once run one after the other.
ARENA: list[Any] = [None]


def _aligned_empty(shape: tuple[int, ...], dtype: Any = np.float32) -> np.ndarray:
    dt = np.dtype(dtype)
    n = int(np.prod(shape)) if shape else 1
    raw = np.empty(n * dt.itemsize + ALIGN_BYTES, dtype=np.uint8)
    off = (-raw.ctypes.data) % ALIGN_BYTES
    return raw[off:off + n * dt.itemsize].view(dt).reshape(shape)


_THREADS: dict[str | bytes, int] = {}  # PRISM_NUM_THREADS values already parsed (0: unset, use the default)
# read on every call, so it must be cheap: os.environ.get encodes the key and decodes the value (measured
# 2.4 µs per call on a 2-core EPYC, more than the rest of a piece's Python path); os.environ keeps its
# contents in the ``_data`` dict, which every os.environ update (monkeypatch.setenv included) writes
_ENV: dict | None = getattr(os.environ, "_data", None)
_THREADS_KEY = os.environ.encodekey("PRISM_NUM_THREADS") if _ENV is not None else "PRISM_NUM_THREADS"


def num_threads(default: int) -> int:
    """``PRISM_NUM_THREADS`` if set (a positive int), else ``default`` (OpenMP's max threads). Read at every
    call, so a change takes effect on the next one."""
    raw = _ENV.get(_THREADS_KEY) if _ENV is not None else os.environ.get("PRISM_NUM_THREADS")
    if not raw:
        return default
    n = _THREADS.get(raw)
    if n is not None:
        return n or default
    v = (raw.decode() if isinstance(raw, bytes) else raw).strip()
    if not v:
        _THREADS[raw] = 0
        return default
    try:
        n = int(v)
    except ValueError:
        n = 0
    if n < 1:
        raise InputError(f"PRISM_NUM_THREADS must be a positive integer, got {v!r}")
    _THREADS[raw] = n
    return n


def _is_torch(x: object) -> bool:
    return type(x).__module__.startswith("torch") and hasattr(x, "data_ptr")


@dataclass
class _Arg:
    ptr: int
    shape: tuple[int, ...]
    torch: bool


def _np_spelling(dt: DType) -> str:
    return "ml_dtypes.bfloat16" if dt.name == "bfloat16" else f"numpy.{dt.name}"


def _check_array(name: str, x: object, role: str, dt: DType = float32) -> _Arg:
    """Validate one buffer of dtype ``dt``; returns its pointer and shape. Never copies."""
    if isinstance(x, np.ndarray):
        if x.dtype != dt.np:
            raise InputError(f"{role} {name!r}: expected dtype {dt}, got {x.dtype}; convert with "
                             f"x.astype({_np_spelling(dt)})")
        if not x.flags.c_contiguous:
            raise InputError(f"{role} {name!r}: the array is not C-contiguous (strides {x.strides} for shape "
                             f"{x.shape}); pass numpy.ascontiguousarray(x)")
        if role == "output" and not x.flags.writeable:
            raise InputError(f"output {name!r}: the array is read-only")
        return _Arg(x.ctypes.data, tuple(x.shape), False)
    if _is_torch(x):
        t: Any = x
        if t.device.type != "cpu":
            raise InputError(f"{role} {name!r}: the tensor is on {t.device}; Prism's CPU kernels need CPU tensors "
                             "(x.cpu())")
        if str(t.dtype) != f"torch.{dt.name}":
            raise InputError(f"{role} {name!r}: expected dtype torch.{dt.name}, got {t.dtype}; convert with "
                             f"x.to(torch.{dt.name})")
        if not t.is_contiguous():
            raise InputError(f"{role} {name!r}: the tensor is not contiguous (stride {tuple(t.stride())} for shape "
                             f"{tuple(t.shape)}); pass x.contiguous()")
        if role == "output" and t.requires_grad:
            raise InputError(f"output {name!r}: the tensor requires grad; pass a buffer without requires_grad")
        if t.requires_grad and sys.modules["torch"].is_grad_enabled():
            raise InputError(f"{role} {name!r} requires grad and autograd is recording, but Prism kernels are "
                             "inference-only (no backward): call them under torch.no_grad() or "
                             "torch.inference_mode(), or pass x.detach()")
        return _Arg(int(t.data_ptr()), tuple(t.shape), True)
    raise InputError(f"{role} {name!r}: expected a numpy.ndarray or a torch.Tensor, got {type(x).__name__}; "
                     f"wrap it with numpy.asarray(x, dtype={_np_spelling(dt)})")


class Variant:
    """One concrete instantiation: generated source, loaded library, reusable workspace."""

    def __init__(self, gen: Generated, lib: ctypes.CDLL, path: Path, env: dict[str, int],
                 words: tuple[int, ...] = ()) -> None:
        self.gen, self.lib, self.path, self.env = gen, lib, path, env
        self.words = words  # a template's runtime dims, passed after the io pointers (codegen/template.py)
        self.template: Any = None  # the codegen.template.Template this variant runs, if any
        # the variant whose workspace (and lock) this one uses: the first variant of its template, so that a
        # decoder's KV lengths (a variant each) share one workspace instead of growing memory per length
        self.ws_owner: Variant | None = None
        self.fn = lib.prism_entry
        self.fn.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p, ctypes.c_int]
        self.fn.restype = ctypes.c_int
        self.max_threads = int(lib.prism_max_threads())
        self._ws: np.ndarray | None = None
        self._ws_ptr = 0
        self.lock = threading.Lock()
        self.nio = len(gen.input_names) + len(gen.output_names)
        self.ptr_type = ctypes.c_void_p * (self.nio + len(words))

    @property
    def source(self) -> str:
        return self.gen.source

    def workspace(self, nth: int) -> int:
        need = self.gen.ws_floats + nth * self.gen.scratch_floats
        return (self.ws_owner or self)._grow(need)

    def _grow(self, need: int) -> int:
        if self._ws is not None and self._ws.size >= need:
            return self._ws_ptr
        if self._ws is None or self._ws.size < need:
            self._ws = _aligned_empty((max(need, 1),))
            if os.environ.get("PRISM_POISON_WS") == "1":  # tests: uninitialized reads become NaN
                self._ws.fill(np.nan)
            self._ws_ptr = self._ws.ctypes.data
        return self._ws_ptr

    def run(self, ptrs: list[int]) -> None:
        nth = num_threads(self.max_threads)
        arr = self.ptr_type(*ptrs, *self.words)
        with self.lock:
            rc = self.fn(arr, self.workspace(nth), nth)
        if rc != 0:  # pragma: no cover - generated entries return 0
            raise RuntimeError(f"prism kernel returned error code {rc}")

    def torch_launcher(self, out_shapes: tuple, dtypes: tuple) -> Callable[[list[Any]], list[Any]]:
        """The per-call path of checked torch tensors (the frontend's pieces): a function of the input
        tensors (contiguous CPU tensors of the input dtypes, in ``input_names`` order) that allocates fresh
        outputs of ``out_shapes``/``dtypes`` (torch dtypes), runs the kernel and returns the outputs.

        Everything that does not depend on the call is bound once here: a piece's Python-to-C-and-back
        cost is what a call of this function adds to the kernel (docs/frontend.md, "Per-call cost")."""
        torch = sys.modules["torch"]
        empty, default_dtype = torch.empty, torch.get_default_dtype
        fast = fastcall.launcher_type()
        if fast is not None:  # the same path in one C call (runtime/fastcall.py)
            owner = ARENA[0] if type(ARENA[0]) is fast else None   # fastcall.reset() (tests) builds a new type
            launcher = fast(ctypes.cast(self.fn, ctypes.c_void_p).value, self.max_threads, empty, default_dtype,
                            # the sizes as separate arguments: empty(256) is ~0.5 µs cheaper than empty((256,))
                            tuple(tuple(s) if len(s) else ((),) for s in out_shapes),
                            tuple({"dtype": d} for d in dtypes),
                            tuple(dtypes), num_threads, self.gen.ws_floats, self.gen.scratch_floats, self.words,
                            owner)
            if owner is None:
                ARENA[0] = launcher
            return launcher
        outs_spec = tuple(zip(out_shapes, dtypes))
        ptr_type, fn, lock, max_threads, workspace = self.ptr_type, self.fn, self.lock, self.max_threads, self.workspace
        words = self.words
        profiling = fastcall.PROFILING

        def launch(ins: list[Any]) -> list[Any]:
            dd = default_dtype()  # empty() without a dtype argument is ~1 µs cheaper: use it where it agrees
            outs = [empty(s) if d is dd else empty(s, dtype=d) for s, d in outs_spec]
            arr = ptr_type(*[a.data_ptr() for a in ins], *[o.data_ptr() for o in outs], *words)
            nth = num_threads(max_threads)
            with lock:
                if profiling[0]:
                    t0 = time.perf_counter()
                    rc = fn(arr, workspace(nth), nth)
                    fastcall.add_kernel_time(time.perf_counter() - t0)
                else:
                    rc = fn(arr, workspace(nth), nth)
            if rc != 0:  # pragma: no cover - generated entries return 0
                raise RuntimeError(f"prism kernel returned error code {rc}")
            return outs
        return launch


class Kernel:
    """A compiled program: ``kernel(X=x, W=w)`` or ``kernel.call({"X": x, "W": w}, out=...)``.

    Returns the array of a single output, or a dict name -> array for several (torch tensors when any
    input is a torch tensor). ``out`` (an array for a single output, or a dict) reuses caller buffers.
    """

    def __init__(self, graph: Graph, params: Params = None, isa: str | None = None, templates: bool = False) -> None:
        if not isinstance(graph, Graph):
            raise UnsupportedError(f"prism.compile expects a prism.Graph, got {type(graph).__name__}")
        graph.check()
        self.graph = graph
        self.params = params
        self.isa = ISA_.get(isa)
        self.input_names = tuple(graph.inputs)
        self.output_names = tuple(graph.output_names)
        self.input_dtypes = tuple(n.dtype for n in graph.inputs.values())
        self.output_dtypes = tuple(n.dtype for n in graph.outputs)
        self._torch_out: tuple | None = None   # the outputs' torch dtypes (torch imported by the caller)
        self._variants: dict[tuple, Variant] = {}
        self._by_shapes: dict[tuple, Variant] = {}
        self._launchers: dict[tuple, Callable[[list[Any]], list[Any]]] = {}  # torch_launcher: shapes -> launch
        self._dims = graph.symbols()
        # specialize's compiles, one at a time: a variant may be compiled ahead on a background thread
        # (prism.tune.ahead) while the caller asks for it
        self._compiling = threading.RLock()
        # templates: one compiled source per guard region of the dims instead of one per value
        # (codegen/template.py); each entry (template, params, its C text, library, path)
        self.templates = templates and bool(self._dims) and os.environ.get("PRISM_TEMPLATES", "1") != "0"
        self._templates: list[tuple[Any, dict[str, object], str, ctypes.CDLL, Path]] = []
        self.template_failures: list[str] = []
        if not callable(params):
            self._check_params(dict(params or {}))
        if not self._dims:
            self.specialize()

    def _check_params(self, params: dict[str, object]) -> None:
        needed: set[str] = set()
        for bg in self.graph.customized_ops():
            needed |= bg.symbols()
        missing = sorted(needed - self._dims - set(params))
        if missing:
            raise UnsupportedError(f"the graph's customized operators have free parameters {missing} (grid sizes, "
                                   "for-loop ranges or maps); pass their values: prism.compile(graph, params="
                                   + "{" + ", ".join(f"{m!r}: ..." for m in missing) + "})")
        stray = sorted(f"{k}={v!r}" for k, v in params.items() if isinstance(v, D.Follows) and v.dim not in self._dims)
        if stray:
            raise UnsupportedError(f"params {stray} follow dims the graph does not have (its dims: "
                                   f"{sorted(self._dims)})")
        clash = sorted(set(params) & self._dims)
        if clash:
            raise UnsupportedError(f"params {clash} are input dims of the graph; they are bound from the input "
                                   "shapes at call time")

    # --- compilation -----------------------------------------------------------------------------
    def specialize(self, **dims: int) -> Variant:
        """The compiled variant for concrete values of the graph's symbolic dims (compiled on first use)."""
        key = tuple(sorted(dims.items()))
        v = self._variants.get(key)
        if v is not None:
            return v
        with self._compiling:
            v = self._variants.get(key)
            return v if v is not None else self._specialize(key, dims)

    def _specialize(self, key: tuple, dims: dict[str, int]) -> Variant:
        missing = sorted(self._dims - set(dims))
        if missing:
            raise InputError(f"specialize: give values for the symbolic dims {missing}")
        params = self.params(dict(dims)) if callable(self.params) else dict(self.params or {})
        if callable(self.params):
            self._check_params(dict(params))
        if self.templates:
            v = self._from_template(dict(dims), params)
            if v is not None:
                self._variants[key] = v
                return v
        g = self.graph.instantiate({**dims, **D.resolve_params(params, dims)})
        for n in g.nodes:   # the matmul micro-kernels are planned for non-empty panels
            if n.op == "matmul" and 0 in (*n.shape, *n.src[0].shape[-1:]):
                raise UnsupportedError(f"a matmul of shapes {[tuple(s.shape) for s in n.src]} has a zero-size dim at "
                                       f"{dims or 'the fixed shape'}; Prism compiles no empty contraction or output: "
                                       "handle empty tensors before calling the kernel")
        gen = generate(g, self.isa)
        lib, path = cache.load(gen.source, ENTRY_POINTS)
        v = Variant(gen, lib, path, dict(dims))
        self._variants[key] = v
        return v

    def covers(self, **dims: int) -> bool:
        """Whether a call at ``dims`` runs compiled code already: a variant of these values, or a compiled template
        whose guards hold there (no trace, no compile)."""
        if tuple(sorted(dims.items())) in self._variants:
            return True
        if not self.templates or not self._templates:
            return False
        try:
            params = self.params(dict(dims)) if callable(self.params) else dict(self.params or {})
        except PrismError:
            return False
        return any(tparams == params and t.holds(dims) for t, tparams, *_ in self._templates)

    def _from_template(self, dims: dict[str, int], params: dict[str, object]) -> Variant | None:
        """The variant at ``dims`` from a compiled template whose guards hold there (tracing, validating and
        compiling one when none does); None when the graph's code cannot be a template here (then it is
        generated for these values). Gives up after TEMPLATE_TRIES failures."""
        from prism.codegen.template import TemplateError, trace
        for t, tparams, src, lib, path in self._templates:
            if tparams == params and t.holds(dims):
                return self._template_variant(t, dims, src, lib, path)
        if len(self.template_failures) >= TEMPLATE_TRIES or 0 in dims.values():
            return None
        try:
            t = trace(self.graph, params, dims, self.isa)
        except TemplateError as e:
            self.template_failures.append(f"{dims}: {e}")
            return None
        except PrismError:  # not valid at these dims at all: the plain path raises the error
            return None
        except Exception as e:  # a template is an optimization: a failure generates per value
            self.template_failures.append(f"{dims}: {type(e).__name__}: {e}")
            return None
        try:
            t.validate(self.graph, params, self.isa)
            src = t.source()
            lib, path = cache.load(src, ENTRY_POINTS)
        except Exception as e:
            self.template_failures.append(f"{dims}: {type(e).__name__}: {e}")
            return None
        self._templates.append((t, dict(params), src, lib, path))
        return self._template_variant(t, dims, src, lib, path)

    @staticmethod
    def _template_variant(t: Any, dims: dict[str, int], src: str, lib: ctypes.CDLL, path: Path) -> Variant:
        v = Variant(t.bind(dims, src), lib, path, dims, t.words(dims))
        v.template = t
        if t.first is None:
            t.first = v
        else:   # one workspace and lock for every value of the template (its C entry is serialized anyway)
            v.ws_owner, v.lock = t.first, t.first.lock
        return v

    def source_at(self, env: Mapping[str, int]) -> str:
        """The C that runs at ``env`` (the values of the symbolic dims; {} for a fixed-shape graph)."""
        return self.specialize(**env).source if self._dims else self.source

    @property
    def source(self) -> str:
        """The generated C of the (only) compiled variant; use ``specialize(n=...).source`` to pick one."""
        if len(self._variants) == 1:
            return next(iter(self._variants.values())).source
        if not self._variants:
            raise InputError(f"this kernel has symbolic dims {sorted(self._dims)} and has not been compiled yet; "
                             "call it once or use kernel.specialize(" + ", ".join(f"{d}=..." for d in
                                                                                sorted(self._dims)) + ").source")
        raise InputError(f"this kernel has {len(self._variants)} compiled variants "
                         f"{[dict(k) for k in self._variants]}; pick one with kernel.specialize(...).source")

    # --- calling ---------------------------------------------------------------------------------
    def __call__(self, **inputs: Any) -> Any:
        return self.call(inputs)

    def call(self, inputs: Mapping[str, Any], out: Any = None) -> Any:
        if not isinstance(inputs, Mapping):
            raise InputError(f"call: inputs must be a mapping name -> array, got {type(inputs).__name__}")
        unknown = [k for k in inputs if k not in self.input_names]
        if unknown:
            raise InputError(f"unknown input(s) {unknown}; this kernel takes {list(self.input_names)}")
        missing = [k for k in self.input_names if k not in inputs]
        if missing:
            raise InputError(f"missing input(s) {missing}; this kernel takes {list(self.input_names)}")
        args = [_check_array(k, inputs[k], "input", dt) for k, dt in zip(self.input_names, self.input_dtypes)]
        shapes = tuple(a.shape for a in args)
        v, _ = self.variant_for(shapes)  # first call with these shapes: binds the symbols (clear errors)
        use_torch = any(a.torch for a in args)
        if use_torch and out is None:  # torch in, fresh torch tensors out (PyTorch's allocator: 64-byte aligned)
            empty = sys.modules["torch"].empty
            res = [empty(s, dtype=d) for s, d in zip(v.gen.output_shapes, self.torch_output_dtypes())]
            v.run([a.ptr for a in args] + [r.data_ptr() for r in res])
            return res[0] if len(res) == 1 else dict(zip(self.output_names, res))
        outs = self._outputs(v, out, use_torch, args)
        v.run([a.ptr for a in args] + [o.ptr for _, o in outs])
        result = [arr for arr, _ in outs]
        if use_torch and out is None:
            torch = sys.modules["torch"]
            result = [torch.from_numpy(r) for r in result]
        if out is not None:
            return out
        if len(result) == 1:
            return result[0]
        return dict(zip(self.output_names, result))

    def variant_for(self, shapes: tuple[tuple[int, ...], ...]) -> tuple[Variant, tuple]:
        """The compiled variant for input ``shapes`` (bound and compiled on first use) and its output shapes."""
        v = self._by_shapes.get(shapes)
        if v is None:
            v = self.specialize(**self.graph.bind(dict(zip(self.input_names, shapes))))
            self._by_shapes[shapes] = v
        return v, tuple(v.gen.output_shapes)

    def torch_output_dtypes(self) -> tuple:
        """The outputs' dtypes as torch dtypes (torch is imported by whoever passes torch tensors)."""
        if self._torch_out is None:
            torch = sys.modules["torch"]
            self._torch_out = tuple(getattr(torch, d.name) for d in self.output_dtypes)
        return self._torch_out

    def call_tensors(self, args: list[Any]) -> list[Any]:
        """The lean call path of the frontend's pieces: ``args`` are torch tensors in ``input_names`` order
        that the caller has checked (float32, CPU, contiguous, no autograd recording); returns fresh output
        tensors in ``output_names`` order. The shapes still select (and on first use bind and compile) the
        variant, so a shape the program does not accept raises the same errors as :meth:`call`."""
        return self.torch_launcher(tuple(tuple(a.shape) for a in args))(args)

    def torch_launcher(self, shapes: tuple[tuple[int, ...], ...], out_view: tuple[int, ...] | None = None
                       ) -> Callable[[list[Any]], list[Any]]:
        """:meth:`Variant.torch_launcher` of the variant for input ``shapes`` (bound and compiled on first
        use; kept per shapes): the lean per-call path of checked torch tensors. PyTorch's CPU allocator
        aligns the outputs to 64 bytes. ``out_view``: allocate the single output in this shape instead (the
        same elements in the same order: the caller's ``reshape`` of the result, absorbed)."""
        key = (shapes, out_view)
        hit = self._launchers.get(key)
        if hit is None:
            v, out_shapes = self.variant_for(shapes)
            if out_view is not None:
                if len(out_shapes) != 1 or math.prod(out_shapes[0]) != math.prod(out_view):
                    raise ValueError(f"out_view {out_view} does not fit the outputs {out_shapes}")
                out_shapes = (tuple(out_view),)
            hit = self._launchers[key] = v.torch_launcher(out_shapes, self.torch_output_dtypes())
        return hit

    def _outputs(self, v: Variant, out: Any, use_torch: bool, args: list[_Arg]) -> list[tuple[Any, _Arg]]:
        shapes = v.gen.output_shapes
        if out is None:
            res = []
            for s, dt in zip(shapes, self.output_dtypes):
                a = _aligned_empty(s, dt.np)
                res.append((a, _Arg(a.ctypes.data, s, False)))
            return res
        if not isinstance(out, Mapping):
            if len(self.output_names) != 1:
                raise InputError(f"out: this kernel has {len(self.output_names)} outputs "
                                 f"{list(self.output_names)}; pass a dict name -> buffer")
            out = {self.output_names[0]: out}
        unknown = [k for k in out if k not in self.output_names]
        missing = [k for k in self.output_names if k not in out]
        if unknown or missing:
            raise InputError(f"out: expected buffers for {list(self.output_names)}"
                             + (f"; unknown {unknown}" if unknown else "")
                             + (f"; missing {missing}" if missing else ""))
        res = []
        for name, s, dt in zip(self.output_names, shapes, self.output_dtypes):
            a = _check_array(name, out[name], "output", dt)
            if a.shape != s:
                raise InputError(f"output {name!r}: expected shape {s}, got {a.shape}")
            nbytes = dt.itemsize * math.prod(s)
            for k, ia, idt in zip(self.input_names, args, self.input_dtypes):
                ib = idt.itemsize * math.prod(ia.shape)
                if a.ptr < ia.ptr + ib and ia.ptr < a.ptr + nbytes:
                    raise InputError(f"output {name!r} overlaps input {k!r}; pass a separate buffer")
            res.append((out[name], a))
        return res

    def __repr__(self) -> str:
        return (f"<prism.Kernel {self.graph.name!r} inputs={list(self.input_names)} outputs={list(self.output_names)}"
                f" variants={len(self._variants)} isa={self.isa.name}>")


def compile(graph: Graph, params: Params = None, isa: str | None = None, templates: bool = False) -> Kernel:
    """Compile a kernel graph to native code (see :class:`Kernel`).

    ``params``: values of the block-graph symbols (grid sizes, for-loop ranges, maps), as a dict or a
    function of the bound batch dims. ``isa``: force a SIMD path (default: the machine's best, or
    ``PRISM_ISA``). ``templates``: a new value of a symbolic dim is served by a source compiled once for
    its guard region (codegen/template.py) where the code allows; ``PRISM_TEMPLATES=0`` turns it off.
    """
    return Kernel(graph, params, isa, templates)
