"""prism.verify: both checks reported, verified only when both pass; the numeric verifier's
instantiations, tolerances and the hook for compiled kernels."""

from __future__ import annotations

import math

import numpy as np
import pytest
from verify_cases import MUTANTS

import prism
from prism.errors import PrismError
from prism.ir import dims as D
from prism.verify import NumericResult, VerifyResult, compiled_runner, interpreter_runner, numeric_check
from prism.verify import numeric as NU
from prism.verify.numeric import choose_instantiations, reduction_length, standard_normal_inputs, to_float32, tolerance
from prism.workloads import WORKLOADS

pytestmark = pytest.mark.unit


def test_verify_accepts_a_symbolic_hand_written_kernel() -> None:
    w = WORKLOADS["W1"]
    s = w.shapes[0]
    r = prism.verify(w.hand_written(s), w.program(s), hostile_input="X")
    assert isinstance(r, VerifyResult)
    assert r.verified and r.formal.proved and r.numeric.passed
    assert "VERIFIED" in str(r)


def test_verify_rejects_a_mutant_on_both_counts() -> None:
    case = next(c for c in MUTANTS if c.name == "W7.lora-in-loop")
    cand, ref = case.build()
    r = prism.verify(cand, ref, hostile_input=case.hostile)
    assert not r.verified
    assert not r.formal.proved and not r.numeric.passed
    assert "NOT VERIFIED" in str(r)


def test_verified_needs_both_checks() -> None:
    """A numeric check that passes cannot make up for a missing proof (W7.lora-in-loop is right at F=1)."""
    case = next(c for c in MUTANTS if c.name == "W7.lora-in-loop")
    cand, ref = case.build()
    r = prism.verify(cand, ref, instantiations=[{"n": 3, "G": 4, "F": 1}])
    assert r.numeric.passed and not r.formal.proved and not r.verified


def test_explain_reports_the_rules_the_proof_needs() -> None:
    w = WORKLOADS["W1"]
    s = w.shapes[0]
    r = prism.verify(w.hand_written(s), w.program(s), explain=True, kinds=("normal",))
    chain = r.formal.chain
    assert "cancel.combine-partition" in chain and "cancel.reduce-partial-matmul" in chain
    assert all(any(name == f for _, f, _ in r.formal.fired) for name in chain)
    # the chain is sufficient: proving with only those rules still succeeds
    from prism.verify import prove
    assert prove(w.hand_written(s), w.program(s), active=chain).proved


def test_instantiations_satisfy_every_constraint_and_include_odd_sizes() -> None:
    w = WORKLOADS["W1"]
    s = w.shapes[0]
    hand, prog = w.hand_written(s), w.program(s)
    envs = choose_instantiations(hand, prog, n=3)
    assert len(envs) == 3 and len({tuple(sorted(e.items())) for e in envs}) == 3
    for env in envs:
        assert set(env) == {"n", "G", "F"}
        for bg in hand.customized_ops():
            for c in bg.constraints:
                assert D.evaluate(c.num, env) % D.evaluate(c.den, env) == 0
    # G and F must divide 1024 (powers of two only) but the batch dim n is free: one choice is odd
    assert any(e["n"] & (e["n"] - 1) for e in envs)
    assert all(e["G"] > 1 and e["F"] > 1 for e in envs[:1])  # the first exercises the splits


def test_tolerance_scales_with_the_reduction_length() -> None:
    w = WORKLOADS["W1"]
    prog = w.program(w.shapes[0])
    assert reduction_length(prog, {"n": 2}) == w.shapes[0]["d"]
    assert tolerance(64) == pytest.approx(1e-4)
    assert tolerance(1024) == pytest.approx(4e-4)
    assert tolerance(8) == pytest.approx(1e-4)


def test_compiled_kernels_plug_in_as_runners() -> None:
    """A compiled kernel is any callable made by compile_fn(graph, params); here a stand-in."""
    w = WORKLOADS["W3"]
    s = w.shapes[0]
    hand, prog = w.hand_written(s), w.program(s)
    seen = []

    def fake_compile(g, params):
        seen.append(dict(params))
        return lambda **x: g.evaluate(x, params=params)["Y"]  # one array, like a single-output kernel

    runners = [interpreter_runner(), compiled_runner(fake_compile, "fake")]
    r = numeric_check(hand, prog, runners=runners, n_instantiations=1, kinds=("normal",))
    assert r.passed and {c.runner for c in r.checks} == {"interpreter[float32]", "fake"}
    assert seen and set(seen[0]) == {"n", "G", "F"}

    def broken_compile(g, params):
        def run(**x):
            return np.zeros((1, 1), np.float32)
        return run
    bad = numeric_check(hand, prog, runners=[compiled_runner(broken_compile, "broken")], n_instantiations=1,
                        kinds=("normal",))
    assert not bad.passed and math.isinf(bad.failures[0].max_error) and "shape" in bad.failures[0].detail


def test_the_draw_is_the_same_on_any_number_of_threads(monkeypatch: pytest.MonkeyPatch) -> None:
    """Large draws run in independently seeded chunks on every core: the values may not depend on that."""
    g = prism.Graph("big")
    g.output(g.matmul(g.input("A", ("n", 1000)), g.input("B", (1000, 3000))), "C")
    monkeypatch.setattr(NU, "_PARALLEL_MIN", 1)
    monkeypatch.setattr(NU.os, "cpu_count", lambda: 4)
    many = standard_normal_inputs(g, {"n": 5}, seed=7)
    monkeypatch.setattr(NU.os, "cpu_count", lambda: 1)
    one = standard_normal_inputs(g, {"n": 5}, seed=7)
    assert many["B"].shape == (1000, 3000) and many["A"].shape == (5, 1000)
    assert all(np.array_equal(many[k], one[k]) for k in one)
    assert not np.array_equal(standard_normal_inputs(g, {"n": 5}, seed=8)["B"], one["B"])
    b = one["B"].reshape(-1)
    assert not np.array_equal(b[:NU._CHUNK // 2], b[NU._CHUNK:NU._CHUNK + NU._CHUNK // 2])  # chunks differ
    assert abs(float(b.mean())) < 0.01 and abs(float(b.std()) - 1) < 0.01
    monkeypatch.setattr(NU.os, "cpu_count", lambda: 4)
    y = to_float32(one["B"][:, ::2])  # a strided view
    assert y.dtype == np.float32 and y.flags.c_contiguous and np.array_equal(y, one["B"][:, ::2].astype(np.float32))
    with pytest.raises(PrismError, match="float32 array of shape"):
        to_float32(one["A"], out=np.empty((5, 1000)))


def test_shared_draws_draw_an_unchanged_input_once_across_checks(monkeypatch: pytest.MonkeyPatch) -> None:
    """Inside ``shared_draws`` (a template's checks at several values of its dim) an input whose shape did not
    change is the same draw, converted to its dtype once; the input that changed is drawn anew. Outside, an
    input of a fixed shape gets new values at every instantiation (the search's checks want that)."""
    g = prism.Graph("shared")
    g.output(g.matmul(g.input("A", ("n", 64), "bfloat16"), g.input("B", (64, 48), "bfloat16")), "C")
    a, b = standard_normal_inputs(g, {"n": 5}, seed=3), standard_normal_inputs(g, {"n": 9}, seed=3)
    assert not np.array_equal(a["B"], b["B"])
    converted: list[tuple] = []
    real = NU.to_dtype

    def counting(x: np.ndarray, dtype: object, out: object = None) -> np.ndarray:
        converted.append(x.shape)
        return real(x, dtype, out)  # type: ignore[arg-type]
    monkeypatch.setattr(NU, "to_dtype", counting)
    with NU.shared_draws():
        outer = NU._shared()
        with NU.shared_draws():   # nested (a template's checks inside a new shape's derivation): the same scope
            assert NU._shared() is outer
        assert NU._shared() is outer
        r1 = numeric_check(g, g, instantiations=[{"n": 5}], runners=[compiled_runner(
            lambda gg, p: prism.compile(gg))], kinds=("normal",))
        first = list(converted)
        r2 = numeric_check(g, g, instantiations=[{"n": 9}], runners=[compiled_runner(
            lambda gg, p: prism.compile(gg))], kinds=("normal",))
        c = standard_normal_inputs(g, {"n": 5}, seed=NU.SEEDS[0])
        d = standard_normal_inputs(g, {"n": 9}, seed=NU.SEEDS[0])
    assert r1.passed and r2.passed
    assert c["B"] is d["B"] and c["A"].shape == (5, 64) and d["A"].shape == (9, 64)
    later = converted[len(first):]
    assert (64, 48) in first and (64, 48) not in later and (9, 64) in later   # B converted by the first check only
    assert NU._shared() is None


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
def test_draws_are_standard_normal_exact_in_the_input_dtype_and_seeded(dtype: str) -> None:
    """A float input's draw is standard normal, each value exactly its input's dtype (the float64 reference sees
    what the kernel is given), the same for the same seed and shapes and different for another seed."""
    from prism.ir.dtypes import SUPPORTED, round_to
    g = prism.Graph("draw")
    g.output(g.exp(g.input("X", (1000, 1100), dtype)), "Y")
    a = standard_normal_inputs(g, {}, seed=0)["X"]
    assert a.dtype == np.float64 and a.shape == (1000, 1100)
    assert np.array_equal(a, round_to(a, SUPPORTED[dtype])) and np.array_equal(a, a.astype(np.float32))
    assert abs(a.mean()) < 0.01 and abs(a.std() - 1) < 0.01 and np.abs(a).max() > 4
    assert np.array_equal(a, standard_normal_inputs(g, {}, seed=0)["X"])
    assert not np.array_equal(a, standard_normal_inputs(g, {}, seed=1)["X"])


def test_numeric_check_starts_from_given_draws_and_converts_shared_inputs_once() -> None:
    w = WORKLOADS["W3"]
    s = w.shapes[0]
    hand, prog = w.hand_written(s), w.program(s)
    env = choose_instantiations(hand, prog, 1)[0]
    draw = standard_normal_inputs(prog, env, seed=3)
    seeded = {k: to_float32(v) for k, v in draw.items()}
    seen: list[dict[str, np.ndarray]] = []

    def fake_compile(g, params):
        def run(**x):
            seen.append(x)
            return g.evaluate(x, params=params)["Y"]
        return run
    runner = compiled_runner(fake_compile, "fake", float32=[(draw[k], seeded[k]) for k in draw])
    # as the final check runs it (SuperKernel._check): hostile and tiny scale the first input only
    r = numeric_check(hand, prog, instantiations=[env], runners=[runner], seeds=(3,), draws={3: draw},
                      hostile_input="X")
    assert r.passed and len(seen) == 3  # normal, hostile, tiny (no input is small enough to be negated)
    normal, hostile, tiny = seen
    assert all(normal[k] is seeded[k] for k in draw)                   # the caller's float32 copies
    assert hostile["X"] is not normal["X"] and np.array_equal(hostile["X"], 32 * normal["X"])
    assert all(hostile[k] is normal[k] is tiny[k] for k in draw if k != "X")  # weights converted once
    # by default every input is scaled in turn (each such run converts the scaled input only), then tiny
    # scales all of them at once
    seen.clear()
    assert numeric_check(hand, prog, instantiations=[env], runners=[runner], seeds=(3,), draws={3: draw}).passed
    assert len(seen) == 1 + 2 * len(draw) + 1
    assert [sum(run[k] is not seeded[k] for k in draw) for run in seen] == [0] + [1] * 2 * len(draw) + [len(draw)]
    ref = prog.evaluate(draw, dtype=np.float64)
    assert numeric_check(hand, prog, instantiations=[env], seeds=(3,), draws={3: draw},
                         normal_references={3: ref}).passed
    wrong = numeric_check(hand, prog, instantiations=[env], seeds=(3,), draws={3: draw},
                          normal_references={3: {k: v + 1.0 for k, v in ref.items()}})
    assert not wrong.passed and {c.kind for c in wrong.failures} == {"normal"}  # the given outputs are used
    with pytest.raises(PrismError, match="normal_references= are the reference's outputs on draws="):
        numeric_check(hand, prog, instantiations=[env], normal_references={3: ref})
    with pytest.raises(PrismError, match="draws= needs exactly one instantiation"):
        numeric_check(hand, prog, n_instantiations=2, draws={0: draw})
    with pytest.raises(PrismError, match=r"draws\[0\] has shapes"):
        numeric_check(hand, prog, instantiations=[{**env, "n": env["n"] + 1}], draws={0: draw})


def test_a_runner_that_raises_fails_the_check() -> None:
    w = WORKLOADS["W3"]
    s = w.shapes[0]

    def crash(g, params):
        raise RuntimeError("compiler exploded")
    r = numeric_check(w.hand_written(s), w.program(s), runners=[compiled_runner(crash)], n_instantiations=1,
                      kinds=("normal",))
    assert isinstance(r, NumericResult) and not r.passed
    assert "compiler exploded" in r.failures[0].detail


def test_hostile_inputs_catch_a_softmax_without_max_subtraction() -> None:
    g = prism.Graph("naive")
    x = g.mul_scalar(g.input("x", ("m", 64)), 4.0)
    e = g.exp(x)
    g.output(g.div(e, g.sum(e, -1)), "out")
    ref = prism.Graph("ref")
    ref.output(ref.softmax(ref.mul_scalar(ref.input("x", ("m", 64)), 4.0), -1), "out")
    assert numeric_check(g, ref, kinds=("normal",)).passed  # mathematically equal ...
    r = numeric_check(g, ref, kinds=("hostile",))              # ... but overflows in float32
    assert not r.passed and "non-finite" in r.failures[0].detail


def test_the_search_gate_rejects_an_unshifted_exp_the_numeric_check_would_pass() -> None:
    """At a decode-like shape (one query row, head dim 128) the hostile draw keeps the scores inside exp's range,
    so exp(s) / sum(exp(s)) passes every numeric kind; the gate rejects it for exponentiating a value the program
    shifts by its maximum first (search/gate.unshifted_exp). The shifted form, written out or in a block, passes;
    a program that itself exponentiates an unshifted value does not constrain its candidates."""
    from prism.ir import BlockBuilder
    from prism.search.gate import unshifted_exp
    from prism.search.gate import verify as gate_verify

    def attn(naive: bool, name: str) -> prism.Graph:
        g = prism.Graph(name)
        q, k = g.input("q", (1, 128)), g.input("k", ("n", 128))
        s = g.mul_scalar(g.matmul(q, g.permute(k, (1, 0))), 0.0884)
        if naive:
            e = g.exp(s)
        else:
            e = g.exp(g.sub(s, g.max(s, -1)))
        g.output(g.div(e, g.sum(e, -1)), "p")
        return g
    ref = prism.Graph("ref")
    q, k = ref.input("q", (1, 128)), ref.input("k", ("n", 128))
    ref.output(ref.softmax(ref.mul_scalar(ref.matmul(q, ref.permute(k, (1, 0))), 0.0884), -1), "p")
    naive = attn(True, "naive")
    assert numeric_check(naive, ref).passed   # every kind: the scores stay below ~88 at this shape
    assert unshifted_exp(naive, ref) is not None
    v = gate_verify(naive, ref)
    assert not v.ok and "numerically unsafe" in v.detail
    assert unshifted_exp(attn(False, "stable"), ref) is None and unshifted_exp(ref, ref) is None
    assert unshifted_exp(naive, naive) is None   # the program's own exp is unshifted: its range, its choice
    # inside a block graph: the same rule
    g = prism.Graph("block_naive")
    Q, K = g.input("q", (1, 128)), g.input("k", ("n", 128))
    bb = BlockBuilder(grid=(1,), forloop=1, inputs=[Q, K])
    e = bb.exp(bb.mul_scalar(bb.matmul(bb.iter(0), bb.transpose(bb.iter(1), 0, 1)), 0.0884))
    bb.save(bb.div(e, bb.sum(e, -1)), omap=(None,))
    (y,) = g.customized(bb.build(), [Q, K])
    g.output(y, "p")
    assert unshifted_exp(g, ref) is not None


def test_numeric_check_judges_ill_conditioned_programs_by_their_own_float32_error() -> None:
    """x / (x + 1) near x = -1: the program run in float32 is itself far from float64 there; a candidate
    as accurate as it passes, one with an added error beyond OWN_ERROR_FACTOR times it does not."""
    from prism.verify.numeric import _compare
    x = np.concatenate([np.linspace(-3, 3, 4001), [-1 + 1e-5, -1 - 2e-5]])
    r = x / (x + 1)
    x32 = x.astype(np.float32)
    p32 = (x32 / (x32 + np.float32(1))).astype(np.float32)
    err, why = _compare(p32, r, lambda: p32)
    assert err <= 1e-4 and "allows" in why
    plain, _ = _compare(p32, r)
    assert plain > 1e-4  # without the program's own error the same candidate fails
    worse = p32.astype(np.float64) * (1 + 1e-3)
    assert _compare(worse, r, lambda: p32)[0] > 1e-4


def test_the_tuners_filter_allows_a_rounding_programs_own_float32_steps() -> None:
    """max_error with the program's float32 run (the tuner's filter, tune/tuner.py): round(x * 1000.3) steps by one
    from the float64 reference where x * 1000.3 rounds across a half in float32 (~0.1 % of the elements); a
    candidate that rounds as the program does passes, where without the allowance it failed every candidate; a
    candidate that floors instead (off by a step at half of the elements) still fails."""
    from prism.verify.numeric import Float32Program, max_error
    g = prism.Graph("round")
    x = g.input("x", (256, 1024))
    g.output(g.mul_scalar(g.round(g.mul_scalar(x, 1000.3)), 0.001), "y")
    draw = {"x": np.random.default_rng(0).standard_normal((256, 1024))}
    ref = g.evaluate(draw, dtype=np.float64)
    same = g.evaluate({"x": draw["x"].astype(np.float32)}, dtype=np.float32)
    tol = 1e-4
    assert max_error(same, ref) > tol                                   # plain: one step at rare elements
    assert max_error(same, ref, Float32Program(g, draw, {})) <= tol
    x32 = draw["x"].astype(np.float32)
    floored = {"y": (np.floor(x32 * np.float32(1000.3)) * np.float32(0.001)).astype(np.float32)}
    assert max_error(floored, ref, Float32Program(g, draw, {})) > tol


def test_a_rounding_step_carried_through_a_product_is_the_programs_own_error() -> None:
    """steps(): a quantizer before a product (W8A8) -- one value rounds across a half in float32 (0.35f / 0.1f is
    3.4999998882 in float64, 3.5 in float32: 3 against 4) and the step reaches every output of its row, 1/8 of the
    outputs, more than the rare elements the allowance excuses elsewhere (OWN_ERROR_MAX_FRACTION). The program has
    a piecewise-constant operator, so the candidate that rounds as the program's float32 run does passes the
    tuner's filter and the numeric check's comparison; one that floors instead still fails."""
    from prism.verify.numeric import OWN_ERROR_MAX_FRACTION, Float32Program, max_error, steps
    g = prism.Graph("quantized product")
    x, s, w = g.input("x", (8, 64)), g.input("s", (8, 1)), g.input("w", (64, 256))
    g.output(g.matmul(g.round(g.div(x, s)), w), "y")
    rng = np.random.default_rng(0)
    xv = np.round(rng.standard_normal((8, 64)) * 20) + 0.75   # over a scale of 1: exact in both precisions
    sv = np.ones((8, 1))
    xv[2], sv[2] = 0.0, np.float32(0.1)
    xv[2, 5] = np.float32(0.35)
    draw = {"x": xv, "s": sv, "w": rng.standard_normal((64, 256))}
    ref = g.evaluate(draw, dtype=np.float64)
    same = g.evaluate({k: v.astype(np.float32) for k, v in draw.items()}, dtype=np.float32)
    off = np.abs(same["y"] - ref["y"]) > 1e-5 * np.abs(ref["y"]).max()   # the step: w[5] times 1
    assert off[2].mean() > 0.9 and not off[[0, 1, 3, 4, 5, 6, 7]].any() and off.mean() > OWN_ERROR_MAX_FRACTION
    plain = prism.Graph("plain product")
    plain.output(plain.matmul(plain.input("x", (8, 64)), plain.input("w", (64, 256))), "y")
    assert steps(g) and not steps(plain)
    tol = 1e-4
    assert max_error(same, ref, Float32Program(g, draw, {})) <= tol
    x32, s32, w32 = (draw[k].astype(np.float32) for k in ("x", "s", "w"))
    floored = {"y": np.floor(x32 / s32) @ w32}
    assert max_error(floored, ref, Float32Program(g, draw, {})) > tol


def test_a_small_output_may_have_one_element_where_the_program_itself_errs() -> None:
    """A check at a small instantiation has outputs of a few elements: one element in float32's subnormal range
    (where the program itself, run in float32, is off by 1.6e-4) no longer rejects a candidate exactly as
    accurate as the program (a gated MLP at the decode shape [1, 1, 64] lost every candidate to this); two such
    elements of three still make the reference suspect, and an error beyond the program's own still fails."""
    from prism.verify.numeric import _compare
    r = np.array([-4.79e-221, 5.11901139e-39, -8.46e-123])
    p32 = np.array([0.0, 5.117719e-39, 0.0], dtype=np.float32)
    assert _compare(p32, r)[0] > 1e-4                      # plain: the subnormal element fails
    err, why = _compare(p32, r, lambda: p32)
    assert err <= 1e-6 and "allows" in why
    worse = p32.astype(np.float64) * np.array([1.0, 1.01, 1.0])
    assert _compare(worse, r, lambda: p32)[0] > 1e-4
    r2 = np.array([5.11901139e-39, 5.11901139e-39, -8.46e-123])
    p2 = np.array([5.117719e-39, 5.117719e-39, 0.0], dtype=np.float32)
    assert _compare(p2, r2, lambda: p2)[0] > 1e-4          # two of three: nothing is excused


def test_scaled_inputs_excuse_the_programs_own_error_everywhere() -> None:
    """A KL divergence of two log-softmaxes at inputs x1e-3: float32 rounds both log-softmaxes to -log(n) +
    O(1e-3), so the program itself errs by ~1e-4..1e-3 relative at every element. At the scaled kinds
    (``everywhere=True``) a candidate as accurate as the program passes; the rare-element rule still refuses
    it at the normal kinds, and an error beyond the program's own fails either way."""
    from prism.verify.numeric import _compare
    rng = np.random.default_rng(0)
    x, z = rng.standard_normal((2, 64, 512)) * 1e-3

    def kl(x: np.ndarray, z: np.ndarray) -> np.ndarray:
        def ls(v: np.ndarray) -> np.ndarray:
            s = v - v.max(-1, keepdims=True)
            return s - np.log(np.exp(s).sum(-1, keepdims=True))
        p = np.exp(ls(x))
        return (p * (ls(x) - ls(z))).sum(-1)

    r = kl(x, z)
    p32 = kl(x.astype(np.float32), z.astype(np.float32))
    assert p32.dtype == np.float32
    plain, _ = _compare(p32, r, lambda: p32)
    assert plain > 1e-4                                    # not excused: ill-conditioned at every element
    err, why = _compare(p32, r, lambda: p32, everywhere=True)
    assert err <= 1e-6 and "allows" in why
    worse = p32.astype(np.float64) + 0.05 * np.abs(r).max()
    assert _compare(worse, r, lambda: p32, everywhere=True)[0] > 1e-4
