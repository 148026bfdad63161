"""Element types. float32 is the working type; float64 exists for reference/accuracy graphs."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from prism.errors import DTypeError


@dataclass(frozen=True)
class DType:
    name: str
    itemsize: int

    @property
    def np(self) -> np.dtype:
        return np.dtype(self.name)

    def __str__(self) -> str:
        return self.name


float32 = DType("float32", 4)
float64 = DType("float64", 8)

SUPPORTED: dict[str, DType] = {"float32": float32, "float64": float64}
_ALIASES = {"f32": "float32", "fp32": "float32", "f64": "float64", "fp64": "float64"}
_PLANNED = ("bfloat16", "float16")


def as_dtype(x: object) -> DType:
    """Normalize a dtype given as a DType, a name, or a numpy/torch dtype; clear error otherwise."""
    if isinstance(x, DType):
        return x
    name = str(x)
    name = name.removeprefix("torch.")
    name = _ALIASES.get(name, name)
    if name in SUPPORTED:
        return SUPPORTED[name]
    if name in _PLANNED:
        raise DTypeError(f"dtype {name!r} is not supported yet (planned); supported: {sorted(SUPPORTED)}. "
                         "Cast the inputs to float32 or leave this part to PyTorch.")
    raise DTypeError(f"unknown dtype {x!r}; supported: {sorted(SUPPORTED)}")
