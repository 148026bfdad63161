"""CPU tier: every test here compiles and runs generated C.

The whole run uses a fresh kernel cache (``PRISM_TEST_CACHE_DIR`` reuses one across runs) and
poisons every new workspace with NaN, so a generated kernel that reads scratch it never wrote fails.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest


def _session_cache(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The run's kernel cache. Under pytest-xdist every worker is a session of its own: they share one
    directory beside their temporary roots (the cache is safe for concurrent processes), so the tiny
    Llama that one file searches and tunes serves the next file's shapes on whichever worker runs it
    (a per-worker cache cost the suite ~4 minutes of CPU time)."""
    if os.environ.get("PRISM_TEST_CACHE_DIR"):
        return os.environ["PRISM_TEST_CACHE_DIR"]
    if os.environ.get("PYTEST_XDIST_WORKER"):
        shared = tmp_path_factory.getbasetemp().parent / "prism-cache-shared"
        shared.mkdir(exist_ok=True)
        return str(shared)
    return str(tmp_path_factory.mktemp("prism-cache"))


@pytest.fixture(scope="session", autouse=True)
def _prism_cpu_env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    cache = _session_cache(tmp_path_factory)
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
