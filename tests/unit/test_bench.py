"""prism.bench: accounting, roofline, scheduler, correctness gate, Prism column, JSON. No timing asserts."""

from __future__ import annotations

import itertools
import json
import math

import numpy as np
import pytest

import prism
from prism.bench import accounting
from prism.bench.data import aligned, case_inputs, check_outputs
from prism.bench.results import PRISM_NOTE, Report, finish_case
from prism.bench.run import Config, case_label, default_workloads, run_case, select_cases
from prism.bench.schedule import interleave, rotation
from prism.bench.systems import BY_NAME, prism_system, select
from prism.bench.systems.base import Prepared, System, Unavailable
from prism.errors import PrismError
from prism.workloads import WORKLOADS

pytestmark = pytest.mark.unit

W1, W4 = WORKLOADS["W1"], WORKLOADS["W4"]
W1_SMALL = W1.shapes[0]          # n=8, d=1024, m=1024


# --- accounting and roofline ------------------------------------------------------------------

def test_roofline_memory_and_compute_bound() -> None:
    c = accounting.Cost(bytes=4_000_000, flops=10_000_000)
    # 4 MB at 40 GB/s = 100 µs; 10 MFLOP at 1 TFLOP/s = 10 µs -> memory bound
    assert accounting.roofline_seconds(c, 40e9, 1e12) == pytest.approx(100e-6)
    # same program on a machine with 1 GFLOP/s: 10 ms of arithmetic dominates
    assert accounting.roofline_seconds(c, 40e9, 1e9) == pytest.approx(10e-3)
    with pytest.raises(ValueError, match="positive"):
        accounting.roofline_seconds(c, 0.0, 1e9)


def test_w1_bytes_and_flops() -> None:
    n, d, m = W1_SMALL["n"], W1_SMALL["d"], W1_SMALL["m"]
    cost = accounting.program_cost(W1.program(W1_SMALL), W1.env(W1_SMALL))
    assert cost.bytes == 4 * (n * d + d * m + n * m)          # X and W read once, Y written once
    assert cost.flops == 2 * n * d * m + 3 * n * d             # matmul MACs + rms_norm (square, sum, divide)


@pytest.mark.parametrize("shape", W4.shapes, ids=lambda s: f"q{s['q']}h{s['h']}")
def test_w4_bytes_and_flops(shape: dict) -> None:
    b, h, q, kv, d = (shape[k] for k in ("b", "h", "q", "kv", "D"))
    cost = accounting.program_cost(W4.program(shape), W4.env(shape))
    assert cost.bytes == 4 * (b * h * q * d + 2 * b * h * kv * d + b * h * q * d)
    scores = b * h * q * kv
    # QK^T and PV: 2 * q*kv*D each; the 1/sqrt(D) scale: 1 per score; softmax: 5 per score; transpose: free
    assert cost.flops == 2 * (2 * scores * d) + scores + 5 * scores


# --- scheduler ----------------------------------------------------------------------------------

class FakeClock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


DT = 1 / 256  # exact in binary, so the fake clock never drifts


def _fakes(names: list[str], clock: FakeClock, log: list[str], dt: float = DT) -> dict:
    def make(name: str):
        def call() -> None:
            log.append(name)
            clock.t += dt
        return call
    return {n: make(n) for n in names}


def test_rotation() -> None:
    assert rotation(["a", "b", "c"], 0) == ["a", "b", "c"]
    assert rotation(["a", "b", "c"], 1) == ["b", "c", "a"]
    assert rotation(["a", "b", "c"], 4) == ["b", "c", "a"]
    assert rotation([], 3) == []


def test_interleave_rotates_and_visits_everyone_each_round() -> None:
    clock, log, rounds_seen = FakeClock(), [], []
    names = ["a", "b", "c"]
    t = interleave(_fakes(names, clock, log), rounds=4, block_s=5 * DT, warmup_s=2 * DT, warmup_rounds=1,
                   clock=clock, before_round=rounds_seen.append)
    assert rounds_seen == [-1, 0, 1, 2, 3, 4]  # before each round (warm-up included) and after the last
    by_round: dict[int, list[str]] = {}
    for r, name in t.visits:
        by_round.setdefault(r, []).append(name)
    assert sorted(by_round) == [-1, 0, 1, 2, 3]
    for order in by_round.values():
        assert sorted(order) == names                     # every system exactly once per round
    firsts = [by_round[r][0] for r in range(4)]
    assert len(set(firsts)) == 3                          # the order rotates: each system leads some round
    assert [by_round[r] for r in range(3)] == [rotation(by_round[-1], r + 1) for r in range(3)]
    # blocks are contiguous: a visit = warm-up calls + timed calls of one system, no interleaving inside
    runs = [k for k, _ in itertools.groupby(log)]
    assert len(runs) == len(t.visits)
    # warm-up round discarded; a timed block runs until block_s has passed: 5 calls per visit
    for n in names:
        assert t.samples[n] == [DT] * 20
        assert t.rounds_of[n] == [r for r in range(4) for _ in range(5)]
        assert t.round_medians(n) == [DT] * 4
        assert t.median(n) == DT
    assert len(log) == 5 * 3 * (2 + 5)  # visits x (warm-up calls + timed calls)


def test_interleave_slow_call_still_timed_once_per_block() -> None:
    clock, log = FakeClock(), []
    t = interleave(_fakes(["slow"], clock, log, dt=1.0), rounds=2, block_s=0.05, warmup_s=0.01, clock=clock)
    assert len(t.samples["slow"]) == 2
    # 3 visits (1 warm-up round + 2 rounds), each 1 warm-up call + 1 timed call: blocks never over-run
    assert len(log) == 6


def test_interleave_drops_a_system_that_raises() -> None:
    clock, log = FakeClock(), []
    calls = _fakes(["a", "b"], clock, log)
    count = [0]

    def flaky() -> None:
        count[0] += 1
        clock.t += DT
        if count[0] == 3:
            raise RuntimeError("boom")
    calls["b"] = flaky
    t = interleave(calls, rounds=3, block_s=2 * DT, warmup_s=DT, clock=clock)
    assert isinstance(t.errors["b"], RuntimeError) and "a" not in t.errors
    assert len(t.samples["a"]) == 3 * 2 and [n for _, n in t.visits].count("a") == 4
    assert count[0] == 3  # never called again after raising


def test_interleave_rejects_no_rounds() -> None:
    with pytest.raises(ValueError, match="rounds"):
        interleave({}, rounds=0)


# --- inputs and checks --------------------------------------------------------------------------

def test_aligned_copies_are_64_byte_aligned_and_equal(rng: np.random.Generator) -> None:
    for shape in [(3,), (7, 5), (2, 3, 5)]:
        a = rng.standard_normal(shape).astype(np.float32)
        b = aligned(a)
        assert b.ctypes.data % 64 == 0 and b.flags.c_contiguous
        np.testing.assert_array_equal(a, b)
    assert all(v.ctypes.data % 64 == 0 for v in case_inputs(W1, W1_SMALL).values())


def test_check_outputs_reasons() -> None:
    ref = {"Y": np.ones((2, 3))}
    assert check_outputs({"Y": np.ones((2, 3), np.float32)}, ref).ok
    assert "missing" in (check_outputs({}, ref).reason or "")
    assert "shape" in (check_outputs({"Y": np.ones((3, 2))}, ref).reason or "")
    bad = np.ones((2, 3))
    bad[0, 0] = np.nan
    assert "non-finite" in (check_outputs({"Y": bad}, ref).reason or "")
    c = check_outputs({"Y": np.full((2, 3), 1.5)}, ref)
    assert not c.ok and c.max_rel_err == pytest.approx(0.5) and "relative error" in (c.reason or "")


# --- run_case with fake systems -----------------------------------------------------------------

class FakeLimits:
    method = "fake"

    def triad_bandwidth(self) -> float:
        return 50e9

    def read_bandwidth(self) -> float:
        return 80e9

    def peak_flops(self, seconds: float = 0.5) -> float:
        return 200e9


def _fake_system(name: str, scale: float, kind: str = "baseline") -> System:
    def prepare(w, shape, inputs, threads) -> Prepared:  # the harness's own test: the float32 reference
        out = w.program(shape).evaluate(dict(inputs))

        def call() -> object:
            return {k: v * scale for k, v in out.items()}
        return Prepared(call, lambda res: res)
    return System(name, name, kind, prepare)


def _unavailable_system(name: str) -> System:
    def prepare(w, shape, inputs, threads) -> Prepared:
        raise Unavailable(f"{name} is not installed")
    return System(name, name, "baseline", prepare)


def _crashing_system(name: str) -> System:
    def prepare(w, shape, inputs, threads) -> Prepared:
        raise RuntimeError("segfault-ish")
    return System(name, name, "baseline", prepare)


CFG = Config(workloads=["W1"], rounds=2, block_ms=0.5, warmup_ms=0.1, settle_ms=0.0, threads=1)


def _case(systems: list[System]):
    return run_case(W1, W1_SMALL, systems, CFG, FakeLimits(), FakeLimits().peak_flops())


def test_wrong_baseline_is_excluded_with_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delattr(prism, "compile", raising=False)
    case = _case([BY_NAME["hand"], _fake_system("good", 1.0), _fake_system("liar", 1.5),
                  _unavailable_system("absent"), _crashing_system("crashy")])
    good, liar = case.system("good"), case.system("liar")
    assert good is not None and liar is not None
    assert good.status == "ok" and good.median_us is not None and good.max_rel_err is not None
    assert liar.status == "wrong" and "excluded from best baseline" in (liar.reason or "")
    assert "relative error" in (liar.reason or "")
    assert liar.samples_us  # still timed, for information
    assert case.best_baseline == "good"
    assert case.system("absent").status == "unavailable"  # type: ignore[union-attr]
    crashy = case.system("crashy")
    assert crashy is not None and crashy.status == "failed" and "segfault-ish" in (crashy.reason or "")
    assert case.bandwidth_gbs == pytest.approx(50.0) and case.triad_gbs == pytest.approx([50.0] * 4)
    cost = accounting.program_cost(W1.program(W1_SMALL), W1.env(W1_SMALL))
    assert case.roofline_us == pytest.approx(max(cost.bytes / 50e9, cost.flops / 200e9) * 1e6)
    assert good.roofline_fraction == pytest.approx(case.roofline_us / good.median_us)
    assert good.gbs == pytest.approx(cost.bytes / (good.median_us * 1e-6) / 1e9)
    # the read-only stream beside the triad gives a second roofline (the limit of a weight stream)
    assert case.read_bandwidth_gbs == pytest.approx(80.0) and case.read_gbs == pytest.approx([80.0] * 4)
    assert case.read_roofline_us == pytest.approx(max(cost.bytes / 80e9, cost.flops / 200e9) * 1e6)
    assert good.read_fraction == pytest.approx(case.read_roofline_us / good.median_us)


def test_system_failing_while_timed_is_reported() -> None:
    good = _fake_system("good", 1.0)

    def prepare(w, shape, inputs, threads) -> Prepared:
        inner, n = good.prepare(w, shape, inputs, threads), [0]

        def call() -> object:
            n[0] += 1
            if n[0] > 2:  # passes the check, then dies in the timing loop
                raise MemoryError("out of memory")
            return inner.call()
        return Prepared(call, inner.fetch)
    case = _case([good, System("flaky", "flaky", "baseline", prepare)])
    flaky = case.system("flaky")
    assert flaky is not None and flaky.status == "failed" and "while timing: MemoryError" in (flaky.reason or "")
    assert flaky.median_us is None and case.best_baseline == "good"


def test_best_baseline_none_when_all_wrong(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delattr(prism, "compile", raising=False)
    case = _case([_fake_system("liar", -1.0)])
    assert case.best_baseline is None and case.system("liar").status == "wrong"  # type: ignore[union-attr]


def test_prism_column_unavailable_without_compile(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delattr(prism, "compile", raising=False)
    with pytest.raises(Unavailable, match=r"prism\.compile"):
        prism_system.prism_runner(W1, W1_SMALL)
    case = _case([BY_NAME["hand"], _fake_system("good", 1.0)])
    p = case.system("hand")
    assert p is not None and p.status == "unavailable" and "prism.compile" in (p.reason or "")
    assert p.median_us is None and not p.samples_us      # never substituted by anything
    assert case.prism_us is None and case.prism_speedup is None and case.prism_roofline_fraction is None


@pytest.mark.parametrize("bare_array", [True, False], ids=["returns-array", "returns-dict"])
def test_prism_column_uses_prism_compile_when_present(monkeypatch: pytest.MonkeyPatch, bare_array: bool) -> None:
    seen = {}

    class FakeKernel:  # stands in for the code generator in this harness test: runs the hand-written graph
        def __init__(self, graph: prism.Graph) -> None:
            self.graph = graph

        def call(self, inputs: dict, out: dict | None = None) -> dict:
            res = self.graph.evaluate(inputs)
            if out is None:  # prism's convention: a one-output kernel returns the array itself
                return next(iter(res.values())) if bare_array else res
            for k, v in res.items():
                out[k][...] = v
            return out

    def fake_compile(graph: prism.Graph, params: dict | None = None) -> FakeKernel:
        seen["graph"] = graph
        return FakeKernel(graph)

    monkeypatch.setattr(prism, "compile", fake_compile, raising=False)
    case = _case([BY_NAME["hand"], _fake_system("good", 1.0)])
    p = case.system("hand")
    assert p is not None and p.status == "ok" and p.samples_us
    assert seen["graph"].customized_ops()
    assert not (seen["graph"].customized_ops()[0].symbols() & set(W1.params(W1_SMALL)))  # params bound
    assert p.kind == "reference" and case.prism_us is None  # a reference column is never Prism's result
    assert case.best_baseline_us == case.system("good").median_us  # nor a baseline
    assert p.label == prism_system.HAND_LABEL and "hand-written" in p.label.lower()


# --- results and JSON ---------------------------------------------------------------------------

def test_json_round_trip(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delattr(prism, "compile", raising=False)
    case = _case([BY_NAME["hand"], _fake_system("good", 1.0), _fake_system("liar", 2.0)])
    rep = Report(machine={"cpu": "test", "threads": 1, "versions": {"numpy": np.__version__}},
                 limits={"peak_gflops": 200.0, "startup_triad_gbs": 50.0, "method": "fake"},
                 config={"rounds": 2, "systems": ["prism", "good", "liar"]}, cases=[case], warnings=["w"])
    text = rep.to_json()
    d = json.loads(text)
    assert d["schema"] == "prism-bench/1" and d["note"] == PRISM_NOTE
    assert {"samples_us", "sample_rounds", "round_medians_us", "status", "reason"} <= set(d["cases"][0]["systems"][1])
    back = Report.from_json(text)
    assert back == rep
    assert back.cases[0].system("liar").status == "wrong"  # type: ignore[union-attr]
    with pytest.raises(ValueError, match="schema"):
        Report.from_dict({**d, "schema": "other/9"})


def test_finish_case_recomputes_from_samples() -> None:
    from prism.bench.results import CaseResult, SystemResult
    a = SystemResult("a", "a", "baseline", "ok", samples_us=[30.0, 10.0, 20.0])
    p = SystemResult("prism", "p", "prism", "ok", samples_us=[5.0, 5.0])
    c = finish_case(CaseResult("W1", "x", {}, "", bytes=1000, flops=0, peak_gflops=1.0, triad_gbs=[1.0],
                               bandwidth_gbs=1.0, roofline_us=1.0, bound="memory", systems=[a, p]))
    assert a.median_us == 20.0 and a.gbs == pytest.approx(1000 / 20e-6 / 1e9)
    assert c.best_baseline == "a" and c.prism_speedup == pytest.approx(4.0)
    assert c.prism_roofline_fraction == pytest.approx(0.2)


# --- selection and CLI validation --------------------------------------------------------------

def test_select_systems_and_cases() -> None:
    assert [s.name for s in select("jax")] == ["prism", "jax"]
    assert [s.name for s in select("torch,ort")] == ["prism", "torch", "torch-sdpa", "ort"]
    assert {s.name for s in select(None)} >= {"prism", "torch", "compile", "max-autotune", "jax", "ort"}
    assert [s.name for s in select("jax,prism", prism=False)] == ["jax"]
    assert "prism" not in {s.name for s in select(None, prism=False)}
    with pytest.raises(PrismError, match="unknown system 'tensorflow'"):
        select("tensorflow")
    quick = select_cases(["W1", "W6"], quick=True)
    assert [(w.id, s["n"] if w.id == "W1" else s["S"]) for w, s in quick] == [("W1", 8), ("W6", 1024)]
    assert len(select_cases(["W4"], quick=False)) == len(W4.shapes)
    with pytest.raises(PrismError, match="unknown workload"):
        select_cases(["W99"], quick=False)
    assert case_label(WORKLOADS["W6"], WORKLOADS["W6"].shapes[3]) == "b=8,S=4096"
    bf = select_cases(["W1"], quick=True, precision="bfloat16")
    assert [(w.id, w.extra["precision"]) for w, _ in bf] == [("W1", "bfloat16")]
    f16 = select_cases(["W1", "W6"], quick=True, precision="float16")
    assert [(w.id, w.extra["precision"]) for w, _ in f16] == [("W1", "float16"), ("W6", "float16")]
    assert {v.dtype.name for v in f16[0][0].program(f16[0][1]).inputs.values()} == {"float16"}
    with pytest.raises(PrismError, match="int8 weight-only applies"):
        select_cases(["W4"], quick=True, precision="int8w")
    # int8 weight-only: every workload with weights, W7 included
    assert default_workloads("int8w", quick=False) == default_workloads("int8w-bf16", quick=False) == [
        "W1", "W2", "W3", "W7"]
    with pytest.raises(PrismError, match="unknown precision"):
        select_cases(["W1"], quick=True, precision="fp8")


def test_main_rejects_bad_arguments_before_measuring(capsys: pytest.CaptureFixture) -> None:
    from prism.bench import main
    assert main(["--workloads", "W42"]) == 2
    assert "unknown workload" in capsys.readouterr().err
    assert main(["--systems", "nope"]) == 2
    assert main(["--rounds", "0"]) == 2


def test_plot_writes_png(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("matplotlib")
    from prism.bench.report import plot
    monkeypatch.delattr(prism, "compile", raising=False)
    rep = Report(machine={"cpu": "test", "threads": 1}, limits={}, config={"systems": ["prism", "good"]},
                 cases=[_case([BY_NAME["hand"], _fake_system("good", 1.0)])])
    plot(rep, tmp_path / "c.png")
    assert (tmp_path / "c.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert math.isfinite(rep.cases[0].roofline_us)


def test_render_shows_statuses_and_the_hand_written_note(monkeypatch: pytest.MonkeyPatch) -> None:
    import io

    from rich.console import Console

    from prism.bench.report import render
    monkeypatch.delattr(prism, "compile", raising=False)
    rep = Report(machine={"cpu": "test", "threads": 1}, limits={"peak_gflops": 200.0, "startup_triad_gbs": 50.0},
                 config={"systems": ["hand", "good", "liar"]},
                 cases=[_case([BY_NAME["hand"], _fake_system("good", 1.0), _fake_system("liar", 3.0)])])
    buf = io.StringIO()
    render(rep, Console(file=buf, width=250, color_system=None))
    text = buf.getvalue()
    assert "HAND-WRITTEN" in text and "not a search result" in text
    assert "unavailable" in text and "✗" in text and "excluded from best baseline" in text


def test_the_settle_waits_until_this_process_is_idle() -> None:
    """After a visit the bench sleeps at least --settle-ms, then until the process's other threads (a
    library's spinning workers) stop using CPU, at most SETTLE_MAX_S. A fake clock: the workers spin at
    1.5 cores until t = 0.042 s."""
    from prism.tune.contention import SETTLE_MAX_S, wait_until_idle
    now = [0.0]

    def clock() -> float:
        return now[0]

    def cpu() -> float:  # 1.5 cores of spinning until `until`, nothing after
        return 1.5 * min(now[0], until)

    def sleep(s: float) -> None:
        now[0] += s
    until = 0.042
    waited = wait_until_idle(0.02, clock=clock, cpu=cpu, sleep=sleep)
    assert waited == pytest.approx(0.05)          # 20 ms, then 5 ms steps until a step with no spinning
    now[0], until = 0.0, 0.0
    assert wait_until_idle(0.02, clock=clock, cpu=cpu, sleep=sleep) == pytest.approx(0.025)  # one idle step
    now[0], until = 0.0, 10.0
    assert wait_until_idle(0.02, clock=clock, cpu=cpu, sleep=sleep) == pytest.approx(SETTLE_MAX_S)  # capped


def test_notes_warn_when_the_process_never_went_idle() -> None:
    from prism.bench.report import notes
    from prism.bench.results import CaseResult, Report
    from prism.tune.contention import SETTLE_MAX_S

    def case(label: str, settle: float | None) -> CaseResult:
        return CaseResult("W4", "x", {}, label, bytes=1, flops=0, peak_gflops=1.0, triad_gbs=[1.0],
                          bandwidth_gbs=1.0, roofline_us=1.0, bound="memory", settle_ms_max=settle)
    rep = Report(machine={}, limits={}, config={}, cases=[case("quiet", 41.0), case("spun", SETTLE_MAX_S * 1e3),
                                                          case("old report", None)])
    text = notes(rep).plain
    assert "still busy 500 ms after a visit" in text and "W4 spun" in text
    assert "quiet" not in text and "old report" not in text
    assert Report.from_json(rep.to_json()).cases[1].settle_ms_max == SETTLE_MAX_S * 1e3


def test_a_triad_after_another_limits_released_the_arrays_still_reads_them() -> None:
    """The C probes keep one set of triad arrays per process; the tuner's machine measurement releases them
    (Limits.release) while the bench's own Limits still measures a triad beside every case. It re-allocates
    instead of timing a loop over no elements (which reported 350,000-460,000 GB/s)."""
    from prism.tune.native import TRIAD_FLOATS, Limits
    bench, tuner = Limits.load(1), Limits.load(1)
    if bench._lib is None:
        pytest.skip("no C compiler: the NumPy triad has its own arrays per Limits")
    first = bench.triad_bandwidth()
    tuner.triad_bandwidth()
    tuner.release()
    assert bench._lib.prism_bench_triad_size() == 0
    again = bench.triad_bandwidth()
    assert bench._lib.prism_bench_triad_size() == TRIAD_FLOATS
    assert again < 20 * first and again < 5e12, (first, again)   # a DRAM-sized stream, not an empty loop
    tuner.triad_bandwidth()
    tuner.release()
    read = bench.read_bandwidth()   # the read-only stream runs over the same arrays: re-allocated too
    assert bench._lib.prism_bench_triad_size() == TRIAD_FLOATS
    assert 0 < read < 20 * first and read < 5e12, (first, read)
    bench.release()


def test_the_numpy_fallback_measures_a_read_stream_too() -> None:
    from prism.tune.native import Limits
    lim = Limits.load(1, use_c=False)
    assert lim.method.startswith("NumPy fallback")
    assert 0 < lim.read_bandwidth() < 5e12
    lim.release()
