"""Every operator's NumPy reference (prism.reference.numpy_ops.IMPL, reached through Graph.evaluate) agrees
with PyTorch on random inputs.

Tolerances: float64 rtol = atol = 1e-10 (both sides compute in float64; only summation order and
libm differ); float32 rtol 1e-5, atol 1e-6 (a few ulps of the float32 results, inputs are O(1)).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from prism.errors import ShapeError
from prism.ir import OPS, Graph, Tensor
from prism.ir.ops import broadcast_shapes
from prism.reference.numpy_ops import IMPL

torch = pytest.importorskip("torch")
Fn = torch.nn.functional

pytestmark = pytest.mark.unit

TOL = {"float64": dict(rtol=1e-10, atol=1e-10), "float32": dict(rtol=1e-5, atol=1e-6)}
DTYPES = sorted(TOL)
NOT_COMPUTE_OPS = {"input", "output", "customized", "result"}


def run(build: Callable[..., Tensor], arrays: dict[str, np.ndarray], dtype: str) -> np.ndarray:
    """Build ``out = build(g, *inputs)`` in a fresh graph and evaluate it in ``dtype``."""
    g = Graph()
    ins = [g.input(k, a.shape, dtype) for k, a in arrays.items()]
    g.output(build(g, *ins), "out")
    res = g.evaluate({k: a.astype(dtype) for k, a in arrays.items()})["out"]
    assert res.dtype == np.dtype(dtype)
    return res


def torch_of(arrays: dict[str, np.ndarray], dtype: str) -> list:
    return [torch.from_numpy(np.ascontiguousarray(a.astype(dtype))) for a in arrays.values()]


def close(got: np.ndarray, want, dtype: str) -> None:
    want = want.detach().numpy() if hasattr(want, "detach") else np.asarray(want)
    assert got.shape == want.shape, (got.shape, want.shape)
    np.testing.assert_allclose(got, want, **TOL[dtype])


def rand(rng: np.random.Generator, *shape: int) -> np.ndarray:
    return rng.standard_normal(shape)


def positive(rng: np.random.Generator, *shape: int) -> np.ndarray:
    return np.abs(rng.standard_normal(shape)) + 0.1


def nonzero(rng: np.random.Generator, *shape: int) -> np.ndarray:
    x = rng.standard_normal(shape)
    return np.sign(x) * (np.abs(x) + 0.5)


# --- matmul -----------------------------------------------------------------------------------------

MATMUL_SHAPES = [
    ((4, 5), (5, 6)),
    ((2, 3, 4, 5), (5, 6)),
    ((4, 5), (2, 5, 6)),
    ((3, 1, 4, 5), (2, 5, 6)),
    ((2, 3, 4, 5), (2, 3, 5, 6)),
    ((1, 4, 5), (3, 5, 6)),
    ((2, 1, 1, 3), (1, 4, 3, 2)),
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("sa,sb", MATMUL_SHAPES)
def test_matmul(rng, dtype: str, sa: tuple, sb: tuple) -> None:
    arrays = {"a": rand(rng, *sa), "b": rand(rng, *sb)}
    got = run(lambda g, a, b: g.matmul(a, b), arrays, dtype)
    close(got, torch.matmul(*torch_of(arrays, dtype)), dtype)


def test_matmul_float32_graph_evaluated_in_float64(rng) -> None:
    """A float32 program evaluated with dtype=float64 computes in float64 (the accuracy reference)."""
    a, b = rand(rng, 3, 7), rand(rng, 7, 2)
    g = Graph()
    x, w = g.input("a", a.shape), g.input("b", b.shape)
    g.output(x @ w, "out")
    got = g.evaluate({"a": a.astype(np.float32), "b": b.astype(np.float32)}, dtype=np.float64)["out"]
    assert got.dtype == np.float64
    want = torch.from_numpy(a.astype(np.float32).astype(np.float64)) @ torch.from_numpy(
        b.astype(np.float32).astype(np.float64))
    close(got, want, "float64")


# --- element-wise unary --------------------------------------------------------------------------------
# name -> (the op it covers, prism builder, torch function, input generator)
UNARY: dict[str, tuple[str, Callable, Callable, Callable]] = {
    "exp": ("exp", lambda g, x: g.exp(x), torch.exp, rand),
    "square": ("square", lambda g, x: g.square(x), torch.square, rand),
    "sqrt": ("sqrt", lambda g, x: g.sqrt(x), torch.sqrt, positive),
    "rsqrt": ("rsqrt", lambda g, x: g.rsqrt(x), torch.rsqrt, positive),
    "silu": ("silu", lambda g, x: g.silu(x), Fn.silu, rand),
    "gelu": ("gelu", lambda g, x: g.gelu(x), lambda t: Fn.gelu(t, approximate="none"), rand),
    "gelu_tanh": ("gelu", lambda g, x: g.gelu(x, approximate="tanh"), lambda t: Fn.gelu(t, approximate="tanh"),
                  rand),
    "relu": ("relu", lambda g, x: g.relu(x), torch.relu, rand),
    "sigmoid": ("sigmoid", lambda g, x: g.sigmoid(x), torch.sigmoid, rand),
    "tanh": ("tanh", lambda g, x: g.tanh(x), torch.tanh, rand),
    "neg": ("neg", lambda g, x: g.neg(x), torch.neg, rand),
    "mul_scalar": ("mul_scalar", lambda g, x: g.mul_scalar(x, 2.5), lambda t: t * 2.5, rand),
    "mul_scalar_neg": ("mul_scalar", lambda g, x: g.mul_scalar(x, -0.3), lambda t: t * -0.3, rand),
    "add_scalar": ("add_scalar", lambda g, x: g.add_scalar(x, 1.5), lambda t: t + 1.5, rand),
    "add_scalar_neg": ("add_scalar", lambda g, x: g.add_scalar(x, -3.25), lambda t: t - 3.25, rand),
    "abs": ("abs", lambda g, x: g.abs(x), torch.abs, rand),
    "log": ("log", lambda g, x: g.log(x), torch.log, positive),
    "erf": ("erf", lambda g, x: g.erf(x), torch.erf, rand),
    "sin": ("sin", lambda g, x: g.sin(x), torch.sin, lambda r, *s: 4 * rand(r, *s)),
    "cos": ("cos", lambda g, x: g.cos(x), torch.cos, lambda r, *s: 4 * rand(r, *s)),
    "clamp": ("clamp", lambda g, x: g.clamp(x, -0.5, 0.7), lambda t: torch.clamp(t, -0.5, 0.7), rand),
    "clamp_min": ("clamp", lambda g, x: g.clamp(x, 0.1, float("inf")), lambda t: torch.clamp(t, min=0.1), rand),
    "hardtanh": ("clamp", lambda g, x: g.clamp(x), Fn.hardtanh, rand),
    "leaky_relu": ("leaky_relu", lambda g, x: g.leaky_relu(x), Fn.leaky_relu, rand),
    "leaky_relu_0.2": ("leaky_relu", lambda g, x: g.leaky_relu(x, 0.2), lambda t: Fn.leaky_relu(t, 0.2), rand),
    "hardsigmoid": ("hardsigmoid", lambda g, x: g.hardsigmoid(x), Fn.hardsigmoid, lambda r, *s: 4 * rand(r, *s)),
    "hardswish": ("hardswish", lambda g, x: g.hardswish(x), Fn.hardswish, lambda r, *s: 4 * rand(r, *s)),
    "elu": ("elu", lambda g, x: g.elu(x), Fn.elu, rand),
    "elu_0.5": ("elu", lambda g, x: g.elu(x, 0.5), lambda t: Fn.elu(t, 0.5), rand),
    "selu": ("elu", lambda g, x: g.elu(x, 1.6732632423543772848170429916717, 1.0507009873554804934193349852946),
             Fn.selu, rand),
    "celu": ("elu", lambda g, x: g.elu(x, 0.7, 1.0, 1 / 0.7), lambda t: Fn.celu(t, 0.7), rand),
    "softplus": ("softplus", lambda g, x: g.softplus(x), Fn.softplus, lambda r, *s: 10 * rand(r, *s)),
    "softplus_beta": ("softplus", lambda g, x: g.softplus(x, 2.0, 5.0), lambda t: Fn.softplus(t, 2.0, 5.0),
                      lambda r, *s: 5 * rand(r, *s)),
    "mish": ("mish", lambda g, x: g.mish(x), Fn.mish, lambda r, *s: 5 * rand(r, *s)),
    "round": ("round", lambda g, x: g.round(x), torch.round, lambda r, *s: 4 * rand(r, *s)),
    "round_halves": ("round", lambda g, x: g.round(x), torch.round, lambda r, *s: np.round(8 * rand(r, *s)) / 2),
    "round_2": ("round", lambda g, x: g.round(x, 2), lambda t: torch.round(t, decimals=2), rand),
    "round_-1": ("round", lambda g, x: g.round(x, -1), lambda t: torch.round(t, decimals=-1),
                 lambda r, *s: 100 * rand(r, *s)),
    "floor": ("floor", lambda g, x: g.floor(x), torch.floor, lambda r, *s: 4 * rand(r, *s)),
    "ceil": ("ceil", lambda g, x: g.ceil(x), torch.ceil, lambda r, *s: 4 * rand(r, *s)),
    "trunc": ("trunc", lambda g, x: g.trunc(x), torch.trunc, lambda r, *s: 4 * rand(r, *s)),
    "frac": ("frac", lambda g, x: g.frac(x), torch.frac, lambda r, *s: 4 * rand(r, *s)),
    "sign": ("sign", lambda g, x: g.sign(x), torch.sign, lambda r, *s: np.where(rand(r, *s) > 1, 0.0, rand(r, *s))),
    "reciprocal": ("reciprocal", lambda g, x: g.reciprocal(x), torch.reciprocal, nonzero),
    "log1p": ("log1p", lambda g, x: g.log1p(x), torch.log1p, lambda r, *s: positive(r, *s) - 0.95),
    "expm1": ("expm1", lambda g, x: g.expm1(x), torch.expm1, rand),
    "exp2": ("exp2", lambda g, x: g.exp2(x), torch.exp2, lambda r, *s: 10 * rand(r, *s)),
    "log2": ("log2", lambda g, x: g.log2(x), torch.log2, positive),
    "log10": ("log10", lambda g, x: g.log10(x), torch.log10, positive),
    **{f"compare_{k}": ("compare", lambda g, x, k=k: g.compare(x, k, 0.25),
                        lambda t, k=k: getattr(torch, k)(t, 0.25).to(t.dtype), rand)
       for k in ("gt", "ge", "lt", "le", "eq", "ne")},
    "compare_eq_hit": ("compare", lambda g, x: g.compare(g.relu(x), "eq", 0.0),
                       lambda t: (torch.relu(t) == 0).to(t.dtype), rand),
    "cast_bf16": ("cast", lambda g, x: g.cast(g.cast(x, "bfloat16"), "float32"),
                  lambda t: t.float().to(torch.bfloat16).to(t.dtype), lambda r, *s: 100 * rand(r, *s)),
    "cast_f16": ("cast", lambda g, x: g.cast(g.cast(x, "float16"), "float32"),
                 lambda t: t.float().to(torch.float16).to(t.dtype), rand),
    "mask_scalar": ("mask_scalar", lambda g, x: g.mask_scalar(g.relu(x), -2.5),
                    lambda t: torch.where(torch.relu(t) != 0, -2.5, 0.0).to(t.dtype), rand),
}


@pytest.mark.parametrize("case,dtype", [(c, d) for c in sorted(UNARY) for d in DTYPES
                                        if not (UNARY[c][0] == "cast" and d == "float64")])  # (no cast from f64)
def test_unary(rng, case: str, dtype: str) -> None:
    _, build, tfn, gen = UNARY[case]
    arrays = {"x": gen(rng, 3, 4, 5)}
    got = run(build, arrays, dtype)
    close(got, tfn(*torch_of(arrays, dtype)), dtype)


@pytest.mark.parametrize("case", ["sigmoid", "silu", "tanh", "relu", "gelu", "gelu_tanh", "neg", "abs", "erf",
                                  "clamp", "leaky_relu", "hardsigmoid", "hardswish", "elu", "selu", "softplus",
                                  "softplus_beta", "mish"])
def test_unary_large_magnitudes_stay_finite(case: str) -> None:
    """Stable forms: sigmoid/silu must not overflow for |x| ~ 1e3 in float32."""
    _, build, tfn, _ = UNARY[case]
    arrays = {"x": np.array([[-1000.0, -90.0, -20.0, -1e-3, 0.0, 1e-3, 20.0, 90.0, 1000.0]])}
    got = run(build, arrays, "float32")
    assert np.all(np.isfinite(got))
    close(got, tfn(*torch_of(arrays, "float32")), "float32")


# --- element-wise binary with broadcasting ---------------------------------------------------------------
BINARY: dict[str, tuple[Callable, Callable]] = {
    "add": (lambda g, a, b: g.add(a, b), torch.add),
    "sub": (lambda g, a, b: g.sub(a, b), torch.sub),
    "mul": (lambda g, a, b: g.mul(a, b), torch.mul),
    "div": (lambda g, a, b: g.div(a, b), torch.div),
    "maximum": (lambda g, a, b: g.maximum(a, b), torch.maximum),
    "minimum": (lambda g, a, b: g.minimum(a, b), torch.minimum),
    "mask_select": (lambda g, a, b: g.mask_select(g.relu(a), b),
                    lambda a, b: torch.where(torch.relu(a) != 0, b, torch.zeros((), dtype=b.dtype))),
}
BROADCAST_SHAPES = [((3, 4), (3, 4)), ((4, 1), (1, 5)), ((3,), (2, 3)), ((2, 1, 4), (3, 1)), ((2, 3, 4), (4,)),
                    ((1,), (2, 3)), ((2, 3, 1), (2, 1, 5))]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("sa,sb", BROADCAST_SHAPES)
@pytest.mark.parametrize("name", sorted(BINARY))
def test_binary(rng, name: str, sa: tuple, sb: tuple, dtype: str) -> None:
    build, tfn = BINARY[name]
    arrays = {"a": rand(rng, *sa), "b": nonzero(rng, *sb) if name == "div" else rand(rng, *sb)}
    got = run(build, arrays, dtype)
    close(got, tfn(*torch_of(arrays, dtype)), dtype)


_shape = st.lists(st.integers(1, 3), max_size=4).map(tuple)


@given(_shape, _shape)
def test_broadcast_shape_rule_matches_torch(a: tuple, b: tuple) -> None:
    try:
        want = tuple(torch.broadcast_shapes(a, b))
    except RuntimeError:
        with pytest.raises(ShapeError):
            broadcast_shapes(a, b)
        return
    assert broadcast_shapes(a, b) == want


def test_evaluate_accepts_torch_tensors(rng) -> None:
    a = rng.standard_normal((3, 4)).astype(np.float32)
    g = Graph()
    g.output(g.tanh(g.input("a", (3, 4))), "out")
    got = g.evaluate({"a": torch.from_numpy(a)})["out"]
    close(got, torch.tanh(torch.from_numpy(a)), "float32")


# --- reductions (keepdim) ---------------------------------------------------------------------------------
REDUCE: dict[str, tuple[Callable, Callable]] = {
    "sum": (lambda g, x, d: g.sum(x, d), lambda t, d: torch.sum(t, d, keepdim=True)),
    "max": (lambda g, x, d: g.max(x, d), lambda t, d: torch.amax(t, d, keepdim=True)),
    "min": (lambda g, x, d: g.min(x, d), lambda t, d: torch.amin(t, d, keepdim=True)),
    "mean": (lambda g, x, d: g.mean(x, d), lambda t, d: torch.mean(t, d, keepdim=True)),
}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("dim", [0, 1, 2, -1, -2, -3])
@pytest.mark.parametrize("name", sorted(REDUCE))
def test_reductions_keepdim(rng, name: str, dim: int, dtype: str) -> None:
    build, tfn = REDUCE[name]
    arrays = {"x": rand(rng, 3, 4, 5)}
    got = run(lambda g, x: build(g, x, dim), arrays, dtype)
    assert got.ndim == 3 and got.shape[dim] == 1
    close(got, tfn(*torch_of(arrays, dtype), dim), dtype)


# --- composites ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("eps", [1e-6, 1e-2])
@pytest.mark.parametrize("dim", [-1, 0, 1, -2])
def test_rms_norm_against_formula(rng, dim: int, eps: float, dtype: str) -> None:
    arrays = {"x": rand(rng, 3, 4, 8)}
    got = run(lambda g, x: g.rms_norm(x, eps=eps, dim=dim), arrays, dtype)
    (t,) = torch_of(arrays, dtype)
    close(got, t / torch.sqrt(torch.mean(t * t, dim, keepdim=True) + eps), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("eps", [1e-6, 1e-2])
def test_rms_norm_against_torch_functional(rng, eps: float, dtype: str) -> None:
    arrays = {"x": rand(rng, 2, 5, 16)}
    got = run(lambda g, x: g.rms_norm(x, eps=eps), arrays, dtype)
    close(got, Fn.rms_norm(torch_of(arrays, dtype)[0], (16,), eps=eps), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("eps", [1e-5, 1e-2])
def test_layer_norm_against_torch_functional(rng, eps: float, dtype: str) -> None:
    arrays = {"x": rand(rng, 2, 5, 16) * 3.0 + 7.0}   # a mean far from 0: the variance is centred
    got = run(lambda g, x: g.layer_norm(x, eps=eps), arrays, dtype)
    close(got, Fn.layer_norm(torch_of(arrays, dtype)[0], (16,), eps=eps), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("dim", [0, 1, -2])
def test_layer_norm_over_other_dims(rng, dim: int, dtype: str) -> None:
    arrays = {"x": rand(rng, 3, 4, 6)}
    got = run(lambda g, x: g.layer_norm(x, 1e-5, dim), arrays, dtype)
    (t,) = torch_of(arrays, dtype)
    c = t - t.mean(dim, keepdim=True)
    close(got, c / torch.sqrt((c * c).mean(dim, keepdim=True) + 1e-5), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("dim", [0, 1, 2, -1, -2])
def test_softmax(rng, dim: int, dtype: str) -> None:
    arrays = {"x": rand(rng, 3, 4, 6)}
    got = run(lambda g, x: g.softmax(x, dim), arrays, dtype)
    close(got, torch.softmax(torch_of(arrays, dtype)[0], dim), dtype)


@pytest.mark.parametrize("dim", [-1, 0])
def test_softmax_hostile_inputs_stay_finite(rng, dim: int) -> None:
    """x * 1000 overflows exp() in float32; the reference subtracts the max and must stay finite."""
    arrays = {"x": rand(rng, 4, 8) * 1000.0}
    with np.errstate(over="ignore"):
        assert not np.all(np.isfinite(np.exp(arrays["x"].astype(np.float32))))  # the input is hostile
    got = run(lambda g, x: g.softmax(x, dim), arrays, "float32")
    assert np.all(np.isfinite(got))
    close(got, torch.softmax(torch_of(arrays, "float32")[0], dim), "float32")
    np.testing.assert_allclose(got.sum(axis=dim), 1.0, rtol=1e-6)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("dim", [-1, 1])
def test_rotate_half_as_transformers_writes_it(rng, dim: int, dtype: str) -> None:
    """``transformers``' rotate_half: cat((-x[..., h:], x[..., :h]), -1), here along any dim, with the hostile
    values of a negation (inf, -0.0, nan) passed through exactly."""
    x = rand(rng, 3, 8, 6)
    x[0, 0, 0], x[1, 5, 1], x[2, 7, 2] = np.inf, -0.0, np.nan
    arrays = {"x": x}
    got = run(lambda g, x: g.rotate_half(x, dim), arrays, dtype)
    t = torch_of(arrays, dtype)[0]
    h = t.shape[dim] // 2
    want = torch.cat((-t.narrow(dim, h, h), t.narrow(dim, 0, h)), dim)
    close(got, want, dtype)
    np.testing.assert_array_equal(np.signbit(got), np.signbit(want.numpy()))


# --- layout ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("perm", [(0, 1, 2), (2, 0, 1), (1, 0, 2), (0, 2, 1), (2, 1, 0), (-1, 0, 1)])
def test_permute(rng, perm: tuple, dtype: str) -> None:
    arrays = {"x": rand(rng, 2, 3, 4)}
    got = run(lambda g, x: g.permute(x, perm), arrays, dtype)
    close(got, torch_of(arrays, dtype)[0].permute(perm), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("d0,d1", [(-1, -2), (0, 2), (1, 0), (2, 2)])
def test_transpose(rng, d0: int, d1: int, dtype: str) -> None:
    arrays = {"x": rand(rng, 2, 3, 4)}
    got = run(lambda g, x: g.transpose(x, d0, d1), arrays, dtype)
    close(got, torch_of(arrays, dtype)[0].transpose(d0, d1), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(6, 4), (4, 6), (24,), (2, 12), (2, 3, 4), (1, 24, 1), (3, 2, 2, 2)])
def test_reshape(rng, shape: tuple, dtype: str) -> None:
    arrays = {"x": rand(rng, 2, 3, 4)}
    got = run(lambda g, x: g.reshape(x, shape), arrays, dtype)
    close(got, torch_of(arrays, dtype)[0].reshape(shape), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shapes,dim", [(((2, 3), (2, 5)), 1), (((2, 3), (1, 3), (4, 3)), 0),
                                        (((2, 3, 1), (2, 3, 2)), -1), (((1, 2), (1, 2)), -2)])
def test_concat(rng, shapes: tuple, dim: int, dtype: str) -> None:
    arrays = {f"x{i}": rand(rng, *s) for i, s in enumerate(shapes)}
    got = run(lambda g, *xs: g.concat(xs, dim), arrays, dtype)
    close(got, torch.cat(torch_of(arrays, dtype), dim), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("sizes,dim", [((1, 2, 3), 0), ((2, 2), -1), ((4,), 1), ((3, 1), 1)])
def test_split(rng, sizes: tuple, dim: int, dtype: str) -> None:
    arrays = {"x": rand(rng, 6, 4)}
    want = torch.split(torch_of(arrays, dtype)[0], list(sizes), dim)
    assert len(want) == len(sizes)
    for k in range(len(sizes)):
        got = run(lambda g, x, k=k: g.split(x, sizes, dim)[k], arrays, dtype)
        close(got, want[k], dtype)


# --- registry coverage: adding an operator without a reference or a test fails here -----------------------

# Ops with a dedicated test above (besides the UNARY/BINARY tables).
DEDICATED = {"matmul", "sum", "max", "min", "mean", "rms_norm", "layer_norm", "softmax", "rotate_half", "permute",
             "reshape", "concat", "split"}


def test_every_compute_op_has_a_numpy_reference() -> None:
    missing = sorted(n for n in OPS if n not in NOT_COMPUTE_OPS and n not in IMPL)
    assert not missing, f"operators without a NumPy reference in prism.reference.numpy_ops.IMPL: {missing}"
    extra = sorted(n for n in IMPL if n not in OPS)
    assert not extra, f"IMPL entries for unregistered operators: {extra}"


def test_every_elementwise_op_is_in_the_torch_table() -> None:
    covered = {v[0] for v in UNARY.values()}
    want = {n for n, o in OPS.items() if o.group == "unary"}
    assert want - covered == set(), f"unary ops missing from UNARY: {sorted(want - covered)}"
    want_b = {n for n, o in OPS.items() if o.group == "binary"}
    assert want_b - set(BINARY) == set(), f"binary ops missing from BINARY: {sorted(want_b - set(BINARY))}"
    assert covered <= set(OPS) and set(BINARY) <= set(OPS)


def test_every_compute_op_is_compared_with_torch() -> None:
    tested = {v[0] for v in UNARY.values()} | set(BINARY) | DEDICATED
    untested = sorted(set(OPS) - NOT_COMPUTE_OPS - tested)
    assert not untested, f"operators with no PyTorch comparison in this module: {untested}"
    assert DEDICATED <= set(OPS)
