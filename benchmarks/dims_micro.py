"""Micro-benchmark: Prism's own Dim class vs sympy for what search does millions of times.

Run: python benchmarks/dims_micro.py   (figures recorded in docs/architecture.md)
Operations per repetition: build a tile dim D/(G*F), add/multiply, hash, and compare two dims.
"""

from __future__ import annotations

import timeit

import sympy

from prism.ir import dims as D


def ours() -> None:
    B, G, F = D.sym("B"), D.sym("G"), D.sym("F")
    t = D.div_exact(4096 * B, G * F)
    u = t * G + B
    hash(u)
    _ = (t == D.div_exact(4096 * B, F * G))  # decided: structurally identical
    _ = (u > B)                              # decided by the sign rule


def ours_cold() -> None:
    D._MEMO.clear()  # no reuse of earlier arithmetic: the worst case for the memo
    ours()


def theirs() -> None:
    B, G, F = sympy.symbols("B G F", positive=True, integer=True)
    t = 4096 * B / (G * F)
    u = t * G + B
    hash(u)
    _ = (t == 4096 * B / (F * G))  # structural only in sympy
    _ = sympy.simplify(u - B) > 0  # what a sound comparison needs


def structural_only_sympy() -> None:
    B, G, F = sympy.symbols("B G F", positive=True, integer=True)
    t = 4096 * B / (G * F)
    u = t * G + B
    hash(u)
    _ = (t == 4096 * B / (F * G))


if __name__ == "__main__":
    cases = (("prism Dim", ours, 20000), ("prism Dim (memo cleared each time)", ours_cold, 5000),
             ("sympy (structural ==)", structural_only_sympy, 2000),
             ("sympy (+ simplify for a sound >)", theirs, 200))
    for name, fn, n in cases:
        best = min(timeit.repeat(fn, number=n, repeat=5)) / n
        print(f"{name:34s} {best * 1e6:9.2f} us per repetition")
