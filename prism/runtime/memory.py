"""Huge pages for the weights Prism's kernels stream.

A decode step reads every weight once; at batch 1 it runs at the memory bandwidth, and part of that cost
is address translation. On the 2-vCPU Zen 4 VM of docs/bench.md (nested paging: a 4 KB TLB miss walks two
page tables) the same stream of 830 MB of bfloat16 weights through Prism's GEMV micro-kernel, alternated
rep by rep in one process, took 17.7 ms from 4 KB pages and 15.8 ms from 2 MB pages (another run 18.45
and 18.45: the gain moves with the host's phase, 0-10 %); llama.cpp reads its weights through ``mmap`` of
the GGUF file, whose page cache holds large folios, and decoded 10-17 % faster that way than from its own
``malloc``'d copy (``--load-mode none``) in the same minutes.

PyTorch allocates tensors in 4 KB pages unless ``THP_MEM_ALLOC_ENABLE=1`` is set before they are made, so
Prism asks the kernel to move module state its pieces read into huge pages in place: ``madvise`` with
``MADV_COLLAPSE`` (Linux 6.1) over the 2 MB-aligned part of each tensor's storage. Contents, addresses and
the process's memory use do not change (only whole pages inside the storage are collapsed); what it costs
is a copy per huge page when the memory is not yet in huge pages, paid once, on the first call that plans a
piece reading the tensor (1.6-1.9 s per GB on that VM, most of it the kernel finding free 2 MB frames).
Memory already in huge pages costs a system call. Where the kernel cannot (an older kernel, THP
``never``, a file mapping it will not collapse) the tensor stays as it is: nothing else depends on it.

Off by default: ``Options(huge_pages=True)`` (``prism.frontend.compiler``) turns it on, ``PRISM_HUGE_PAGES=0``
off for the process; :data:`STATS` counts what was done.
"""

from __future__ import annotations

import ctypes
import errno
import logging
import os
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any

log = logging.getLogger("prism")

MADV_COLLAPSE = 25
# tensors below this size are not worth a system call (and hold at most one aligned huge page)
MIN_BYTES = 4 << 20


@dataclass
class HugeStats:
    bytes: int = 0        # bytes madvise put in huge pages (or found there already)
    seconds: float = 0.0  # time spent in madvise
    tensors: int = 0      # storages madvise accepted
    failed: int = 0       # storages the kernel refused (left in their pages)
    unsupported: str = ""  # why huge pages are off for this process, if they are


STATS = HugeStats()
_LOCK = threading.Lock()
_DONE: set[tuple[int, int]] = set()   # (address, size) of storages handled
_MADVISE: Any = None
_PAGE: int | None = None


def _setup() -> int:
    """The huge page size, or 0 where collapsing is unavailable (the reason in STATS.unsupported)."""
    global _MADVISE, _PAGE
    if _PAGE is not None:
        return _PAGE
    _PAGE = 0
    if not sys.platform.startswith("linux"):
        STATS.unsupported = f"not Linux ({sys.platform})"
        return 0
    try:
        with open("/sys/kernel/mm/transparent_hugepage/enabled") as f:
            mode = f.read()
        if "[never]" in mode:
            STATS.unsupported = "transparent huge pages are off ([never])"
            return 0
        with open("/sys/kernel/mm/transparent_hugepage/hpage_pmd_size") as f:
            page = int(f.read())
        libc = ctypes.CDLL(None, use_errno=True)
        fn = libc.madvise
        fn.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        fn.restype = ctypes.c_int
    except (OSError, ValueError, AttributeError) as e:
        STATS.unsupported = f"no transparent huge pages here ({type(e).__name__}: {e})"
        return 0
    _MADVISE, _PAGE = fn, page
    return page


def collapse(t: Any) -> int:
    """Move the storage of tensor ``t`` into huge pages, once per storage; returns the bytes collapsed now."""
    global _PAGE
    if os.environ.get("PRISM_HUGE_PAGES", "1") == "0":
        return 0
    try:
        storage = t.untyped_storage()
        start, size = storage.data_ptr(), storage.nbytes()
    except (AttributeError, RuntimeError):  # not a plain CPU tensor (a subclass, a fake tensor)
        return 0
    if size < MIN_BYTES or t.device.type != "cpu":
        return 0
    with _LOCK:
        page = _setup()
        if not page or (start, size) in _DONE:
            return 0
        _DONE.add((start, size))
        lo, hi = -(-start // page) * page, (start + size) // page * page
        if hi <= lo:
            return 0
        t0 = time.perf_counter()
        rc = _MADVISE(lo, hi - lo, MADV_COLLAPSE)
        err = ctypes.get_errno() if rc else 0
        STATS.seconds += time.perf_counter() - t0
        if rc == 0:
            STATS.bytes += hi - lo
            STATS.tensors += 1
            return hi - lo
        if err == errno.EINVAL and not STATS.bytes:  # the kernel has no MADV_COLLAPSE (before Linux 6.1)
            STATS.unsupported = "the kernel has no MADV_COLLAPSE (Linux 6.1 and later)"
            _PAGE = 0
            log.info("prism: weights stay in their pages: %s", STATS.unsupported)
        else:
            STATS.failed += 1
            log.debug("prism: MADV_COLLAPSE of %d bytes failed: %s", hi - lo, os.strerror(err))
        return 0
