"""Search: symbolic generation of fused implementations (sGraphs), pruning, ranking and verification.

``prism.search(graph, limits=prism.search.Limits(...))`` returns a :class:`SearchResult` of verified
candidates, best first, with statistics and a typed stop reason. See docs/search.md.

This package is itself callable (``prism.search(graph)`` is ``prism.search.search(graph)``), so the
top-level name serves as the function without shadowing the package: ``prism.search.Limits`` and
``import prism.search as S`` keep working.
"""


from prism._callable import make_callable
from prism.search.driver import Candidate, SearchResult, search
from prism.search.executor import Executor, InlineExecutor, LocalProcessExecutor
from prism.search.space import Limits
from prism.search.stats import Stats, StopReason

__all__ = ["Candidate", "Executor", "InlineExecutor", "Limits", "LocalProcessExecutor", "SearchResult", "Stats",
           "StopReason", "search"]


make_callable(__name__, search)
