"""Shared pytest configuration: a deterministic RNG and a fast hypothesis profile."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

# OpenMP threads that spin while waiting turn any background load (or torch's and Prism's thread pools
# alternating in one process) into 10-100x slowdowns; tests measure correctness, not speed, so they wait
# passively. Must be set before an OpenMP runtime is loaded.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
# The tuner does not persist measurements taken while other processes load the machine; cache tests must
# not depend on how busy the test machine is (tests/unit/test_tune_contention.py tests that guard itself).
os.environ.setdefault("PRISM_TUNE_CONTENTION_LIMIT", "inf")

import numpy as np
import pytest
from hypothesis import HealthCheck, settings

# Deterministic and bounded: the machine has 2 shared cores and tests must not assert on timing.
settings.register_profile("prism", max_examples=60, deadline=None, derandomize=True, database=None,
                          suppress_health_check=[HealthCheck.too_slow])
# `pytest --hypothesis-profile=thorough` for a longer bug hunt (not part of the unit tier's budget).
settings.register_profile("thorough", parent=settings.get_profile("prism"), max_examples=3000, derandomize=False)
settings.load_profile("prism")


@pytest.fixture
def rng() -> np.random.Generator:
    """A fresh seeded generator per test, so failures reproduce."""
    return np.random.default_rng(1234)


@pytest.fixture
def w1_without_rms() -> Callable[[int, int], Any]:
    """A builder of a WRONG implementation of W1 (the normalization dropped) at X [n, d], W [d, m]."""
    import prism
    from prism.ir.block import BlockBuilder

    def build(d: int, m: int) -> prism.Graph:
        g = prism.Graph("wrong")
        X, W = g.input("X", ("n", d)), g.input("W", (d, m))
        bb = BlockBuilder(grid=("G",), forloop="F", inputs=[X, W])
        acc = bb.accumulate("sum", bb.matmul(bb.iter(0, imap=(None,), fmap=1), bb.iter(1, imap=(1,), fmap=0)))
        bb.save(acc, omap=(1,))
        (y,) = g.customized(bb.build(), [X, W])
        g.output(y, "Y")
        return g
    return build
