"""Stage boundaries measured by the import graph (issue 13, item 3)."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytestmark = pytest.mark.unit


def _loaded_after(statement: str, prefix: str) -> list[str]:
    code = f"import sys; {statement}; print('\\n'.join(sorted(m for m in sys.modules if m.startswith({prefix!r}))))"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    return r.stdout.split()


def test_import_prism_does_not_load_the_bench() -> None:
    """The tuner and the API need the contention meter and the machine probes, which live in prism.tune;
    the bench (its baselines, JAX/ORT adapters, reports) loads only when asked for."""
    assert _loaded_after("import prism", "prism.bench") == []
    assert "prism.bench.run" in _loaded_after("import prism.bench", "prism.bench")
