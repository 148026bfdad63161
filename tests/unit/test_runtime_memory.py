"""Huge pages for streamed weights (prism/runtime/memory.py): contents never change, each storage is handled
once, small tensors and the off switch cost nothing, and a kernel without MADV_COLLAPSE turns it off."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from prism.runtime import memory  # noqa: E402

pytestmark = pytest.mark.unit


def test_collapse_keeps_the_contents_and_handles_a_storage_once() -> None:
    t = torch.randn(3 << 20)  # 12 MiB: at least five whole 2 MiB pages
    ref = t.clone()
    before = memory.STATS.bytes
    got = memory.collapse(t)
    assert torch.equal(t, ref)
    if memory.STATS.unsupported:  # e.g. a kernel before Linux 6.1, THP off: nothing was done
        assert got == 0
    else:
        assert got == 0 or got % (2 << 20) == 0
        assert memory.STATS.bytes == before + got
        # whole huge pages inside the storage only
        assert got <= t.untyped_storage().nbytes()
    assert memory.collapse(t) == 0   # the same storage again: nothing to do
    assert torch.equal(t, ref)


def test_small_tensors_and_the_switch_are_left_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    assert memory.collapse(torch.randn(1000)) == 0
    monkeypatch.setenv("PRISM_HUGE_PAGES", "0")
    assert memory.collapse(torch.randn(3 << 20)) == 0


def test_a_kernel_without_madv_collapse_turns_it_off(monkeypatch: pytest.MonkeyPatch) -> None:
    import ctypes
    import errno

    if not memory._setup():
        pytest.skip(f"huge pages unavailable here: {memory.STATS.unsupported}")

    def einval(addr: int, size: int, advice: int) -> int:
        ctypes.set_errno(errno.EINVAL)
        return -1

    monkeypatch.setattr(memory, "_MADVISE", einval)
    monkeypatch.setattr(memory, "STATS", memory.HugeStats())
    monkeypatch.setattr(memory, "_DONE", set())   # an earlier test's storage may have had this address
    page = memory._PAGE
    try:
        assert memory.collapse(torch.randn(3 << 20)) == 0
        assert "MADV_COLLAPSE" in memory.STATS.unsupported and memory._PAGE == 0
        assert memory.collapse(torch.randn(3 << 20)) == 0   # not asked again
    finally:
        memory._PAGE = page
