"""Programs that read one input two ways (a Gram matrix ``x @ x.T``, self-attention scores) are searched to
the end.

With a permute the identity in the size-free abstraction, ``x`` and ``x.T`` were one atom: every product of
``x`` tiles passed the sub-expression test and the block search of ``sum(relu(x @ x.T), -1)`` on [64, 64] ran
past 881k states and its 60 s limit. A permute of an input is now an atom of its own
(``prism.search.abstract.permuted_atom``), and a customized operator may take an input the target multiplies
by its own permutation twice (``KernelSearch.twice``): without that, ``softmax(x @ x.T / 8)`` could only be
expressed by a predefined permute and a second kernel, and its search spent its 60 s limit (1.2M block
states); only the later copy is read permuted (the copies are symmetric). The state limits below are what the
old search could not finish within (measured: 12k and 22k states now).
"""

from __future__ import annotations

import pytest

from prism.ir import Graph
from prism.search import Limits, search
from prism.search.driver import StopReason

pytestmark = pytest.mark.cpu


def _exhausts(g: Graph, state_limit: int) -> None:
    r = search(g, Limits(state_limit=state_limit, time_limit=600.0), cache=False)
    assert r.stop_reason is StopReason.EXHAUSTED, (r.stop_reason, r.stats.states)
    assert r.candidates and all(c.verdict.ok for c in r.candidates)   # (verified: proof + numeric check)


def test_gram_matrix_search_exhausts_within_the_state_limit() -> None:
    g = Graph("gram")
    x = g.input("x", (64, 64))
    g.output(g.sum(g.relu(g.matmul(x, g.permute(x, (1, 0)))), -1), "o")
    _exhausts(g, 300_000)


def test_self_attention_scores_search_exhausts_within_the_state_limit() -> None:
    g = Graph("self-attention scores")
    x = g.input("x", (64, 64))
    g.output(g.softmax(g.mul_scalar(g.matmul(x, g.permute(x, (1, 0))), 0.125), -1), "o")
    _exhausts(g, 400_000)


def test_an_input_read_only_transposed_is_still_a_search_input() -> None:
    """The target holds only ``k``'s permuted atom; the search still starts from ``k`` (its class is added),
    and finds the fused kernel (as grouped-query attention reads its keys)."""
    g = Graph("qkt")
    q = g.input("q", (2, 4, 12, 32))
    k = g.input("k", (2, 1, 20, 32))
    g.output(g.softmax(g.matmul(q, g.permute(k, (0, 1, 3, 2))), -1), "o")
    r = search(g, Limits(time_limit=120.0), cache=False)
    assert r.stop_reason is StopReason.EXHAUSTED
    assert r.candidates and all(c.verdict.ok for c in r.candidates)
