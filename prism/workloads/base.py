"""The workload record shared by W1-W7."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import numpy as np

from prism.errors import PrismError
from prism.ir.graph import Graph

Shape = Mapping[str, int]


@dataclass(frozen=True)
class Workload:
    """One benchmark workload of WORKLOADS.md.

    ``program(shape)`` is the program as a user writes it (batch-like dims symbolic);
    ``hand_written(shape)`` is the known-good fused structure as a kernel graph with customized
    operators whose grid sizes and for-loop ranges are *symbols*; ``params(shape)`` is the sensible
    concrete instantiation of those symbols for that shape (rule in ``params_rule``) and
    ``alt_params(shape)`` more valid instantiations for testing. Hand-written structures are the
    target the search must rediscover and the first test of the code generator, never a search result.
    """

    id: str
    name: str
    formula: str
    shapes: tuple[Mapping[str, int], ...]
    symbolic: tuple[str, ...]                       # batch-like dims kept symbolic in the program
    input_shapes: Callable[[Shape], dict[str, tuple[int, ...]]]
    program: Callable[[Shape], Graph]
    hand_written: Callable[[Shape], Graph]
    params: Callable[[Shape], dict[str, int]]
    alt_params: Callable[[Shape], list[dict[str, int]]]
    hostile_input: str                              # the input multiplied by 30 for hostile checks
    params_rule: str
    structure: str
    notes: str = ""
    extra: dict = field(default_factory=dict)

    def shape_label(self, shape: Shape) -> str:
        return ",".join(f"{k}={v}" for k, v in shape.items())

    def inputs(self, shape: Shape, kind: str = "normal", seed: int = 0, dtype: object = np.float32
               ) -> dict[str, np.ndarray]:
        """Random inputs: ``normal`` (standard normal, weights scaled by 1/sqrt(fan-in) so outputs stay
        O(1)) or ``hostile`` (the same with ``hostile_input`` multiplied by 30, which overflows a
        softmax without max-subtraction)."""
        if kind not in ("normal", "hostile"):
            raise PrismError(f"input kind must be 'normal' or 'hostile', got {kind!r}")
        rng = np.random.default_rng(seed)
        out = {}
        for name, shp in self.input_shapes(shape).items():
            a = rng.standard_normal(shp)
            if name in self.extra.get("weights", ()):
                a /= np.sqrt(shp[-2])
            if kind == "hostile" and name == self.hostile_input:
                a *= 30.0
            out[name] = a.astype(dtype)
        return out

    def env(self, shape: Shape) -> dict[str, int]:
        """Values of the program's symbolic dims for a shape."""
        return {s: shape[s] for s in self.symbolic}
