"""The machine's SIMD instruction set, as data the code generator reads.

Detection reads the CPU flags (``/proc/cpuinfo``); ``PRISM_ISA=avx512|avx2|portable`` overrides it
(used by the tests to exercise every path on one machine). A path is only chosen when the machine can
run it: asking for AVX-512 on an AVX2 machine is an error, not a crash at call time.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from pathlib import Path

from prism.errors import UnsupportedError


@dataclass(frozen=True)
class ISA:
    """One SIMD path: ``width`` float32 lanes per vector register, ``nregs`` vector registers."""

    name: str
    width: int
    nregs: int
    vtype: str
    required_flags: tuple[str, ...]

    @property
    def vector(self) -> bool:
        return self.width > 1


AVX512 = ISA("avx512", 16, 32, "__m512", ("avx512f",))
AVX2 = ISA("avx2", 8, 16, "__m256", ("avx2", "fma"))
PORTABLE = ISA("portable", 1, 16, "float", ())
ISAS: dict[str, ISA] = {i.name: i for i in (AVX512, AVX2, PORTABLE)}


_SYSFS = Path("/sys/devices/system/cpu/cpu0/cache")


def _size(text: str) -> int:
    t = text.strip().upper()
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(t[-1:], 1)
    return int(t.rstrip("KMG")) * mult


def cache_sizes(base: Path = _SYSFS) -> dict[int, int]:
    """{level: bytes} of the data/unified caches of cpu0 (missing levels: 32 KiB L1, 1 MiB L2, no L3)."""
    sizes = {1: 32 << 10, 2: 1 << 20, 3: 0}
    try:
        for idx in sorted(base.glob("index*")):
            level = int((idx / "level").read_text())
            if (idx / "type").read_text().strip() == "Instruction" or level not in sizes:
                continue
            sizes[level] = _size((idx / "size").read_text())
    except (OSError, ValueError):
        pass
    return sizes


@functools.cache
def l1d_bytes() -> int:
    """This machine's L1 data cache per core (32 KiB where sysfs does not say)."""
    return cache_sizes()[1]


@functools.cache
def l2_bytes() -> int:
    """This machine's L2 cache per core (1 MiB where sysfs does not say)."""
    return cache_sizes()[2]


@functools.cache
def cpu_flags() -> frozenset[str]:
    """The CPU feature flags of this machine (empty when /proc/cpuinfo is unavailable)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


def machine_fingerprint() -> str:
    """What a ``-march=native`` binary depends on: the CPU model and its flags (part of the cache key)."""
    model = ""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return model + "|" + " ".join(sorted(cpu_flags()))


def detect() -> ISA:
    """The best path this machine supports, or the one named by ``PRISM_ISA``."""
    flags = cpu_flags()
    want = os.environ.get("PRISM_ISA", "").strip().lower()
    if want:
        isa = ISAS.get(want)
        if isa is None:
            raise UnsupportedError(f"PRISM_ISA={want!r} is not a known SIMD path; use one of {sorted(ISAS)}")
        missing = [f for f in isa.required_flags if f not in flags]
        if missing:
            raise UnsupportedError(f"PRISM_ISA={want!r} needs CPU flags {missing} that this machine lacks; "
                                   f"unset PRISM_ISA or choose 'portable'")
        return isa
    for isa in (AVX512, AVX2):
        if all(f in flags for f in isa.required_flags):
            return isa
    return PORTABLE


def get(name: str | ISA | None) -> ISA:
    if isinstance(name, ISA):
        return name
    if name is None:
        return detect()
    try:
        return ISAS[name]
    except KeyError:
        raise UnsupportedError(f"unknown SIMD path {name!r}; use one of {sorted(ISAS)}") from None


def bf16_dot(isa: ISA) -> bool:
    """Whether the kernels of ``isa`` may use ``vdpbf16ps`` (AVX512_BF16: 32 bfloat16 products summed in
    pairs into 16 float32 lanes per instruction) for bfloat16 x bfloat16 contractions. ``PRISM_BF16_DOT=0``
    turns it off (the tests run both paths on a machine that has it)."""
    if isa.name != "avx512" or os.environ.get("PRISM_BF16_DOT", "").strip() == "0":
        return False
    return "avx512_bf16" in cpu_flags()


def i8_dot(isa: ISA) -> bool:
    """Whether the kernels of ``isa`` may use ``vpdpbusd`` (AVX512_VNNI: 64 u8 x s8 products summed in fours into
    16 int32 lanes per instruction) for int8 x int8 contractions. ``PRISM_I8_DOT=0`` turns it off (the tests run
    both paths on a machine that has it)."""
    if isa.name != "avx512" or os.environ.get("PRISM_I8_DOT", "").strip() == "0":
        return False
    return "avx512_vnni" in cpu_flags()


_ARCH_REQ_XCOMP_PERM = 0x1023   # arch_prctl: ask for an extended state component's permission (Linux 5.16+)
_XFEATURE_XTILEDATA = 18        # the AMX tile data


@functools.cache
def _amx_permitted() -> bool:
    """Whether this process may use the AMX tile registers: Linux grants them per process, on request
    (``arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)``); a tile instruction without it is SIGILL. Asked
    once per process; the grant holds for every thread of the process, those started later included."""
    import ctypes
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.syscall(158, _ARCH_REQ_XCOMP_PERM, _XFEATURE_XTILEDATA) == 0   # 158: SYS_arch_prctl (x86-64)
    except (OSError, AttributeError):
        return False


def tile_bf16(isa: ISA) -> bool:
    """Whether the kernels of ``isa`` may use the AMX tiles for bfloat16 x bfloat16 contractions (``tdpbf16ps``:
    a 16 x 32 by 32 x 16 product summed into 16 x 16 float32 per instruction, 16 times ``vdpbf16ps``'s products;
    mk.tn_kernel_amx). Needs AMX_TILE and AMX_BF16 in the CPU flags, the AVX-512 path, the kernel's grant
    (:func:`_amx_permitted`). ``PRISM_AMX=0`` turns it off (the tests run both paths on a machine that has it)."""
    return _tiles(isa, {"amx_tile", "amx_bf16", "avx512_bf16"})


def tile_int8(isa: ISA) -> bool:
    """Whether the kernels of ``isa`` may use the AMX tiles for int8 x int8 contractions (``tdpbssd``: a 16 x 64 by
    64 x 16 product of signed bytes summed into 16 x 16 int32 per instruction; mk.tn_kernel_amx_i8, the W8A8 form
    over many rows). Needs AMX_TILE and AMX_INT8 in the CPU flags, AVX512_VNNI (the kernels of fewer rows), the
    AVX-512 path and the kernel's grant; ``PRISM_AMX=0`` turns it off with the bfloat16 tiles."""
    return _tiles(isa, {"amx_tile", "amx_int8", "avx512_vnni"})


def _tiles(isa: ISA, flags: set[str]) -> bool:
    """The AVX-512 path, not turned off by ``PRISM_AMX=0``, these CPU flags and the kernel's grant."""
    if isa.name != "avx512" or os.environ.get("PRISM_AMX", "").strip() == "0":
        return False
    return flags <= cpu_flags() and _amx_permitted()
