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


def test_the_ir_imports_no_later_stage() -> None:
    """The IR is the bottom of the pipeline's data: no module of prism.ir imports (even lazily) the
    interpreters, the search, the verifier, the tuner, the code generator or the runtime. The reference
    interpreter registers itself behind Graph.evaluate instead (there was an ir <-> reference cycle)."""
    import ast
    from pathlib import Path

    import prism
    later = ("prism.reference", "prism.search", "prism.verify", "prism.tune", "prism.codegen", "prism.runtime",
             "prism.frontend", "prism.bench", "prism.api")
    bad = []
    for path in sorted((Path(prism.__file__).parent / "ir").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            bad += [f"{path.name}: {n}" for n in names if n.startswith(later)]
    assert bad == []


def test_prism_verify_is_the_package_and_the_function() -> None:
    """``prism.verify(candidate, reference)`` is the verifier's entry point, and ``prism.verify`` is also the
    package: ``import prism.verify.egraph as E`` works (a function exported under the package's name made
    that an AttributeError)."""
    code = ("import prism, prism.verify.egraph as E, prism.verify.api as A; "
            "g = prism.Graph(); x = g.input('x', (4, 8)); g.output(g.exp(x), 'y'); "
            "r = prism.verify(g, g); print(E.__name__, callable(E.prove), isinstance(r, A.VerifyResult), r.verified)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert r.stdout.split() == ["prism.verify.egraph", "True", "True", "True"], r.stdout + r.stderr
