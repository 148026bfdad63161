"""CPU tier: every test here compiles and runs generated C.

The whole session uses a fresh kernel cache (``PRISM_TEST_CACHE_DIR`` reuses one across runs) and
poisons every new workspace with NaN, so a generated kernel that reads scratch it never wrote fails.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest


@pytest.fixture(scope="session", autouse=True)
def _prism_cpu_env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    cache = os.environ.get("PRISM_TEST_CACHE_DIR") or str(tmp_path_factory.mktemp("prism-cache"))
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PRISM_CACHE_DIR", cache)
        mp.setenv("PRISM_POISON_WS", "1")
        mp.delenv("PRISM_ISA", raising=False)
        yield


@pytest.fixture
def fresh_dynamo() -> Iterator[None]:
    """Dynamo's compiled graphs and Prism's graph reports dropped before and after the test (frontend tests
    assert on the reports of their own graphs)."""
    import torch

    from prism.frontend import clear_reports
    torch._dynamo.reset()
    clear_reports()
    yield
    torch._dynamo.reset()
