"""Compiling generated C (disk cache) and calling it with numpy arrays or torch tensors."""

from prism.runtime.cache import STATS, CacheStats, cache_dir, reset_stats
from prism.runtime.kernel import Kernel, Variant, compile

__all__ = ["STATS", "CacheStats", "Kernel", "Variant", "cache_dir", "compile", "reset_stats"]
