"""The reductions, each defined once with every stage's rule (see ``prism.ir.ops``).

A reduction folds one dim of its operand with a :class:`Monoid` (keepdim: the dim becomes 1), optionally
dividing by the dim's extent (``mean``). Adding a reduction over an existing monoid is one
``reduction(...)`` call here plus its tests; a reduction over a new monoid adds one :data:`MONOIDS` entry
beside it. Every stage derives its rule from these two: the builder method, the NumPy reference, the
verifier's term constructor (``(Sum x d)``, ...), its interpretation and the layout, lifting and extent-1
rules every reduction gets (``prism.verify.rules``), the rules the reduction brings (``rules=``), the
search's abstract value (the monoid applied by name), the kernels' C loops (the monoid's identity and
combine; an add monoid is summed as a tree, a compare monoid keeps a NaN flag: ``prism.codegen.loops``),
the cost, the frontend converters (every PyTorch spelling of ``torch=``) and the JAX/ONNX translations
of the bench. ``tests/unit/test_op_coverage.py`` fails when a stage lacks a reduction.

Not derived: splitting a reduction across the grid or the for-loop of a block graph (``prism.ir.block``'s
accumulators, the verifier's partial families ``Reduce``/``ReduceMax`` and their rules, the split-K
merges). A reduction whose monoid has no accumulator is never split: the search keeps its whole dim in
one block, which is correct and, for rows up to a few thousand elements, what the kernels do anyway.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from prism.ir.builder import OpMethods, Tensor, _norm_dim
from prism.ir.ops import OpRule, Torch, _reduce, register


@dataclass(frozen=True)
class Monoid:
    """How a reduction combines values. ``name`` is the abstract value's operator (search) and the kernels'
    loop kind; ``c_init`` the C identity; ``c_combine(acc, x)`` the NaN-propagating scalar combine;
    ``compare``: ``""`` for an add monoid (summed as a tree), else the comparison that keeps the new value
    (``>``: max) with a NaN flag beside it; ``omp`` the OpenMP reduction operator; ``negated`` the monoid
    with ``m(-x) == -negated(x)`` (the kernels reduce ``max(-y)`` as ``-min(y)``: one negation per row,
    not per element); ``numpy(a, axis)`` the fold, keepdims."""

    name: str
    c_init: str
    c_combine: Callable[[str, str], str]
    compare: str
    omp: str
    negated: str
    numpy: Callable[[Any, int], Any]


MONOIDS: dict[str, Monoid] = {m.name: m for m in (
    Monoid("sum", "0.0f", lambda a, x: f"{a} + {x}", "", "+", "",
           lambda a, axis: np.sum(a, axis=axis, keepdims=True)),
    Monoid("max", "-INFINITY", lambda a, x: f"pr_max({a}, {x})", ">", "max", "min",
           lambda a, axis: np.max(a, axis=axis, keepdims=True)),
    Monoid("min", "INFINITY", lambda a, x: f"pr_min({a}, {x})", "<", "min", "max",
           lambda a, axis: np.min(a, axis=axis, keepdims=True)),
)}


def reduction(name: str, doc: str, *, monoid: str, term_head: str, mean: bool = False, linear: bool = False,
              flops: int = 1, rules: tuple[OpRule, ...] = (), torch: Torch | None = None,
              jax: str, onnx: str) -> None:
    """Register a keepdim reduction over one dim. ``mean``: the monoid's result divided by the dim's
    extent. ``term_head``: the verifier's constructor ``(Head x d)``. ``linear``: ``f(a*x) == a*f(x)``
    (search: partial sums may flow through it). ``torch``: the PyTorch names converted to it and their
    signature (every ``torch.``, ``Tensor.`` and ``aten.`` spelling of each; ``dim``: one int, a list or
    None; ``keepdim``; its ``attrs`` is unused: a reduction's one attribute is its dim).
    ``jax``: the ``jax.numpy`` function; ``onnx``: the ONNX operator (``ReduceSum``, ...)."""
    m = MONOIDS[monoid]

    def numpy(a: Any, arg: tuple) -> Any:
        r = m.numpy(a[0], arg[0])
        return r / a[0].dtype.type(a[0].shape[arg[0]]) if mean else r

    register(name, "reduction", 1, ("dim",), _reduce, doc, numpy=numpy, flops=flops, linear=linear,
             term_head=term_head, rules=rules, monoid=monoid, mean=mean,
             torch=(torch,) if torch else (),
             abstract=lambda alg, arg, srcs: alg.u(monoid, srcs[0]),
             jax=lambda mod, a, arg: getattr(mod.numpy, jax)(a[0], axis=arg[0], keepdims=True),
             onnx=lambda b, ins, arg: b.reduce(onnx, ins[0], arg[0]))
    if not hasattr(OpMethods, name):
        def build(self: OpMethods, x: Tensor, dim: int = -1) -> Tensor:
            return self._apply(name, (x,), (_norm_dim(dim, self._own(x, name).rank, name),))
        build.__name__ = name
        build.__doc__ = f"{doc} (keepdim)"
        setattr(OpMethods, name, build)


_WITH_DTYPE = ("input", "dim", "keepdim", "dtype")

reduction("sum", "the sum over one dim", monoid="sum", term_head="Sum", linear=True,
          torch=Torch(("sum",), _WITH_DTYPE), jax="sum", onnx="ReduceSum")
reduction("max", "the maximum over one dim (NaN propagates)", monoid="max", term_head="Max",
          torch=Torch(("amax",), ("input", "dim", "keepdim")), jax="max", onnx="ReduceMax")
reduction("mean", "the mean over one dim", monoid="sum", term_head="Mean", mean=True, linear=True,
          torch=Torch(("mean",), _WITH_DTYPE), jax="mean", onnx="ReduceMean")
reduction("min", "the minimum over one dim (NaN propagates)", monoid="min", term_head="Min",
          torch=Torch(("amin",), ("input", "dim", "keepdim")), jax="min", onnx="ReduceMin",
          rules=(OpRule("op.min-is-negated-max", "(Min x d)", '(Un "neg" (Max (Un "neg" x) d))', both=False,
                        ex=(("d", -1),)),
                 OpRule("op.min-min-comm", "(Min (Min x d) e)", "(Min (Min x e) d)", both=False,
                        ex=(("x", ("m", "n", "k")), ("d", -2), ("e", -1)))))
