"""The element-wise operators, each defined once with every stage's rule (see ``prism.ir.ops``).

Adding one is one ``unary(...)`` or ``binary(...)`` call here plus its tests: the builder method, the
NumPy reference, the verifier's term (``(Un "name" x)``, or the binary's constructor) and its rewrite
rules, the search's abstract expression, the C lowering, the cost, the frontend converters (every
PyTorch spelling: ``F.``, ``torch.``, ``Tensor.``, ``nn.`` modules, ``aten.``) and the JAX/ONNX
translations of the bench are all derived from it. ``tests/unit/test_op_coverage.py`` fails when a stage
lacks an operator.

C lowerings are scalar expressions over the C prelude's branch-free math (``pr_exp``, ``pr_log``,
``pr_erf``, ...; ``prism/codegen/prelude.py`` states their accuracy); the generated loops run them under
``#pragma omp simd``, so an expression that calls no libm function vectorizes. NaN propagates through
every operator as in PyTorch (comparisons are written so that a NaN input selects the NaN branch).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from prism.errors import DTypeError
from prism.ir.builder import OpMethods, Tensor
from prism.ir.dtypes import FLOATS, DType, as_dtype, exact_cast, round_to
from prism.ir.ops import OpRule, Torch, broadcast_shapes, register

Arrays = Sequence[Any]
_erf_scalar = np.vectorize(math.erf, otypes=[np.float64])


def _same_shape(ctx: Any, shapes: tuple, arg: tuple) -> tuple:
    return shapes[0]


def _broadcast(ctx: Any, shapes: tuple, arg: tuple) -> tuple:
    return broadcast_shapes(shapes[0], shapes[1])


def _number(v: Any, what: str) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise ValueError(f"{what} must be a constant number, got {type(v).__name__} {v!r}")
    return float(v)


def _no_inplace(get: Callable[[str, Any], Any]) -> None:
    if get("inplace", False):
        raise ValueError("inplace=True (the mutation must happen in PyTorch)")


def unary(name: str, doc: str, *, numpy: Callable[..., Any], c: Callable[..., str], c_defs: str = "",
          flops: int = 1, attrs: tuple[str, ...] = (), defaults: tuple = (), linear: bool = False,
          abstract: Callable[..., Any] | None = None, rules: tuple[OpRule, ...] = (),
          torch: Torch | tuple[Torch, ...] = (),
          jax: Callable[..., Any] | None = None, onnx: Callable[..., Any] | None = None,
          method: bool = True, dtype_fn: Callable[..., Any] | None = None, steps: bool = False) -> None:
    """Register a unary element-wise operator. ``numpy(x, *attrs)``; ``c(x, *attrs, lit=)`` gives the C
    expression of C argument ``x`` (``lit(v)`` is the exact float32 literal of ``v``); ``jax(jax, x,
    *attrs)``; ``onnx(b, x, *attrs)`` with ``b.op(kind, inputs, **attributes)`` and ``b.scalar(v)``."""
    torch = (torch,) if isinstance(torch, Torch) else tuple(torch)
    register(name, "unary", 1, attrs, _same_shape, doc, elementwise=True, defaults=defaults,
             numpy=lambda a, arg: numpy(a[0], *arg),
             c=lambda args, arg, lit: c(args[0], *arg, lit=lit),
             c_defs=c_defs, flops=flops, linear=linear, abstract=abstract, rules=rules, torch=torch,
             jax=(lambda m, a, arg: jax(m, a[0], *arg)) if jax else None,
             onnx=(lambda b, ins, arg: onnx(b, ins[0], *arg)) if onnx else None, dtype_fn=dtype_fn, steps=steps)
    if method and not hasattr(OpMethods, name):
        def build(self: OpMethods, x: Tensor, *values: Any) -> Tensor:
            if len(values) > len(attrs):
                raise TypeError(f"{name}() takes {len(attrs)} attribute(s) {attrs}, got {len(values)}")
            arg = tuple(values) + tuple(defaults[len(values):])
            return self._apply(name, (x,), tuple(float(v) if isinstance(v, int) else v for v in arg))
        build.__name__ = name
        build.__doc__ = f"{doc} (attributes {attrs}, defaults {defaults})" if attrs else doc
        setattr(OpMethods, name, build)


def binary(name: str, doc: str, *, numpy: Callable[..., Any], c: Callable[..., str], term_head: str,
           flops: int = 1, c_defs: str = "", rules: tuple[OpRule, ...] = (), torch: Torch | tuple[Torch, ...] = (),
           jax: Callable[..., Any] | None = None, onnx: str | Callable[..., Any] = "") -> None:
    """Register a binary element-wise operator (NumPy broadcasting). ``onnx``: the ONNX operator, or
    ``onnx(b, a, b)`` building it."""
    torch = (torch,) if isinstance(torch, Torch) else tuple(torch)
    register(name, "binary", 2, (), _broadcast, doc + " with NumPy broadcasting", elementwise=True,
             numpy=lambda a, arg: numpy(a[0], a[1]), c=lambda args, arg, lit: c(args[0], args[1]), c_defs=c_defs,
             flops=flops, term_head=term_head, rules=rules, torch=torch,
             jax=(lambda m, a, arg: jax(m, a[0], a[1])) if jax else None,
             onnx=(lambda b, ins, arg: onnx(b, *ins)) if callable(onnx) else
             (lambda b, ins, arg: b.op(onnx, ins)) if onnx else None)
    if not hasattr(OpMethods, name):
        def build(self: OpMethods, a: Tensor, b: Tensor) -> Tensor:
            return self._apply(name, (a, b))
        build.__name__ = name
        build.__doc__ = doc
        setattr(OpMethods, name, build)


def _torch1(*names: str, modules: tuple[tuple[str, tuple[str, ...]], ...] = ()) -> Torch:
    """A unary operator without attributes, with an optional ``inplace`` flag (which stays in PyTorch)."""
    def attrs(get: Callable[[str, Any], Any]) -> tuple:
        _no_inplace(get)
        return ()
    return Torch(names, ("input", "inplace"), attrs, modules)


# --- references --------------------------------------------------------------------------------

def _sigmoid(x: np.ndarray) -> np.ndarray:
    # 1 / (1 + e) for x >= 0 and e / (1 + e) below, e = exp(-|x|) in (0, 1]: no overflow, a few ulps. Measured need:
    # exp(-logaddexp(0, -x)) took 62 ms over llama-1b's [256, 5632] gate in float64 (logaddexp ~40 ns an element),
    # 0.31 s of a 1.9 s new template region's checks of the fused MLP; this form takes a few ms
    e = np.exp(-np.abs(x))
    s = 1 / (1 + e)
    return np.where(x >= 0, s, e * s).astype(x.dtype, copy=False)


def _softplus(x: np.ndarray, beta: float, threshold: float) -> np.ndarray:
    bx = x * x.dtype.type(beta)
    return np.where(bx > threshold, x, np.logaddexp(0, bx) / x.dtype.type(beta))


def _elu(x: np.ndarray, alpha: float, scale: float, input_scale: float) -> np.ndarray:
    t = x.dtype.type
    neg = t(alpha) * np.expm1(x * t(input_scale))
    return t(scale) * np.where(x > 0, x, neg)


def _hardsigmoid(x: np.ndarray) -> np.ndarray:
    t = x.dtype.type
    return np.minimum(np.maximum(x + t(3), t(0)), t(6)) / t(6)


def _gelu(x: np.ndarray, approximate: str) -> np.ndarray:
    if approximate == "tanh":
        c = math.sqrt(2.0 / math.pi)
        return (0.5 * x * (1.0 + np.tanh(c * (x + 0.044715 * x ** 3)))).astype(x.dtype, copy=False)
    return (0.5 * x * (1.0 + _erf_scalar(x.astype(np.float64) / math.sqrt(2.0)))).astype(x.dtype, copy=False)


def _clamp(x: np.ndarray, lo: float, hi: float) -> np.ndarray:
    t = x.dtype.type
    return np.minimum(np.maximum(x, t(lo)), t(hi))  # NaN propagates through np.maximum/minimum


# --- ONNX helpers ------------------------------------------------------------------------------

def _onnx_mul_c(b: Any, x: str, c: float) -> str:
    return b.op("Mul", [x, b.scalar(c)])


def _onnx_gelu(b: Any, x: str, approximate: str) -> str:
    if approximate == "tanh":  # 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
        cube = b.op("Mul", [b.op("Mul", [x, x]), x])
        inner = _onnx_mul_c(b, b.op("Add", [x, _onnx_mul_c(b, cube, 0.044715)]), math.sqrt(2.0 / math.pi))
        t = b.op("Tanh", [inner])
    else:  # 0.5 x (1 + erf(x / sqrt(2)))
        t = b.op("Erf", [b.op("Div", [x, b.scalar(math.sqrt(2.0))])])
    return b.op("Mul", [_onnx_mul_c(b, x, 0.5), b.op("Add", [b.scalar(1.0), t])])


def _onnx_elu(b: Any, x: str, alpha: float, scale: float, input_scale: float) -> str:
    if input_scale != 1.0:
        neg = _onnx_mul_c(b, b.op("Sub", [b.op("Exp", [_onnx_mul_c(b, x, input_scale)]), b.scalar(1.0)]), alpha)
        y = b.op("Where", [b.op("Greater", [x, b.scalar(0.0)]), x, neg])
    else:
        y = b.op("Elu", [x], alpha=alpha)
    return y if scale == 1.0 else _onnx_mul_c(b, y, scale)


def _onnx_softplus(b: Any, x: str, beta: float, threshold: float) -> str:
    bx = x if beta == 1.0 else _onnx_mul_c(b, x, beta)
    sp = b.op("Softplus", [bx])
    sp = sp if beta == 1.0 else _onnx_mul_c(b, sp, 1.0 / beta)
    return b.op("Where", [b.op("Greater", [bx, b.scalar(threshold)]), x, sp])


# --- frontend attribute readers ---------------------------------------------------------------------

def _gelu_attrs(get: Callable[[str, Any], Any]) -> tuple:
    approx = get("approximate", "none")
    if approx not in ("none", "tanh"):
        raise ValueError(f"approximate={approx!r} (supported: 'none', 'tanh')")
    return (approx,)


def _leaky_attrs(get: Callable[[str, Any], Any]) -> tuple:
    _no_inplace(get)
    return (_number(get("negative_slope", 0.01), "negative_slope"),)


def _hardtanh_attrs(get: Callable[[str, Any], Any]) -> tuple:
    _no_inplace(get)
    return (_number(get("min_val", -1.0), "min_val"), _number(get("max_val", 1.0), "max_val"))


def _relu6_attrs(get: Callable[[str, Any], Any]) -> tuple:
    _no_inplace(get)
    return (0.0, 6.0)


def _clamp_attrs(get: Callable[[str, Any], Any]) -> tuple:
    lo, hi = get("min", None), get("max", None)
    if lo is None and hi is None:
        raise ValueError("clamp without bounds")
    return (-math.inf if lo is None else _number(lo, "min"), math.inf if hi is None else _number(hi, "max"))


def _elu_attrs(get: Callable[[str, Any], Any]) -> tuple:
    _no_inplace(get)
    return (_number(get("alpha", 1.0), "alpha"), 1.0, 1.0)


def _aten_elu_attrs(get: Callable[[str, Any], Any]) -> tuple:
    return (_number(get("alpha", 1.0), "alpha"), _number(get("scale", 1.0), "scale"),
            _number(get("input_scale", 1.0), "input_scale"))


SELU_ALPHA = 1.6732632423543772848170429916717
SELU_SCALE = 1.0507009873554804934193349852946


def _selu_attrs(get: Callable[[str, Any], Any]) -> tuple:
    _no_inplace(get)
    return (SELU_ALPHA, SELU_SCALE, 1.0)


def _celu_attrs(get: Callable[[str, Any], Any]) -> tuple:  # celu(x, a) = elu(x / a) * a for x < 0
    _no_inplace(get)
    a = _number(get("alpha", 1.0), "alpha")
    if a == 0:
        raise ValueError("celu with alpha=0")
    return (a, 1.0, 1.0 / a)


def _softplus_attrs(get: Callable[[str, Any], Any]) -> tuple:
    beta = _number(get("beta", 1.0), "beta")
    if beta == 0:
        raise ValueError("softplus with beta=0")
    return (beta, _number(get("threshold", 20.0), "threshold"))


# --- the operators -------------------------------------------------------------------------------

unary("exp", "e**x", numpy=np.exp, c=lambda x, lit: f"pr_exp({x})", flops=8,
      torch=_torch1("exp"), jax=lambda m, x: m.numpy.exp(x), onnx=lambda b, x: b.op("Exp", [x]))
unary("log", "natural logarithm (log(0) = -inf, log(x < 0) = NaN)", numpy=np.log, c=lambda x, lit: f"pr_log({x})",
      flops=10, rules=(OpRule("op.log-exp", '(Un "log" (Un "exp" x))', "x", both=False),),
      torch=_torch1("log"), jax=lambda m, x: m.numpy.log(x), onnx=lambda b, x: b.op("Log", [x]))
unary("square", "x*x", numpy=lambda x: x * x, c=lambda x, lit: f"pr_square({x})",
      abstract=lambda alg, arg, s: alg.b("mul", s[0], s[0]),
      torch=_torch1("square"), jax=lambda m, x: x * x, onnx=lambda b, x: b.op("Mul", [x, x]))
unary("sqrt", "sqrt(x)", numpy=np.sqrt, c=lambda x, lit: f"sqrtf({x})", flops=4,
      torch=_torch1("sqrt"), jax=lambda m, x: m.numpy.sqrt(x), onnx=lambda b, x: b.op("Sqrt", [x]))
unary("rsqrt", "1/sqrt(x)", numpy=lambda x: 1 / np.sqrt(x), c=lambda x, lit: f"(1.0f / sqrtf({x}))", flops=4,
      torch=_torch1("rsqrt"), jax=lambda m, x: m.lax.rsqrt(x),
      onnx=lambda b, x: b.op("Reciprocal", [b.op("Sqrt", [x])]))
unary("silu", "x*sigmoid(x)", numpy=lambda x: x * _sigmoid(x), c=lambda x, lit: f"pr_silu({x})", flops=9,
      torch=_torch1("silu", modules=(("SiLU", ()),)), jax=lambda m, x: m.nn.silu(x),
      onnx=lambda b, x: b.op("Mul", [x, b.op("Sigmoid", [x])]))
unary("gelu", "x*Phi(x) (exact, erf-based; approximate='tanh' uses the tanh form)", attrs=("approximate",),
      defaults=("none",), numpy=_gelu, flops=12,
      c=lambda x, approximate, lit: f"pr_gelu_tanh({x})" if approximate == "tanh" else f"pr_gelu({x})",
      torch=Torch(("gelu",), ("input", "approximate"), _gelu_attrs, (("GELU", ("approximate",)),)),
      jax=lambda m, x, approximate: m.nn.gelu(x, approximate=approximate == "tanh"), onnx=_onnx_gelu,
      method=False)
unary("relu", "max(x, 0)", numpy=lambda x: np.maximum(x, x.dtype.type(0)), c=lambda x, lit: f"pr_relu({x})",
      torch=_torch1("relu", modules=(("ReLU", ()),)), jax=lambda m, x: m.nn.relu(x),
      onnx=lambda b, x: b.op("Relu", [x]))
unary("sigmoid", "1/(1+exp(-x))", numpy=_sigmoid, c=lambda x, lit: f"pr_sigmoid({x})", flops=8,
      torch=_torch1("sigmoid", modules=(("Sigmoid", ()),)), jax=lambda m, x: m.nn.sigmoid(x),
      onnx=lambda b, x: b.op("Sigmoid", [x]))
unary("tanh", "tanh(x)", numpy=np.tanh, c=lambda x, lit: f"pr_tanh({x})", flops=10,
      torch=_torch1("tanh", modules=(("Tanh", ()),)), jax=lambda m, x: m.numpy.tanh(x),
      onnx=lambda b, x: b.op("Tanh", [x]))
unary("neg", "-x", numpy=lambda x: -x, c=lambda x, lit: f"(-{x})", linear=True,
      torch=_torch1("neg"), jax=lambda m, x: -x, onnx=lambda b, x: b.op("Neg", [x]))
unary("abs", "|x|", numpy=np.abs, c=lambda x, lit: f"fabsf({x})",
      rules=(OpRule("op.abs-neg", '(Un "abs" (Un "neg" x))', '(Un "abs" x)', both=False),),
      torch=_torch1("abs"), jax=lambda m, x: m.numpy.abs(x), onnx=lambda b, x: b.op("Abs", [x]))
unary("erf", "the error function", numpy=lambda x: _erf_scalar(x.astype(np.float64)).astype(x.dtype),
      c=lambda x, lit: f"pr_erf({x})", flops=12,
      torch=_torch1("erf", "special_erf"), jax=lambda m, x: m.lax.erf(x), onnx=lambda b, x: b.op("Erf", [x]))
unary("sin", "sin(x)", numpy=np.sin, c=lambda x, lit: f"pr_sin({x})", flops=12,
      torch=_torch1("sin"), jax=lambda m, x: m.numpy.sin(x), onnx=lambda b, x: b.op("Sin", [x]))
unary("cos", "cos(x)", numpy=np.cos, c=lambda x, lit: f"pr_cos({x})", flops=12,
      torch=_torch1("cos"), jax=lambda m, x: m.numpy.cos(x), onnx=lambda b, x: b.op("Cos", [x]))
unary("mul_scalar", "x * c for a Python float c", attrs=("c",), numpy=lambda x, c: x * x.dtype.type(c),
      c=lambda x, c, lit: f"({x} * {lit(c)})", linear=True,
      abstract=lambda alg, arg, s: alg.b("mul", s[0], alg.atom("c")),
      jax=lambda m, x, c: x * np.float32(c), onnx=_onnx_mul_c, method=False)
unary("add_scalar", "x + c for a Python float c", attrs=("c",), numpy=lambda x, c: x + x.dtype.type(c),
      c=lambda x, c, lit: f"({x} + {lit(c)})",
      abstract=lambda alg, arg, s: alg.b("add", s[0], alg.atom("c")),
      jax=lambda m, x, c: x + np.float32(c), onnx=lambda b, x, c: b.op("Add", [x, b.scalar(c)]), method=False)
unary("clamp", "min(max(x, lo), hi) (lo/hi may be -inf/inf; hardtanh, relu6 and clamp(min=, max=))",
      attrs=("lo", "hi"), defaults=(-1.0, 1.0), numpy=_clamp,
      c=lambda x, lo, hi, lit: f"pr_clamp({x}, {lit(lo)}, {lit(hi)})",
      c_defs="PR_INLINE float pr_clamp(float x, float lo, float hi) "
             "{ return x < lo ? lo : (x > hi ? hi : x); }  /* NaN -> NaN */",
      torch=(Torch(("clamp", "clip"), ("input", "min", "max"), _clamp_attrs),
             Torch(("clamp_min",), ("input", "min"), _clamp_attrs),
             Torch(("clamp_max",), ("input", "max"), _clamp_attrs),
             Torch(("hardtanh",), ("input", "min_val", "max_val", "inplace"), _hardtanh_attrs,
                   (("Hardtanh", ("min_val", "max_val")),)),
             Torch(("relu6",), ("input", "inplace"), _relu6_attrs, (("ReLU6", ()),))),
      jax=lambda m, x, lo, hi: m.numpy.clip(x, lo, hi),
      onnx=lambda b, x, lo, hi: b.op("Clip", [x, b.scalar(lo), b.scalar(hi)]))
unary("leaky_relu", "x if x >= 0 else slope * x", attrs=("slope",), defaults=(0.01,),
      numpy=lambda x, s: np.where(x < 0, x * x.dtype.type(s), x),
      c=lambda x, s, lit: f"pr_leaky_relu({x}, {lit(s)})",
      c_defs="PR_INLINE float pr_leaky_relu(float x, float s) { return x < 0.0f ? x * s : x; }",
      torch=Torch(("leaky_relu",), ("input", "negative_slope", "inplace"), _leaky_attrs,
                  (("LeakyReLU", ("negative_slope",)),)),
      jax=lambda m, x, s: m.nn.leaky_relu(x, s), onnx=lambda b, x, s: b.op("LeakyRelu", [x], alpha=s))
unary("hardsigmoid", "min(max(x + 3, 0), 6) / 6", numpy=_hardsigmoid, c=lambda x, lit: f"pr_hardsigmoid({x})",
      c_defs="PR_INLINE float pr_hardsigmoid(float x) "
             "{ float t = x + 3.0f; t = t < 0.0f ? 0.0f : (t > 6.0f ? 6.0f : t); return t / 6.0f; }",
      torch=_torch1("hardsigmoid", modules=(("Hardsigmoid", ()),)), jax=lambda m, x: m.nn.hard_sigmoid(x),
      onnx=lambda b, x: b.op("HardSigmoid", [x], alpha=1.0 / 6.0, beta=0.5))
unary("hardswish", "x * min(max(x + 3, 0), 6) / 6", numpy=lambda x: x * _hardsigmoid(x),
      c=lambda x, lit: f"pr_hardswish({x})",
      c_defs="PR_INLINE float pr_hardswish(float x) "
             "{ float t = x + 3.0f; t = t < 0.0f ? 0.0f : (t > 6.0f ? 6.0f : t); return x * t / 6.0f; }",
      rules=(OpRule("op.hardswish", '(Un "hardswish" x)', '(Mul x (Un "hardsigmoid" x))'),),
      torch=_torch1("hardswish", modules=(("Hardswish", ()),)), jax=lambda m, x: m.nn.hard_swish(x),
      onnx=lambda b, x: b.op("HardSwish", [x]))
unary("elu", "scale * (x if x > 0 else alpha * (exp(input_scale * x) - 1)) (elu, selu, celu)",
      attrs=("alpha", "scale", "input_scale"), defaults=(1.0, 1.0, 1.0), numpy=_elu, flops=9,
      c=lambda x, a, s, i, lit: f"pr_elu({x}, {lit(a)}, {lit(s)}, {lit(i)})",
      c_defs="PR_INLINE float pr_elu(float x, float a, float s, float i) "
             "{ return s * (x > 0.0f ? x : a * pr_expm1(x * i)); }",
      torch=(Torch(("elu",), ("input", "alpha", "inplace"), _elu_attrs, (("ELU", ("alpha",)),)),
             Torch(("aten.elu",), ("input", "alpha", "scale", "input_scale"), _aten_elu_attrs),
             Torch(("selu",), ("input", "inplace"), _selu_attrs, (("SELU", ()),)),
             Torch(("celu",), ("input", "alpha", "inplace"), _celu_attrs, (("CELU", ("alpha",)),))),
      jax=lambda m, x, a, s, i: s * m.numpy.where(x > 0, x, a * m.numpy.expm1(x * i)), onnx=_onnx_elu)
unary("softplus", "log(1 + exp(beta x)) / beta, x where beta x > threshold", attrs=("beta", "threshold"),
      defaults=(1.0, 20.0), numpy=_softplus, flops=18,
      c=lambda x, beta, thr, lit: (f"pr_softplus({x})" if (beta, thr) == (1.0, 20.0)
                                   else f"pr_softplus_bt({x}, {lit(beta)}, {lit(1 / beta)}, {lit(thr)})"),
      c_defs="PR_INLINE float pr_softplus_bt(float x, float b, float rb, float t) "
             "{ float y = x * b; return y > t ? x : pr_softplus_core(y) * rb; }",
      torch=Torch(("softplus",), ("input", "beta", "threshold"), _softplus_attrs,
                  (("Softplus", ("beta", "threshold")),)),
      jax=lambda m, x, beta, thr: m.numpy.where(x * beta > thr, x, m.nn.softplus(x * beta) / beta),
      onnx=_onnx_softplus)
unary("mish", "x * tanh(softplus(x))", numpy=lambda x: x * np.tanh(np.logaddexp(0, x)),
      c=lambda x, lit: f"pr_mish({x})", flops=28,
      c_defs="PR_INLINE float pr_mish(float x) { return x * pr_tanh(pr_softplus(x)); }",
      rules=(OpRule("op.mish", '(Un "mish" x)', '(Mul x (Un "tanh" (Un "softplus" x)))'),),
      torch=_torch1("mish", modules=(("Mish", ()),)), jax=lambda m, x: x * m.numpy.tanh(m.nn.softplus(x)),
      onnx=lambda b, x: b.op("Mish", [x]))

# --- rounding and other element-wise functions of PyTorch's (breadth: each left a user's program in PyTorch).
# Rounding is discontinuous: where a float32 computation lands within its own rounding error of a step, the
# program's float32 run differs from the float64 reference by a step too, which the numeric check allows at rare
# elements (verify.numeric: the program's own error). rintf/floorf/ceilf/truncf compile to one vrndscaleps
# under -fno-math-errno (runtime/cache.py FLAGS), so the loops stay vectorized ---

def _round_np(x: np.ndarray, decimals: float) -> np.ndarray:
    """torch.round: half to even; ``decimals`` d > 0 as rint(x * 10^d) / 10^d, d < 0 as rint(x / 10^-d) * 10^-d
    (PyTorch's order, the power of ten in the operand's type)."""
    d = int(decimals)
    if d == 0:
        return np.rint(x)
    t = x.dtype.type(10.0 ** abs(d))
    return np.rint(x * t) / t if d > 0 else np.rint(x / t) * t


def _round_c(x: str, decimals: float, lit: Any) -> str:
    d = int(decimals)
    if d == 0:
        return f"rintf({x})"
    t = lit(10.0 ** abs(d))
    return f"(rintf(({x}) * {t}) / {t})" if d > 0 else f"(rintf(({x}) / {t}) * {t})"


def _round_attrs(get: Callable[[str, Any], Any]) -> tuple:
    d = get("decimals", 0)
    if isinstance(d, bool) or not isinstance(d, int):
        raise ValueError(f"round(decimals={d!r}): decimals must be a constant int")
    if abs(d) > 30:
        raise ValueError(f"round(decimals={d}): 10^{abs(d)} is not a float32")
    return (float(d),)


def _onnx_round(b: Any, x: str, decimals: float) -> str:
    d = int(decimals)
    if d == 0:
        return b.op("Round", [x])
    t = b.scalar(10.0 ** abs(d))
    return (b.op("Div", [b.op("Round", [b.op("Mul", [x, t])]), t]) if d > 0
            else b.op("Mul", [b.op("Round", [b.op("Div", [x, t])]), t]))


def _jax_round(m: Any, x: Any, decimals: float) -> Any:
    d = int(decimals)
    if d == 0:
        return m.numpy.round(x)   # half to even, as torch.round
    t = np.float32(10.0 ** abs(d))
    return m.numpy.round(x * t) / t if d > 0 else m.numpy.round(x / t) * t


def _sign_np(x: np.ndarray) -> np.ndarray:
    # PyTorch's sign is (0 < x) - (x < 0): sign(NaN) = 0 (numpy's is NaN)
    return ((x > 0).astype(x.dtype) - (x < 0).astype(x.dtype)).astype(x.dtype, copy=False)


def _onnx_trunc(b: Any, x: str) -> str:
    return b.op("Where", [b.op("Less", [x, b.scalar(0.0)]), b.op("Ceil", [x]), b.op("Floor", [x])])


unary("round", "x rounded to the nearest integer, half to even (decimals d: to multiples of 10^-d)",
      attrs=("decimals",), defaults=(0.0,), numpy=_round_np, c=_round_c, flops=2,
      torch=(Torch(("round", "special_round"), ("input", "decimals"), _round_attrs),),
      jax=_jax_round, onnx=_onnx_round, steps=True)
unary("floor", "the largest integer <= x", numpy=np.floor, c=lambda x, lit: f"floorf({x})",
      torch=_torch1("floor"), jax=lambda m, x: m.numpy.floor(x), onnx=lambda b, x: b.op("Floor", [x]), steps=True)
unary("ceil", "the smallest integer >= x", numpy=np.ceil, c=lambda x, lit: f"ceilf({x})",
      torch=_torch1("ceil"), jax=lambda m, x: m.numpy.ceil(x), onnx=lambda b, x: b.op("Ceil", [x]), steps=True)
unary("trunc", "x rounded toward zero", numpy=np.trunc, c=lambda x, lit: f"truncf({x})",
      torch=_torch1("trunc", "fix"), jax=lambda m, x: m.numpy.trunc(x), onnx=_onnx_trunc, steps=True)
unary("frac", "x - trunc(x) (the fractional part, with x's sign)", numpy=lambda x: x - np.trunc(x),
      c=lambda x, lit: f"(({x}) - truncf({x}))", flops=2, torch=_torch1("frac"),
      jax=lambda m, x: x - m.numpy.trunc(x), onnx=lambda b, x: b.op("Sub", [x, _onnx_trunc(b, x)]), steps=True)
unary("sign", "-1, 0 or 1 by the sign of x (0 for NaN, as PyTorch's)", numpy=_sign_np,
      c=lambda x, lit: f"(({x}) > 0.0f ? 1.0f : (({x}) < 0.0f ? -1.0f : 0.0f))", flops=2,
      torch=_torch1("sign", "sgn"),
      jax=lambda m, x: m.numpy.where(x > 0, 1.0, m.numpy.where(x < 0, -1.0, 0.0)).astype(x.dtype),
      onnx=lambda b, x: b.op("Sub", [b.op("Cast", [b.op("Greater", [x, b.scalar(0.0)])], to=1),
                                     b.op("Cast", [b.op("Less", [x, b.scalar(0.0)])], to=1)]), steps=True)
unary("reciprocal", "1 / x", numpy=lambda x: x.dtype.type(1) / x, c=lambda x, lit: f"(1.0f / ({x}))", flops=4,
      torch=_torch1("reciprocal"), jax=lambda m, x: 1 / x, onnx=lambda b, x: b.op("Reciprocal", [x]))
unary("log1p", "log(1 + x), accurate near 0", numpy=np.log1p, c=lambda x, lit: f"pr_log1p({x})", flops=12,
      torch=_torch1("log1p", "special_log1p"), jax=lambda m, x: m.numpy.log1p(x),
      onnx=lambda b, x: b.op("Log", [b.op("Add", [x, b.scalar(1.0)])]))
unary("expm1", "e**x - 1, accurate near 0", numpy=np.expm1, c=lambda x, lit: f"pr_expm1({x})", flops=10,
      torch=_torch1("expm1", "special_expm1"), jax=lambda m, x: m.numpy.expm1(x),
      onnx=lambda b, x: b.op("Sub", [b.op("Exp", [x]), b.scalar(1.0)]))
unary("exp2", "2**x", numpy=np.exp2, c=lambda x, lit: f"pr_exp2({x})", flops=10,
      # 2^x = 2^n e^(r ln 2) with n = rint(x) and r = x - n exact: r ln 2 in [-0.35, 0.35] rounds to a few ulps
      # of the result, where e^(x ln 2) would carry x ln 2's rounding (|x| ulps of 2^x); 2^n as two factors so
      # that the subnormal results are reached
      c_defs="PR_INLINE float pr_exp2(float x) { float xc = x > 129.0f ? 129.0f : (x < -151.0f ? -151.0f : x); "
             "float n = rintf(xc); float r = xc - n; int32_t ni = (int32_t)n; int32_t h = ni / 2; "
             "float y = pr_exp(r * 0.693147180559945309f) * pr_bits_f((uint32_t)(h + 127) << 23) "
             "* pr_bits_f((uint32_t)(ni - h + 127) << 23); return x != x ? x : y; }",
      torch=_torch1("exp2", "special_exp2"), jax=lambda m, x: m.numpy.exp2(x),
      onnx=lambda b, x: b.op("Pow", [b.scalar(2.0), x]))
unary("log2", "log base 2 (log2(0) = -inf, of x < 0 NaN)", numpy=np.log2,
      c=lambda x, lit: f"(pr_log({x}) * {lit(1 / math.log(2))})", flops=11,
      torch=_torch1("log2"), jax=lambda m, x: m.numpy.log2(x),
      onnx=lambda b, x: b.op("Mul", [b.op("Log", [x]), b.scalar(1 / math.log(2))]))
unary("log10", "log base 10 (log10(0) = -inf, of x < 0 NaN)", numpy=np.log10,
      c=lambda x, lit: f"(pr_log({x}) * {lit(1 / math.log(10))})", flops=11,
      torch=_torch1("log10"), jax=lambda m, x: m.numpy.log10(x),
      onnx=lambda b, x: b.op("Mul", [b.op("Log", [x]), b.scalar(1 / math.log(10))]))

binary("add", "a + b", numpy=lambda a, b: a + b, c=lambda a, b: f"({a} + {b})", term_head="Add",
       jax=lambda m, a, b: a + b, onnx="Add")
binary("sub", "a - b", numpy=lambda a, b: a - b, c=lambda a, b: f"({a} - {b})", term_head="Sub",
       jax=lambda m, a, b: a - b, onnx="Sub")
binary("mul", "a * b", numpy=lambda a, b: a * b, c=lambda a, b: f"({a} * {b})", term_head="Mul",
       jax=lambda m, a, b: a * b, onnx="Mul")
binary("div", "a / b", numpy=lambda a, b: a / b, c=lambda a, b: f"({a} / {b})", term_head="Div", flops=4,
       jax=lambda m, a, b: a / b, onnx="Div")
binary("maximum", "max(a, b) (NaN propagates)", numpy=np.maximum, c=lambda a, b: f"pr_max({a}, {b})",
       term_head="Maximum", torch=Torch(("maximum",), ("input", "other")),
       jax=lambda m, a, b: m.numpy.maximum(a, b), onnx="Max")
binary("minimum", "min(a, b) (NaN propagates)", numpy=np.minimum, c=lambda a, b: f"pr_min({a}, {b})",
       c_defs="PR_INLINE float pr_min(float a, float b) { return a != a ? a : (a < b ? a : b); }",
       term_head="Minimum", rules=(OpRule("op.minimum-comm", "(Minimum a b)", "(Minimum b a)", both=False),),
       torch=Torch(("minimum",), ("input", "other")),
       jax=lambda m, a, b: m.numpy.minimum(a, b), onnx="Min")

# --- masks: a bool tensor is float 0/1 inside Prism (the frontend keeps masks that PyTorch computes or
# uses in PyTorch); where(c, a, b) = mask_select(c, a) + mask_select(c == 0, b), exact for every value ---

_CMP = {"gt": (">", np.greater), "ge": (">=", np.greater_equal), "lt": ("<", np.less), "le": ("<=", np.less_equal),
        "eq": ("==", np.equal), "ne": ("!=", np.not_equal)}


def _compare_np(x: np.ndarray, kind: str, c: float) -> np.ndarray:
    return _CMP[kind][1](x, x.dtype.type(c)).astype(x.dtype)


def _onnx_compare(b: Any, x: str, kind: str, c: float) -> str:
    onnx_op = {"gt": "Greater", "ge": "GreaterOrEqual", "lt": "Less", "le": "LessOrEqual", "eq": "Equal"}
    if kind == "ne":
        m = b.op("Not", [b.op("Equal", [x, b.scalar(c)])])
    else:
        m = b.op(onnx_op[kind], [x, b.scalar(c)])
    return b.op("Cast", [m], to=1)  # to float32


unary("compare", "1 where x <kind> c else 0 (kind: gt ge lt le eq ne; NaN compares false except ne)",
      attrs=("kind", "c"), defaults=("ne", 0.0), numpy=_compare_np,
      c=lambda x, kind, c, lit: f"(({x}) {_CMP[kind][0]} {lit(c)} ? 1.0f : 0.0f)",
      jax=lambda m, x, kind, c: _CMP[kind][1](x, c).astype(x.dtype), onnx=_onnx_compare)
unary("mask_scalar", "v where the mask m is nonzero, else 0", attrs=("v",), defaults=(1.0,),
      numpy=lambda m, v: np.where(m != 0, m.dtype.type(v), m.dtype.type(0)),
      c=lambda m, v, lit: f"(({m}) != 0.0f ? {lit(v)} : 0.0f)",
      jax=lambda mod, m, v: mod.numpy.where(m != 0, v, 0.0).astype(m.dtype),
      onnx=lambda b, m, v: b.op("Where", [b.op("Cast", [m], to=9), b.scalar(v), b.scalar(0.0)]))
binary("mask_select", "x where the mask m is nonzero, else 0 (operands m, x)",
       numpy=lambda m, x: np.where(m != 0, x, x.dtype.type(0)), c=lambda m, x: f"(({m}) != 0.0f ? ({x}) : 0.0f)",
       term_head="MaskSelect", jax=lambda mod, m, x: mod.numpy.where(m != 0, x, 0.0).astype(x.dtype),
       onnx=lambda b, m, x: b.op("Where", [b.op("Cast", [m], to=9), x, b.scalar(0.0)]))


# --- casts: the one operator that changes a dtype. Its value is its operand's rounded to the target's
# precision (an int8 operand is exact in float32); widening is exact. The generated code computes in
# float32 and converts on loads and stores, so a cast is a rounding where it narrows and nothing where it
# widens (prism.ir.dtypes states the mixed-precision rule) ---

def _cast_dtype(dtypes: tuple[DType, ...], arg: tuple) -> DType:
    (target,) = arg
    t = as_dtype(target)
    src = getattr(dtypes[0], "name", "")   # (the search infers shapes with placeholder dtypes)
    if src == "float64" and t.name != "float64":
        # the verifier's rule cast-to-float32 = x holds because no value is wider than float32
        raise DTypeError("cast from float64: Prism programs hold float32 values at most (float64 is the "
                         "reference's type); evaluate with dtype=numpy.float64 instead")
    if t.name == "int8":
        if src not in FLOATS:
            raise DTypeError(f"cast of {src or 'a non-float'} to int8: only a float value is quantized to int8")
        return t
    if t.name not in FLOATS and t.name != "float64":   # (float64: reference graphs; code generation has none)
        raise DTypeError(f"cast to {t} is not supported: a program computes in {list(FLOATS)} and quantizes to "
                         "int8 (cast(round(x / scale), int8)); other integer types stay outside the program")
    return t


def _cast_np(x: np.ndarray, target: str) -> np.ndarray:
    """A widening cast is the identity (also in the float64 accuracy mode, where operands may carry more
    digits than float32: what the program computes is the value, not its float32 rounding); a narrowing one
    rounds to the target's precision; int8 truncates toward zero as PyTorch's ``.to(torch.int8)``, saturating at
    -128 and 127 and taking NaN to 0 (PyTorch leaves both undefined: a quantizer clamps and rounds first)."""
    if target == "int8":
        with np.errstate(invalid="ignore"):
            q = np.clip(np.trunc(x), x.dtype.type(-128), x.dtype.type(127))
        return np.where(np.isnan(x), x.dtype.type(0), q).astype(x.dtype, copy=False)
    return x if target in ("float32", "float64") else round_to(x, as_dtype(target))


def _cast_c(x: str, target: str, lit: Any) -> str:
    return {"float32": f"({x})", "float64": f"({x})", "bfloat16": f"pr_round_bf16({x})",
            "float16": f"pr_round_f16({x})", "int8": f"pr_round_i8({x})"}[target]


def _onnx_cast(b: Any, x: str, target: str) -> str:
    return b.op("Cast", [x], to={"float32": 1, "float16": 10, "bfloat16": 16, "int8": 3}[target])


def _jax_cast(m: Any, x: Any, target: str) -> Any:
    if target == "int8":   # the value (trunc, saturated) in x's float type, as _cast_np
        return m.numpy.where(m.numpy.isnan(x), 0.0, m.numpy.clip(m.numpy.trunc(x), -128, 127)).astype(x.dtype)
    return x.astype(getattr(m.numpy, target))


def is_exact_cast(n: Any) -> bool:
    """Whether node ``n`` is a cast that holds every value of its operand (``dtypes.exact_cast``: int8 -> bfloat16):
    the identity on values, which the search drops, the verifier's terms and the reference pass through, and the
    rounding allowance counts as no rounding."""
    return bool(n.op == "cast" and exact_cast(n.src[0].dtype, n.arg[0]))


def _cast_abstract(alg: Any, arg: tuple, s: Sequence[Any]) -> Any:
    """A cast to float32 is the identity on values (nothing a program holds is wider): abstractly nothing, so
    the search may drop it (operators promote mixed float operands); a narrowing cast is a rounding the
    search must place where the program has it."""
    return s[0] if arg[0] in ("float32", "float64") else alg.u(f"cast:{arg[0]}", s[0])


unary("cast", "x stored as dtype (rounded to its precision; exact when it widens)", attrs=("dtype",),
      defaults=("float32",), numpy=_cast_np, c=_cast_c,
      dtype_fn=_cast_dtype, abstract=_cast_abstract, torch=(),
      # sound on values: every dtype a program holds (bfloat16, float16, int8, float32) widens to float32
      # exactly, and a cast from float64 is rejected by the dtype rule
      rules=(OpRule("op.cast-float32", '(Un "cast" x)', "x", both=False),),
      jax=_jax_cast, onnx=_onnx_cast, method=False)

