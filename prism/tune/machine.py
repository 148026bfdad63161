"""What the tuner knows about the machine: cores, caches, SIMD width (read from the OS) and memory
bandwidth and peak FLOP/s (measured once per machine fingerprint and thread count, then cached).

* cores: the CPUs this process may run on (``os.sched_getaffinity``), else ``os.cpu_count()``;
  threads: ``PRISM_NUM_THREADS`` if set, else the cores (what the runtime's OpenMP uses by default).
* caches: ``/sys/devices/system/cpu/cpu0/cache/index*/{level,type,size}`` (data/unified only);
  defaults 32 KiB / 1 MiB / no L3 where sysfs is missing.
* SIMD width: 16 float32 lanes with ``avx512f``, 8 with ``avx2``+``fma``, else 1 (``/proc/cpuinfo``,
  via :mod:`prism.codegen.isa`, so it is the path the code generator takes).
* bandwidth and peak: prism/bench's STREAM-like triad and FMA loop (:class:`prism.tune.native.Limits`),
  with the tuning thread count and with one thread (a block grid smaller than the thread count only gets
  part of the machine's bandwidth), and the triad once more on arrays that fit in the last-level cache.
  On a shared machine other processes only lower these figures: the T-thread bandwidth is at least the
  one-thread one, and the peak at least T times the one-thread peak (T <= usable cores).
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import threading
from dataclasses import dataclass

from prism.codegen import isa as ISA
from prism.codegen.isa import cache_sizes
from prism.host import usable_cores
from prism.runtime import store
from prism.runtime.kernel import num_threads
from prism.tune.contention import CpuMeter, contended
from prism.tune.stats import STATS

# Used only when measuring is impossible or switched off (PRISM_TUNE_MEASURE=0): the 2-core VM the
# project runs on measured 40-76 GB/s (triad, 2 threads) and ~117 GFLOP/s per core (WORKLOADS.md,
# docs/codegen.md); the defaults sit at the low end so the model does not promise too much.
DEFAULT_BANDWIDTH = 40e9
DEFAULT_BANDWIDTH_1 = 25e9
DEFAULT_CORE_FLOPS = 60e9


@dataclass(frozen=True)
class Machine:
    cores: int
    threads: int
    l1: int                      # bytes per core (data)
    l2: int                      # bytes per core
    l3: int                      # bytes, shared (0 if none)
    simd: int                    # float32 lanes of the code generator's SIMD path
    isa: str
    fingerprint: str             # CPU model + flags + cores + caches (hashed)
    bandwidth: float             # bytes/s, `threads` threads
    bandwidth_1: float           # bytes/s, one thread
    cache_bandwidth: float       # bytes/s, `threads` threads, arrays resident in the last-level cache
    peak_flops: float            # flop/s, `threads` threads
    measured: bool               # False: the defaults above
    # bfloat16 x bfloat16 products with vdpbf16ps (codegen.isa.bf16_dot): two products per float32 lane and
    # instruction, so such a product's flops run at up to twice ``peak_flops`` (an FMA loop's; cost.block_cost)
    pair_dot: bool = False
    # int8 x int8 products with vpdpbusd (codegen.isa.i8_dot): 64 int8 products per instruction (cost._product_form)
    quad_dot: bool = False
    # bfloat16 tn products on the AMX tiles (codegen.isa.tile_bf16; cost.TILE_TN)
    tile_dot: bool = False
    # int8 x int8 tn products on the AMX tiles (codegen.isa.tile_int8; cost.TILE_I8)
    tile_idot: bool = False

    @property
    def core_flops(self) -> float:
        return self.peak_flops / max(1, self.threads)

    def bandwidth_for(self, active: int) -> float:
        """Bandwidth reachable with ``active`` busy threads (grows with them until the machine saturates)."""
        return min(self.bandwidth, self.bandwidth_1 * max(1, active))

    def to_json(self) -> dict[str, object]:
        return dataclasses.asdict(self)

    def describe(self) -> str:
        src = "measured" if self.measured else "defaults (not measured)"
        return (f"{self.cores} cores, {self.threads} threads, L1 {self.l1 >> 10} KiB, L2 {self.l2 >> 10} KiB, "
                f"L3 {self.l3 >> 20} MiB, {self.isa} ({self.simd} lanes); bandwidth {self.bandwidth / 1e9:.1f} GB/s "
                f"({self.bandwidth_1 / 1e9:.1f} GB/s one thread, {self.cache_bandwidth / 1e9:.0f} GB/s in cache), "
                f"peak {self.peak_flops / 1e9:.0f} GFLOP/s [{src}]")


def fingerprint(cores: int, caches: dict[int, int]) -> str:
    text = f"{ISA.machine_fingerprint()}|cores={cores}|caches={sorted(caches.items())}"
    return hashlib.sha256(text.encode()).hexdigest()[:16]


MEASURED = ("bandwidth", "bandwidth_1", "cache_bandwidth", "peak_flops")
_MEMO: dict[tuple, Machine] = {}
_LOCK = threading.Lock()


def _measure(threads: int, cores: int, llc: int) -> dict[str, float]:
    from prism.tune.native import TRIAD_REPS, Limits
    lim = Limits.load(threads)
    bw = lim.triad_bandwidth()
    one = dataclasses.replace(lim, threads=1)   # the same arrays, first-touched by the threads above
    bw1 = one.triad_bandwidth() if threads > 1 else bw
    # Other processes only ever lower a figure, and on a shared machine a T-thread run loses whole
    # scheduler quanta; the machine can do at least T times its one-thread peak on T distinct cores.
    peak = max(lim.peak_flops(0.2), one.peak_flops(0.2) * min(threads, cores))
    # the same triad on arrays that stay in the last-level cache (what repeated calls on small weights see),
    # with one thread and with T: cache bandwidth grows with the cores (private L2s, L3 slices)
    lib = getattr(lim, "_lib", None)
    small = max(1 << 14, (llc or 4 << 20) // (3 * 4 * 4))
    cache_bw = 2.0 * bw
    if lib is not None and lib.prism_bench_triad_init(small, threads) == 0:
        best = {}
        for t in sorted({1, threads}):
            lib.prism_bench_triad(2, t)  # warm the lines into the cache
            best[t] = 3 * 4 * small / lib.prism_bench_triad(TRIAD_REPS * 20, t)
        cache_bw = max(best[threads], best[1] * min(threads, cores))
    lim.release()  # nothing of the measurement stays in memory (the arrays are 192 MiB)
    # more threads cannot lower the machine's bandwidth: a lower figure is contention from other processes
    return {"bandwidth": max(bw, bw1), "bandwidth_1": min(bw, bw1), "peak_flops": peak,
            "cache_bandwidth": max(cache_bw, bw, bw1)}


def detect(measure: bool | None = None) -> Machine:
    """This machine (see the module docstring). ``measure=False`` (or ``PRISM_TUNE_MEASURE=0``) uses the
    default bandwidth/peak instead of measuring; measurements are cached on disk per fingerprint."""
    cores = usable_cores()
    threads = num_threads(cores)
    caches = cache_sizes()
    fp = fingerprint(cores, caches)
    if measure is None:
        measure = os.environ.get("PRISM_TUNE_MEASURE", "1").strip() != "0"
    isa = ISA.detect()
    key = (fp, threads, measure)  # one measurement per process even when the cache dir changes
    with _LOCK:
        m = _MEMO.get(key)
        if m is not None:
            return m
        base = dict(cores=cores, threads=threads, l1=caches[1], l2=caches[2], l3=caches[3], simd=isa.width,
                    isa=isa.name, fingerprint=fp, pair_dot=ISA.bf16_dot(isa), quad_dot=ISA.i8_dot(isa),
                    tile_dot=ISA.tile_bf16(isa), tile_idot=ISA.tile_int8(isa))
        if not measure:
            m = Machine(**base, bandwidth=DEFAULT_BANDWIDTH, bandwidth_1=DEFAULT_BANDWIDTH_1,
                        cache_bandwidth=2 * DEFAULT_BANDWIDTH, peak_flops=DEFAULT_CORE_FLOPS * threads, measured=False)
        else:
            path = store.root() / "machine" / f"{fp}-t{threads}-v2.json"  # v2: measured without contention
            got = store.load(path, "machine")
            p = got.payload
            if p is None or not all(isinstance(p.get(k), (int, float)) and p[k] > 0 for k in MEASURED):
                if got.corrupt or p is not None:
                    STATS.rebuilds += 1
                STATS.machine_measurements += 1
                meter = CpuMeter()
                meter.start()
                p = _measure(threads, cores, caches[3])
                busy = meter.stop()
                p["contention"] = busy
                if contended(busy):
                    # other processes lowered these figures: use them in this process, measure again next time
                    STATS.contended_machine += 1
                else:
                    store.save(path, "machine", p)
            m = Machine(**base, **{k: float(p[k]) for k in MEASURED}, measured=True)
        _MEMO[key] = m
        return m
