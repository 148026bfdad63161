"""Element types.

Storage types: ``float32`` (the working type), ``bfloat16`` and ``float16`` (low-precision storage) and
``int8`` (quantized weights, ``w = q * scale``, and since 2026-11-29 quantized values of the program: a cast of a
float to int8 truncates toward zero and saturates, as a quantizer's ``round(x / s).clamp(-127, 127).to(torch.int8)``
needs; int8 values never compute element-wise, and a matmul of two int8 operands sums its exact products in
float32); ``float64`` exists for reference and accuracy graphs.

The mixed-precision rule: a tensor's dtype is how it is *stored* when it is stored (a program's inputs and
outputs). Every operator computes in float32 (or float64 in the reference's accuracy mode) on the values
of its operands, and matmuls and reductions accumulate in float32 whatever their operands' dtype; a value
is rounded to a narrower type only where the program says so: an explicit ``cast``, a program output
of that dtype, and (on machines with AVX512_BF16) a bfloat16 value of the program that a kernel stores as
a bfloat16 matmul operand for ``vdpbf16ps`` (``codegen/block.py``). Intermediates that Prism materializes
between its own kernels are float32. This is what users expect of low-precision inference (bfloat16
checkpoints, int8 weight-only) and is at least as accurate as PyTorch eager, which rounds every operator's
result to the tensor's dtype (the numeric check's allowance is that rounding error:
``verify.numeric.rounding_allowance``).

NumPy has no bfloat16: ``ml_dtypes`` (the package JAX uses for it) provides the array type.
"""

from __future__ import annotations

from dataclasses import dataclass

import ml_dtypes
import numpy as np

from prism.errors import DTypeError


@dataclass(frozen=True)
class DType:
    name: str
    itemsize: int
    kind: str = "float"     # float | int
    eps: float = 0.0        # relative rounding error bound of storing a float32 value in this type (0: exact)
    tiny: float = 0.0       # the smallest positive (subnormal) value: below eps * |x|, rounding is absolute

    @property
    def np(self) -> np.dtype:
        return _NP[self.name]

    @property
    def is_float(self) -> bool:
        return self.kind == "float"

    @property
    def low_precision(self) -> bool:
        """Narrower than float32: values stored in it are rounded (bfloat16, float16) or quantized (int8)."""
        return self.itemsize < 4

    def __str__(self) -> str:
        return self.name


float32 = DType("float32", 4, tiny=2.0 ** -149)
float64 = DType("float64", 8)
# eps: half an ulp of 1 relative to the value (round to nearest): 2^-8 for bfloat16's 8 significant bits,
# 2^-11 for float16's 11; float16's subnormals start at 2^-14 (a 1e-6 result is stored to 2^-24)
bfloat16 = DType("bfloat16", 2, eps=2.0 ** -8, tiny=2.0 ** -133)
float16 = DType("float16", 2, eps=2.0 ** -11, tiny=2.0 ** -24)
int8 = DType("int8", 1, kind="int")

_NP: dict[str, np.dtype] = {"float32": np.dtype(np.float32), "float64": np.dtype(np.float64),
                            "bfloat16": np.dtype(ml_dtypes.bfloat16), "float16": np.dtype(np.float16),
                            "int8": np.dtype(np.int8)}
SUPPORTED: dict[str, DType] = {d.name: d for d in (float32, float64, bfloat16, float16, int8)}
FLOATS = ("float32", "bfloat16", "float16")          # what a program computes and stores values in
_ALIASES = {"f32": "float32", "fp32": "float32", "f64": "float64", "fp64": "float64", "bf16": "bfloat16",
            "half": "float16", "f16": "float16", "fp16": "float16", "float": "float32", "double": "float64",
            "i8": "int8"}


def as_dtype(x: object) -> DType:
    """Normalize a dtype given as a DType, a name, or a numpy/torch dtype; clear error otherwise."""
    if isinstance(x, DType):
        return x
    name = str(x)
    name = name.removeprefix("torch.")
    name = _ALIASES.get(name, name)
    if name in SUPPORTED:
        return SUPPORTED[name]
    raise DTypeError(f"unknown or unsupported dtype {x!r}; supported: {sorted(SUPPORTED)}")


def working_np(dtype: DType) -> np.dtype:
    """The NumPy type the reference interpreters compute a value of ``dtype`` in: float64 for float64, else
    float32 (the mixed-precision rule above)."""
    return np.dtype(np.float64) if dtype.name == "float64" else np.dtype(np.float32)


def of_array(a: object) -> DType:
    """The DType of a numpy array (or anything with a ``dtype``)."""
    return as_dtype(np.dtype(a.dtype).name if hasattr(a, "dtype") else a)


def round_to(a: np.ndarray, dtype: DType) -> np.ndarray:
    """``a``'s values rounded to ``dtype``'s precision, kept in ``a``'s own float type (round to nearest
    even; NaN and inf kept): what storing a value in ``dtype`` does to it. int8 rounds half to even and
    saturates at [-128, 127] (quantization is done outside the program, so this is only for its inputs)."""
    a = np.asarray(a)
    if dtype.name in ("float64",) or (dtype.name == "float32" and a.dtype == np.float32):
        return a
    if dtype.kind == "int":
        return np.clip(np.rint(a), -128, 127).astype(a.dtype, copy=False)
    # float64 -> bfloat16 directly would differ from float32 -> bfloat16 in double-rounding ties; the kernels
    # round float32 values, so do the same
    return a.astype(np.float32).astype(dtype.np).astype(a.dtype)


# significant bits of each float type (with the implicit one): an integer of at most that many bits is exact
_SIGNIFICAND = {"bfloat16": 8, "float16": 11, "float32": 24, "float64": 53}


def exact_cast(src: DType | str, dst: DType | str) -> bool:
    """Whether ``cast(x, dst)`` of any value of an operand of dtype ``src`` is the identity on values. A cast to
    float32/float64 is (every operator computes in float32, the rule above); int8 (-128..127: 8 bits: a program
    input or a cast's integral value) is exact in every float type, bfloat16's 8 significant bits included
    (``q.to(torch.bfloat16)`` of int8 weight-only on a bfloat16 model). A cast to bfloat16 or float16 of a float
    is not, even from the same dtype: an operator's result labelled bfloat16 holds its float32 value until it
    is stored, and the cast is where it rounds (``cast(rms_norm(x), bfloat16)`` of a bfloat16 x)."""
    a, b = as_dtype(src), as_dtype(dst)
    if not b.is_float:
        return False
    if a.kind == "int":
        return 8 * a.itemsize <= _SIGNIFICAND[b.name]
    return b.name == "float64" or (b.name == "float32" and a.name != "float64")


def quantize_int8(w: np.ndarray, group_size: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The int8 weight-only rule (torchao's int8 weight-only layout), stated once: per-row symmetric
    quantization of ``w`` [out, in] to ``(q int8 [out, in], s float32 [out, 1])``, ``s = max |w_row| / 127``
    (a zero row gets scale 1), ``q = round(w / s)`` half to even in float32, so ``q * s`` is the
    dequantized weight. ``group_size`` G: the same per group of G consecutive values of each row, ``s`` float32
    [out, in / G] (``q[:, k] * s[:, k // G]`` the dequantized weight; llama.cpp's q8_0 takes G = 32).
    ``prism.quantize_weights`` and the ``int8w`` workloads both use it."""
    w = np.asarray(w, dtype=np.float32)
    k = w.shape[-1]
    g = k if group_size is None else group_size   # per row: one group of the whole row
    if g < 1 or k % g:
        raise ValueError(f"quantize_int8: group_size {group_size} does not divide the {k} input features")
    wg = w.reshape(*w.shape[:-1], k // g, g)
    s = np.max(np.abs(wg), axis=-1, keepdims=True) / np.float32(127.0)
    s = np.where(s > 0, s, np.float32(1.0)).astype(np.float32)
    q = np.clip(np.rint(wg / s), -127, 127).astype(np.int8)
    return q.reshape(w.shape), s.reshape(*w.shape[:-1], k // g)

__all__ = [
    "FLOATS",
    "SUPPORTED",
    "DType",
    "as_dtype",
    "bfloat16",
    "exact_cast",
    "float16",
    "float32",
    "float64",
    "int8",
    "of_array",
    "quantize_int8",
    "round_to",
    "working_np",
]
