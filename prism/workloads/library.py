"""W1-W7 of WORKLOADS.md: programs, shapes, and the hand-written known-good structures."""

from __future__ import annotations

import math

from prism.ir.block import BlockBuilder
from prism.ir.builder import Tensor
from prism.ir.graph import Graph
from prism.workloads.base import Shape, Workload

EPS = 1e-6

# --- linear-layer family (W1, W2, W3, W7) -------------------------------------------------------

_LINEAR = tuple(dict(n=n, d=d, m=d) for n, d in ((8, 1024), (8, 2048), (8, 4096), (16, 1024), (16, 4096)))
_QKV = (dict(n=1, d=4096, m=6144),)
_LLAMA_MLP = (dict(n=1, d=4096, m=11008), dict(n=16, d=4096, m=11008))

_LINEAR_RULE = ("grid G = the smallest even divisor of m leaving at most 2048 output columns (a multiple of 16) "
                "per block; for-loop F = d/256 (a 256-deep slice of the contraction per iteration). Wide blocks "
                "keep each weight row one long contiguous read: 64-column blocks cost 25-40% of bandwidth "
                "(docs/codegen.md)")


def _linear_G(m: int) -> int:
    for g in range(2, m + 1, 2):
        if m % g == 0 and m // g <= 2048 and (m // g) % 16 == 0:
            return g
    return 1


def _linear_params(s: Shape) -> dict[str, int]:
    return {"G": _linear_G(s["m"]), "F": s["d"] // 256}


def _linear_alt(s: Shape) -> list[dict[str, int]]:
    return [{"G": s["m"] // 128, "F": s["d"] // 128}, {"G": 4, "F": 1}]


def _x_w(s: Shape, *weights: str) -> dict[str, tuple[int, ...]]:
    out: dict[str, tuple[int, ...]] = {"X": (s["n"], s["d"])}
    for w in weights:
        out[w] = (s["d"], s["m"])
    return out


def _inputs(g: Graph, w: Workload, s: Shape) -> dict[str, Tensor]:
    return {name: g.input(name, tuple(k if k in w.symbolic else s[k] for k in _dimnames(w, name)))
            for name in w.input_shapes(s)}


_DIMNAMES: dict[str, dict[str, tuple[str, ...]]] = {}


def _dimnames(w: Workload, name: str) -> tuple[str, ...]:
    return _DIMNAMES[w.id][name]


def _linear_block(names: list[str], ins: dict[str, Tensor], post: str) -> BlockBuilder:
    bb = BlockBuilder(grid=("G",), forloop="F", inputs=[ins[n] for n in names])
    x = bb.iter(0, imap=(None,), fmap=1)
    accs = [bb.accumulate("sum", bb.matmul(x, bb.iter(i, imap=(1,), fmap=0))) for i in range(1, len(names))]
    if post == "rms":
        r = bb.accumulate("rms", x, eps=EPS)
        y = bb.div(accs[0], r)
    elif post == "rms_mlp":
        r = bb.accumulate("rms", x, eps=EPS)
        y = bb.mul(bb.div(accs[0], r), bb.div(accs[1], r))
    elif post == "swiglu":
        y = bb.mul(bb.silu(accs[0]), accs[1])
    else:  # pragma: no cover
        raise ValueError(post)
    bb.save(y, omap=(1,))
    return bb


def _w1_program(s: Shape) -> Graph:
    g = Graph("W1 rmsnorm_linear")
    i = _inputs(g, W1, s)
    g.output(g.matmul(g.rms_norm(i["X"], eps=EPS), i["W"]), "Y")
    return g


def _w1_hand(s: Shape) -> Graph:
    g = Graph("W1 hand-written")
    i = _inputs(g, W1, s)
    (y,) = g.customized(_linear_block(["X", "W"], i, "rms").build(), [i["X"], i["W"]])
    g.output(y, "Y")
    return g


def _w2_program(s: Shape) -> Graph:
    g = Graph("W2 rmsnorm_mlp")
    i = _inputs(g, W2, s)
    xn = g.rms_norm(i["X"], eps=EPS)
    g.output(g.mul(g.matmul(xn, i["Wu"]), g.matmul(xn, i["Wg"])), "Y")
    return g


def _w2_hand(s: Shape) -> Graph:
    g = Graph("W2 hand-written")
    i = _inputs(g, W2, s)
    (y,) = g.customized(_linear_block(["X", "Wu", "Wg"], i, "rms_mlp").build(), [i["X"], i["Wu"], i["Wg"]])
    g.output(y, "Y")
    return g


def _w3_program(s: Shape) -> Graph:
    g = Graph("W3 swiglu")
    i = _inputs(g, W3, s)
    g.output(g.mul(g.silu(g.matmul(i["X"], i["Wg"])), g.matmul(i["X"], i["Wu"])), "Y")
    return g


def _w3_hand(s: Shape) -> Graph:
    g = Graph("W3 hand-written")
    i = _inputs(g, W3, s)
    (y,) = g.customized(_linear_block(["X", "Wg", "Wu"], i, "swiglu").build(), [i["X"], i["Wg"], i["Wu"]])
    g.output(y, "Y")
    return g


def _w7_program(s: Shape) -> Graph:
    g = Graph("W7 lora")
    i = _inputs(g, W7, s)
    g.output(g.add(g.matmul(i["X"], i["W"]), g.matmul(g.matmul(i["X"], i["A"]), i["B"])), "Y")
    return g


def _w7_hand(s: Shape) -> Graph:
    """X @ A as a small predefined kernel, then one kernel: grid over m, loop over d accumulating
    X @ W, and the rank-r contraction (X@A) @ B added after the loop. This is the concat-along-the-
    contraction form of WORKLOADS.md with its last r-deep step peeled out of the loop (same sums)."""
    g = Graph("W7 hand-written")
    i = _inputs(g, W7, s)
    xa = g.matmul(i["X"], i["A"])
    bb = BlockBuilder(grid=("G",), forloop="F", inputs=[i["X"], i["W"], xa, i["B"]])
    x = bb.iter(0, imap=(None,), fmap=1)
    w = bb.iter(1, imap=(1,), fmap=0)
    xa_t = bb.iter(2, imap=(None,))
    b_t = bb.iter(3, imap=(1,))
    acc = bb.accumulate("sum", bb.matmul(x, w))
    bb.save(bb.add(acc, bb.matmul(xa_t, b_t)), omap=(1,))
    (y,) = g.customized(bb.build(), [i["X"], i["W"], xa, i["B"]])
    g.output(y, "Y")
    return g


# --- attention family (W4, W5, W6) -----------------------------------------------------------------

_ATTN = tuple(dict(b=b, h=h, q=q, kv=kv, D=D) for b, h, q, kv, D in
              ((2, 8, 1, 1024, 128), (2, 8, 128, 1024, 128), (2, 32, 1, 1024, 128), (4, 8, 1, 1024, 128)))
_GQA = tuple(dict(b=b, S=S) for b, S in ((1, 1024), (1, 4096), (8, 1024), (8, 4096)))
_GQA_H, _GQA_KVH, _GQA_D = 32, 8, 128


def _attention(g: Graph, q: Tensor, k: Tensor, v: Tensor, D: int, norm: bool) -> Tensor:
    if norm:
        q, k = g.rms_norm(q, eps=EPS), g.rms_norm(k, eps=EPS)
    scores = g.mul_scalar(g.matmul(q, g.transpose(k, -1, -2)), 1.0 / math.sqrt(D))
    return g.matmul(g.softmax(scores, -1), v)


def _attn_hand(g: Graph, q: Tensor, k: Tensor, v: Tensor, D: int, norm: bool, rows: int) -> Tensor:
    """Flash attention over a (batch, heads, ...) grid.

    rows == 1 or a small GQA group (decode): split-KV ("flash decoding"). Kernel 1: grid
    (batch, heads, P KV splits), loop over F KV chunks per split, online-softmax accumulators; saves
    per-split row max, rescaled sum and unnormalized output. Kernel 2 (predefined ops): combine splits.
    Otherwise (prefill): grid (batch, heads, T query tiles), loop over KV chunks, normalize after the loop.
    """
    b, h = q.shape[0], q.shape[1]
    decode = rows <= 8
    bb = BlockBuilder(grid=(b, h, "P" if decode else "T"), forloop="F", inputs=[q, k, v],
                      splits=("P",) if decode else ())
    qt = bb.iter(0, imap=(0, 1, None if decode else 2))
    kvmap = (0, 1, 2 if decode else None)
    kt = bb.iter(1, imap=kvmap, fmap=2)
    vt = bb.iter(2, imap=kvmap, fmap=2)
    if norm:
        qt, kt = bb.rms_norm(qt, eps=EPS), bb.rms_norm(kt, eps=EPS)
    s = bb.mul_scalar(bb.matmul(qt, bb.transpose(kt, -1, -2)), 1.0 / math.sqrt(D))
    den = bb.accumulate("softmax_sum", s)
    num = bb.accumulate("softmax_matmul", s, vt)
    if not decode:
        bb.save(bb.div(num, den), omap=(0, 1, 2))
        (o,) = g.customized(bb.build(), [q, k, v])
        return o
    mx = bb.accumulate("max", s)
    for t in (mx, den, num):
        bb.save(t, omap=(0, 1, 2))  # per-split partials, concatenated along the row dim: [b, h, P*rows, .]
    m_p, s_p, o_p = g.customized(bb.build(), [q, k, v])
    P = m_p.shape[2] // rows  # symbolic: P
    m5 = g.reshape(m_p, (b, h, P, rows, 1))
    s5 = g.reshape(s_p, (b, h, P, rows, 1))
    o5 = g.reshape(o_p, (b, h, P, rows, D))
    w = g.exp(g.sub(m5, g.max(m5, 2)))                   # exp(m_p - m) per split
    tot = g.sum(g.mul(s5, w), 2)                          # [b, h, 1, rows, 1]
    o = g.div(g.sum(g.mul(o5, w), 2), tot)                # [b, h, 1, rows, D]
    return g.reshape(o, (b, h, rows, D))


def _attn_io(s: Shape) -> dict[str, tuple[int, ...]]:
    return {"Q": (s["b"], s["h"], s["q"], s["D"]), "K": (s["b"], s["h"], s["kv"], s["D"]),
            "V": (s["b"], s["h"], s["kv"], s["D"])}


def _attn_params(s: Shape) -> dict[str, int]:
    if s["q"] <= 8:
        P = max(1, s["kv"] // 512)
        return {"P": P, "F": s["kv"] // (P * 128)}
    return {"T": s["q"] // 32, "F": s["kv"] // 128}


def _attn_alt(s: Shape) -> list[dict[str, int]]:
    if s["q"] <= 8:
        return [{"P": 1, "F": s["kv"] // 128}, {"P": 4, "F": 2}]
    return [{"T": 1, "F": s["kv"] // 256}, {"T": s["q"] // 16, "F": s["kv"] // 64}]


_ATTN_RULE = ("decode (q <= 8 rows per KV head): P = max(1, kv/512) KV splits, F = kv/(128 P) (128 keys per "
              "iteration); prefill: T = q/32 query tiles of 32 rows, F = kv/128")


def _make_attn(name: str, norm: bool):
    def program(s: Shape) -> Graph:
        g = Graph(name)
        i = _inputs(g, W5 if norm else W4, s)
        g.output(_attention(g, i["Q"], i["K"], i["V"], s["D"], norm), "O")
        return g

    def hand(s: Shape) -> Graph:
        g = Graph(name + " hand-written")
        i = _inputs(g, W5 if norm else W4, s)
        g.output(_attn_hand(g, i["Q"], i["K"], i["V"], s["D"], norm, s["q"]), "O")
        return g
    return program, hand


def _gqa_io(s: Shape) -> dict[str, tuple[int, ...]]:
    return {"Q": (s["b"], _GQA_H, 1, _GQA_D), "K": (s["b"], _GQA_KVH, s["S"], _GQA_D),
            "V": (s["b"], _GQA_KVH, s["S"], _GQA_D)}


def _w6_program(s: Shape) -> Graph:
    """Query head j uses KV head j // 4: grouping the 4 query heads of a KV head as rows is a reshape."""
    g = Graph("W6 gqa_decode")
    i = _inputs(g, W6, s)
    grp = _GQA_H // _GQA_KVH
    qg = g.reshape(i["Q"], ("b", _GQA_KVH, grp, _GQA_D))
    o = _attention(g, qg, i["K"], i["V"], _GQA_D, False)
    g.output(g.reshape(o, ("b", _GQA_H, 1, _GQA_D)), "O")
    return g


def _w6_hand(s: Shape) -> Graph:
    g = Graph("W6 hand-written")
    i = _inputs(g, W6, s)
    grp = _GQA_H // _GQA_KVH
    qg = g.reshape(i["Q"], ("b", _GQA_KVH, grp, _GQA_D))
    o = _attn_hand(g, qg, i["K"], i["V"], _GQA_D, False, grp)
    g.output(g.reshape(o, ("b", _GQA_H, 1, _GQA_D)), "O")
    return g


def _gqa_params(s: Shape) -> dict[str, int]:
    return _attn_params({"q": 1, "kv": s["S"]})


def _gqa_alt(s: Shape) -> list[dict[str, int]]:
    return _attn_alt({"q": 1, "kv": s["S"]})


_w4_program, _w4_hand = _make_attn("W4 attention", False)
_w5_program, _w5_hand = _make_attn("W5 qk_norm_attention", True)

W1 = Workload("W1", "rmsnorm_linear", "Y = rms_norm(X) @ W", _LINEAR + _QKV, ("n",),
              lambda s: _x_w(s, "W"), _w1_program, _w1_hand, _linear_params, _linear_alt, "X", _LINEAR_RULE,
              "grid over m, loop over d: accumulate X@W (sum) and the rms of X; divide after the loop",
              extra={"weights": ("W",)})
W2 = Workload("W2", "rmsnorm_mlp", "Y = (rms_norm(X) @ Wu) * (rms_norm(X) @ Wg)", _LINEAR + _QKV, ("n",),
              lambda s: _x_w(s, "Wu", "Wg"), _w2_program, _w2_hand, _linear_params, _linear_alt, "X",
              _LINEAR_RULE, "as W1 with both matmuls sharing the X tile; one rms; divide, multiply",
              extra={"weights": ("Wu", "Wg")})
W3 = Workload("W3", "swiglu", "Y = silu(X @ Wg) * (X @ Wu)", _LINEAR + _LLAMA_MLP, ("n",),
              lambda s: _x_w(s, "Wg", "Wu"), _w3_program, _w3_hand, _linear_params, _linear_alt, "X",
              _LINEAR_RULE, "grid over m, loop over d, both matmuls sharing the X tile; silu(a)*b after the loop",
              extra={"weights": ("Wg", "Wu")})
W4 = Workload("W4", "attention", "O = softmax(Q @ K^T / sqrt(D)) @ V", _ATTN, ("b",), _attn_io,
              _w4_program, _w4_hand, _attn_params, _attn_alt, "Q", _ATTN_RULE,
              "decode: split-KV with online softmax + combine kernel; prefill: grid over query tiles, loop over KV")
W5 = Workload("W5", "qk_norm_attention", "W4 with Q = rms_norm(Q), K = rms_norm(K)", _ATTN, ("b",), _attn_io,
              _w5_program, _w5_hand, _attn_params, _attn_alt, "Q", _ATTN_RULE,
              "as W4, normalizing the Q and K tiles inside the kernel")
W6 = Workload("W6", "gqa_decode", "W4 with 32 query heads sharing 8 KV heads", _GQA, ("b",), _gqa_io,
              _w6_program, _w6_hand, _gqa_params, _gqa_alt, "Q", _ATTN_RULE,
              "split-KV; each block serves the 4 query heads of one KV head, so K and V are read once")
W7 = Workload("W7", "lora", "Y = X @ W + (X @ A) @ B",
              (dict(n=16, d=256, m=4096, r=16), dict(n=1, d=4096, m=4096, r=16), dict(n=16, d=4096, m=4096, r=16)),
              ("n",), lambda s: {"X": (s["n"], s["d"]), "W": (s["d"], s["m"]), "A": (s["d"], s["r"]),
                                 "B": (s["r"], s["m"])},
              _w7_program, _w7_hand, _linear_params, _linear_alt, "X", _LINEAR_RULE,
              "X@A as a small kernel; one kernel looping over the contraction of concat(X, X@A) @ concat(W, B)",
              extra={"weights": ("W", "A", "B"), "int8_weights": ("W",)})  # the adapters stay float

_DIMNAMES.update({
    "W1": {"X": ("n", "d"), "W": ("d", "m")},
    "W2": {"X": ("n", "d"), "Wu": ("d", "m"), "Wg": ("d", "m")},
    "W3": {"X": ("n", "d"), "Wg": ("d", "m"), "Wu": ("d", "m")},
    "W4": {"Q": ("b", "h", "q", "D"), "K": ("b", "h", "kv", "D"), "V": ("b", "h", "kv", "D")},
    "W5": {"Q": ("b", "h", "q", "D"), "K": ("b", "h", "kv", "D"), "V": ("b", "h", "kv", "D")},
    "W6": {"Q": ("b", "H", "one", "D"), "K": ("b", "KVH", "S", "D"), "V": ("b", "KVH", "S", "D")},
    "W7": {"X": ("n", "d"), "W": ("d", "m"), "A": ("d", "r"), "B": ("r", "m")},
})
for _s in _GQA:
    _s.update({"H": _GQA_H, "KVH": _GQA_KVH, "one": 1, "D": _GQA_D})

WORKLOADS: dict[str, Workload] = {w.id: w for w in (W1, W2, W3, W4, W5, W6, W7)}
