"""Code generation: concrete kernel graphs (with customized block-graph operators) to C + OpenMP."""

from prism.codegen.isa import ISA, detect
from prism.codegen.kernel import Generated, generate

__all__ = ["ISA", "Generated", "detect", "generate"]
