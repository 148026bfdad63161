"""The corpus of `prism bench --corpus`: at least 40 programs in the six categories, each builds, and its
eager float32 result matches the float64 result within the category's tolerance (so the bench's check is
meaningful); the relative-error measure rejects NaN/inf mismatches."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

from prism.bench.corpus import TOL, programs  # noqa: E402
from prism.bench.corpus_run import Row, _reference, geomean, markdown, rel_error, summary  # noqa: E402

pytestmark = pytest.mark.unit

PROGRAMS = programs()


def test_corpus_size_and_categories() -> None:
    assert len(PROGRAMS) >= 40
    assert {p.category for p in PROGRAMS} == set(TOL)
    assert programs("linear_") and all("linear_" in p.name for p in programs("linear_"))


@pytest.mark.parametrize("p", PROGRAMS, ids=[p.name for p in PROGRAMS])
def test_program_eager_matches_float64(p) -> None:
    fn, inputs = p.make()
    with torch.inference_mode():
        got = fn(*inputs)
    assert rel_error(got, _reference(fn, inputs)) <= p.tol


def test_rel_error_checks_non_finite_positions() -> None:
    r = torch.tensor([1.0, float("nan"), float("-inf")])
    assert rel_error(r.clone(), r) == 0.0
    assert rel_error(torch.tensor([1.0, 0.0, float("-inf")]), r) == math.inf
    assert rel_error(torch.tensor([1.5, float("nan"), float("-inf")]), r) == pytest.approx(0.5)


def test_summary_and_table() -> None:
    a = Row("a", "gemm", 1e-4, us={"eager": 10.0, "compile": 20.0, "prism": 5.0},
            status={"eager": "ok", "compile": "ok", "prism": "ok"})
    b = Row("b", "loss", 1e-4, us={"eager": 10.0, "compile": 10.0, "prism": 20.0},
            status={"eager": "ok", "compile": "ok", "prism": "ok"}, fallbacks=["x: y"])
    s = summary([a, b])
    assert s["geomean_vs_eager"] == pytest.approx(1.0) and s["without_fallback"] == 1
    assert s["at_or_above_eager"] == 1 and geomean([]) is None
    text = markdown([a, b], {"threads": 2})
    assert "| a | gemm |" in text and "fallback: x: y" in text


def test_summary_counts_the_dynamo_capture_separately() -> None:
    a = Row("a", "gemm", 1e-4, us={"eager": 10.0, "compile": 20.0, "prism": 40.0, "prism-dynamo": 5.0},
            status={"eager": "ok", "compile": "ok", "prism": "ok", "prism-dynamo": "ok"})
    b = Row("b", "loss", 1e-4, us={"eager": 10.0, "compile": 10.0, "prism": 20.0, "prism-dynamo": 1.0},
            status={"eager": "ok", "compile": "ok", "prism": "ok", "prism-dynamo": "failed: x"})
    a.dynamo_fallbacks = ["aten.expand_as.default: not supported by Prism"]
    a.capture, b.capture = "export", "dynamo"
    s = summary([a, b])
    assert s["without_fallback"] == 2 and s["dynamo"]["without_fallback"] == 0
    assert s["at_or_above_eager"] == 0 and s["geomean_vs_eager"] == pytest.approx((0.25 * 0.5) ** 0.5)
    x = s["dynamo"]
    assert x["prism_ok"] == 1 and x["compared"] == 1 and x["geomean_vs_eager"] == pytest.approx(2.0)
    assert a.speedup("compile", "prism-dynamo") == pytest.approx(4.0) and b.speedup("eager", "prism-dynamo") is None
    text = markdown([a, b], {"threads": 2})
    assert "| export | 5.0 | 2.00x | 4.00x |" in text and "prism-dynamo failed: x" in text
    assert "prism-dynamo fallback: aten.expand_as.default" in text and s["exported"] == 1
