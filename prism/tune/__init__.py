"""Instantiation and auto-tuning of verified sGraphs (DESIGN.md §8). See docs/tune.md."""

from prism.tune.candidates import Instance, Instantiation, instantiate, symbol_values
from prism.tune.cost import Estimate, estimate
from prism.tune.machine import Machine, detect
from prism.tune.stats import STATS, TuneStats, reset_stats
from prism.tune.tuner import NoInstanceError, Row, Tuned, TuneResult, TuningError, spearman, tune

__all__ = ["STATS", "Estimate", "Instance", "Instantiation", "Machine", "NoInstanceError", "Row", "TuneResult",
           "TuneStats", "Tuned", "TuningError", "detect", "estimate", "instantiate", "reset_stats", "spearman",
           "symbol_values", "tune"]
