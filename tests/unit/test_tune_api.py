"""prism.superoptimize without compiling: what it accepts from the search, and its errors."""

from __future__ import annotations

import sys
from collections.abc import Callable

import numpy as np
import pytest

import prism
from prism.api import Implementation, NoVerifiedKernelError, Options, SuperKernel, _verified_implementations
from prism.errors import InputError, PrismError
from prism.search import Candidate, Limits, SearchResult, Stats, StopReason
from prism.search.cost import CostReport
from prism.search.gate import Verdict
from prism.tune import STATS, reset_stats
from prism.workloads import WORKLOADS

pytestmark = pytest.mark.unit
Mutant = Callable[[int, int], prism.Graph]

SHAPE = {"n": 8, "d": 64, "m": 128}


def _program() -> prism.Graph:
    return WORKLOADS["W1"].program(SHAPE)


def _candidate(g: prism.Graph, ok: bool, how: str) -> Candidate:
    return Candidate(g, CostReport(1.0, 0, 0, 1, 0), Verdict(ok, how, "test double"), "test double")


def _result(cands: list[Candidate], stop: StopReason = StopReason.EXHAUSTED) -> SearchResult:
    return SearchResult(_program(), "symbolic", Limits(), stop, cands, Stats())


def test_numeric_only_candidates_are_reverified_and_wrong_ones_dropped(w1_without_rms: Mutant) -> None:
    reset_stats()
    right = WORKLOADS["W1"].hand_written(SHAPE)
    res = _result([_candidate(w1_without_rms(64, 128), True, "numeric-only"), _candidate(right, True, "numeric-only"),
                   _candidate(right, False, "formal+numeric")])
    impls = _verified_implementations(res, _program(), None)
    assert STATS.reverifications == 2
    assert len(impls) == 1 and impls[0].graph is right and impls[0].how == "formal+numeric"
    assert "proved" in impls[0].proof


def test_a_missing_search_module_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "prism.search", None)
    with pytest.raises(PrismError, match="needs the search"):
        prism.superoptimize(_program())


def test_nothing_verified_raises_with_the_stop_reason(w1_without_rms: Mutant, monkeypatch: pytest.MonkeyPatch,
                                                       tmp_path) -> None:  # type: ignore[no-untyped-def]
    import prism.search as S
    monkeypatch.setenv("PRISM_CACHE_DIR", str(tmp_path))
    wrong = _candidate(w1_without_rms(64, 128), True, "numeric-only")
    monkeypatch.setattr(S, "search", lambda *a, **k: _result([wrong], StopReason.TIME_LIMIT))
    with pytest.raises(NoVerifiedKernelError, match="stop reason: time_limit"):
        prism.superoptimize(_program())


def test_bad_calls_fail_before_any_tuning() -> None:
    reset_stats()
    impl = Implementation(0, WORKLOADS["W1"].hand_written(SHAPE), "formal+numeric", "test double", "test double")
    k = SuperKernel(_program(), _result([]), [impl], Options())
    x = np.zeros((8, 64), np.float32)
    with pytest.raises(InputError, match="missing input"):
        k(X=x)
    with pytest.raises(InputError, match="unknown input"):
        k(X=x, W=np.zeros((64, 128), np.float32), Z=x)
    with pytest.raises(InputError, match="dim 1 must be 64"):
        k(X=np.zeros((8, 32), np.float32), W=np.zeros((64, 128), np.float32))
    with pytest.raises(InputError, match="missing"):
        k.specialize()
    with pytest.raises(InputError, match="positive"):
        k.specialize(n=0)
    with pytest.raises(InputError, match="expected a numpy"):
        k(X=[[1.0]], W=np.zeros((64, 128), np.float32))
    assert STATS.tunings == 0 and STATS.compiles == 0
    assert "no shape tuned yet" in k.explain()


def test_search_env_defaults_and_errors() -> None:
    from prism.api import SEARCH_DIM, search_env
    prog = _program()
    assert search_env(prog) == {"n": SEARCH_DIM}
    assert search_env(prog, {"n": 3}) == {"n": 3}
    with pytest.raises(InputError, match="not symbolic dims"):
        search_env(prog, {"m": 4})
    with pytest.raises(InputError, match="positive ints"):
        search_env(prog, {"n": 0})


def test_superoptimize_gives_the_search_one_fixed_env(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:  # type: ignore[no-untyped-def]
    import prism.search as S
    from prism.api import clear_memory_caches
    seen = []
    right = WORKLOADS["W1"].hand_written(SHAPE)

    def fake(*a, **k):  # type: ignore[no-untyped-def]
        seen.append(k.get("env"))
        return _result([_candidate(right, True, "formal+numeric")], StopReason.EXHAUSTED)
    monkeypatch.setenv("PRISM_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(S, "search", fake)
    clear_memory_caches()
    prism.superoptimize(_program())
    prism.superoptimize(_program(), search_dims={"n": 2})
    assert seen == [{"n": 8}, {"n": 2}]   # the ranking env is part of the memo key: two searches


def test_a_derived_shape_keeps_a_grid_that_equalled_a_moving_dim() -> None:
    """A tuned winner's grid size equal to a dim that takes a new value (one row per block at prompt length 141:
    g0 = 141) follows the dim (prism.ir.dims.Follows); values equal to a dim that did not move, to two moving
    dims, or to 1 stay as they are; nothing to follow gives None."""
    from prism.api import _following
    from prism.ir.dims import Follows, resolve_params
    assert _following({"g0": 141, "F": 1}, {"d0": 141}, {"d0": 157}) == {"g0": Follows("d0"), "F": 1}
    assert _following({"g0": 4, "F": 1}, {"d0": 128}, {"d0": 141}) is None
    assert _following({"g0": 16}, {"d0": 16, "b": 16}, {"d0": 20, "b": 20}) is None        # ambiguous
    assert _following({"g0": 16}, {"d0": 16, "b": 16}, {"d0": 20, "b": 16}) == {"g0": Follows("d0")}
    assert _following({"g0": 1}, {"d0": 1}, {"d0": 2}) is None
    assert _following({"m0": None, "g0": 8}, {"n": 8}, {"n": 9}) == {"m0": None, "g0": Follows("n")}
    assert resolve_params({"g0": Follows("d0"), "F": 2}, {"d0": 157}) == {"g0": 157, "F": 2}


def test_a_derived_shape_tries_the_winner_close_candidates_and_near_sizes(monkeypatch: pytest.MonkeyPatch) -> None:
    """api.SuperKernel._derived's order at a new prompt length (llama-small's MLP piece tuned at 141, asked at
    the prime 157, where only 1 and 157 divide): the winner, the candidates measured within DERIVE_SLACK of it
    (a grid over the weight's columns is valid at every length), the winner's sGraph with sizes within NEAR of
    its own (never 3 -> 157: one row per block), then the slower candidates; a split before the nearest sizes."""
    from prism.api import DERIVE_SLACK
    from prism.tune.tuner import Row, TuneResult

    def row(sg: int, params: dict, t: float) -> Row:
        return Row(sg, params, t, 0, "ok", t)
    rows = [row(1, {"g0": 2, "g1": 3}, 4.485e-3), row(1, {"g0": 4, "g1": 3}, 4.503e-3),
            row(0, {"g0": 22}, 4.485e-3 * (DERIVE_SLACK + 0.05)), row(1, {"g0": 2, "g1": 47}, 8.4e-3)]
    res = TuneResult("p", {"d0": 141}, {}, {}, [], rows, 0, 4)
    sk = SuperKernel.__new__(SuperKernel)
    calls: list[tuple[int, dict]] = []

    def from_cached(env, cached, params=None, template=False, checked=None, row=None):  # type: ignore[no-untyped-def]
        from prism.ir.dims import resolve_params
        r = row or cached.best
        p = dict(r.params if params is None else params)
        calls.append((r.sgraph, p))
        return None if env["d0"] % int(resolve_params(p, env).get("g1", 1)) else ("spec", r.sgraph, p)
    monkeypatch.setattr(sk, "_from_cached", from_cached)
    monkeypatch.setattr(sk, "_split", lambda env, anchor, res, **kw: None)   # no split (its order: the end of the test)
    monkeypatch.setattr(sk, "_covers", lambda row, params, env: True)   # the winner has code there (see the end)
    # the model's seconds per flop of one row per block 6x the winner's: neither near in size nor in time
    monkeypatch.setattr(sk, "_nearest_params", lambda env, r, a: ({"g0": 2, "g1": env["d0"]}, 6.0))
    assert sk._derived({"d0": 157}, {"d0": 141}, res) == ("spec", 0, {"g0": 22})
    assert calls == [(1, {"g0": 2, "g1": 3}), (1, {"g0": 4, "g1": 3}), (0, {"g0": 22})]
    # far in size (3 -> 157) but at a model's seconds per flop within NEAR_ESTIMATE of the winner's at the anchor (a
    # row-wise piece, no weights re-read per block): taken before the slower candidates, following the length
    from prism.api import NEAR_ESTIMATE
    from prism.ir.dims import Follows
    monkeypatch.setattr(sk, "_nearest_params", lambda env, r, a: ({"g0": 2, "g1": env["d0"]}, NEAR_ESTIMATE))
    calls.clear()
    assert sk._derived({"d0": 157}, {"d0": 141}, res) == ("spec", 1, {"g0": 2, "g1": Follows("d0")})
    assert calls == [(1, {"g0": 2, "g1": 3}), (1, {"g0": 4, "g1": 3}), (1, {"g0": 2, "g1": Follows("d0")})]
    monkeypatch.setattr(sk, "_nearest_params", lambda env, r, a: ({"g0": 2, "g1": env["d0"]}, 6.0))
    rows[2].measured_s = 4.49e-3   # within the slack (and faster than the second): tried right after the winner
    calls.clear()
    assert sk._derived({"d0": 157}, {"d0": 141}, res) == ("spec", 0, {"g0": 22})
    assert calls == [(1, {"g0": 2, "g1": 3}), (0, {"g0": 22})]
    monkeypatch.setattr(sk, "_nearest_params", lambda env, r, a: ({"g0": 2, "g1": 4}, 6.0))   # near: before slow ones
    rows[2].measured_s = 9e-3
    calls.clear()
    assert sk._derived({"d0": 148}, {"d0": 141}, res) == ("spec", 1, {"g0": 2, "g1": 4})
    assert calls == [(1, {"g0": 2, "g1": 3}), (1, {"g0": 4, "g1": 3}), (1, {"g0": 2, "g1": 4})]
    # nearest sizes equal to the new length (3 rows per block at 141 -> one per row at the prime 157) follow it
    rows[0].params, rows[1].params = {"g0": 2, "g1": 47}, {"g0": 2, "g1": 141}   # the second: one row per block
    monkeypatch.setattr(sk, "_nearest_params", lambda env, r, a: ({"g0": 2, "g1": env["d0"]}, 6.0))
    calls.clear()
    assert sk._derived({"d0": 157}, {"d0": 141}, res) == ("spec", 1, {"g0": 2, "g1": Follows("d0")})
    assert calls == [(1, {"g0": 2, "g1": 47}), (1, {"g0": 2, "g1": Follows("d0")})]   # 141 followed first
    rows[1].measured_s = 9e-3   # no close candidate: the winner's nearest size (157, 3.3x of 47) follows the length
    calls.clear()
    assert sk._derived({"d0": 157}, {"d0": 141}, res) == ("spec", 1, {"g0": 2, "g1": Follows("d0")})
    assert calls == [(1, {"g0": 2, "g1": 47}), (1, {"g0": 2, "g1": Follows("d0")})]
    # a split (the tuned kernel on the rows it divides, a remainder) comes after the winner and its close candidates,
    # before the nearest sizes
    monkeypatch.setattr(sk, "_split", lambda env, anchor, res, **kw: calls.append(("split", env["d0"])) or ("split",))
    calls.clear()
    assert sk._derived({"d0": 157}, {"d0": 141}, res) == ("split",)
    assert calls == [(1, {"g0": 2, "g1": 47}), ("split", 157)]
    # ... and first when neither the winner nor a close candidate has compiled code at the new length (each would
    # be a new template: a gcc run and its checks), where the split's parts are already built
    monkeypatch.setattr(sk, "_covers", lambda row, params, env: False)
    calls.clear()
    assert sk._derived({"d0": 188}, {"d0": 141}, res) == ("split",)
    assert calls == [("split", 188)]
    # a close candidate with compiled code comes before a winner with none (no gcc run, no checks), and the split
    # is not tried first then
    rows[1].measured_s = 4.5e-3
    monkeypatch.setattr(sk, "_covers", lambda row, params, env: row is rows[1])
    calls.clear()
    assert sk._derived({"d0": 188}, {"d0": 141}, res) == ("spec", 1, {"g0": 2, "g1": Follows("d0")})
    assert calls == [(1, {"g0": 2, "g1": Follows("d0")})]


def _row_blocks(K: int, weight: int | None) -> prism.Graph:
    """An sGraph over a symbolic row count m with its rows split g0 ways: exp(X) per row, or (``weight``) X @ W^T
    with W [weight, K] read whole by every block."""
    from prism.ir.block import BlockBuilder
    g = prism.Graph("rows")
    x = g.input("X", ("m", K))
    ins = [x] + ([g.input("W", (weight, K))] if weight else [])
    bb = BlockBuilder(grid=("g0",), forloop=1, inputs=ins)
    xi = bb.iter(0, imap=(0,))
    y = bb.matmul(xi, bb.transpose(bb.iter(1, imap=(None,)), 0, 1)) if weight else bb.exp(xi)
    bb.save(y, omap=(0,))
    (out,) = g.customized(bb.build(), ins)
    g.output(out, "Y")
    return g


@pytest.mark.parametrize("weight", [None, 4096])
def test_nearest_sizes_far_from_the_winner_pass_on_the_models_cost_per_flop(weight: int | None) -> None:
    """SuperKernel._nearest_params on real estimates (api.NEAR_ESTIMATE): tuned at 16 row blocks of 128 rows, asked
    at the prime 131, the nearest valid split is one row per block (131 blocks; one block is below the thread
    count). A row-wise piece costs about as much per flop that way and passes; a product whose every block reads
    the whole weight (16 MB here) reads it once per row and is refused."""
    from prism.api import NEAR_ESTIMATE
    from prism.tune.machine import detect
    from prism.tune.tuner import Row
    g = _row_blocks(1024, weight)
    sk = SuperKernel.__new__(SuperKernel)
    sk.program, sk.implementations, sk._machine = g, [Implementation(0, g, "test", "", "")], detect(False)
    if sk.machine.threads < 2:
        pytest.skip("one thread: a single block passes the machine filters, so it is the nearest split")
    found = sk._nearest_params({"m": 131}, Row(0, {"g0": 16}, 1e-3, 0, "ok", 1e-3), {"m": 128})
    assert found is not None
    near, ratio = found
    assert near == {"g0": 131}
    if weight is None:
        assert ratio <= NEAR_ESTIMATE, ratio
    else:
        assert ratio > NEAR_ESTIMATE, ratio


def _linear(n: object) -> prism.Graph:
    g = prism.Graph("linear")
    x, w = g.input("X", (n, 256)), g.input("W", (64, 256))
    g.output(g.matmul(x, g.permute(w, (1, 0))), "Y")
    return g


@pytest.mark.parametrize("second", [1.320e-3, 1.5e-3])
def test_a_twins_winner_missing_from_the_symbolic_search_has_a_stand_in_within_the_slack(second: float) -> None:
    """SuperKernel._twin: the fixed-shape twin's winner is an sGraph the symbolic kernel does not have (llama-1b's Q
    projection: a row-tiled grid only the static search keeps, 1.319 ms); its fastest candidate that the symbolic
    kernel has stands in as the winner if measured within DERIVE_SLACK of it (the program as written here; in the
    model a column grid, 1.320 ms), else the tuning is no anchor. Rows of the missing sGraph are left out."""
    import types

    from prism.tune.machine import detect
    from prism.tune.tuner import Row, TuneResult

    def kernel(program: prism.Graph, graphs: list[prism.Graph]) -> SuperKernel:
        k = SuperKernel.__new__(SuperKernel)
        k.program, k.options, k._machine = program, Options(), detect(False)
        k.input_names = tuple(program.inputs)
        k.implementations = [Implementation(i, gr, "test", "", "") for i, gr in enumerate(graphs)]
        return k

    static = _linear(16)
    other = kernel(static, [static, _row_split()])
    sym = kernel(_linear("n"), [_linear("n")])
    rows = [Row(1, {"g0": 2}, 1.319e-3, 0, "ok", 1.319e-3), Row(0, {}, second, 0, "ok", second)]
    spec = types.SimpleNamespace(tuning=TuneResult("p", {}, {}, {}, [], rows, 0, 2))
    got = sym._twin(other, spec)  # type: ignore[arg-type]
    if second > 1.319e-3 * 1.10:
        assert got is None
        return
    assert got is not None
    env, res = got
    assert env == {"n": 16} and len(res.rows) == 1 and res.best.sgraph == 0 and res.best.measured_s == second


def _row_split() -> prism.Graph:
    """X[16, 256] @ W[64, 256]^T with X's rows split over a grid (an sGraph the symbolic kernel above lacks)."""
    from prism.ir.block import BlockBuilder
    g = prism.Graph("linear")
    x, w = g.input("X", (16, 256)), g.input("W", (64, 256))
    bb = BlockBuilder(grid=("g0",), forloop=1, inputs=[x, w])
    t = bb.matmul(bb.iter(0, imap=(0,)), bb.transpose(bb.iter(1, imap=(None,)), 0, 1))
    bb.save(t, omap=(0,))
    (y,) = g.customized(bb.build(), [x, w])
    g.output(y, "Y")
    return g


def test_a_splits_tail_is_cut_into_the_fewest_runs_of_lengths_with_compiled_code() -> None:
    """api._tail_runs: the rows left after the tuned runs as at most three runs of covered lengths, fewest first
    and largest first; None where no such cut exists (the split then compiles the tail at its own length)."""
    from prism.api import _tail_runs
    cov = lambda x: x == 1 or 2 <= x <= 7 or 32 <= x <= 63   # the pre-build's 1, 2 and 33 rows
    assert _tail_runs(0, cov) == [] and _tail_runs(5, cov) == [5] and _tail_runs(40, cov) == [40]
    assert _tail_runs(8, cov) == [7, 1] and _tail_runs(13, cov) == [7, 6] and _tail_runs(72, cov) == [40, 32]
    assert _tail_runs(127, cov) == [63, 63, 1]
    assert _tail_runs(31, cov) is None and _tail_runs(200, cov) is None and _tail_runs(9, lambda x: False) is None
    for r in range(1, 190):
        runs = _tail_runs(r, cov)
        assert runs is None or (sum(runs) == r and len(runs) <= 3 and all(map(cov, runs))
                                and runs == sorted(runs, reverse=True))
