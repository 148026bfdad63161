"""A simple static cost model that ranks search results (not the tuner's: that one measures).

For each customized operator we pick a representative instantiation of its symbols (grid sizes and
``F``: powers of two that divide every dim they split) that fits the per-block working set in L2 and
gives every core a block where possible, and estimate its time as DRAM bytes moved -- including
*replication* (a tile read by every block of a grid dim that does not split its tensor) -- over the
bandwidth, against flops over the peak, plus a fixed launch cost per kernel. Predefined operators
read their inputs and write their output once. Ties are broken by the per-block working set.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

import numpy as np

from prism.ir.dims import DimLike, evaluate
from prism.search import maps as M
from prism.search.block import BlockStruct
from prism.search.space import FREE_OPS

DTYPE_BYTES = 4


@dataclass(frozen=True)
class Machine:
    cores: int
    l1_bytes: int
    l2_bytes: int
    bandwidth: float = 40e9         # bytes/s (the 2-core VM measured 40-76 GB/s; WORKLOADS.md)
    core_flops: float = 100e9       # flop/s per core: about a third of the AVX-512 FMA peak at 2.5 GHz
    launch_s: float = 5e-6          # an OpenMP parallel region's fork/join


@lru_cache(maxsize=1)
def machine() -> Machine:
    """This machine's usable cores and cache sizes, read once for every stage by :mod:`prism.tune.machine`
    (the search's constants stay its own: it ranks structures, the tuner's model instances)."""
    from prism.host import usable_cores
    from prism.tune.machine import cache_sizes
    sizes = cache_sizes()
    return Machine(usable_cores(), sizes[1], sizes[2])


@dataclass
class CostReport:
    seconds: float                  # estimated time (the ranking key)
    dram_bytes: int
    flops: int
    kernels: int
    working_set: int                # largest per-block working set (bytes) over the customized ops
    params: dict[str, int] = field(default_factory=dict)   # the representative instantiation
    feasible: bool = True           # False: no instantiation fits the cache (hardware prune)

    def key(self) -> tuple:
        # estimates within a few percent are a tie: then fewer kernels, then the smaller per-block working set
        # (a for-loop keeps tiles in L1 where the grid alone would not) win
        return (not self.feasible, float(f"{self.seconds:.2g}"), self.kernels, self.working_set, self.seconds)

    def to_json(self) -> dict[str, Any]:
        return {"seconds": self.seconds, "dram_bytes": self.dram_bytes, "flops": self.flops, "kernels": self.kernels,
                "working_set": self.working_set, "params": self.params, "feasible": self.feasible}


def _val(x: DimLike, env: Mapping[str, int]) -> int:
    return x if isinstance(x, int) else evaluate(x, env)


def _prod(xs: Sequence[int]) -> int:
    return math.prod(xs) if xs else 1


@dataclass
class _Block:
    """One customized operator's cost under concrete sizes."""

    seconds: float
    dram: int
    flops: int
    ws: int
    blocks: int


def block_costs(s: BlockStruct, a: tuple, sizes: np.ndarray, env: Mapping[str, int], m: Machine
                ) -> dict[str, np.ndarray]:
    """Vectorized cost of structure ``s`` under assignment ``a`` for every row (g0, g1, g2, F) of ``sizes``:
    arrays ``seconds``, ``dram`` (bytes), ``flops``, ``ws`` (bytes), ``blocks`` and ``valid`` (exact splits)."""
    grid, loop = a
    ngrid = len(grid)
    n_in = len(s.ctx.inputs)
    sz = sizes.astype(np.int64)
    looped_in = [loop[M.mvar(i, M.L)] != M.NONE for i in range(n_in)]
    nblocks = np.prod(sz[:, :ngrid], axis=1) if ngrid else np.ones(len(sz), np.int64)
    F = sz[:, 3] if any(looped_in) else np.ones(len(sz), np.int64)
    valid = np.ones(len(sz), bool)
    dims: list[list[np.ndarray]] = []
    for t in s.tensors:
        ds = []
        for d in t.shape:
            if d is None:
                ds.append(np.ones(len(sz), np.int64))
                continue
            full = _val(d[0], env)
            f = np.ones(len(sz), np.int64)
            for p, col in enumerate(grid):
                if col[M.mvar(d[1], M.G)] == d[2]:
                    f = f * sz[:, p]
            if loop[M.mvar(d[1], M.L)] == d[2]:
                f = f * sz[:, 3]
            valid &= (full % f) == 0
            ds.append(np.maximum(full // f, 1))
        dims.append(ds)
    elems = [np.prod(np.stack(ds), axis=0) if ds else np.ones(len(sz), np.int64) for ds in dims]
    dram = np.zeros(len(sz), np.float64)
    flops = np.zeros(len(sz), np.float64)
    looped_t: list[bool] = []
    for k, t in enumerate(s.tensors):
        if t.op == "iter":
            lp = looped_in[t.arg[0]]
            looped_t.append(lp)
            dram += elems[k] * nblocks * (F if lp else 1)
            continue
        lp = t.phase != "post" and any(looped_t[j] for j in t.src)
        looped_t.append(lp)
        reps = nblocks * (F if (lp or t.op == "acc") else 1)
        if t.op == "matmul" or (t.op == "acc" and t.arg[0] == "softmax_matmul"):
            flops += 2.0 * elems[k] * dims[t.src[0]][-1] * reps
        else:
            flops += np.max(np.stack([elems[j] for j in t.src]), axis=0) * reps
    for o in s.outputs:
        dram += elems[o] * nblocks
    ws = np.sum(np.stack(elems), axis=0) * DTYPE_BYTES
    busy = np.minimum(nblocks, m.cores)
    sec = np.maximum(dram * DTYPE_BYTES / m.bandwidth, flops / (m.core_flops * busy)) + m.launch_s
    return {"seconds": sec, "dram": dram * DTYPE_BYTES, "flops": flops, "ws": ws, "blocks": nblocks, "valid": valid}


def _size_options(s: BlockStruct, a: tuple, env: Mapping[str, int]) -> list[list[int]]:
    """Per parallel dim (g0, g1, g2, F): powers of two dividing every dim it splits (>= 2 for a used grid dim)."""
    grid, loop = a
    n_in = len(s.ctx.inputs)
    fulls = [[_val(d, env) for d in shape] for _, shape in s.ctx.inputs]
    options: list[list[int]] = []
    for p in range(M.MAX_GRID + 1):
        if p < M.MAX_GRID and p >= len(grid):
            options.append([1])
            continue
        col = loop if p == M.MAX_GRID else grid[p]
        cv = M.L if p == M.MAX_GRID else M.G
        split = [fulls[i][col[M.mvar(i, cv)]] for i in range(n_in) if col[M.mvar(i, cv)] != M.NONE]
        if not split:
            options.append([1])
            continue
        g = math.gcd(*split)
        opts = [1 << k for k in range(0, 16) if (1 << k) <= g and g % (1 << k) == 0]
        if p < len(grid):
            opts = [v for v in opts if v > 1] or [1]
        options.append(opts)
    return options


def estimate_block(s: BlockStruct, a: tuple, env: Mapping[str, int], m: Machine, index: int
                   ) -> tuple[_Block | None, dict[str, int]]:
    """The best representative instantiation of one customized op (None: nothing fits the cache)."""
    from prism.search.build import symbol_names

    gnames, fname = symbol_names(index)
    if s.sizes:
        sizes = np.array([s.sizes], np.int64)
    else:
        sizes = np.array(list(itertools.product(*_size_options(s, a, env))), np.int64)
    c = block_costs(s, a, sizes, env, m)
    ok = c["valid"]
    if not ok.any():
        return None, {}
    fits = c["ws"] <= m.l2_bytes
    # prefer: fits L2, enough blocks for every core, then the estimated time, then a small working set
    order = np.lexsort((c["ws"], c["seconds"], c["blocks"] < m.cores, ~fits, ~ok))
    b = int(order[0])
    row = [int(v) for v in sizes[b]]
    params = {gnames[p]: row[p] for p in range(len(a[0]))}
    if any(a[1][M.mvar(i, M.L)] != M.NONE for i in range(len(s.ctx.inputs))):
        params[fname] = row[3]
    if not fits[b]:
        return None, params
    return _Block(float(c["seconds"][b]), int(c["dram"][b]), int(c["flops"][b]), int(c["ws"][b]),
                  int(c["blocks"][b])), params


def estimate(ops: Sequence[Any], choice: Sequence[tuple[BlockStruct, tuple]], shapes: Sequence[Sequence[DimLike]],
             env: Mapping[str, int], m: Machine | None = None, memo: dict | None = None) -> CostReport:
    """Cost of a candidate: ``ops`` (KOp), one (structure, assignment) per customized op, and the full
    shapes of the kernel tensors (inputs first, then each op's results). ``memo``: each customized op's estimate
    by (structure, assignment, position), for a caller costing the product of several ops' assignments -- the
    objects must stay alive while it is used (keyed by identity: assignments hold dicts). Measured need: W4's
    prefill with two kernel operators costed 20.9k combinations of 17 structures' assignments, two block
    estimates each, 24 s of its 30 s search; each block's estimate depends on its own assignment only."""
    m = m or machine()
    total = 0.0
    dram = flops = kernels = ws = 0
    params: dict[str, int] = {}
    feasible = True
    ci = 0
    pos = len(shapes) - sum(len(op.structs[0].outputs) if op.custom else 1 for op in ops)
    for op in ops:
        if op.custom:
            s, a = choice[ci]
            key = (id(s), id(a), ci)
            got = memo.get(key) if memo is not None else None
            if got is None:
                got = estimate_block(s, a, env, m, ci)
                if memo is not None:
                    memo[key] = got
            c, p = got
            params.update(p)
            ci += 1
            pos += len(s.outputs)
            if c is None:
                feasible = False
                continue
            total += c.seconds
            dram += c.dram
            flops += c.flops
            ws = max(ws, c.ws)
            kernels += 1
            continue
        out = _prod([_val(d, env) for d in shapes[pos]])
        pos += 1
        if op.tmpl.op in FREE_OPS:
            continue
        ins = sum(_prod([_val(d, env) for d in shapes[j]]) for j in op.srcs)
        b = (ins + out) * DTYPE_BYTES
        f = out
        if op.tmpl.op == "matmul":
            f = 2 * out * _val(shapes[op.srcs[0]][-1], env)
        total += max(b / m.bandwidth, f / (m.core_flops * m.cores)) + m.launch_s
        dram += b
        flops += f
        kernels += 1
    return CostReport(total, dram, flops, kernels, ws, params, feasible)


def graph_cost(g: Any, m: Machine, params: dict[str, int] | None = None) -> CostReport:
    """Cost of a *concrete* kernel graph (every symbol instantiated) under the same model as
    :func:`block_costs` and :func:`estimate`: per customized op, iterator tiles read per block (and per
    iteration when the loop walks them), saved tiles written per block, flops per tile operator; each
    predefined op reads its inputs and writes its output once (``reshape`` is free)."""
    seconds = 0.0
    dram = flops = kernels = ws = 0
    for n in g.nodes:
        if n.op in ("input", "output", "result") or n.op in FREE_OPS:
            continue
        kernels += 1
        if n.op == "customized":
            bg = n.arg[0]
            nblocks = _prod(list(bg.grid))
            F = bg.forloop
            b_dram = b_flops = b_ws = 0
            for t in bg.nodes:
                e = _prod(list(t.shape))
                looped = bg.phase[t] == "loop"
                if t.op == "iter":
                    b_dram += e * nblocks * (F if looped else 1)
                elif t.op == "save":
                    b_dram += e * nblocks
                    continue
                else:
                    reps = nblocks * (F if (looped or t.op == "acc") else 1)
                    if t.op == "matmul" or (t.op == "acc" and t.arg[0] == "softmax_matmul"):
                        b_flops += 2 * e * t.src[0].shape[-1] * reps
                    else:
                        b_flops += max(_prod(list(s.shape)) for s in t.src) * reps
                b_ws += e * DTYPE_BYTES
            busy = min(nblocks, m.cores)
            seconds += max(b_dram * DTYPE_BYTES / m.bandwidth, b_flops / (m.core_flops * busy)) + m.launch_s
            dram += b_dram * DTYPE_BYTES
            flops += b_flops
            ws = max(ws, b_ws)
            continue
        out = _prod(list(n.shape))
        b = (sum(_prod(list(s.shape)) for s in n.src) + out) * DTYPE_BYTES
        f = 2 * out * n.src[0].shape[-1] if n.op == "matmul" else out
        seconds += max(b / m.bandwidth, f / (m.core_flops * m.cores)) + m.launch_s
        dram += b
        flops += f
    return CostReport(seconds, dram, flops, kernels, ws, dict(params or {}), ws <= m.l2_bytes)
