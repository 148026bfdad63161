"""The numeric check's former blind spots (issue 12, item 4): each false equation below passed
``numeric_check`` alone before; each must now fail it, and a true equation of the same form must still
pass (docs/verify.md, "Numeric verifier")."""

from __future__ import annotations

from collections.abc import Callable

import pytest

import prism
from prism.ir.builder import Tensor
from prism.verify import numeric_check

Side = Callable[[prism.Graph, dict[str, Tensor]], Tensor]


def _pair(inputs: dict[str, tuple[object, ...]], lhs: Side, rhs: Side) -> tuple[prism.Graph, prism.Graph]:
    """(candidate, reference) computing ``lhs`` and ``rhs`` of the same inputs."""
    out = []
    for side, fn in (("candidate", lhs), ("reference", rhs)):
        g = prism.Graph(side)
        ins = {k: g.input(k, s) for k, s in inputs.items()}
        g.output(fn(g, ins), "out")
        out.append(g)
    return out[0], out[1]


def test_a_finite_candidate_where_the_reference_is_nan_fails() -> None:
    x = {"x": ("m", "n")}
    cand, ref = _pair(x, lambda g, i: i["x"], lambda g, i: g.square(g.sqrt(i["x"])))  # x = sqrt(x)^2: x >= 0 only
    r = numeric_check(cand, ref)
    assert not r.passed and "NaN" in r.failures[0].detail
    assert not prism.verify(cand, ref).numeric.passed
    # NaN exactly where the reference has NaN is agreement: sqrt(x)^2 = sqrt(x) * sqrt(x)
    same_nan = _pair(x, lambda g, i: g.square(g.sqrt(i["x"])), lambda g, i: g.mul(g.sqrt(i["x"]), g.sqrt(i["x"])))
    assert numeric_check(*same_nan).passed


def test_infinities_of_the_opposite_sign_fail() -> None:
    """x / -relu(y) computed as x / (0*relu(y) - relu(y)): equal wherever finite, but where relu(y) = 0 the
    divisor is +0 instead of -0, so every infinity has the wrong sign."""
    xy = {"x": ("m", "n"), "y": ("m", "n")}
    cand, ref = _pair(xy, lambda g, i: g.div(i["x"], g.sub(g.mul_scalar(g.relu(i["y"]), 0.0), g.relu(i["y"]))),
                      lambda g, i: g.div(i["x"], g.neg(g.relu(i["y"]))))
    r = numeric_check(cand, ref)
    assert not r.passed and "inf" in r.failures[0].detail
    same_inf = _pair(xy, lambda g, i: g.neg(g.div(i["x"], g.relu(i["y"]))),
                     lambda g, i: g.div(i["x"], g.neg(g.relu(i["y"]))))
    assert numeric_check(*same_inf).passed


@pytest.mark.parametrize("first_seed", range(6))
def test_an_identity_that_holds_for_one_sign_of_a_scalar_input_fails_on_any_seed(first_seed: int) -> None:
    """relu(a*a*s) = a*a*s holds only for s >= 0: caught whatever the draw of s (1, 1) is, since each
    small input is also run negated."""
    ins = {"a": ("m", "n"), "s": (1, 1)}
    cand, ref = _pair(ins, lambda g, i: g.relu(i["a"] * i["a"] * i["s"]), lambda g, i: i["a"] * i["a"] * i["s"])
    assert not numeric_check(cand, ref, seeds=(first_seed,)).passed
    assert not numeric_check(cand, ref, seeds=(first_seed, first_seed + 1)).passed
    true = _pair(ins, lambda g, i: g.relu(i["a"] * i["a"] * g.square(i["s"])),
                 lambda g, i: i["a"] * i["a"] * g.square(i["s"]))
    assert numeric_check(*true, seeds=(first_seed,)).passed


def test_the_default_check_uses_two_seeds_and_negates_small_inputs() -> None:
    ins = {"a": ("m", "n"), "s": (1, 1)}
    cand, ref = _pair(ins, lambda g, i: g.relu(i["a"] * i["a"] * i["s"]), lambda g, i: i["a"] * i["a"] * i["s"])
    assert not prism.verify(cand, ref).numeric.passed
    true = _pair({"a": ("m", 8), "s": (1, 1)}, lambda g, i: g.mul(i["a"], i["s"]), lambda g, i: g.mul(i["s"], i["a"]))
    r = numeric_check(*true)
    assert r.passed
    assert {c.seed for c in r.checks} == {0, 1}
    assert {c.input for c in r.checks if c.kind == "negated"} == {"s"}  # a: more than SMALL_INPUT elements


def _naive_softmax(g: prism.Graph, x: Tensor) -> Tensor:
    e = g.exp(g.mul_scalar(x, 4.0))
    return g.div(e, g.sum(e, -1))


def test_hostile_scaling_reaches_the_second_input() -> None:
    """A softmax without max subtraction on the second declared input overflows in float32 once that input
    is x30; before, only the first input was scaled."""
    vx = {"v": ("m", 64), "x": ("m", 64)}
    cand, ref = _pair(vx, lambda g, i: i["v"] * _naive_softmax(g, i["x"]),
                      lambda g, i: i["v"] * g.softmax(g.mul_scalar(i["x"], 4.0), -1))
    r = numeric_check(cand, ref)
    assert not r.passed
    bad = r.failures[0]
    assert (bad.kind, bad.input) == ("hostile", "x") and "non-finite" in bad.detail
    assert not prism.verify(cand, ref).numeric.passed
    stable = _pair(vx, lambda g, i: i["v"] * g.softmax(g.mul_scalar(i["x"], 4.0), -1),
                   lambda g, i: i["v"] * g.softmax(g.mul_scalar(i["x"], 4.0), -1))
    ok = numeric_check(*stable)
    assert ok.passed and {c.input for c in ok.checks if c.kind == "hostile"} == {"v", "x"}
    assert {c.input for c in ok.checks if c.kind == "tiny"} == {"v", "x", "v,x"}  # in turn, then at once


def test_tiny_scaling_reaches_the_second_input() -> None:
    """rms_norm with its epsilon dropped, on the second input: invisible at unit scale, wrong at x1e-3."""
    vx = {"v": ("m", 32), "x": ("m", 32)}
    cand, ref = _pair(vx, lambda g, i: i["v"] * g.div(i["x"], g.sqrt(g.mean(g.square(i["x"]), -1))),
                      lambda g, i: i["v"] * g.rms_norm(i["x"], 1e-6, -1))
    assert numeric_check(cand, ref, kinds=("normal",)).passed  # indistinguishable at unit scale
    r = numeric_check(cand, ref)
    assert not r.passed and (r.failures[0].kind, r.failures[0].input) == ("tiny", "x")


def test_a_dropped_epsilon_on_a_sum_of_inputs_fails_through_tiny_all_at_once() -> None:
    """rms_norm(x + h) without its epsilon: scaling x or h alone leaves the sum at unit scale; the tiny run
    with every input x1e-3 at once shows it."""
    xh = {"x": ("m", 32), "h": ("m", 32)}

    def no_eps(g: prism.Graph, i: dict[str, Tensor]) -> Tensor:
        s = i["x"] + i["h"]
        return g.div(s, g.sqrt(g.mean(g.square(s), -1)))
    cand, ref = _pair(xh, no_eps, lambda g, i: g.rms_norm(i["x"] + i["h"], 1e-6, -1))
    r = numeric_check(cand, ref)
    assert not r.passed and (r.failures[0].kind, r.failures[0].input) == ("tiny", "x,h")


def test_overflow_is_excused_only_where_the_program_overflows_in_float32_too() -> None:
    """Scaling every input in turn reaches inputs a program itself cannot take x30 in float32 (here
    exp(120 * s * a) overflows): a candidate that overflows exactly where the program run in float32 does
    still passes; one that overflows where the program does not (square before sqrt) fails."""
    ins = {"a": ("m", 16), "s": ("m", 16)}
    program = _pair(ins, lambda g, i: g.exp(g.mul_scalar(i["s"] * i["a"], 4.0)),
                    lambda g, i: g.exp(g.mul_scalar(i["a"] * i["s"], 4.0)))
    r = numeric_check(*program)
    assert r.passed
    assert any("as in the program run in float32" in c.detail for c in r.checks if c.kind == "hostile")
    unsafe = _pair({"a": ("m", 16)}, lambda g, i: g.sqrt(g.square(g.exp(i["a"]))), lambda g, i: g.exp(i["a"]))
    bad = numeric_check(*unsafe)
    assert not bad.passed and bad.failures[0].kind == "hostile" and "+inf" in bad.failures[0].detail
