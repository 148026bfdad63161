"""Program representations: symbolic dims, dtypes, the op registry, kernel graphs and block graphs."""

from prism.ir.block import ACCUMULATORS, BlockBuilder, BlockGraph, InputSpec, MapVar
from prism.ir.builder import Tensor
from prism.ir.dims import Dim, Divisible, sym
from prism.ir.dtypes import DType, float32, float64
from prism.ir.graph import Graph
from prism.ir.ops import OPS, TILE_OPS

__all__ = ["ACCUMULATORS", "OPS", "TILE_OPS", "BlockBuilder", "BlockGraph", "DType", "Dim", "Divisible", "Graph",
           "InputSpec", "MapVar", "Tensor", "float32", "float64", "sym"]
