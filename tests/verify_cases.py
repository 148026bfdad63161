"""A corpus for testing the verifier: deliberately wrong variants ("mutants") of the hand-written
W1-W7 structures, and tables of true and false tensor identities.

Every mutant builds a valid graph (it type-checks for all symbol values) that computes something other
than its program; the verifier must never prove it, and the numeric check must reject it. Some mutants
are right at particular symbol values only (e.g. ``F = 1``): one proof must cover every value.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from prism.ir.block import BlockBuilder
from prism.ir.builder import Tensor
from prism.ir.graph import Graph
from prism.workloads import WORKLOADS

EPS = 1e-6


@dataclass(frozen=True)
class Case:
    """A candidate graph and its reference; ``hostile`` names the input scaled for hostile checks."""

    name: str
    build: Callable[[], tuple[Graph, Graph]]
    hostile: str | None = None
    doc: str = ""


# --- linear family (W1, W2, W3, W7) ---------------------------------------------------------------

def _lin_inputs(g: Graph, weights: tuple[str, ...], d: int = 1024, m: int = 1024) -> dict[str, Tensor]:
    out = {"X": g.input("X", ("n", d))}
    for w in weights:
        out[w] = g.input(w, (d, m))
    return out


def _linear(wid: str, body: Callable[[BlockBuilder, Tensor, list[Tensor]], None], grid: tuple = ("G",)
            ) -> tuple[Graph, Graph]:
    w = WORKLOADS[wid]
    s = w.shapes[0]
    weights = tuple(w.extra["weights"])
    g = Graph(f"{wid} mutant")
    ins = _lin_inputs(g, weights, s["d"], s["m"])
    bb = BlockBuilder(grid=grid, forloop="F", inputs=[ins[k] for k in ("X", *weights)])
    x = bb.iter(0, imap=(None,) * len(grid), fmap=1)
    ws = [bb.iter(i + 1, imap=(1,) + (None,) * (len(grid) - 1), fmap=0) for i in range(len(weights))]
    body(bb, x, ws)
    outs = g.customized(bb.build(), [ins[k] for k in ("X", *weights)])
    g.output(outs[0], "Y")
    return g, w.program(s)


def _w1(post: Callable[[BlockBuilder, Tensor, Tensor], Tensor], omap: tuple = (1,)) -> Callable[[], tuple]:
    def build() -> tuple[Graph, Graph]:
        def body(bb: BlockBuilder, x: Tensor, ws: list[Tensor]) -> None:
            acc = bb.accumulate("sum", bb.matmul(x, ws[0]))
            bb.save(post(bb, x, acc), omap=omap)
        return _linear("W1", body)
    return build


def _w1_split_k_partial_rms() -> tuple[Graph, Graph]:
    """Split-K over grid dim 1 with partial sums added, but the rms taken over each split's chunk only."""
    s = WORKLOADS["W1"].shapes[0]
    g = Graph("W1 split-K mutant")
    ins = _lin_inputs(g, ("W",), s["d"], s["m"])
    bb = BlockBuilder(grid=("G", "S"), forloop="F", inputs=[ins["X"], ins["W"]])
    x = bb.iter(0, imap=(None, 1), fmap=1)
    w = bb.iter(1, imap=(1, 0), fmap=0)
    acc = bb.accumulate("sum", bb.matmul(x, w))
    bb.save(bb.div(acc, bb.accumulate("rms", x, eps=EPS)), omap=(1, None))
    (y,) = g.customized(bb.build(), [ins["X"], ins["W"]])
    g.output(y, "Y")
    return g, WORKLOADS["W1"].program(s)


def _w2(post: Callable[[BlockBuilder, Tensor, list[Tensor], Tensor], Tensor]) -> Callable[[], tuple]:
    def build() -> tuple[Graph, Graph]:
        def body(bb: BlockBuilder, x: Tensor, ws: list[Tensor]) -> None:
            accs = [bb.accumulate("sum", bb.matmul(x, w)) for w in ws]
            bb.save(post(bb, x, accs, bb.accumulate("rms", x, eps=EPS)), omap=(1,))
        return _linear("W2", body)
    return build


def _w3(post: Callable[[BlockBuilder, list[Tensor]], Tensor]) -> Callable[[], tuple]:
    def build() -> tuple[Graph, Graph]:
        def body(bb: BlockBuilder, x: Tensor, ws: list[Tensor]) -> None:
            accs = [bb.accumulate("sum", bb.matmul(x, w)) for w in ws]
            bb.save(post(bb, accs), omap=(1,))
        return _linear("W3", body)
    return build


def _w7(variant: str) -> Callable[[], tuple]:
    def build() -> tuple[Graph, Graph]:
        w = WORKLOADS["W7"]
        s = w.shapes[0]
        g = Graph("W7 mutant")
        X, W = g.input("X", ("n", s["d"])), g.input("W", (s["d"], s["m"]))
        A, B = g.input("A", (s["d"], s["r"])), g.input("B", (s["r"], s["m"]))
        xa = g.matmul(X, A)
        bb = BlockBuilder(grid=("G",), forloop="F", inputs=[X, W, xa, B])
        x = bb.iter(0, imap=(None,), fmap=1)
        wt = bb.iter(1, imap=(1,), fmap=0)
        xa_t = bb.iter(2, imap=(None,))
        b_t = bb.iter(3, imap=(1,))
        lora = bb.matmul(xa_t, b_t)
        if variant == "lora-in-loop":      # the rank-r term added in every iteration: F times
            y = bb.accumulate("sum", bb.add(bb.matmul(x, wt), lora))
        elif variant == "no-lora":
            y = bb.accumulate("sum", bb.matmul(x, wt))
        elif variant == "lora-sub":
            y = bb.sub(bb.accumulate("sum", bb.matmul(x, wt)), lora)
        elif variant == "lora-mul":
            y = bb.mul(bb.accumulate("sum", bb.matmul(x, wt)), lora)
        else:  # pragma: no cover
            raise ValueError(variant)
        bb.save(y, omap=(1,))
        (out,) = g.customized(bb.build(), [X, W, xa, B])
        g.output(out, "Y")
        return g, w.program(s)
    return build


# --- attention family (W4, W5, W6) ---------------------------------------------------------------

@dataclass(frozen=True)
class _Attn:
    """Knobs of the split-KV / prefill attention structure (defaults: the correct hand-written one)."""

    scale: float | None = None            # None: 1/sqrt(D)
    kernel_sum: str = "softmax_sum"       # or "sum_last-exp" (no max subtraction inside the kernel)
    rescale_den: bool = True
    rescale_num: bool = True
    swap_sub: bool = False                # exp(M - m_p) instead of exp(m_p - M)
    tot_reduce: str = "sum"               # or "max"
    split_order: str = "P,rows"           # or "rows,P": reshape the partials with the wrong grouping
    norm_q: bool = True                   # W5: rms-normalize Q
    norm_k_dim: int = -1                  # W5: the dim K is normalized over
    norm_eps: float = EPS
    prefill_divide: bool = True
    prefill_omap: tuple = (0, 1, 2)
    out_permute: bool = False             # W6: regroup the heads in the wrong order


def _attn_core(g: Graph, q: Tensor, k: Tensor, v: Tensor, D: int, norm: bool, rows: int, kb: _Attn) -> Tensor:
    b, h = q.shape[0], q.shape[1]
    decode = rows <= 8
    bb = BlockBuilder(grid=(b, h, "P" if decode else "T"), forloop="F", inputs=[q, k, v])
    qt = bb.iter(0, imap=(0, 1, None if decode else 2))
    kvmap = (0, 1, 2 if decode else None)
    kt = bb.iter(1, imap=kvmap, fmap=2)
    vt = bb.iter(2, imap=kvmap, fmap=2)
    if norm:
        if kb.norm_q:
            qt = bb.rms_norm(qt, eps=kb.norm_eps)
        kt = bb.rms_norm(kt, eps=kb.norm_eps, dim=kb.norm_k_dim)
    scale = kb.scale if kb.scale is not None else 1.0 / math.sqrt(D)
    s = bb.mul_scalar(bb.matmul(qt, bb.transpose(kt, -1, -2)), scale)
    den = bb.accumulate("softmax_sum", s) if kb.kernel_sum == "softmax_sum" else bb.accumulate("sum_last", bb.exp(s))
    num = bb.accumulate("softmax_matmul", s, vt)
    if not decode:
        bb.save(bb.div(num, den) if kb.prefill_divide else num, omap=kb.prefill_omap)
        (o,) = g.customized(bb.build(), [q, k, v])
        return o
    mx = bb.accumulate("max", s)
    for t in (mx, den, num):
        bb.save(t, omap=(0, 1, 2))
    m_p, s_p, o_p = g.customized(bb.build(), [q, k, v])
    P = m_p.shape[2] // rows
    grp = (b, h, P, rows) if kb.split_order == "P,rows" else (b, h, rows, P)
    m5, s5, o5 = (g.reshape(t, (*grp, last)) for t, last in ((m_p, 1), (s_p, 1), (o_p, D)))
    red = 2 if kb.split_order == "P,rows" else 3
    M = g.max(m5, red)
    w = g.exp(g.sub(M, m5) if kb.swap_sub else g.sub(m5, M))
    tot_in = g.mul(s5, w) if kb.rescale_den else s5
    tot = g.sum(tot_in, red) if kb.tot_reduce == "sum" else g.max(tot_in, red)
    o = g.div(g.sum(g.mul(o5, w) if kb.rescale_num else o5, red), tot)
    return g.reshape(o, (b, h, rows, D))


def _attn(wid: str, kb: _Attn, shape_index: int = 0) -> Callable[[], tuple]:
    def build() -> tuple[Graph, Graph]:
        w = WORKLOADS[wid]
        s = w.shapes[shape_index]
        g = Graph(f"{wid} mutant")
        if wid == "W6":
            Q = g.input("Q", ("b", 32, 1, 128))
            K, V = g.input("K", ("b", 8, s["S"], 128)), g.input("V", ("b", 8, s["S"], 128))
            o = _attn_core(g, g.reshape(Q, ("b", 8, 4, 128)), K, V, 128, False, 4, kb)
            if kb.out_permute:
                o = g.permute(o, (0, 2, 1, 3))
            g.output(g.reshape(o, ("b", 32, 1, 128)), "O")
        else:
            Q = g.input("Q", ("b", s["h"], s["q"], s["D"]))
            K = g.input("K", ("b", s["h"], s["kv"], s["D"]))
            V = g.input("V", ("b", s["h"], s["kv"], s["D"]))
            g.output(_attn_core(g, Q, K, V, s["D"], wid == "W5", s["q"], kb), "O")
        return g, w.program(s)
    return build


def _sq(bb: BlockBuilder, x: Tensor) -> Tensor:
    return bb.sqrt(bb.accumulate("sum_last", bb.square(x)))


MUTANTS: tuple[Case, ...] = (
    # W1 rms_norm @ W
    Case("W1.no-normalization", _w1(lambda bb, x, acc: acc), "X"),
    Case("W1.dropped-epsilon", _w1(lambda bb, x, acc: bb.div(acc, bb.accumulate("rms", x, eps=0.0))), "X"),
    Case("W1.wrong-epsilon", _w1(lambda bb, x, acc: bb.div(acc, bb.accumulate("rms", x, eps=1e-2))), "X"),
    Case("W1.rms-without-mean", _w1(lambda bb, x, acc: bb.div(acc, _sq(bb, x))), "X"),
    Case("W1.rms-as-max", _w1(lambda bb, x, acc: bb.div(acc, bb.accumulate("max", bb.square(x)))), "X"),
    Case("W1.multiply-by-rms", _w1(lambda bb, x, acc: bb.mul(acc, bb.accumulate("rms", x, eps=EPS))), "X"),
    Case("W1.omap-partial-sums", _w1(lambda bb, x, acc: bb.div(acc, bb.accumulate("rms", x, eps=EPS)), (None,)), "X",
         doc="blocks' column tiles added instead of concatenated (wrong omap)"),
    Case("W1.omap-wrong-dim", _w1(lambda bb, x, acc: bb.div(acc, bb.accumulate("rms", x, eps=EPS)), (0,)), "X"),
    Case("W1.split-k-partial-rms", _w1_split_k_partial_rms, "X"),
    # W2
    Case("W2.one-division-missing", _w2(lambda bb, x, a, r: bb.mul(bb.div(a[0], r), a[1])), "X"),
    Case("W2.same-weight-twice", _w2(lambda bb, x, a, r: bb.mul(bb.div(a[0], r), bb.div(a[0], r))), "X"),
    Case("W2.add-not-mul", _w2(lambda bb, x, a, r: bb.add(bb.div(a[0], r), bb.div(a[1], r))), "X"),
    # W3
    Case("W3.silu-on-wrong-operand", _w3(lambda bb, a: bb.mul(a[0], bb.silu(a[1]))), "X"),
    Case("W3.gelu-not-silu", _w3(lambda bb, a: bb.mul(bb.gelu(a[0]), a[1])), "X"),
    Case("W3.sigmoid-not-silu", _w3(lambda bb, a: bb.mul(bb.sigmoid(a[0]), a[1])), "X"),
    # W7
    Case("W7.lora-in-loop", _w7("lora-in-loop"), "X", doc="the rank-r term accumulated F times (right only at F=1)"),
    Case("W7.no-lora", _w7("no-lora"), "X"),
    Case("W7.lora-subtracted", _w7("lora-sub"), "X"),
    Case("W7.lora-multiplied", _w7("lora-mul"), "X"),
    # W4 attention (decode: split-KV + combine kernel; prefill: query tiles)
    Case("W4.missing-denominator-rescale", _attn("W4", _Attn(rescale_den=False)), "Q"),
    Case("W4.missing-numerator-rescale", _attn("W4", _Attn(rescale_num=False)), "Q"),
    Case("W4.rescale-sign-swapped", _attn("W4", _Attn(swap_sub=True)), "Q"),
    Case("W4.total-by-max", _attn("W4", _Attn(tot_reduce="max")), "Q"),
    Case("W4.no-max-subtraction-in-kernel", _attn("W4", _Attn(kernel_sum="sum_last-exp")), "Q"),
    Case("W4.wrong-scale", _attn("W4", _Attn(scale=1.0 / 128)), "Q"),
    Case("W4.prefill-no-division", _attn("W4", _Attn(prefill_divide=False), 1), "Q"),
    Case("W4.prefill-omap-partial-sums", _attn("W4", _Attn(prefill_omap=(0, 1, None)), 1), "Q"),
    Case("W4.prefill-unscaled-sum", _attn("W4", _Attn(kernel_sum="sum_last-exp"), 1), "Q"),
    # W5
    Case("W5.q-not-normalized", _attn("W5", _Attn(norm_q=False)), "Q"),
    Case("W5.k-normalized-over-kv-chunk", _attn("W5", _Attn(norm_k_dim=-2)), "Q",
         doc="rms over the keys of one loop chunk instead of the head dim"),
    Case("W5.dropped-epsilon", _attn("W5", _Attn(norm_eps=0.0)), "Q"),
    Case("W5.missing-denominator-rescale", _attn("W5", _Attn(rescale_den=False)), "Q"),
    # W6
    Case("W6.off-by-one-split", _attn("W6", _Attn(split_order="rows,P")), "Q",
         doc="per-split partials regrouped as [rows, P] instead of [P, rows]"),
    Case("W6.heads-regrouped", _attn("W6", _Attn(out_permute=True)), "Q"),
    Case("W6.missing-numerator-rescale", _attn("W6", _Attn(rescale_num=False)), "Q"),
    Case("W6.rescale-sign-swapped", _attn("W6", _Attn(swap_sub=True)), "Q"),
)


# --- tensor identities ---------------------------------------------------------------------------

Builder = Callable[[Graph, dict[str, Tensor]], Tensor]


def identity(name: str, inputs: dict[str, tuple], lhs: Builder, rhs: Builder, hostile: str | None = None,
             doc: str = "") -> Case:
    """``lhs(inputs) == rhs(inputs)`` as a candidate (lhs) / reference (rhs) pair of kernel graphs."""
    def build() -> tuple[Graph, Graph]:
        out = []
        for side, fn in (("lhs", lhs), ("rhs", rhs)):
            g = Graph(f"{name} {side}")
            ins = {k: g.input(k, shape) for k, shape in inputs.items()}
            g.output(fn(g, ins), "out")
            out.append(g)
        return out[0], out[1]
    return Case(name, build, hostile, doc)


_MK = {"A": ("m", "k"), "B": ("k", "n"), "C": ("n", "p"), "D": ("p", "q")}
_SQ = {"A": ("n", "n"), "B": ("n", "n"), "C": ("n", "n")}
_EW = {"a": ("m", "n"), "b": ("m", "n"), "c": ("m", "n")}
_ROW = {"x": ("m", "k"), "W": ("k", "n"), "r": ("m", 1)}
_LORA = {"X": ("n", "d"), "W": ("d", "m"), "A": ("d", "r"), "B": ("r", "m")}


def _T(g: Graph, x: Tensor) -> Tensor:
    return g.transpose(x, -2, -1)


def _softmax_manual(g: Graph, x: Tensor) -> Tensor:
    e = g.exp(g.sub(x, g.max(x, -1)))
    return g.div(e, g.sum(e, -1))


TRUE_IDENTITIES: tuple[Case, ...] = (
    identity("min-is-negated-max", {"x": ("m", "n")}, lambda g, i: g.min(i["x"], -1),
             lambda g, i: g.neg(g.max(g.neg(i["x"]), -1))),
    identity("min-of-rows-then-cols", {"x": ("m", "n")}, lambda g, i: g.min(g.min(i["x"], 0), 1),
             lambda g, i: g.min(g.min(i["x"], 1), 0)),
    identity("min-of-negated-is-negated-max", {"x": ("m", "n")}, lambda g, i: g.min(g.neg(i["x"]), -1),
             lambda g, i: g.neg(g.max(i["x"], -1))),
    identity("mean-is-scaled-sum", {"x": ("m", 48)}, lambda g, i: g.mean(i["x"], -1),
             lambda g, i: g.mul_scalar(g.sum(i["x"], -1), 1.0 / 48)),
    identity("mean-of-scaled-is-scaled-sum", {"x": ("m", 64)}, lambda g, i: g.mean(g.mul_scalar(i["x"], 2.0), -1),
             lambda g, i: g.mul_scalar(g.sum(i["x"], -1), 1.0 / 32)),
    identity("matmul-assoc", _MK, lambda g, i: (i["A"] @ i["B"]) @ i["C"], lambda g, i: i["A"] @ (i["B"] @ i["C"])),
    identity("matmul-assoc-4", _MK, lambda g, i: ((i["A"] @ i["B"]) @ i["C"]) @ i["D"],
             lambda g, i: i["A"] @ (i["B"] @ (i["C"] @ i["D"]))),
    identity("matmul-assoc-4-middle", _MK, lambda g, i: (i["A"] @ (i["B"] @ i["C"])) @ i["D"],
             lambda g, i: (i["A"] @ i["B"]) @ (i["C"] @ i["D"])),
    identity("matmul-distrib-right", {**_MK, "E": ("k", "n")}, lambda g, i: i["A"] @ (i["B"] + i["E"]),
             lambda g, i: i["A"] @ i["B"] + i["A"] @ i["E"]),
    identity("matmul-distrib-left", {**_MK, "E": ("m", "k")}, lambda g, i: (i["A"] + i["E"]) @ i["B"],
             lambda g, i: i["A"] @ i["B"] + i["E"] @ i["B"]),
    identity("matmul-factor-chain", {**_MK, "E": ("k", "p")}, lambda g, i: i["A"] @ (i["B"] @ i["C"]) + i["A"] @ i["E"],
             lambda g, i: i["A"] @ (i["B"] @ i["C"] + i["E"])),
    identity("transpose-of-matmul", _MK, lambda g, i: _T(g, i["A"] @ i["B"]),
             lambda g, i: _T(g, i["B"]) @ _T(g, i["A"])),
    identity("transpose-of-batched-matmul", {"A": ("z", "m", "k"), "B": ("z", "k", "n")},
             lambda g, i: _T(g, i["A"] @ i["B"]), lambda g, i: _T(g, i["B"]) @ _T(g, i["A"])),
    identity("transpose-twice", {"A": ("m", "k")}, lambda g, i: _T(g, _T(g, i["A"])), lambda g, i: i["A"]),
    identity("transpose-of-add", {"A": ("m", "k"), "B": ("m", "k")}, lambda g, i: _T(g, i["A"] + i["B"]),
             lambda g, i: _T(g, i["A"]) + _T(g, i["B"])),
    identity("transpose-of-mul", {"A": ("m", "k"), "B": ("m", "k")}, lambda g, i: _T(g, i["A"] * i["B"]),
             lambda g, i: _T(g, i["A"]) * _T(g, i["B"])),
    identity("transpose-of-exp", {"A": ("m", "k")}, lambda g, i: _T(g, g.exp(i["A"])),
             lambda g, i: g.exp(_T(g, i["A"]))),
    identity("mul-distrib", _EW, lambda g, i: i["a"] * (i["b"] + i["c"]),
             lambda g, i: i["a"] * i["b"] + i["a"] * i["c"]),
    identity("mul-factor", _EW, lambda g, i: i["a"] * i["b"] + i["a"] * i["c"],
             lambda g, i: i["a"] * (i["b"] + i["c"])),
    identity("add-comm-assoc", _EW, lambda g, i: (i["a"] + i["b"]) + i["c"], lambda g, i: i["c"] + (i["b"] + i["a"])),
    identity("mul-comm-assoc", _EW, lambda g, i: (i["a"] * i["b"]) * i["c"], lambda g, i: i["b"] * (i["c"] * i["a"])),
    identity("exp-of-sum", {"a": ("m", "n"), "b": ("m", "n")}, lambda g, i: g.exp(i["a"] + i["b"]),
             lambda g, i: g.exp(i["a"]) * g.exp(i["b"])),
    identity("exp-of-difference", {"a": ("m", "n"), "b": ("m", 1)}, lambda g, i: g.exp(i["a"] - i["b"]),
             lambda g, i: g.exp(i["a"]) / g.exp(i["b"])),
    identity("online-softmax-rescale", {"a": ("m", "n"), "b": ("m", 1), "c": ("m", 1)},
             lambda g, i: g.exp(i["a"] - i["c"]) * g.exp(i["c"] - i["b"]), lambda g, i: g.exp(i["a"] - i["b"])),
    identity("lora-merge", _LORA, lambda g, i: i["X"] @ i["W"] + (i["X"] @ i["A"]) @ i["B"],
             lambda g, i: g.concat([i["X"], i["X"] @ i["A"]], 1) @ g.concat([i["W"], i["B"]], 0),
             doc="X@W + (X@A)@B = concat(X, X@A, dim=1) @ concat(W, B, dim=0)"),
    identity("row-scale-div-matmul", _ROW, lambda g, i: (i["x"] / i["r"]) @ i["W"],
             lambda g, i: (i["x"] @ i["W"]) / i["r"]),
    identity("row-scale-mul-matmul", _ROW, lambda g, i: (i["x"] * i["r"]) @ i["W"],
             lambda g, i: (i["x"] @ i["W"]) * i["r"]),
    identity("col-scale-matmul", {"x": ("m", "k"), "W": ("k", "n"), "c": (1, "n")},
             lambda g, i: i["x"] @ (i["W"] * i["c"]), lambda g, i: (i["x"] @ i["W"]) * i["c"]),
    identity("softmax-shift-invariance", {"x": ("m", "n"), "c": ("m", 1)},
             lambda g, i: g.softmax(i["x"] + i["c"], -1), lambda g, i: g.softmax(i["x"], -1), hostile="x"),
    identity("softmax-matmul-normalize-after", {"x": ("m", "n"), "V": ("n", "d")},
             lambda g, i: g.softmax(i["x"], -1) @ i["V"],
             lambda g, i: (g.exp(i["x"] - g.max(i["x"], -1)) @ i["V"]) / g.sum(g.exp(i["x"] - g.max(i["x"], -1)), -1),
             hostile="x"),
    identity("softmax-is-its-definition", {"x": ("m", "n")}, lambda g, i: g.softmax(i["x"], -1),
             lambda g, i: _softmax_manual(g, i["x"])),
    identity("rmsnorm-linear", {"x": ("m", "k"), "W": ("k", "n")}, lambda g, i: g.rms_norm(i["x"], 1e-6) @ i["W"],
             lambda g, i: (i["x"] @ i["W"]) / g.sqrt(g.add_scalar(g.mean(g.square(i["x"]), -1), 1e-6))),
    identity("split-of-matmul-cols", {"X": ("m", "k"), "W": ("k", 12)},
             lambda g, i: g.split(i["X"] @ i["W"], [5, 7], 1)[1], lambda g, i: i["X"] @ g.split(i["W"], [5, 7], 1)[1]),
    identity("split-of-matmul-rows", {"X": (10, "k"), "W": ("k", "n")},
             lambda g, i: g.split(i["X"] @ i["W"], [3, 7], 0)[0], lambda g, i: g.split(i["X"], [3, 7], 0)[0] @ i["W"]),
    identity("concat-matmul-cols", {"X": ("m", "k"), "W1": ("k", "n"), "W2": ("k", "p")},
             lambda g, i: g.concat([i["X"] @ i["W1"], i["X"] @ i["W2"]], 1),
             lambda g, i: i["X"] @ g.concat([i["W1"], i["W2"]], 1)),
    identity("concat-matmul-rows", {"A": ("m", "k"), "B": ("p", "k"), "W": ("k", "n")},
             lambda g, i: g.concat([i["A"] @ i["W"], i["B"] @ i["W"]], 0),
             lambda g, i: g.concat([i["A"], i["B"]], 0) @ i["W"]),
    identity("split-of-concat-first", {"A": ("m", "k"), "B": ("m", "n")},
             lambda g, i: g.split(g.concat([i["A"], i["B"]], 1), ["k", "n"], 1)[0], lambda g, i: i["A"]),
    identity("split-of-concat-second", {"A": ("m", "k"), "B": ("m", "n")},
             lambda g, i: g.split(g.concat([i["A"], i["B"]], 1), ["k", "n"], 1)[1], lambda g, i: i["B"]),
    identity("concat-of-sums", {"a": ("m", "k"), "b": ("m", "n"), "c": ("m", "k"), "d": ("m", "n")},
             lambda g, i: g.concat([i["a"], i["b"]], 1) + g.concat([i["c"], i["d"]], 1),
             lambda g, i: g.concat([i["a"] + i["c"], i["b"] + i["d"]], 1)),
    identity("transpose-of-concat", {"a": ("m", "k"), "b": ("m", "n")},
             lambda g, i: g.permute(g.concat([i["a"], i["b"]], 1), (1, 0)),
             lambda g, i: g.concat([g.permute(i["a"], (1, 0)), g.permute(i["b"], (1, 0))], 0)),
    identity("transpose-of-row-concat", {"a": ("k", "m"), "b": ("n", "m")},
             lambda g, i: g.permute(g.concat([i["a"], i["b"]], 0), (1, 0)),
             lambda g, i: g.concat([g.permute(i["a"], (1, 0)), g.permute(i["b"], (1, 0))], 1)),
    identity("batched-transpose-of-concat", {"a": ("z", "m", "k"), "b": ("z", "m", "n")},
             lambda g, i: g.permute(g.concat([i["a"], i["b"]], 2), (0, 2, 1)),
             lambda g, i: g.concat([g.permute(i["a"], (0, 2, 1)), g.permute(i["b"], (0, 2, 1))], 1)),
    identity("transpose-of-concat-other-axis", {"a": ("k", "m", "n"), "b": ("l", "m", "n")},
             lambda g, i: g.permute(g.concat([i["a"], i["b"]], 0), (0, 2, 1)),
             lambda g, i: g.concat([g.permute(i["a"], (0, 2, 1)), g.permute(i["b"], (0, 2, 1))], 0)),
    identity("exp-of-concat", {"a": ("m", "k"), "b": ("m", "n")}, lambda g, i: g.exp(g.concat([i["a"], i["b"]], 1)),
             lambda g, i: g.concat([g.exp(i["a"]), g.exp(i["b"])], 1)),
    identity("sum-of-matmul", _MK, lambda g, i: g.sum(i["A"] @ i["B"], -1), lambda g, i: i["A"] @ g.sum(i["B"], -1)),
    identity("sum-of-row-scaled", {"x": ("m", "n"), "r": ("m", 1)}, lambda g, i: g.sum(i["x"] * i["r"], -1),
             lambda g, i: g.sum(i["x"], -1) * i["r"]),
    identity("sum-interchange", {"x": ("m", "n", "k")}, lambda g, i: g.sum(g.sum(i["x"], 0), 2),
             lambda g, i: g.sum(g.sum(i["x"], 2), 0)),
    identity("max-shift", {"x": ("m", "n"), "c": ("m", 1)}, lambda g, i: g.max(i["x"] + i["c"], -1),
             lambda g, i: g.max(i["x"], -1) + i["c"]),
    identity("scale-of-matmul", _MK, lambda g, i: g.mul_scalar(i["A"] @ i["B"], 0.125),
             lambda g, i: g.mul_scalar(i["A"], 0.125) @ i["B"]),
    identity("scale-right-operand", _MK, lambda g, i: i["A"] @ g.mul_scalar(i["B"], 3.0),
             lambda g, i: g.mul_scalar(i["A"] @ i["B"], 3.0)),
    identity("scales-commute", {"x": ("m", "n")}, lambda g, i: g.mul_scalar(g.mul_scalar(i["x"], 2.0), 3.0),
             lambda g, i: g.mul_scalar(g.mul_scalar(i["x"], 3.0), 2.0)),
    identity("sub-add-cancel", {"a": ("m", "n"), "b": ("m", "n")}, lambda g, i: (i["a"] - i["b"]) + i["b"],
             lambda g, i: i["a"]),
    identity("sub-is-add-neg", {"a": ("m", "n"), "b": ("m", "n")}, lambda g, i: i["a"] - i["b"],
             lambda g, i: i["a"] + g.neg(i["b"])),
    identity("neg-neg", {"a": ("m", "n")}, lambda g, i: g.neg(g.neg(i["a"])), lambda g, i: i["a"]),
    identity("silu-definition", {"a": ("m", "n")}, lambda g, i: g.silu(i["a"]),
             lambda g, i: i["a"] * g.sigmoid(i["a"])),
    identity("rsqrt-is-division", {"a": ("m", "n"), "s": ("m", 1)}, lambda g, i: i["a"] * g.rsqrt(g.square(i["s"])),
             lambda g, i: i["a"] / g.sqrt(g.square(i["s"]))),
    identity("square-is-product", {"a": ("m", "n")}, lambda g, i: g.square(i["a"]), lambda g, i: i["a"] * i["a"]),
    identity("div-div", _EW, lambda g, i: (i["a"] / i["b"]) / i["c"], lambda g, i: i["a"] / (i["b"] * i["c"])),
    identity("scale-fold", {"x": ("m", "n")}, lambda g, i: (i["x"] * 2.0) * 3.0, lambda g, i: i["x"] * 6.0),
    identity("shift-then-scale", {"x": ("m", "n")}, lambda g, i: (i["x"] + 1.0) * 2.0,
             lambda g, i: i["x"] * 2.0 + 2.0),
    identity("shift-fold", {"x": ("m", "n")}, lambda g, i: (i["x"] + 1.5) - 0.25, lambda g, i: i["x"] + 1.25),
    identity("scale-by-one", {"x": ("m", "n")}, lambda g, i: g.exp(i["x"] * 1.0), lambda g, i: g.exp(i["x"])),
    identity("scale-through-concat", {"a": ("m", "k"), "b": ("m", "n")},
             lambda g, i: g.concat([i["a"] * 0.5, i["b"] * 0.5], 1), lambda g, i: g.concat([i["a"], i["b"]], 1) * 0.5),
    identity("shift-through-concat", {"a": ("k", "m"), "b": ("n", "m")},
             lambda g, i: g.concat([i["a"] + 2.0, i["b"] + 2.0], 0), lambda g, i: g.concat([i["a"], i["b"]], 0) + 2.0),
    identity("hardswish-definition", {"a": ("m", "n")}, lambda g, i: g.hardswish(i["a"]),
             lambda g, i: i["a"] * g.hardsigmoid(i["a"])),
    identity("mish-definition", {"a": ("m", "n")}, lambda g, i: g.mish(i["a"]),
             lambda g, i: i["a"] * g.tanh(g.softplus(i["a"]))),
    identity("minimum-commutes", _EW, lambda g, i: g.minimum(i["a"], i["b"]), lambda g, i: g.minimum(i["b"], i["a"])),
    identity("abs-of-neg", {"a": ("m", "n")}, lambda g, i: g.abs(g.neg(i["a"])), lambda g, i: g.abs(i["a"])),
)


FALSE_IDENTITIES: tuple[Case, ...] = (
    identity("min-is-max", {"x": ("m", "n")}, lambda g, i: g.min(i["x"], -1), lambda g, i: g.max(i["x"], -1)),
    identity("min-is-max-of-negated", {"x": ("m", "n")}, lambda g, i: g.min(i["x"], -1),
             lambda g, i: g.max(g.neg(i["x"]), -1)),
    identity("shift-then-scale-wrong", {"x": ("m", "n")}, lambda g, i: (i["x"] + 1.0) * 2.0,
             lambda g, i: i["x"] * 2.0 + 1.0),
    identity("scale-fold-wrong", {"x": ("m", "n")}, lambda g, i: (i["x"] * 2.0) * 3.0, lambda g, i: i["x"] * 5.0),
    identity("transpose-of-concat-parts-not-transposed", {"a": ("m", "m"), "b": ("m", "m")},
             lambda g, i: g.permute(g.concat([i["a"], i["b"]], 1), (1, 0)),
             lambda g, i: g.concat([i["a"], i["b"]], 0)),
    identity("transpose-of-concat-parts-swapped", {"a": ("m", "n"), "b": ("m", "n")},
             lambda g, i: g.permute(g.concat([i["a"], i["b"]], 1), (1, 0)),
             lambda g, i: g.concat([g.permute(i["b"], (1, 0)), g.permute(i["a"], (1, 0))], 0)),
    identity("concat-scale-one-side", {"a": ("m", "k"), "b": ("m", "n")},
             lambda g, i: g.concat([i["a"] * 0.5, i["b"]], 1), lambda g, i: g.concat([i["a"], i["b"]], 1) * 0.5),
    identity("hardswish-is-hardsigmoid", {"a": ("m", "n")}, lambda g, i: g.hardswish(i["a"]),
             lambda g, i: g.hardsigmoid(i["a"])),
    identity("leaky-slopes-differ", {"a": ("m", "n")}, lambda g, i: g.leaky_relu(i["a"], 0.1),
             lambda g, i: g.leaky_relu(i["a"], 0.2)),
    identity("matmul-commutes", _SQ, lambda g, i: i["A"] @ i["B"], lambda g, i: i["B"] @ i["A"]),
    identity("transpose-no-swap", _SQ, lambda g, i: _T(g, i["A"] @ i["B"]), lambda g, i: _T(g, i["A"]) @ _T(g, i["B"])),
    identity("transpose-is-identity", _SQ, lambda g, i: _T(g, i["A"]), lambda g, i: i["A"]),
    identity("matmul-with-transposed", _SQ, lambda g, i: i["A"] @ i["B"], lambda g, i: i["A"] @ _T(g, i["B"])),
    identity("matmul-assoc-reordered", _SQ, lambda g, i: (i["A"] @ i["B"]) @ i["C"],
             lambda g, i: i["A"] @ (i["C"] @ i["B"])),
    identity("matmul-distrib-dropped", {**_SQ}, lambda g, i: i["A"] @ (i["B"] + i["C"]),
             lambda g, i: i["A"] @ i["B"] + i["C"]),
    identity("exp-of-sum-as-sum", {"a": ("m", "n"), "b": ("m", "n")}, lambda g, i: g.exp(i["a"] + i["b"]),
             lambda g, i: g.exp(i["a"]) + g.exp(i["b"])),
    identity("exp-of-product", {"a": ("m", "n"), "b": ("m", "n")}, lambda g, i: g.exp(i["a"] * i["b"]),
             lambda g, i: g.exp(i["a"]) * g.exp(i["b"])),
    identity("exp-of-neg", {"a": ("m", "n")}, lambda g, i: g.exp(g.neg(i["a"])), lambda g, i: g.neg(g.exp(i["a"]))),
    identity("softmax-shift-by-full-tensor", {"x": ("m", "n"), "c": ("m", "n")},
             lambda g, i: g.softmax(i["x"] + i["c"], -1), lambda g, i: g.softmax(i["x"], -1)),
    identity("softmax-shift-by-column", {"x": ("m", "n"), "c": (1, "n")},
             lambda g, i: g.softmax(i["x"] + i["c"], -1), lambda g, i: g.softmax(i["x"], -1)),
    identity("softmax-wrong-dim", {"x": ("n", "n")}, lambda g, i: g.softmax(i["x"], -1),
             lambda g, i: g.softmax(i["x"], 0)),
    identity("softmax-unshifted-denominator", {"x": ("m", "n")}, lambda g, i: g.softmax(i["x"], -1),
             lambda g, i: g.exp(i["x"]) / g.sum(g.exp(i["x"] - g.max(i["x"], -1)), -1)),
    identity("online-softmax-wrong-rescale", {"a": ("m", "n"), "b": ("m", 1), "c": ("m", 1)},
             lambda g, i: g.exp(i["a"] - i["c"]) * g.exp(i["b"] - i["c"]), lambda g, i: g.exp(i["a"] - i["b"])),
    identity("sub-commutes", {"a": ("m", "n"), "b": ("m", "n")}, lambda g, i: i["a"] - i["b"],
             lambda g, i: i["b"] - i["a"]),
    identity("div-commutes", {"a": ("m", "n"), "b": ("m", "n")}, lambda g, i: i["a"] / i["b"],
             lambda g, i: i["b"] / i["a"]),
    identity("div-is-mul", {"a": ("m", "n"), "b": ("m", "n")}, lambda g, i: i["a"] / i["b"],
             lambda g, i: i["a"] * i["b"]),
    identity("div-div-wrong", _EW, lambda g, i: (i["a"] / i["b"]) / i["c"], lambda g, i: i["a"] / (i["b"] / i["c"])),
    identity("rmsnorm-wrong-epsilon", {"x": ("m", "n")}, lambda g, i: g.rms_norm(i["x"], 1e-6),
             lambda g, i: g.rms_norm(i["x"], 1e-2), hostile="x"),
    identity("rmsnorm-wrong-dim", {"x": ("n", "n")}, lambda g, i: g.rms_norm(i["x"], 1e-6, -1),
             lambda g, i: g.rms_norm(i["x"], 1e-6, 0)),
    identity("column-scale-as-row-scale", {"x": ("n", "n"), "W": ("n", "n"), "c": (1, "n")},
             lambda g, i: (i["x"] / i["c"]) @ i["W"], lambda g, i: (i["x"] @ i["W"]) / i["c"]),
    identity("row-scale-moved-to-weight", {"x": ("n", "n"), "W": ("n", "n"), "r": ("n", 1)},
             lambda g, i: (i["x"] @ i["W"]) / i["r"], lambda g, i: i["x"] @ (i["W"] / i["r"])),
    identity("sqrt-of-sum", {"a": ("m", "n"), "b": ("m", "n")},
             lambda g, i: g.sqrt(g.square(i["a"]) + g.square(i["b"])),
             lambda g, i: g.sqrt(g.square(i["a"])) + g.sqrt(g.square(i["b"]))),
    identity("max-of-sum", {"x": ("m", "n"), "y": ("m", "n")}, lambda g, i: g.max(i["x"] + i["y"], -1),
             lambda g, i: g.max(i["x"], -1) + g.max(i["y"], -1)),
    identity("sum-of-product", {"x": ("m", "n"), "y": ("m", "n")}, lambda g, i: g.sum(i["x"] * i["y"], -1),
             lambda g, i: g.sum(i["x"], -1) * g.sum(i["y"], -1)),
    identity("mean-is-sum", {"x": ("m", "n")}, lambda g, i: g.mean(i["x"], -1), lambda g, i: g.sum(i["x"], -1)),
    identity("mean-is-sum-over-another-count", {"x": ("m", 48)}, lambda g, i: g.mean(i["x"], -1),
             lambda g, i: g.mul_scalar(g.sum(i["x"], -1), 1.0 / 64)),
    identity("mean-is-sum-scaled-twice", {"x": ("m", 48)}, lambda g, i: g.mean(i["x"], -1),
             lambda g, i: g.mul_scalar(g.sum(i["x"], -1), 2.0 / 48)),
    identity("max-shift-by-full-tensor", {"x": ("m", "n"), "c": ("m", "n")}, lambda g, i: g.max(i["x"] + i["c"], -1),
             lambda g, i: g.max(i["x"], -1) + g.max(i["c"], -1)),
    identity("lora-merge-wrong-order", _LORA, lambda g, i: i["X"] @ i["W"] + (i["X"] @ i["A"]) @ i["B"],
             lambda g, i: g.concat([i["X"] @ i["A"], i["X"]], 1) @ g.concat([i["W"], i["B"]], 0)),
    identity("concat-order-swapped", {"A": ("m", "n"), "B": ("m", "n")}, lambda g, i: g.concat([i["A"], i["B"]], 1),
             lambda g, i: g.concat([i["B"], i["A"]], 1)),
    identity("split-takes-other-part", {"A": ("m", "n"), "B": ("m", "n")},
             lambda g, i: g.split(g.concat([i["A"], i["B"]], 1), ["n", "n"], 1)[0], lambda g, i: i["B"]),
    identity("split-of-matmul-wrong-operand", {"X": ("m", 8), "W": (8, 8)},
             lambda g, i: g.split(i["X"] @ i["W"], [4, 4], 1)[0], lambda g, i: g.split(i["X"], [4, 4], 1)[0] @
             g.split(i["W"], [4, 4], 0)[0]),
    identity("relu-is-identity", {"a": ("m", "n")}, lambda g, i: g.relu(i["a"]), lambda g, i: i["a"]),
    identity("silu-is-sigmoid", {"a": ("m", "n")}, lambda g, i: g.silu(i["a"]), lambda g, i: g.sigmoid(i["a"])),
    identity("tanh-is-sigmoid", {"a": ("m", "n")}, lambda g, i: g.tanh(i["a"]), lambda g, i: g.sigmoid(i["a"])),
    identity("gelu-exact-is-tanh-form", {"a": ("m", "n")}, lambda g, i: g.gelu(i["a"]),
             lambda g, i: g.gelu(i["a"], approximate="tanh")),
    identity("scale-not-distributed", {"x": ("m", "n"), "y": ("m", "n")},
             lambda g, i: g.mul_scalar(i["x"] + i["y"], 2.0),
             lambda g, i: g.mul_scalar(i["x"], 2.0) + i["y"]),
    identity("scale-both-operands", _MK, lambda g, i: g.mul_scalar(i["A"] @ i["B"], 2.0),
             lambda g, i: g.mul_scalar(i["A"], 2.0) @ g.mul_scalar(i["B"], 2.0)),
    identity("shift-through-matmul", _MK, lambda g, i: g.add_scalar(i["A"] @ i["B"], 1.0),
             lambda g, i: g.add_scalar(i["A"], 1.0) @ i["B"]),
    identity("scale-is-shift", {"x": ("m", "n")}, lambda g, i: g.mul_scalar(i["x"], 2.0),
             lambda g, i: g.add_scalar(i["x"], 2.0)),
    identity("square-of-neg-is-neg", {"a": ("m", "n")}, lambda g, i: g.square(g.neg(i["a"])),
             lambda g, i: g.neg(g.square(i["a"]))),
    identity("permute-is-identity", {"x": ("n", "n", "k")}, lambda g, i: g.permute(i["x"], (1, 0, 2)),
             lambda g, i: i["x"]),
    identity("sum-interchange-wrong-dims", {"x": ("n", "n", "n")}, lambda g, i: g.sum(g.sum(i["x"], 0), 2),
             lambda g, i: g.sum(g.sum(i["x"], 1), 0)),
    identity("maximum-is-add", {"a": ("m", "n"), "b": ("m", "n")}, lambda g, i: g.maximum(i["a"], i["b"]),
             lambda g, i: i["a"] + i["b"]),
)
