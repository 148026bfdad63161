"""NumPy interpreters: the ground truth for the verifier, the code generator and the search."""

from prism.ir.graph import register_evaluator
from prism.reference.block import simulate
from prism.reference.kernel import evaluate_graph
from prism.reference.numpy_ops import IMPL

register_evaluator(evaluate_graph)

__all__ = ["IMPL", "evaluate_graph", "simulate"]
