"""Search: symbolic generation of fused implementations (sGraphs), pruning, ranking and verification.

``prism.search(graph, limits=prism.search.Limits(...))`` returns a :class:`SearchResult` of verified
candidates, best first, with statistics and a typed stop reason. See docs/search.md.

This package is itself callable (``prism.search(graph)`` is ``prism.search.search(graph)``), so the
top-level name serves as the function without shadowing the package: ``prism.search.Limits`` and
``import prism.search as S`` keep working.
"""

import sys
import types

from prism.search.driver import Candidate, SearchResult, search
from prism.search.executor import Executor, InlineExecutor, LocalProcessExecutor
from prism.search.space import Limits
from prism.search.stats import Stats, StopReason

__all__ = ["Candidate", "Executor", "InlineExecutor", "Limits", "LocalProcessExecutor", "SearchResult", "Stats",
           "StopReason", "search"]


class _CallableModule(types.ModuleType):
    def __call__(self, *args: object, **kwargs: object) -> SearchResult:
        return search(*args, **kwargs)  # type: ignore[arg-type]


sys.modules[__name__].__class__ = _CallableModule
