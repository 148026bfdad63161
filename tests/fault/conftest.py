"""Fault tier (``pytest -m fault``): one test per fault of the outside fault suite (docs/reliability.md).

Each test damages something a user can damage -- a cache file, the compiler, the arguments, the budget --
and asserts the precise outcome: a correct result, or a ``PrismError`` that names the value and the fix.
Every test gets its own empty cache directory, so a damaged cache never leaks into another test.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.fault)


@pytest.fixture(autouse=True)
def _fresh_cache(tmp_path: Path) -> Iterator[Path]:
    from prism.api import clear_memory_caches
    from prism.runtime import cache
    cache._LOADED.clear()      # libraries loaded by earlier tests would skip this test's (empty) kernel cache
    clear_memory_caches()
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PRISM_CACHE_DIR", str(tmp_path / "cache"))
        mp.setenv("PRISM_POISON_WS", "1")
        mp.delenv("PRISM_ISA", raising=False)
        yield tmp_path / "cache"
