"""Programs that several search tests build."""

from __future__ import annotations

import prism
from prism.ir.dims import DimLike


def grouped_linear(n_out: int, k_in: int, group: int = 32, rows: DimLike = "n",
                   name: str = "grouped_linear") -> prism.Graph:
    """y = x @ (q * s per group of ``group`` inputs)^T as the frontend captures an int8 Linear with group scales
    (``capture._fuse_grouped_linear``): x [rows, K], q int8 [N, K], s [N, K / group]."""
    gn = k_in // group
    g = prism.Graph(name)
    x, q, s = g.input("x", (rows, k_in)), g.input("q", (n_out, k_in), "int8"), g.input("s", (n_out, gn))
    x3 = g.permute(g.reshape(x, (rows, gn, group)), (1, 0, 2))
    q3 = g.cast(g.permute(g.reshape(q, (n_out, gn, group)), (1, 2, 0)), "float32")
    s3 = g.permute(g.reshape(s, (n_out, gn, 1)), (1, 2, 0))
    g.output(g.reshape(g.sum(g.mul(g.matmul(x3, q3), s3), 0), (rows, n_out)), "y")
    return g
