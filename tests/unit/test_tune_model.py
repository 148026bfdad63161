"""The cost model, the ranking statistics, the tuning table and the tuner's disk store."""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Callable

import pytest

import prism
from prism.ir.block import BlockBuilder
from prism.runtime import store
from prism.tune.candidates import Instance, instantiate
from prism.tune.cost import Estimate, OpCost, block_cost, contiguous_run, estimate
from prism.tune.machine import Machine, cache_sizes, detect
from prism.tune.tuner import Row, TuneResult, select, spearman
from prism.workloads import WORKLOADS

pytestmark = pytest.mark.unit

MACHINE = Machine(cores=2, threads=2, l1=32 << 10, l2=1 << 20, l3=32 << 20, simd=16, isa="avx512",
                  fingerprint="test", bandwidth=40e9, bandwidth_1=25e9, cache_bandwidth=100e9, peak_flops=200e9,
                  measured=False)


def _replicated(n: int, d: int, m: int, g: int, rows_split: bool) -> prism.BlockGraph:
    """X [n, d] @ W [d, m]: grid of g blocks over W's columns; X is replicated over them unless rows_split."""
    bb = BlockBuilder(grid=(g,), forloop=1, inputs=[((n, d), "float32", "X"), ((d, m), "float32", "W")])
    if rows_split:
        x = bb.iter(0, imap=(0,))
        w = bb.iter(1, imap=(None,))
        bb.save(bb.matmul(x, w), omap=(0,))
    else:
        x = bb.iter(0, imap=(None,))
        w = bb.iter(1, imap=(1,))
        bb.save(bb.matmul(x, w), omap=(1,))
    return bb.build()


def test_replicated_input_is_read_per_block_unless_it_fits_in_cache() -> None:
    small_cache = dataclasses.replace(MACHINE, l2=0, l3=0)
    n, d, m, g = 64, 4096, 1024, 8
    rep = block_cost(_replicated(n, d, m, g, False), small_cache)
    x_bytes, w_bytes, y_bytes = n * d * 4, d * m * 4, n * m * 4
    assert rep.dram_bytes == g * x_bytes + w_bytes + y_bytes          # X read by all 8 blocks
    assert rep.replication > 1
    fits = block_cost(_replicated(n, d, m, g, False), MACHINE)         # X (1 MiB) fits in the caches
    assert fits.dram_bytes == x_bytes + w_bytes + y_bytes
    assert fits.memory_s < rep.memory_s


def test_partial_sums_cost_an_extra_pass() -> None:
    def split_k(g: int) -> prism.BlockGraph:
        bb = BlockBuilder(grid=(g,), forloop=1, inputs=[((8, 4096), "float32"), ((4096, 256), "float32")])
        bb.save(bb.matmul(bb.iter(0, imap=(1,)), bb.iter(1, imap=(0,))), omap=(None,))
        return bb.build()
    one, four = block_cost(split_k(1), MACHINE), block_cost(split_k(4), MACHINE)
    assert four.dram_bytes > one.dram_bytes  # 4 slots written, read back, and the output written


def test_strided_narrow_tiles_pay_whole_lines() -> None:
    assert contiguous_run((8, 4), (8, 64)) == 4
    assert contiguous_run((2, 64), (8, 64)) == 128
    assert contiguous_run((1, 8, 64), (4, 8, 64)) == 512
    narrow = block_cost(_replicated(8, 1024, 1024, 256, False), dataclasses.replace(MACHINE, l3=0, l2=1 << 10))
    wide = block_cost(_replicated(8, 1024, 1024, 16, False), dataclasses.replace(MACHINE, l3=0, l2=1 << 10))
    assert narrow.dram_bytes > wide.dram_bytes  # 4-column strips move a 64-byte line per row


def test_load_balance_and_overheads_shape_the_ranking() -> None:
    w = WORKLOADS["W1"]
    s = w.shapes[2]
    r = instantiate(w.hand_written(s), w.env(s), MACHINE)
    by = {(i.params["G"], i.params["F"]): i.estimate.seconds for i in r.kept + r.dropped}
    assert by[(2, 16)] < by[(1, 16)]          # one block leaves a core idle
    assert by[(16, 4)] < by[(16, 1024)]       # 4-row weight tiles: per-iteration overhead and narrow rows


def test_estimate_needs_a_concrete_graph() -> None:
    w = WORKLOADS["W1"]
    with pytest.raises(ValueError, match="concrete"):
        estimate(w.hand_written(w.shapes[0]), MACHINE)
    e = estimate(w.program(w.shapes[0]).instantiate({"n": 8}), MACHINE)  # predefined ops only
    assert e.seconds > 0 and e.flops >= 2 * 8 * 1024 * 1024


def test_spearman() -> None:
    assert spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    assert spearman([1, 2], [1, 2]) is None
    assert spearman([1, 1, 1], [1, 2, 3]) is None
    assert spearman([1, 2, 2, 3], [1, 2, 3, 4]) == pytest.approx(0.9486832980505138)


def _inst(sg: int, sec: float) -> Instance:
    return Instance(sg, {"G": sg}, prism.Graph(), {"G": sg}, Estimate(sec, 0, 0))


def test_select_keeps_the_best_of_every_sgraph_the_model_does_not_rule_out() -> None:
    from prism.tune.tuner import STRUCTURE_SPREAD
    assert STRUCTURE_SPREAD == 4.0
    pool = ([_inst(0, t) for t in (1.0, 1.1, 1.2, 1.3)] + [_inst(1, 3.0), _inst(2, 3.9), _inst(2, 3.95)]
            + [_inst(3, 4.5)])
    picked = select(pool, 4)
    assert [p.estimate.seconds for p in picked] == [1.0, 1.1, 3.0, 3.9]
    assert [p.estimate.seconds for p in select(pool, 2)] == [1.0, 3.0]
    # sGraph 3 is predicted 4.5x slower than the favourite: measured only if nothing else is left
    assert 3 not in {p.sgraph for p in select(pool, 7)}
    assert [p.sgraph for p in select(pool, 8)][-1] == 3


def _result() -> TuneResult:
    rows = [Row(0, {"G": 2, "F": 4}, 1e-4, 1, "ok", 2e-4, 1e-7, 30), Row(1, {"G": 4}, 0.5e-4, 0, "ok", 1e-4, 0.0, 40),
            Row(0, {"G": 8, "F": 1}, 3e-4, 2, "wrong result", math.inf, 0.5, 0, "error 0.5 > tolerance 1e-4")]
    return TuneResult("key", {"n": 8}, {"X": [8, 64]}, {"fingerprint": "fp", "threads": 2}, ["a", "b"], rows, 1, 12,
                      spearman=-1.0, top1_ratio=1.0)


def test_tune_result_roundtrip_and_table() -> None:
    r = _result()
    back = TuneResult.from_json(json.loads(json.dumps(r.to_json())))
    assert back == r and back.best.params == {"G": 4} and back.top1_within_10pct
    text = r.table()
    assert "wrong result" in text and "inf" in text and "Spearman -1.00" in text
    assert text.splitlines()[1].startswith("*")  # the winner is marked and listed first
    bad = r.to_json()
    bad["winner"] = 2
    with pytest.raises(ValueError):
        TuneResult.from_json(bad)


def test_store_detects_corruption(tmp_path) -> None:  # type: ignore[no-untyped-def]
    p = tmp_path / "a" / "entry.json"
    store.save(p, "tuning", {"x": 1, "y": [1.5, math.inf]})
    assert store.load(p, "tuning").payload == {"x": 1, "y": [1.5, math.inf]}
    assert store.load(p, "machine").corrupt                       # another kind
    assert store.load(tmp_path / "missing.json", "tuning") == store.Loaded(None)
    d = json.loads(p.read_text())
    d["payload"]["x"] = 2                                          # edited without fixing the checksum
    p.write_text(json.dumps(d))
    assert store.load(p, "tuning").corrupt
    p.write_text(p.read_text()[:20])                               # truncated
    got = store.load(p, "tuning")
    assert got.corrupt and got.payload is None
    assert not list(p.parent.glob("*.tmp"))                        # no temporaries left behind


def test_cache_sizes_from_sysfs(tmp_path) -> None:  # type: ignore[no-untyped-def]
    for i, (level, kind, size) in enumerate([(1, "Data", "48K"), (1, "Instruction", "32K"), (2, "Unified", "2048K"),
                                             (3, "Unified", "96M")]):
        d = tmp_path / f"index{i}"
        d.mkdir()
        (d / "level").write_text(f"{level}\n")
        (d / "type").write_text(f"{kind}\n")
        (d / "size").write_text(f"{size}\n")
    assert cache_sizes(tmp_path) == {1: 48 << 10, 2: 2 << 20, 3: 96 << 20}
    assert cache_sizes(tmp_path / "nothing") == {1: 32 << 10, 2: 1 << 20, 3: 0}


def test_detect_honours_prism_num_threads(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("PRISM_NUM_THREADS", "1")
    m1 = detect(measure=False)
    monkeypatch.setenv("PRISM_NUM_THREADS", "3")
    m3 = detect(measure=False)
    assert (m1.threads, m3.threads) == (1, 3)
    assert m1.fingerprint == m3.fingerprint and not m1.measured
    assert m1.l2 > 0 and m1.simd in (1, 8, 16)


def test_measurement_interleaves_the_candidates() -> None:
    from prism.tune.measure import time_interleaved
    log: list[int] = []
    fns = [lambda i=i: log.append(i) for i in range(3)]
    timings = time_interleaved(fns, budget_s=0.0, block_s=0.0, min_rounds=4, warmup=1)
    assert log[:3] == [0, 1, 2]                       # warm-up of each
    rounds = log[3:]
    assert rounds == [0, 1, 2, 1, 2, 0, 2, 0, 1, 0, 1, 2]  # one call each per round, the order rotating
    assert [t.calls for t in timings] == [4, 4, 4]


class _Clock:
    """A fake ``time`` module for the measurement loop: time passes only when a measured function runs."""

    def __init__(self) -> None:
        self.t = 0.0

    def perf_counter(self) -> float:
        return self.t

    def work(self, seconds: float) -> Callable[[], None]:
        def f() -> None:
            self.t += seconds
        return f


def test_measurement_stops_early_only_with_enough_samples_of_every_candidate(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from prism.tune import measure
    clock = _Clock()
    monkeypatch.setattr(measure, "time", clock)
    fast = measure.time_interleaved([clock.work(1e-6), clock.work(1e-6)], budget_s=2.0, block_s=1e-3, enough=50)
    assert min(t.calls for t in fast) >= 50
    # every candidate had enough after 3 rounds: stopped at ENOUGH_AFTER_S, not at a quarter of the budget
    assert measure.ENOUGH_AFTER_S <= clock.t < measure.ENOUGH_AFTER_S + 0.01
    clock.t = 0.0
    # 5 and 5.4 ms per call (8% apart) cannot reach 500 samples, and neither a winner nor a tie is settled:
    # the whole budget is used
    slow = measure.time_interleaved([clock.work(5e-3), clock.work(5.4e-3)], budget_s=0.4, block_s=1e-3, enough=500)
    assert clock.t >= 0.4
    assert max(t.calls for t in slow) < 500
    clock.t = 0.0
    # a tie (5 and 5.1 ms: within TIE_MARGIN) stops after DECIDED_AFTER_S
    measure.time_interleaved([clock.work(5e-3), clock.work(5.1e-3)], budget_s=0.4, block_s=1e-3, enough=500)
    assert measure.DECIDED_AFTER_S <= clock.t < measure.DECIDED_AFTER_S + 0.1
    clock.t = 0.0
    # a decided winner (1 us against 5 ms) stops after DECIDED_AFTER_S once each has DECIDE_SAMPLES
    fast_slow = measure.time_interleaved([clock.work(1e-6), clock.work(5e-3)], budget_s=0.4, block_s=1e-3,
                                         enough=500)
    assert measure.DECIDED_AFTER_S <= clock.t < measure.DECIDED_AFTER_S + 0.01 * measure.DECIDE_SAMPLES
    assert min(t.calls for t in fast_slow) >= measure.DECIDE_SAMPLES and fast_slow[1].calls < 500


def test_a_hopeless_candidate_is_timed_by_its_warm_up_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """A candidate more than HOPELESS times slower than the fastest in its warm-up (and slower than
    HOPELESS_MIN_S) is not called again: llama-1b's LM head had one of 324 ms per call beside three of ~3 ms."""
    from prism.tune import measure
    clock = _Clock()
    monkeypatch.setattr(measure, "time", clock)
    calls = [0, 0, 0]

    def work(i: int, seconds: float) -> Callable[[], None]:
        def f() -> None:
            calls[i] += 1
            clock.t += seconds
        return f
    t = measure.time_interleaved([work(0, 3e-3), work(1, 3.2e-3), work(2, 0.324)], budget_s=0.4, block_s=2e-3,
                                 warmup=1)
    assert calls[2] == 1 and t[2].calls == 1 and t[2].median_s == pytest.approx(0.324)
    assert calls[0] > 10 and calls[1] > 10 and t[0].median_s < t[1].median_s < t[2].median_s
    assert clock.t < 0.324 + 0.4 + 0.01          # its three rounds would have cost 1 s more
    # 8x slower but under HOPELESS_MIN_S (a microsecond kernel): measured as before
    calls[:] = [0, 0, 0]
    clock.t = 0.0
    measure.time_interleaved([work(0, 1e-5), work(1, 1e-5), work(2, 1e-4)], budget_s=0.4, block_s=1e-3, warmup=1)
    assert calls[2] > 3


def _blocks(sec: float, blocks: int) -> Instance:
    est = Estimate(sec, 0, 0, [OpCost("customized", sec, 0, 0, blocks)])
    return Instance(0, {"G": blocks}, prism.Graph(), {"G": blocks}, est)


def test_select_measures_one_of_each_block_count_among_near_ties() -> None:
    # four tilings of 16 blocks predicted fastest, then 8, 4 and 2 blocks within 1 %: near-ties the model
    # cannot separate, so the measurement must see each block count; 1 block is predicted far off
    pool = [_blocks(1.000, 16), _blocks(1.001, 16), _blocks(1.002, 16), _blocks(1.003, 8), _blocks(1.004, 4),
            _blocks(1.005, 2), _blocks(2.0, 1)]
    assert [p.estimate.min_blocks for p in select(pool, 4)] == [16, 8, 4, 2]
    assert [p.estimate.min_blocks for p in select(pool, 6)] == [16, 16, 16, 8, 4, 2]
    assert 1 not in {p.estimate.min_blocks for p in select(pool, 5)}  # beyond SPREAD: only by predicted order


def test_select_measures_every_family_before_other_sgraphs_of_one_family() -> None:
    from prism.tune.tuner import family
    a = WORKLOADS["W1"].hand_written({"n": 8, "d": 64, "m": 128})
    g = prism.Graph("other family")  # the program itself: predefined rms_norm and matmul, no customized op
    X, W = g.input("X", ("n", 64)), g.input("W", (64, 128))
    g.output(g.matmul(g.rms_norm(X), W), "Y")
    assert family(a) != family(g) and family(a) == family(WORKLOADS["W1"].hand_written({"n": 8, "d": 64, "m": 128}))

    def inst(sg: int, graph: prism.Graph, sec: float) -> Instance:
        return Instance(sg, {}, graph, {}, Estimate(sec, 0, 0))
    pool = [inst(0, a, 1.0), inst(1, a, 1.1), inst(2, g, 3.0)]
    assert [p.sgraph for p in select(pool, 2)] == [0, 2]   # not sGraph 1: same family as 0
    assert [p.sgraph for p in select(pool, 3)] == [0, 1, 2]


def test_a_weight_read_transposed_is_streamed_not_resident() -> None:
    """``x @ W.T`` with W stored [out, in] (an input view's iterator, then a tile permute): the weight tile is
    streamed through the registers like a right operand read as stored, so the working set holds the X tile
    and the output only -- counted resident, every wide block failed the cache filter (int8 W2 at d = 4096
    was tuned among 32-block tilings only, 0.54 of its roofline)."""
    n, d, m, g = 1, 4096, 6144, 4

    def build(transposed: bool, plain_use: bool = False) -> prism.BlockGraph:
        wshape = (m, d) if transposed else (d, m)
        bb = BlockBuilder(grid=(g,), forloop=1, inputs=[((n, d), "float32", "X"), (wshape, "float32", "W")])
        x = bb.iter(0, imap=(None,))
        w = bb.iter(1, imap=(0,) if transposed else (1,))
        wt = bb.permute(w, (1, 0)) if transposed else w
        y = bb.matmul(x, wt)
        if plain_use:  # the tile is also read element-wise: resident after all
            y = bb.add(y, bb.permute(bb.sum(w, -1), (1, 0)))
        bb.save(y, omap=(1,))
        return bb.build()
    plain, view = block_cost(build(False), MACHINE), block_cost(build(True), MACHINE)
    tile = d * (m // g) * 4
    assert view.working_set == plain.working_set < tile
    assert block_cost(build(True, plain_use=True), MACHINE).working_set >= tile


def test_the_cpu_of_our_own_child_processes_is_not_foreign_load() -> None:
    """The C compiler Prism runs is this process's work: its CPU time counts as ours (CPU seconds, not wall
    time, so other load on the machine cannot change the result)."""
    import subprocess
    import sys

    from prism.tune.contention import _own_s
    before = _own_s()
    burn = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.3: pass"
    subprocess.run([sys.executable, "-c", burn], check=True)
    assert _own_s() - before >= 0.3


def test_a_bf16_linear_counts_the_pair_instruction_and_the_kernel_its_tile_gets() -> None:
    """bf16 X [8, 128, 2048] @ W[2048, 2048]^T on a machine with vdpbf16ps: compute at PAIR_TN times the FMA
    peak where a block's product has at least TN_MIN_ROWS rows (a block of whole sequences: the batch folds into
    its rows), PAIR_NT where it has 16 rows of each of 8 sequences (the nt kernels), the FMA peak without
    the instruction or for float32; against int8 keys PAIR_TN from 9 rows and the FMA peak in the nt kernels.
    The tuner had measured only the second kind for a prefill's linear+add
    (all predicted equal; measured 11.2-11.7 ms where the first kind takes ~9.2)."""
    from prism.tune.cost import PAIR_NT, PAIR_TN, QUAD_NT, QUAD_TN

    def linear(dtype: str, grid_rows: bool) -> prism.BlockGraph:
        xdt, wdt = (dtype.split("/") * 2)[:2]
        bb = BlockBuilder(grid=(8, 4), forloop=1, inputs=[((8, 128, 2048), xdt, "X"), ((2048, 2048), wdt, "W")])
        x = bb.iter(0, imap=(0 if grid_rows else 1, None))   # a sequence per block, or 16 rows of each
        w = bb.iter(1, imap=(None, 0))
        bb.save(bb.matmul(x, bb.transpose(w, 0, 1)), omap=(0 if grid_rows else 1, 2))
        return bb.build()

    pair = dataclasses.replace(MACHINE, pair_dot=True)
    flops = 2 * 8 * 128 * 2048 * 2048
    busiest = 16 / 32                        # 32 blocks over 2 threads: the busiest thread's share of the flops
    # int8 keys of bfloat16 rows (int8 weight-only): the tn form from matmul.TN_MIN_ROWS_I8 rows; the strips are
    # a loop over the 8 sequences around 16-row products, which the nt kernels run at the FMA rate
    for dtype, machine, rate_seq, rate_rows in (("bfloat16", pair, PAIR_TN, PAIR_NT),
                                               ("bfloat16", MACHINE, 1.0, 1.0), ("float32", pair, 1.0, 1.0),
                                               ("bfloat16/int8", pair, PAIR_TN, 1.0)):
        whole, strips = block_cost(linear(dtype, True), machine), block_cost(linear(dtype, False), machine)
        assert whole.flops == strips.flops == flops
        core = machine.core_flops
        assert whole.compute_s == pytest.approx(flops * busiest / core / rate_seq), (dtype, machine.pair_dot)
        assert strips.compute_s == pytest.approx(flops * busiest / core / rate_rows), (dtype, machine.pair_dot)
    # int8 rows against int8 keys (W8A8) with vpdpbusd: QUAD_TN in the tn form (whole sequences), QUAD_NT in the nt
    # kernels (16 rows of each); the FMA rate without the instruction
    quad = dataclasses.replace(MACHINE, quad_dot=True)
    for machine, rate_seq, rate_rows in ((quad, QUAD_TN, QUAD_NT), (MACHINE, 1.0, 1.0)):
        whole, strips = block_cost(linear("int8", True), machine), block_cost(linear("int8", False), machine)
        core = machine.core_flops
        assert whole.compute_s == pytest.approx(flops * busiest / core / rate_seq), machine.quad_dot
        assert strips.compute_s == pytest.approx(flops * busiest / core / rate_rows), machine.quad_dot
