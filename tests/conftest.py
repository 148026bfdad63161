"""Shared pytest configuration: a deterministic RNG and a fast hypothesis profile."""

from __future__ import annotations

import os

# OpenMP threads that spin while waiting turn any background load (or torch's and Prism's thread pools
# alternating in one process) into 10-100x slowdowns; tests measure correctness, not speed, so they wait
# passively. Must be set before an OpenMP runtime is loaded.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

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
