"""The analytic cost model that ranks instantiations before anything is compiled.

It runs on an sGraph under concrete values of every symbol (:class:`Dims`), or on a concrete graph.
Per customized operator, with ``nb`` blocks, ``T`` threads, ``c = ceil(nb/T)`` blocks on the busiest
thread and ``a = min(nb, T)`` busy threads:

* bytes: every input is read ``tile x blocks x (F if the loop walks it)`` times, rounded up to 64-byte
  lines per contiguous run of the tile. The first read of each byte is charged at a mix of cache and DRAM
  speed (``resident``: the share of the operator's data that fits in ``L3 * L3_SHARE + a * L2``, what
  repeated calls find in cache); re-reads of a *replicated* input at cache speed when it fits in the
  caches, at DRAM speed otherwise. Outputs are written once; a partial-sum output (``omap`` None over a
  grid dim > 1) adds the slots and a reduction pass; accumulator state is read and written every
  iteration (cache speed);
* latency: every contiguous run the tiling cuts a tensor into costs ``RUN_CACHE_S`` / ``RUN_DRAM_S``
  once (a one-column strip of a row-major weight is latency-bound, not bandwidth-bound);
* flops: matmul ``2·M·N·K`` per tile, others weighted per element (``exp`` 8, ``div`` 4, ...), loop nodes
  and accumulators times ``F``, over the SIMD efficiency ``N / (lanes·ceil(N/lanes))`` of the innermost dim;
  a bfloat16 product against a transposed operand (a Linear's ``W^T``) on a machine with ``vdpbf16ps``
  (``Machine.pair_dot``) runs at ``PAIR_TN`` times the FMA peak where the code generator takes its tn path
  (at least ``tn_min_rows`` rows per product -- a batch folds into the rows where the tile keeps whole rows of
  its sequences -- and ``TN_MIN_K`` of K), ``PAIR_NT`` elsewhere (the nt kernels' transpose-and-add per tile);
* time = ``max(memory, compute)`` of the busiest thread (per-thread bandwidth ``min(bw1, bw/a)``, core
  peak) + ``BLOCK_S`` per block + ``ITER_S + NODE_S·(loop nodes)`` per iteration + ``FORK_S``.

Predefined operators: inputs read and output written once, the same roofline, ``FORK_S`` when the code
generator parallelizes them (>= 32 Ki elements), one thread otherwise; reshapes are free.

The per-block *working set* (tiles touched per iteration plus accumulators, except the tiles that are
only ever the right operand of a matmul, directly or through a permute: the micro-kernel streams those
panel by panel) is reported for
the cache filter of :mod:`prism.tune.candidates`. Counting the streamed weight tile dropped every wide
block of W2/W3 at d = 4096 (2 x 2 MiB > L2) and the pipeline ran 1.6-1.7x slower than the hand-written
2-block tiling (full-suite bench, docs/bench.md). The constants were fitted on the project's 2-core VM (see
docs/tune.md); the model is for ranking, and the tuner measures the top of the ranking.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from prism.codegen.block import grouped_products
from prism.codegen.matmul import (
    GROUPED_BLOCK_BYTES,
    GROUPED_DOT_ROWS,
    TN_MIN_K,
    grouped_tn_sizes,
    tiles_take,
    tn_min_rows,
)
from prism.codegen.tiles import elem_of
from prism.ir import dims as D
from prism.ir.block import BlockGraph
from prism.ir.graph import Graph
from prism.ir.node import Node
from prism.ir.ops import OPS
from prism.tune.machine import Machine

BYTES = 4                  # float32: tiles in registers and scratch, whatever their storage dtype
LINE = 64                  # cache line
BLOCK_S = 0.05e-6          # per block: pointers, accumulator init, epilogue bookkeeping
ITER_S = 4e-9              # per for-loop iteration
NODE_S = 3e-9              # per tile operator or accumulator per iteration (call/loop setup of a small tile op)
FORK_S = 3e-6              # an OpenMP parallel region (fork/join)
RUN_CACHE_S = 5e-9         # per contiguous run of a tile (a row of a column strip): a latency-bound access
RUN_DRAM_S = 9e-9          # ... when the tensor comes from DRAM (strided rows defeat the prefetchers)
GROUPED_UNFUSED = 4        # a per-group product not lowered as one (_grouped_cost)
GROUPED_RESIDENT_K = 1024  # values of K per chunk of a many-row grouped product's nt kernels (_grouped_resident)
L3_SHARE = 0.25            # of the shared L3 counted on for one kernel's data (other tensors, other processes)
PARALLEL_MIN = 32 * 1024   # the code generator parallelizes predefined loop nests from this many elements

# flops per element: the element-wise operators' and reductions' from their definitions (OpDef.flops)
OP_FLOPS = {**{n: o.flops for n, o in OPS.items() if o.elementwise or o.group == "reduction"},
            "rms_norm": 6, "layer_norm": 9, "softmax": 14, "rotate_half": 1}
ACC_FLOPS = {"sum": 1, "sum_last": 1, "rms": 2, "max": 1, "softmax_sum": 10}
LAYOUT = ("reshape", "permute", "iter", "save", "split")
# bfloat16 products with vdpbf16ps, flop rate over the machine's FMA peak (codegen/matmul.py: emit_tn from
# tn_min_rows rows and TN_MIN_K of K, the nt kernels below). Measured on the Zen 5 VM, 2 threads: FMA loop 542 GFLOP/s,
# vdpbf16ps loop 1150; bf16 [1024, 2048] x [5632, 2048]^T tn 950-1030, nt 845-864 (docs/codegen.md, "tn").
PAIR_TN = 1.8
PAIR_NT = 1.55
# the same tn products on the AMX tiles (``Machine.tile_dot``: mk.tn_kernel_amx). Measured on the Intel VM of
# 2026-12-01, 2 threads: FMA peak 491 GFLOP/s; bf16 [m, 2048] x [5632, 2048]^T on the tiles 1640-1770 GFLOP/s at m =
# 128, 2100-2340 at 1024, 1100-1230 at 77, 890 at 32 (the nt kernels: ~220 at every m)
TILE_TN = 3.5
# ... at TILE_TN_ROWS rows per product; the tiles' rate grows with the rows that share each key tile (the keys' bytes
# per product): rate = TILE_TN * sqrt(rows / TILE_TN_ROWS), at most TILE_TN_MAX. Measured beside (the same product,
# the weight in L3): 32 rows 890 GFLOP/s (rate 1.8), 77 1120-1230 (2.3-2.5), 128 1640-1770 (3.3-3.6), 1024 2100-2340
# (4.3-4.8). Measured need: llama-1b bf16's fused MLP piece at 128 rows was tuned to 4 blocks of 32 rows (7.0-8.1 ms,
# every candidate measured split the rows); with the rate by rows, 16 blocks of keys over all 128 rows (6.3 ms)
TILE_TN_ROWS = 128
TILE_TN_MAX = 4.5
# int8 x int8 (W8A8) tn products on the AMX tiles (``Machine.tile_idot``: mk.tn_kernel_amx_i8), over the bfloat16
# tiles' rate at the same rows. Measured on the Intel VM of 2026-12-01 (2 threads, [m, 2048] x [5632, 2048]^T, the
# weight in L3): int8 1050 G op/s at m = 32, 2240-2420 at 128, 2750-2810 at 512, against bfloat16's 890, 1640-1770
# and 2100-2340 (at 1024): 1.2-1.35x, not the 2x of the instruction's products (both forms load a 1 KiB tile per
# 16 x 16 block's step: the loads, not the products, bound them)
TILE_I8 = 1.3
# int8 x int8 products with vpdpbusd (W8A8), over the same FMA peak. Measured on the Zen 4 VM, one thread: the float32
# tn kernel 110 GFLOP/s from L2; int8 [128, 2048] @ [1024, 2048]^T tn 187-198 G int8 MAC/s (2 "flops" each: 3.6x),
# nt 76-80 (1.4x) (matmul.TN_MIN_ROWS_I8_I8)
QUAD_TN = 3.5
QUAD_NT = 1.4


def _product_form(n: Node, bg: BlockGraph, m: Machine, S: Dims) -> tuple[float, bool]:
    """The rate of matmul ``n`` over the FMA peak: 1, or PAIR_TN / PAIR_NT for a bfloat16 product against a
    transposed operand on a machine with vdpbf16ps (the module docstring). Against int8 keys (int8 weight-only
    on a bfloat16 model) PAIR_TN where the tn form converts the keys to bfloat16 (from ``tn_min_rows``' rows),
    1 elsewhere (the nt kernels widen them and use FMA). int8 rows against int8 keys on a machine with vpdpbusd:
    QUAD_TN in the tn form, QUAD_NT in the nt kernels. With it, whether the product runs on the AMX tiles (its output
    then builds up in the tn form's Ct block by block of keys, each block's rows written per group of K and read once
    at the end: a stream, not a tile kept resident, so the caller leaves it out of the block's working set. Measured
    need (Intel VM, llama-1b bfloat16, 128 rows): the fused MLP piece's two products [128, 5632 / g0] counted 2.9 MB
    at g0 = 2, over the 2 MiB L2: only 16+ blocks of keys passed the cache filter (each normalizing the 128 rows
    again), 6.3 ms; with the filter relaxed 2 blocks measured 5.7 and the prefill went from 134 to 106 ms, eager's
    108 beside it)."""
    a, b = n.src
    keys = str(b.dtype)
    quad = m.quad_dot and b.op == "permute" and str(a.dtype) == keys == "int8"
    if not quad and not (m.pair_dot and b.op == "permute" and str(a.dtype) == "bfloat16"
                         and keys in ("bfloat16", "int8")):
        return 1.0, False
    other = QUAD_NT if quad else 1.0 if keys == "int8" else PAIR_NT
    tile = S(a.shape)
    if len(tile) < 2:
        return other, False
    rows = tile[-2]
    if len(tile) > 2 and numel(tile[:-2]) > 1:
        # one weight for the batch: the batch folds into the rows where they run on across it
        # (matmul._fold_shared_b): a tile computed in the block is compact; an input's tile where it keeps
        # whole rows of every sequence. Otherwise a loop over the batch, each product in the nt kernels
        fold = len(b.shape) == 2 and (a.op != "iter" or tile[-2] == S(bg.inputs[a.arg[0]].shape)[-2])
        rows = numel(tile[:-1]) if fold else 0
    elems = (elem_of(a.dtype), elem_of(b.dtype))
    tiles = tiles_take(elems, tile[-1], m.tile_dot, m.tile_idot)   # (matmul.on_tiles' rule, the machine's flags)
    tn = rows >= tn_min_rows(elems, tiles) and tile[-1] >= TN_MIN_K
    if tn and tiles:
        return _tile_rate(rows) * (TILE_I8 if quad else 1.0), True
    return ((QUAD_TN if quad else PAIR_TN) if tn and not (quad and tile[-1] % 4) else other), False


def _tile_rate(rows: int) -> float:
    """The rate over the FMA peak of a product of ``rows`` rows on the AMX tiles (TILE_TN, above)."""
    return min(TILE_TN_MAX, TILE_TN * math.sqrt(rows / TILE_TN_ROWS))


def numel(shape: tuple) -> int:
    return math.prod(int(d) for d in shape)


class Dims:
    """Concrete values of (possibly symbolic) dims under ``env``, memoized: the model runs on an sGraph
    and a parameter assignment without building the instantiated graph (that is done for the top-k)."""

    def __init__(self, env: Mapping[str, object] | None = None) -> None:
        self.env = dict(env or {})
        # keyed by id (Dims are interned and live forever): a Dim key makes the dict call Dim.__eq__, a
        # symbolic comparison that raises when undecidable, whenever two hashes collide (hash(-1) ==
        # hash(-2): terms in A^-1 and A^-2 collide)
        self._memo: dict[int, int] = {}

    def dim(self, d: object) -> int:
        if isinstance(d, int):
            return d
        v = self._memo.get(id(d))
        if v is None:
            v = self._memo[id(d)] = int(D.evaluate(d, self.env))  # type: ignore[arg-type]
        return v

    def __call__(self, shape: tuple) -> tuple[int, ...]:
        return tuple(self.dim(d) for d in shape)


@dataclass
class OpCost:
    name: str
    seconds: float
    dram_bytes: int
    flops: int
    blocks: int = 1
    working_set: int = 0
    replication: float = 1.0       # logical input reads / unique input bytes
    memory_s: float = 0.0          # the roofline terms and the overheads that make up ``seconds``
    compute_s: float = 0.0
    overhead_s: float = 0.0


@dataclass
class Estimate:
    seconds: float
    dram_bytes: int
    flops: int
    ops: list[OpCost] = field(default_factory=list)

    @property
    def working_set(self) -> int:
        return max((o.working_set for o in self.ops), default=0)

    @property
    def min_blocks(self) -> int:
        return min((o.blocks for o in self.ops if o.name == "customized"), default=1)


def _simd_eff(n: int, lanes: int) -> float:
    if lanes <= 1 or n <= 0:
        return 1.0
    return n / (lanes * math.ceil(n / lanes))


def _node_flops(n: Node, S: Dims) -> int:
    out = numel(S(n.shape)) if n.shape else 1
    if n.op == "matmul":
        return 2 * out * S.dim(n.src[0].shape[-1])
    if n.op == "acc":
        kind = n.arg[0]
        if kind == "softmax_matmul":
            x, v = S(n.src[0].shape), S(n.src[1].shape)
            return 2 * numel(x[:-1]) * x[-1] * v[-1] + 2 * numel(x)
        return ACC_FLOPS.get(kind, 1) * numel(S(n.src[0].shape))
    if n.op in LAYOUT or n.op in ("input", "output", "result", "customized", "concat"):
        return 0
    src = max((numel(S(x.shape)) for x in n.src), default=out)
    return OP_FLOPS.get(n.op, 1) * max(out, src)


def contiguous_run(tile: tuple, full: tuple) -> int:
    """Elements of the longest contiguous piece of a row-major tile of a tensor of shape ``full``."""
    run = 1
    for t, f in zip(reversed(tile), reversed(full)):
        run *= int(t)
        if int(t) != int(f):
            break
    return max(run, 1)


def itemsize(dtype: object) -> int:
    """Bytes per element of a tensor stored as ``dtype`` (bfloat16 2, int8 1; BYTES when unknown)."""
    return int(getattr(dtype, "itemsize", BYTES))


def _line_bytes(tile: tuple, full: tuple, size: int = BYTES) -> int:
    """Bytes moved for one tile read of elements of ``size`` bytes, rounded to whole cache lines per
    contiguous run."""
    elems = numel(tile)
    run = contiguous_run(tile, full)
    runs = max(1, elems // run)
    return runs * LINE * math.ceil(run * size / LINE)


@functools.lru_cache(maxsize=4096)
def _structure(bg: BlockGraph) -> tuple[tuple[Node, ...], dict[Node, int], dict[Node, bool],
                                       dict[Node, tuple[Node, ...]], dict[Node, list[Node]]]:
    """(nodes in order, consumer counts, streamed, left, users) of a block graph: the same for every
    instantiation, so computed once per block graph (block graphs are immutable and hash by structure)
    instead of once per candidate -- the tuner costs thousands of candidates of a few sGraphs per new
    shape. ``left``: the nodes only ever the left operand of matmuls, with those matmuls."""
    nodes = tuple(bg.nodes)
    consumers: dict[Node, int] = {}
    streamed: dict[Node, bool] = {}   # only ever the right operand of a matmul
    lefts: dict[Node, list[Node]] = {}   # the matmuls a node is the left operand of
    users: dict[Node, list[Node]] = {}
    for n in nodes:
        for pos, s in enumerate(n.src):
            consumers[s] = consumers.get(s, 0) + 1
            users.setdefault(s, []).append(n)
            streamed[s] = streamed.get(s, True) and n.op == "matmul" and pos == 1
            if n.op == "matmul" and pos == 0:
                lefts.setdefault(s, []).append(n)
    left = {s: tuple(v) for s, v in lefts.items() if len(v) == consumers[s]}
    # a tile permuted on its way to a right operand is streamed too: the permute is a strided read (an
    # input view's iterator, a Linear weight [out, in] read as W^T: the code generator's nt kernels stream
    # W's rows). Consumers come after their operands, so one pass in reverse order settles chains.
    for n in reversed(nodes):
        us = users.get(n, [])
        if us and all(u.op == "permute" for u in us):
            streamed[n] = all(streamed.get(u, False) for u in us)
    return nodes, consumers, streamed, left, users


def _grouped(bg: BlockGraph, S: Dims, nodes: tuple[Node, ...], users: dict[Node, list[Node]]
             ) -> list[tuple[Node, list[Node], list[Node]]]:
    """The block's grouped products (``codegen.block.grouped_products``: matmul, chain, factors), none where the
    block has no batched product summed over its batch dim."""
    if not any(n.op == "matmul" for n in nodes) or not any(n.op == "sum" and n.arg[0] % len(n.src[0].shape) == 0
                                                           for n in nodes):
        return []
    return list(grouped_products(list(nodes), users, bg.phase, S, S.dim(bg.forloop) == 1).values())


def _grouped_resident(found: list[tuple[Node, list[Node], list[Node]]], S: Dims) -> tuple[set[Node], int]:
    """(the nodes of the grouped products, whose tiles are never made: ``emit_grouped`` keeps them in registers,
    the bytes their lowering keeps resident beyond the block's tiles, negative where the rows are streamed). Up
    to GROUPED_DOT_ROWS rows: nothing more. More: a block of dequantized keys (GROUPED_BLOCK_BYTES of scratch), the
    rows read in chunks of GROUPED_RESIDENT_K values by the nt kernels, not resident as a whole. Measured need: the
    rows' whole tile and the [Gn, rows, keys] product counted as resident kept every form that does not split the
    rows out of the L2 filter: [128, 2048] x [5632, 2048]^T was tuned to 352 x 2 blocks (each key block dequantized
    twice), 9.3-12.1 ms against 8.1-8.4 for 8-88 blocks of keys alone (Zen 5, 2 threads)."""
    fused: set[Node] = set()
    extra = 0
    for mm, chain, _ in found:
        fused.update((mm, *chain))
        gn, rows, _keys = S(mm.shape)
        if rows <= GROUPED_DOT_ROWS:
            continue
        a = mm.src[0]
        while a.op in LAYOUT and a.src:
            a = a.src[0]
        k = gn * S.dim(mm.src[0].shape[-1])
        size = itemsize(a.dtype)
        extra += GROUPED_BLOCK_BYTES - rows * max(0, k - GROUPED_RESIDENT_K) * size
    return fused, extra


def _grouped_cost(found: list[tuple[Node, list[Node], list[Node]]], fused: set[Node], S: Dims,
                  nodes: tuple[Node, ...]) -> float:
    """Flops-equivalent per block beyond the matmul's own of the block's grouped products (codegen:
    ``matmul.emit_grouped``): up to GROUPED_DOT_ROWS rows (or a factor per row) every row widens each weight
    again, the matmul's flops twice over; more rows dequantize the keys once per block (2 a weight). A per-group
    product the pattern does not cover (an accumulator between over a longer loop) is lowered as products of one
    group each (K = G per call): GROUPED_UNFUSED times its flops' time (measured 3.4-3.8x the model's estimate at
    1 and 8 rows, [*, 2048] x [5632, 2048]^T, G = 32); without it the tuner measured those forms first."""
    flops = 0.0
    if not found:
        return flops
    for mm, _, factors in found:
        gn, rows, keys = S(mm.shape)
        k = gn * S.dim(mm.src[0].shape[-1])
        if rows <= GROUPED_DOT_ROWS or any(S(f.shape)[1] == rows > 1 for f in factors):
            flops += 2.0 * rows * keys * k
        else:
            flops += 2.0 * keys * k
    for n in nodes:   # (``fused``: the grouped products' nodes, _grouped_resident)
        if n.op == "matmul" and len(n.shape) == 3 and n not in fused:
            flops += (GROUPED_UNFUSED - 1) * _node_flops(n, S)
    return flops


def _grouped_paired(found: list[tuple[Node, list[Node], list[Node]]], S: Dims, m: Machine) -> set[Node]:
    """The grouped products ``emit_grouped`` runs in the tn form's ``vdpbf16ps`` groups (mk.tn_kernel_grouped):
    bfloat16 rows against int8 keys, more than GROUPED_DOT_ROWS rows, one factor that does not vary with the row,
    the sizes it takes (``grouped_tn_sizes``), on a machine with ``vdpbf16ps``: PAIR_TN.
    Measured (Zen 5 VM, 2 threads, bfloat16 [128, 2048] x int8 [5632, 2048]^T, groups of 32, through
    prism.optimize): 7.64 ms on float32 FMAs against dequantized blocks, 3.96 ms so (the per-channel form's tn
    3.61, the bfloat16 weight's 3.21). (float32 rows take the tn form's FMAs: rate 1, as before.)"""
    out: set[Node] = set()
    if not m.pair_dot:
        return out
    for mm, _, factors in found:
        gn, rows, _keys = S(mm.shape)
        a, b = mm.src
        g = S.dim(a.shape[-1])
        if (str(a.dtype), str(b.dtype)) == ("bfloat16", "int8") and rows > GROUPED_DOT_ROWS and len(factors) == 1 \
                and S(factors[0].shape)[1] == 1 and grouped_tn_sizes("bf16", g, gn * g):
            out.add(mm)
    return out


def block_cost(bg: BlockGraph, m: Machine, S: Dims | None = None) -> OpCost:
    S = S or Dims()
    grid = [S.dim(g) for g in bg.grid]
    nb = math.prod(grid)
    F = S.dim(bg.forloop)
    T = m.threads
    busiest = math.ceil(nb / T)
    active = min(nb, T)
    nodes, consumers, streamed, left, users = _structure(bg)
    found = _grouped(bg, S, nodes, users)
    fused, grouped_ws = _grouped_resident(found, S)
    paired = _grouped_paired(found, S, m)
    reads: dict[int, int] = {}
    runs: dict[int, int] = {}
    rmw = 0
    flops = 0.0
    eff_flops = 0.0
    ws = 0
    loop_nodes = 0
    for n in nodes:
        trips = F if bg.phase.get(n) == "loop" else 1
        if n.op == "iter":
            idx, _imap, fmap = n.arg
            full, tile = S(bg.inputs[idx].shape), S(n.shape)
            size = itemsize(bg.inputs[idx].dtype)
            trips = F if fmap is not None else 1
            reads[idx] = reads.get(idx, 0) + _line_bytes(tile, full, size) * trips * nb
            # the tiling cuts the tensor into runs; each costs a latency once (re-reads hit the cache)
            runs[idx] = max(runs.get(idx, 0), numel(full) // contiguous_run(tile, full))
            # a right matmul operand is streamed through the registers panel by panel (the code
            # generator's nn kernel reuses each panel from L1 across row groups): not resident; so is
            # the left operand of matrix-vector products W @ x (one output column), which the code
            # generator emits transposed, W's rows as the streamed keys (matmul.emit_matmul)
            matvec = n in left and all(S.dim(mm.shape[-1]) == 1 for mm in left[n])
            if not (streamed.get(n, False) or matvec):
                ws += numel(tile) * size
            continue
        if n.op == "save":
            continue
        if n.op == "acc" and any(bg.phase.get(x) == "loop" for x in n.src):
            trips = F  # an accumulator works every iteration
            rmw += numel(S(n.shape)) * BYTES * 2 * F  # its state is read and written each iteration
        f = _node_flops(n, S) * trips
        flops += f
        inner = max([S.dim(x.shape[-1]) for x in (n, *n.src) if x.shape] or [1])
        rate, tiles = (PAIR_TN, False) if n in paired else _product_form(n, bg, m, S) if n.op == "matmul" \
            else (1.0, False)
        eff_flops += f / _simd_eff(inner, m.simd) / rate
        if trips > 1:
            loop_nodes += 1
        # element-wise nodes with one consumer are fused into it by the code generator (no tile); a product on the
        # AMX tiles streams its output through Ct (_product_form)
        if n not in fused and not tiles and (n.op == "acc" or (n.op not in LAYOUT and not (consumers.get(n, 0) == 1
                                                                            and n.op not in ("matmul",)))):
            ws += numel(S(n.shape)) * BYTES
    ws = max(0, ws + grouped_ws)
    eff_flops += _grouped_cost(found, fused, S, nodes)
    out_bytes = sum(numel(S(s.shape)) * itemsize(s.dtype) * nb * (F if s.arg[2] is not None else 1)
                    for s in bg.outputs)
    unique_total = sum(numel(S(bg.inputs[i].shape)) * itemsize(bg.inputs[i].dtype) for i in reads)
    cache = m.l3 * L3_SHARE + active * m.l2
    resident = min(1.0, cache / max(1, unique_total + out_bytes))   # the share repeated calls find in cache
    per_dram = 1.0 / min(m.bandwidth_1, m.bandwidth / active)       # seconds per byte, one busy thread
    per_cache = m.threads / m.cache_bandwidth
    per_mixed = resident * per_cache + (1 - resident) * per_dram
    dram = 0
    t_bytes = 0.0
    logical = 0
    for idx, r in reads.items():
        unique = numel(S(bg.inputs[idx].shape)) * itemsize(bg.inputs[idx].dtype)
        logical += r
        first, extra = min(r, unique), max(0, r - unique)
        miss = 0.0 if unique <= cache else (unique - cache) / unique   # re-reads of a replicated input
        dram += first + int(extra * miss)
        t_bytes += first * per_mixed + extra * (miss * per_dram + (1 - miss) * per_cache)
    dram += out_bytes
    t_bytes += out_bytes * per_mixed
    reduce_bytes = 0
    for s in bg.outputs:
        slots = math.prod(g for g, e in zip(grid, s.arg[1]) if e is None)
        if slots > 1:  # per-block partial sums, then a parallel reduction pass over the slots
            tile = numel(S(s.shape)) * BYTES * nb
            reduce_bytes += tile + tile // slots
    t_bytes += rmw * nb * per_cache
    t_runs = sum(runs.values()) * (resident * RUN_CACHE_S + (1 - resident) * RUN_DRAM_S)
    mem_s = max(t_bytes, t_runs) * busiest / nb
    comp_s = eff_flops * busiest / m.core_flops
    over = busiest * (BLOCK_S + F * (ITER_S + NODE_S * loop_nodes)) + FORK_S
    red_s = reduce_bytes * per_mixed / active + FORK_S if reduce_bytes else 0.0
    return OpCost("customized", max(mem_s, comp_s) + over + red_s, dram + reduce_bytes, int(flops * nb), nb, ws,
                  logical / unique_total if unique_total else 1.0, mem_s + red_s, comp_s, over)


def _predefined_cost(n: Node, m: Machine, S: Dims) -> OpCost:
    if n.op in ("reshape", "input", "output", "result"):
        return OpCost(n.op, 0.0, 0, 0)
    out = numel(S(n.shape))
    nbytes = sum(numel(S(x.shape)) * itemsize(x.dtype) for x in n.src) + out * itemsize(n.dtype)
    flops = _node_flops(n, S)
    if out >= PARALLEL_MIN:
        sec = max(nbytes / m.bandwidth, flops / m.peak_flops) + FORK_S
    else:
        sec = max(nbytes / m.bandwidth_1, flops / m.core_flops)
    return OpCost(n.op, sec, nbytes, flops)


def estimate(g: Graph, m: Machine, env: Mapping[str, object] | None = None) -> Estimate:
    """The model's time for kernel graph ``g`` on machine ``m`` (see the module docstring): ``g`` concrete, or
    with every symbol (batch dims, grid sizes, F) given a value in ``env``."""
    S = Dims(env)
    missing = sorted(g.symbols() - set(S.env))
    if missing:
        raise ValueError(f"the cost model needs concrete dims; give values for {missing}")
    ops: list[OpCost] = []
    for n in g.nodes:
        if n.op == "customized":
            ops.append(block_cost(n.arg[0], m, S))
        elif n.op not in ("input", "output", "result"):
            ops.append(_predefined_cost(n, m, S))
    return Estimate(sum(o.seconds for o in ops), sum(o.dram_bytes for o in ops), sum(o.flops for o in ops), ops)
