"""``prism bench --models``: Hugging Face decoders end to end, ``generate()`` under eager PyTorch,
``torch.compile`` (inductor, default mode) and ``torch.compile(backend="prism")``, in one process.

Per model (a ``transformers`` config built with seeded random weights; nothing is downloaded):

1. **Prepare** each system on its own copy of the same weights: the first ``generate()`` from the
   caches as they are (empty caches: pass ``PRISM_CACHE_DIR`` of an empty folder) is timed as *start-up*
   (Dynamo capture, Prism's search, tuning and compiles, inductor's codegen), and the memory it adds
   (RSS after ``malloc_trim``, less the copy of the weights) is recorded. The timed calls then run once
   untimed as *warm-up* (a one-token ``generate()`` takes other graphs: Dynamo recompiles), timed too.
   The generated token ids must equal eager's (greedy decoding); a system that differs is flagged.
2. **Time** in interleaved rounds (rotated order, same thread count, ``torch.inference_mode()``): per
   round and system, ``generate(max_new_tokens=1)`` gives the time to first token (the prompt's prefill),
   then ``generate`` of 2 and of N tokens (no end-of-sequence token: exactly N, see below); decode tokens/s is
   ``(N - 2) / (T(N) - T(2))``: the same prefill and first step (Dynamo's static decode graph) cancel,
   what is left are N - 2 steps of the dynamic decode graph. Medians over rounds.
3. **New prompt lengths**: after the rounds, per system, a one-token ``generate()`` at two new prompt
   lengths (prompt + 13: Dynamo compiles its dynamic prefill graph; prompt + 29: a second new value of
   it), each less the same call repeated: the time a new length adds.
4. **Roofline** of decode: bytes per token are the parameters a step reads (all but the embedding table,
   of which one row is read; the KV cache is left out: a few MB at these lengths) over the read bandwidth
   measured beside the run (a read-only sum of a 1 GiB buffer with transparent huge pages requested,
   best of 5, before and after the rounds; the lower is used, so the fraction is not flattered).
5. **Share on Prism**: of the compute operators in the prefill and the dynamic decode graph (layout
   operators -- views, ``cat``, slicing -- not counted), the fraction inside pieces that Prism runs;
   what stays in PyTorch is listed with its reason.
6. **First token in a new process** (``--first-token``): after the rounds, per compiling system, a child
   process builds the same model (untimed), wraps ``forward`` as above and times its first
   ``generate(max_new_tokens=1)`` on the caches this run filled (Dynamo's capture of the prefill graph,
   Prism's cached searches and tunings or inductor's cache, the prefill itself); its token must equal
   eager's in that process.

``--dtype bfloat16``: the same models moved to bfloat16 (``model.to(torch.bfloat16)``) for every system. Eager
rounds every operator's result to bfloat16, Prism only where PyTorch stores a tensor, so greedy tokens may part
at a near-tie: a system whose tokens differ from eager's is wrong unless its prompt logits agree with eager's
within ``LOGITS_RTOL`` (then the report notes where the tokens part). ``--dtype int8w``: every ``nn.Linear``
int8 weight-only (``prism.quantize_weights``, the LM head included); every system runs the same int8 weights
and computes in float32, so the tokens must equal eager's. ``--dtype int8w-bf16``: the same int8 weights in the
model moved to bfloat16 afterwards (torchao's int8 weight-only on a bfloat16 checkpoint: bfloat16 activations
and scales), tokens judged as in bfloat16. ``--dtype int8w-g32``: as ``int8w`` with one scale per group of 32
input features of each output (``quantize_weights(group_size=32)``: the weights of llama.cpp's ``q8_0``; float32
activations, tokens must equal eager's); ``--dtype int8w-g32-bf16``: those weights in the model moved to
bfloat16 afterwards (bfloat16 activations, scales and biases; the int8 weights stay), tokens judged as in
bfloat16. ``--dtype w8a8``: the int8 weights of ``int8w`` and every Linear's input rows quantized to int8 at each
call (``prism.quantize_weights(activations="int8")``: per-row scales; the
like-for-like of llama.cpp's ``q8_0``, which quantizes activations in blocks of 32); the quantized values and
the products are exact in float32 on every system, but the quantizer's rounding is discontinuous (float32
reassociation upstream flips some values by one step), so tokens are judged as in bfloat16.

llama.cpp is a baseline of this benchmark where ``PRISM_LLAMA_CPP`` names a built llama.cpp tree (not in
CI; ``prism/bench/llamacpp.py``): the same weights as GGUF, timed by ``llama-bench`` between the rounds;
without it the report says so.
"""

from __future__ import annotations

import atexit
import copy
import ctypes
import dataclasses
import gc
import json
import mmap
import os
import shutil
import statistics
import sys
import tempfile
import time
import weakref
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from prism.workloads.precision import (
    HALF,
    INT8W,
    INT8W_G32,
    INT8W_G32_BF16,
    MODEL_PRECISIONS,
    W8A8,
    activation_dtype,
)

SYSTEMS = ("eager", "compile", "prism")


@dataclass(frozen=True)
class ModelSpec:
    arch: str                     # llama | qwen2 | qwen3 | mistral
    layers: int
    hidden: int
    mlp: int
    heads: int
    kv_heads: int
    vocab: int = 32000
    head_dim: int | None = None   # qwen3 states it; the others derive hidden / heads


MODELS: dict[str, ModelSpec] = {
    "llama-tiny": ModelSpec("llama", 2, 64, 128, 4, 2, vocab=128),        # the tests' size
    "llama-small": ModelSpec("llama", 4, 1024, 2816, 16, 4),              # the first try
    "llama-1b": ModelSpec("llama", 8, 2048, 5632, 16, 4),                 # the llama.cpp anchor (1.7 GB f32)
    "qwen2-small": ModelSpec("qwen2", 4, 1024, 2816, 16, 4),              # bias in Q/K/V
    "qwen3-small": ModelSpec("qwen3", 4, 1024, 3072, 16, 8, head_dim=64),  # QK-norm
    "mistral-small": ModelSpec("mistral", 4, 1024, 2816, 16, 4),
}
DEFAULT = ("llama-1b",)
NEW_LENGTHS = (13, 29)   # prompt + these: the first new length (Dynamo's dynamic graph), then another
# tokens decoded past the KV lengths the rounds saw (each a new length: a system that specializes kernels to
# shapes pays for every one; the rounds repeat their lengths and do not show it). Two of Prism's planning cycles
# (a length planned with the next PLAN_AHEAD = 16, frontend/runtime.py): any 34 consecutive new lengths hold two of
# its batches of planning, so the rate is its average (8 before 2026-11-30 held one or none)
FRESH_TOKENS = 34
QUICK = ("llama-small",)


DTYPES = MODEL_PRECISIONS   # int8w: every Linear int8 weight-only; w8a8: int8 activations too (prism.quantize_weights)
# low precision: a system's greedy tokens may leave eager's where two logits are closer than the rounding
# (eager rounds every operator to bfloat16, Prism only where PyTorch stores a tensor); its prompt logits must
# then agree with eager's within this (relative to the largest logit), else it is wrong
# w8a8: quantizing activations is discontinuous (round), so any float32 reassociation upstream -- legitimately
# different between systems -- flips some values by one step: llama-1b's prompt logits moved 0.049 relative
# when its input embeddings were scaled by 1 + 1e-7 in eager, and w8a8's own error against the float32 model is
# 0.098 (/tmp script, 2026-11-29); torch.compile and Prism both part from eager's tokens by 0.05
LOGITS_RTOL = {"float32": 1e-3, "bfloat16": 0.08, "float16": 0.02, "int8w-bf16": 0.08, W8A8: 0.1,
               INT8W_G32_BF16: 0.08}


# where build() saved each float model's checkpoint, for copy_model
_CHECKPOINTS: weakref.WeakKeyDictionary[Any, Path] = weakref.WeakKeyDictionary()


def build(spec: ModelSpec, seed: int = 0, dtype: str = "float32", from_checkpoint: bool = True) -> Any:
    """The model of ``spec`` with seeded random weights (drawn in float32, then stored as ``dtype``), eval mode.
    ``int8w``: the float32 model with every ``nn.Linear`` (the LM head too, as llama.cpp's q8_0) replaced by
    int8 weight-only layers (``prism.quantize_weights``); eager PyTorch runs their forward as written;
    ``int8w-bf16``: that model moved to bfloat16 (the int8 weights stay int8). ``w8a8``: the float32 model
    with every Linear quantized as for ``int8w`` and its input rows quantized to int8 at each call
    (``quantize_weights(activations="int8")``, llama.cpp's ``q8_0`` quantizes its activations too).

    ``from_checkpoint`` (float dtypes): the model is saved (``save_pretrained``, safetensors, in a temporary
    folder removed at exit) and loaded back with ``from_pretrained``, so its weights sit where a user's
    model's do: transformers 5 leaves the parameters in the ``mmap`` of the checkpoint file (page cache), as
    llama.cpp reads its GGUF. On the 2-vCPU Zen 4 VM that memory streams faster than the anonymous memory
    of a model made in the process: llama-1b bf16 decode on Prism 25.19 -> 22.08 ms per step with the same
    weights in a file mapping (two copies in one process, rounds alternating, paired median 0.912), and
    llama.cpp decoded 10-17 % slower from its own ``malloc``'d copy (``--load-mode none``) than through its
    ``mmap``. :func:`copy_model` gives each system its own model on the same file."""
    import torch
    import transformers as tf
    common = dict(hidden_size=spec.hidden, intermediate_size=spec.mlp, num_hidden_layers=spec.layers,
                  num_attention_heads=spec.heads, num_key_value_heads=spec.kv_heads, vocab_size=spec.vocab,
                  max_position_embeddings=4096)
    cls, cfg = {"llama": (tf.LlamaForCausalLM, tf.LlamaConfig), "qwen2": (tf.Qwen2ForCausalLM, tf.Qwen2Config),
                "qwen3": (tf.Qwen3ForCausalLM, tf.Qwen3Config),
                "mistral": (tf.MistralForCausalLM, tf.MistralConfig)}[spec.arch]
    if spec.head_dim is not None:
        common["head_dim"] = spec.head_dim
    if spec.arch == "mistral":
        common["sliding_window"] = None
    torch.manual_seed(seed)
    if dtype in INT8W or dtype in (W8A8, INT8W_G32, INT8W_G32_BF16):
        from prism.frontend.quantize import quantize_weights
        model = quantize_weights(cls(cfg(**common)).eval(), activations="int8" if dtype == W8A8 else None,
                                 group_size=32 if dtype in (INT8W_G32, INT8W_G32_BF16) else None)
        act = activation_dtype(dtype)   # (float32: as built; .to() would widen the float16 group scales too)
        return model if act == "float32" else model.to(getattr(torch, act))
    model = cls(cfg(**common)).eval().to(getattr(torch, dtype))
    if not from_checkpoint:
        return model
    folder = Path(tempfile.mkdtemp(prefix="prism-bench-model-"))
    atexit.register(shutil.rmtree, folder, True)   # the loaded models' mappings keep the file's pages
    model.save_pretrained(folder)
    loaded = _load(folder, dtype)
    _CHECKPOINTS[loaded] = folder
    return loaded


def _load(folder: Path, dtype: str) -> Any:
    import torch
    import transformers as tf
    model = tf.AutoModelForCausalLM.from_pretrained(folder, dtype=getattr(torch, dtype)).eval()
    for p in model.parameters():   # fault the mapping in now, not inside a system's first timed call
        p.detach().reshape(-1)[:: max(1, 4096 // p.element_size())].sum()
    return model


def copy_model(model: Any) -> Any:
    """Another model with ``model``'s weights and generation config: loaded again from the checkpoint
    :func:`build` saved it from (its own modules on the same file's pages), else a deep copy."""
    folder = _CHECKPOINTS.get(model)
    if folder is None:
        return copy.deepcopy(model)
    other = _load(folder, str(next(model.parameters()).dtype).removeprefix("torch."))
    other.generation_config = copy.deepcopy(model.generation_config)
    return other


def decode_bytes(model: Any) -> int:
    """Parameter bytes one decode step reads: all but the input embedding table, of which one row is read
    (unless the LM head shares it: then the head reads all of it)."""
    from prism.frontend.quantize import Int8Linear
    emb = model.get_input_embeddings().weight
    head = getattr(model.get_output_embeddings(), "weight", None)  # an int8 head holds buffers
    int8 = [t for m in model.modules() if isinstance(m, Int8Linear) for t in (m.qweight, m.scale)]
    return sum(p.numel() * p.element_size() for p in [*model.parameters(), *int8] if p is not emb or p is head)


def read_bandwidth(size: int = 1 << 30, repeats: int = 5) -> float:
    """Bytes/s of a read-only sum over ``size`` bytes (huge pages requested), best of ``repeats``."""
    import torch
    buf = mmap.mmap(-1, size)
    if hasattr(mmap, "MADV_HUGEPAGE"):
        buf.madvise(mmap.MADV_HUGEPAGE)
    t = torch.frombuffer(buf, dtype=torch.float32)
    t.fill_(1.0)
    best = float("inf")
    for _ in range(repeats + 1):
        t0 = time.perf_counter()
        t.sum()
        best = min(best, time.perf_counter() - t0)
    del t
    buf.close()
    return size / best


def rss() -> int:
    """Resident bytes of this process after a collection and ``malloc_trim``."""
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except OSError:
        pass
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@dataclass
class SystemResult:
    status: str = "ok"                 # ok | wrong: ... | failed: ...
    startup_s: float | None = None     # the first generate(), compiling included
    warmup_s: float | None = None      # the timed calls once more, untimed (recompiles happen here)
    memory_mib: float | None = None    # RSS the system added beyond its copy of the weights
    ttft_ms: list[float] = field(default_factory=list)    # generate(max_new_tokens=1): the prefill
    two_ms: list[float] = field(default_factory=list)     # two tokens: the prefill and the first step
    total_ms: list[float] = field(default_factory=list)   # N tokens
    share: float | None = None         # Prism: compute operators on Prism (prefill and decode graphs)
    kept: list[str] = field(default_factory=list)   # Prism: what stayed in PyTorch, with the reason
    prism_pieces: int | None = None
    stats: dict[str, int] = field(default_factory=dict)   # Prism: searches, tunings, compiles of start-up
    new_length_s: list[float] = field(default_factory=list)  # first call at a new prompt length less the next
    tps: list[float] = field(default_factory=list)   # decode tokens/s measured directly (llama-bench)
    # per round, ms per decode step inside the N-token call (logits-processor stamps from the second token to
    # the last): not moved by the prefill's noise, as the difference of two calls is (at batch 8 llama-1b's
    # 2.1-2.4 s prefill swung the difference by 7 ms per step)
    step_ms: list[float] = field(default_factory=list)
    fresh_tps: float | None = None   # decode tokens/s at KV lengths not seen before (FRESH_TOKENS past them)
    # Prism: where a decode step's time goes (ms per step; _decode_breakdown): step, kernels, piece calls
    # (kernels included), and piece calls / kernel launches per step
    breakdown: dict[str, float] = field(default_factory=dict)
    first_token_s: float | None = None   # --first-token: a new process's first generate(1), warm caches

    def ttft(self) -> float | None:
        return statistics.median(self.ttft_ms) if self.ttft_ms else None

    def decode_tps(self, new_tokens: int) -> float | None:
        if self.tps:
            return statistics.median(self.tps)
        if self.step_ms:
            return 1e3 / statistics.median(self.step_ms)
        if not self.total_ms or not self.two_ms:
            return None
        per = [(t - f) / (new_tokens - 2) for t, f in zip(self.total_ms, self.two_ms)]
        m = statistics.median(per)
        return 1e3 / m if m > 0 else None

    def round_tps(self, new_tokens: int) -> list[float]:
        """Decode tokens/s of each round, in round order (measured directly, or from that round's calls)."""
        if self.tps:
            return list(self.tps)
        if self.step_ms:
            return [1e3 / x for x in self.step_ms]
        return [(new_tokens - 2) * 1e3 / (t - f) for t, f in zip(self.total_ms, self.two_ms) if t > f]


@dataclass
class ModelResult:
    name: str
    spec: dict[str, Any]
    prompt: int
    new_tokens: int
    decode_bytes: int
    bandwidth: list[float] = field(default_factory=list)
    dtype: str = "float32"
    systems: dict[str, SystemResult] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    batch: int = 1   # sequences per generate(): every step decodes one token of each

    def decode_tps(self, system: str) -> float | None:
        """Tokens per second of ``system``'s decode, all sequences together."""
        steps = self.systems[system].decode_tps(self.new_tokens)
        return steps * self.batch if steps is not None else None

    def prefill_tps(self, system: str) -> float | None:
        ttft = self.systems[system].ttft()
        return self.batch * self.prompt / ttft * 1e3 if ttft else None

    def paired(self, a: str, b: str) -> tuple[list[float], float] | None:
        """Decode of system ``a`` over ``b`` round by round (each round runs every system within minutes of
        the others) and the median of those ratios; None unless both have the same rounds. The host's read
        bandwidth moves between rounds (llama.cpp 36.9 -> 51.4 tokens/s from one round to the next here), so
        a ratio of the two medians may compare different phases; the paired median does not."""
        if a not in self.systems or b not in self.systems:
            return None
        ra, rb = self.systems[a].round_tps(self.new_tokens), self.systems[b].round_tps(self.new_tokens)
        if not ra or len(ra) != len(rb):
            return None
        ratios = [x / y for x, y in zip(ra, rb)]
        return ratios, statistics.median(ratios)

    def roofline(self, system: str) -> float | None:
        """The decode's fraction of the read-bandwidth bound: every step reads the weights once, whatever the
        batch."""
        steps = self.systems[system].decode_tps(self.new_tokens)
        if steps is None or not self.bandwidth:
            return None
        return self.decode_bytes / min(self.bandwidth) * steps


def _share(reports: list[Any]) -> tuple[float | None, list[str]]:
    on = off = 0
    kept: Counter[str] = Counter()
    for r in reports:
        for p in r.pieces:
            if p.by_prism:
                on += len(p.ops)
            else:
                off += len(p.ops)
                kept[f"{p.label}: {p.reason or p.status}"] += 1
        for f in r.fallbacks:
            off += f.count
            kept[f"{f.op}: {f.reason}"] += f.count
    total = on + off
    return (on / total if total else None), [f"{k} (x{v})" for k, v in kept.items()]


def _first_difference(a: Any, b: Any) -> int:
    """The first position (column of a [batch, tokens] pair) where any sequence differs, or -1."""
    diff = (a != b).reshape(-1, a.shape[-1]).any(0).nonzero()
    return int(diff[0]) if len(diff) else -1


def _step_clock(reading: Callable[[], Any] | None = None) -> tuple[Any, list[Any]]:
    """A logits-processor list that records when each decode step's logits are ready, and that record
    (with ``reading()`` beside each time where given: ``(time, reading)``)."""
    from transformers import LogitsProcessor, LogitsProcessorList
    stamps: list[Any] = []

    class Clock(LogitsProcessor):
        def __call__(self, input_ids: Any, scores: Any) -> Any:
            t = time.perf_counter()
            stamps.append(t if reading is None else (t, reading()))
            return scores
    return LogitsProcessorList([Clock()]), stamps


def _decode_breakdown(model: Any, ids: Any, n: int, kw: dict[str, Any]) -> dict[str, float]:
    """Where Prism's decode steps go, in one ``generate()`` of ``n`` tokens with the kernel and piece-call
    accounting on (``prism.runtime.fastcall.set_profiling``: two clock reads per call): per step (the steps
    after the first, as the rounds), milliseconds in kernels, in piece calls (checks, output allocation,
    launch and kernel), the whole step, and the piece calls and kernel launches per step. The rest of a
    step ran outside Prism: the graph's PyTorch operators, Dynamo's frame evaluation and guards, and
    ``generate()``'s own Python."""
    from prism.runtime import fastcall
    clock, t = _step_clock(fastcall.profile_totals)
    fastcall.set_profiling(True)
    try:
        model.generate(ids, max_new_tokens=n, logits_processor=clock, **kw)
    finally:
        fastcall.set_profiling(False)
    if len(t) != n or n < 3:
        return {}
    (t0, p0), (t1, p1) = t[1], t[n - 1]
    d, steps = p1 - p0, n - 2
    return {"step_ms": (t1 - t0) / steps * 1e3, "kernel_ms": d.kernel_s / steps * 1e3,
            "piece_ms": d.piece_s / steps * 1e3, "piece_calls": d.pieces / steps, "kernel_calls": d.kernels / steps}


GENERATE_KW = dict(do_sample=False, pad_token_id=0)   # greedy, as every timed generate() of this bench


FIRST_TOKEN_CHILD = r"""
import json, sys, time
import torch
from prism.bench.models import GENERATE_KW as kw, MODELS, build, prompt_ids
name, dtype, system, prompt, threads = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
batch, dynamic = int(sys.argv[6]), {"none": None, "true": True}[sys.argv[7]]
torch.set_num_threads(threads)
model = build(MODELS[name], dtype=dtype)
model.generation_config.eos_token_id = None
ids = prompt_ids(MODELS[name], prompt, batch)
with torch.inference_mode():
    ref = model.generate(ids, max_new_tokens=1, **kw)
    backend = "prism" if system == "prism" else "inductor"
    model.forward = torch.compile(model.forward, backend=backend, dynamic=dynamic)
    t = time.perf_counter()
    got = model.generate(ids, max_new_tokens=1, **kw)
    dt = time.perf_counter() - t
print("FIRST_TOKEN " + json.dumps({"seconds": dt, "same": bool(torch.equal(got, ref))}))
"""


def prompt_ids(spec: ModelSpec, prompt: int, batch: int = 1) -> Any:
    """The benchmark's prompts: ``batch`` x ``prompt`` token ids drawn with a generator seeded 1."""
    import torch
    return torch.randint(0, spec.vocab, (batch, prompt), generator=torch.Generator().manual_seed(1))


def first_token_in_new_process(name: str, dtype: str, system: str, prompt: int,
                               threads: int, batch: int = 1, dynamic: bool | None = None) -> tuple[float | None, str]:
    """(seconds, "") of a new process's first ``generate(max_new_tokens=1)`` under ``system`` ("compile" or
    "prism") on the caches as they are (item 6 of the module docstring), or (None, why not)."""
    import subprocess
    r = subprocess.run([sys.executable, "-c", FIRST_TOKEN_CHILD, name, dtype, system, str(prompt), str(threads),
                        str(batch), "true" if dynamic else "none"],
                       capture_output=True, text=True)
    line = next((x for x in r.stdout.splitlines() if x.startswith("FIRST_TOKEN ")), None)
    if r.returncode != 0 or line is None:
        tail = (r.stderr.strip().splitlines() or ["no output"])[-1][:200]
        return None, f"failed (exit {r.returncode}): {tail}"
    got = json.loads(line.split(" ", 1)[1])
    if not got["same"]:
        return None, "wrong: its first token differs from eager's"
    return float(got["seconds"]), ""


def recompile_limit_hits() -> int:
    """How many times Dynamo has refused to compile a frame again in this process (its recompile limit)."""
    from torch._dynamo.utils import counters
    return sum(n for k, n in counters["unimplemented"].items() if k.startswith("Dynamo recompile limit"))


def fresh_dynamo_sizes() -> None:
    """Forget which sizes Dynamo has seen change (its automatic-dynamic state), as a new process would: the
    state is kept per code object, and every system's copy of the model runs the same ``forward``, so the system
    compiled second started from the first one's: its first graph (the prefill) was dynamic in the prompt length
    from the start, because the first system's decode had changed it (measured: Prism's start-up searched and
    tuned a dynamic prefill graph and pre-built its next shape, 35.4 s, where alone it tunes the static one,
    30.1 s). The graphs compiled so far stay; what a later size change does is Dynamo's as before."""
    try:
        from torch._dynamo import pgo
    except ImportError:   # an older torch keeps this state in the frame: nothing shared to reset
        return
    pgo.reset_code_state()


def run_model(name: str, spec: ModelSpec, prompt: int, new_tokens: int, rounds: int,
              log: Callable[[str], None], new_lengths: tuple[int, ...] = NEW_LENGTHS,
              dtype: str = "float32", fresh_tokens: int = FRESH_TOKENS, first_token: bool = False,
              batch: int = 1, dynamic: bool | None = None) -> ModelResult:
    import torch

    # Dynamo's graphs of the models before this one: transformers wraps every model's forward in the same
    # function, whose compiled variants count against Dynamo's recompile limit (8); past it every frame runs
    # eagerly, so a second model's compile and prism systems ran eager PyTorch (measured: mistral-small after
    # qwen3-small at batch 8, "start-up 0.6 s", no piece called). Their systems are not called again.
    torch._dynamo.reset()
    # ... and the two compiled systems' graphs count against that one limit together: each gets the limit a
    # process of its own would have (measured: with each system's start-up from a fresh automatic-dynamic state,
    # fresh_dynamo_sizes, the three graphs each compiled left two for the new prompt lengths, and the second
    # new length ran eagerly for both); the process's own limit is back after the run
    with torch._dynamo.config.patch(recompile_limit=2 * torch._dynamo.config.recompile_limit):
        return _run_model(name, spec, prompt, new_tokens, rounds, log, new_lengths, dtype, fresh_tokens, first_token,
                          batch, dynamic)


def _run_model(name: str, spec: ModelSpec, prompt: int, new_tokens: int, rounds: int,
               log: Callable[[str], None], new_lengths: tuple[int, ...], dtype: str, fresh_tokens: int,
               first_token: bool, batch: int, dynamic: bool | None) -> ModelResult:
    import torch

    from prism.frontend import clear_reports, reports
    from prism.tune import STATS
    base = build(spec, dtype=dtype)
    # exactly the tokens asked for, with no end-of-sequence token to stop at: ``min_new_tokens`` would do
    # it too, but its two logits processors mask the EOS id over the whole vocabulary at every step
    # (``torch.isin``), ~1 ms of Python and PyTorch per token on llama-small for every system (measured:
    # Prism 8.3-9.5 -> 7.6-7.8 ms per step, eager's time outside forward 1.7 -> 0.7 ms), which no
    # llama-bench run pays; greedy decoding is otherwise the same
    base.generation_config.eos_token_id = None
    res = ModelResult(name, asdict(spec), prompt, new_tokens, decode_bytes(base), dtype=dtype, batch=batch)
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, spec.vocab, (batch, prompt), generator=g)   # = prompt_ids(spec, prompt, batch); g goes on
    kw = GENERATE_KW
    calls: dict[str, Any] = {}
    ref = None
    run0 = dataclasses.asdict(STATS)
    limit0 = recompile_limit_hits()
    for sysname in SYSTEMS:
        r = res.systems[sysname] = SystemResult()
        before = rss()
        model = base if sysname == "eager" else copy_model(base)
        copied = rss()
        clear_reports()  # no torch._dynamo.reset(): it would drop the other systems' compiled graphs
        if sysname == "compile":   # dynamic: torch.compile's (None: static first, dynamic after a size changes)
            model.forward = torch.compile(model.forward, dynamic=dynamic)
        elif sysname == "prism":
            model.forward = torch.compile(model.forward, backend="prism", dynamic=dynamic)
        if sysname != "eager":
            fresh_dynamo_sizes()
        log(f"{name}: {sysname}: first generate() ...")
        stats0 = dataclasses.asdict(STATS)
        t0 = time.perf_counter()
        try:
            with torch.inference_mode():
                out = model.generate(ids, max_new_tokens=new_tokens, **kw)
        except Exception as e:  # a system failing must not stop the others
            r.status = f"failed: {type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"
            log(f"{name}: {sysname}: {r.status}")
            continue
        r.startup_s = time.perf_counter() - t0
        with torch.inference_mode():   # the LM head on the last position only (generate()'s logits_to_keep): the
            # whole prompt's logits were a graph of their own whose LM head ran every position (llama-1b w8a8 at
            # batch 8: its tuning at 1024 rows took 23 s); the layers' pieces are the prefill's
            logits = model(ids, logits_to_keep=1).logits[:, -1].float()
        if ref is None:
            ref, ref_logits = out, logits
        elif not torch.equal(out, ref):
            err = float((logits - ref_logits).abs().max() / ref_logits.abs().max())
            at = _first_difference(out[:, prompt:], ref[:, prompt:])
            # (int8w computes in float32 and rounds nothing: tokens must agree)
            if not (activation_dtype(dtype) in HALF or dtype == W8A8) or err > LOGITS_RTOL[dtype]:
                r.status = f"wrong: token ids differ from eager's (prompt logits off by {err:.2g} relative)"
            else:
                res.notes.append(f"{sysname}: greedy tokens leave eager's at new token {at}"
                                 + (f" in {int((out != ref).any(-1).sum())} of {batch} sequences" if batch > 1 else "")
                                 + f" ({dtype} rounding: "
                                 f"the prompt's logits agree within {err:.2g} relative, tolerance "
                                 f"{LOGITS_RTOL[dtype]})")
        t0 = time.perf_counter()  # the timed calls once, untimed: Dynamo's recompiles (a one-token
        with torch.inference_mode():  # generate() takes other paths) happen here, not in the rounds
            model.generate(ids, max_new_tokens=1, **kw)
            model.generate(ids, max_new_tokens=new_tokens, **kw)
        r.warmup_s = time.perf_counter() - t0
        r.memory_mib = (rss() - copied) / 2**20 if sysname != "eager" else (rss() - before) / 2**20
        if sysname == "prism":
            reps = reports()
            r.share, r.kept = _share(reps)
            r.prism_pieces = sum(len(x.prism_pieces()) for x in reps)
            if not r.prism_pieces and r.status == "ok":   # never report eager PyTorch as Prism's result
                r.status = "failed: no graph reached Prism (Dynamo ran the model eagerly)"
            now = dataclasses.asdict(STATS)
            r.stats = {k: now[k] - stats0[k] for k in ("searches", "search_cache_hits", "search_memory_hits",
                                                       "search_transfers", "tunings", "tune_cache_hits",
                                                       "tune_memory_hits", "tune_derived", "template_served",
                                                       "compiles")}
        log(f"{name}: {sysname}: start-up {r.startup_s:.1f} s, warm-up {r.warmup_s:.1f} s, "
            f"+{r.memory_mib:.0f} MiB, {r.status}")
        calls[sysname] = model
    res.bandwidth.append(read_bandwidth())
    if batch == 1:
        lcpp = _llama_cpp_setup(spec, dtype, base if dtype == "float32" else None, res, log)
    else:   # llama-bench times one sequence (its -b is the prompt's batch, not sequences)
        lcpp = None
        res.notes.append(f"llama.cpp: not run at batch {batch} (llama-bench times one sequence)")
    with torch.inference_mode():
        for k in range(rounds):
            order = list(calls)
            order = order[k % len(order):] + order[:k % len(order)]
            for sysname in order:
                model = calls[sysname]
                # untimed, as llama-bench's warm-up run: the first call of a system's turn, after the others
                # streamed their own weights, took Prism's llama-1b bf16 prefill 153-177 ms where the same
                # call repeated takes 114-127 ms (a 2-token generate() right after it: 140 ms)
                model.generate(ids, max_new_tokens=1, **kw)
                t0 = time.perf_counter()
                model.generate(ids, max_new_tokens=1, **kw)
                t1 = time.perf_counter()
                model.generate(ids, max_new_tokens=2, **kw)
                t2 = time.perf_counter()
                clock, stamps = _step_clock()
                model.generate(ids, max_new_tokens=new_tokens, logits_processor=clock, **kw)
                t3 = time.perf_counter()
                if len(stamps) == new_tokens:
                    res.systems[sysname].step_ms.append((stamps[-1] - stamps[1]) / (new_tokens - 2) * 1e3)
                res.systems[sysname].ttft_ms.append((t1 - t0) * 1e3)
                res.systems[sysname].two_ms.append((t2 - t1) * 1e3)
                res.systems[sysname].total_ms.append((t3 - t2) * 1e3)
            if lcpp is not None:
                _llama_cpp_round(lcpp, prompt, new_tokens, res, log)
            log(f"{name}: round {k + 1}/{rounds}")
    res.bandwidth.append(read_bandwidth())
    if "prism" in calls:  # after the rounds, so that they are timed without the accounting
        with torch.inference_mode():
            b = res.systems["prism"].breakdown = _decode_breakdown(calls["prism"], ids, new_tokens, kw)
        if b:
            log(f"{name}: prism decode step {b['step_ms']:.2f} ms: kernels {b['kernel_ms']:.2f} ms, piece calls "
                f"{b['piece_ms']:.2f} ms ({b['piece_calls']:.0f} per step), outside Prism "
                f"{b['step_ms'] - b['piece_ms']:.2f} ms")
    with torch.inference_mode():  # new prompt lengths: what a new length adds to the time to first token
        for extra in new_lengths:
            longer = torch.randint(0, spec.vocab, (batch, prompt + extra), generator=g)
            for sysname, model in calls.items():
                t0 = time.perf_counter()
                model.generate(longer, max_new_tokens=1, **kw)
                t1 = time.perf_counter()
                model.generate(longer, max_new_tokens=1, **kw)
                t2 = time.perf_counter()
                res.systems[sysname].new_length_s.append((t1 - t0) - (t2 - t1))
            log(f"{name}: prompt length {prompt + extra}: " + ", ".join(
                f"{s} +{r.new_length_s[-1]:.2f} s" for s, r in res.systems.items() if r.new_length_s))
    if fresh_tokens > 0:  # decode past every KV length seen: what a longer generate() pays per token
        with torch.inference_mode():
            n = new_tokens + fresh_tokens
            for sysname, model in calls.items():
                # untimed first, as in the rounds: the first call of a system's turn, after the others streamed
                # their weights, is slow for a while (the rounds' note above); without it Prism's 34 new-KV-length
                # steps read 78.3 tokens/s right after inductor's turn where its rounds read 108.7 (one bench run,
                # llama-1b int8w-g32-bf16), and a script replaying the bench's order without the other systems
                # measured 5 % between new and seen lengths
                model.generate(ids, max_new_tokens=1, **kw)
                # steps timed inside one generate() (the difference of two generate() calls came out <= 0
                # under load)
                clock, t = _step_clock()
                model.generate(ids, max_new_tokens=n, logits_processor=clock, **kw)
                if len(t) == n:  # token i >= new_tokens is decoded at a KV length never seen before
                    res.systems[sysname].fresh_tps = fresh_tokens / (t[n - 1] - t[new_tokens - 1])
            log(f"{name}: decode at new KV lengths: " + ", ".join(
                f"{s} {_f(r.fresh_tps, '{:.2f}')} tok/s" for s, r in res.systems.items() if s in calls))
    if lcpp is not None:
        shutil.rmtree(lcpp[2], ignore_errors=True)
    if first_token:  # a new process on the caches this run filled
        for sysname in ("compile", "prism"):
            if sysname in calls:
                secs, why = first_token_in_new_process(name, dtype, sysname, prompt, torch.get_num_threads(),
                                                       batch, dynamic)
                res.systems[sysname].first_token_s = secs
                if why:
                    res.notes.append(f"{sysname}: first token in a new process {why}")
                log(f"{name}: {sysname}: first token in a new process: {_f(secs, '{:.2f}')} s {why}")
    hit = recompile_limit_hits() - limit0
    if hit:   # a call past the limit runs eagerly: its time is PyTorch's, whatever system it was timed for
        res.notes.append(f"Dynamo hit its recompile limit {hit} time(s) in this run: the calls it refused ran in "
                         "eager PyTorch, so a time measured after it is not the compiled system's")
        log(f"{name}: {res.notes[-1]}")
    if "prism" in calls:   # over the whole run: new lengths are served after start-up
        now = dataclasses.asdict(STATS)
        res.notes.append(f"prism over the whole run: {now['tune_derived'] - run0['tune_derived']} shapes derived "
                         f"from a tuned one, {now['template_served'] - run0['template_served']} of them served "
                         f"by a compiled template with no check of their own, {now['tunings'] - run0['tunings']} "
                         "tunings (docs/codegen.md, \"Templates\")")
    return res


def _llama_cpp_setup(spec: ModelSpec, dtype: str, float32_model: Any, res: ModelResult,
                     log: Callable[[str], None]) -> tuple[Any, Path, Path] | None:
    """(tree, GGUF, its work dir) of the llama.cpp baseline (prism/bench/llamacpp.py), or None with the
    reason in the notes. The GGUF holds the same seeded weights, written from the float32 model (the run's
    own for a float32 run, else built again from the seed)."""
    from prism.bench import llamacpp
    tree, why = llamacpp.find()
    if tree is None:
        res.notes.append(why)
        return None
    work = Path(tempfile.mkdtemp(prefix="prism-llamacpp-"))
    try:
        log(f"{res.name}: llama.cpp: writing the model as GGUF ({llamacpp.OUTTYPE[dtype]}) ...")
        model = float32_model if float32_model is not None else build(spec, dtype="float32", from_checkpoint=False)
        gguf = llamacpp.export_gguf(tree, model, dtype, work)
    except Exception as e:  # the baseline failing must not stop the others
        res.systems["llama.cpp"] = SystemResult(status=f"failed: {type(e).__name__}: {str(e)[:200]}")
        shutil.rmtree(work, ignore_errors=True)
        return None
    shutil.rmtree(work / "hf", ignore_errors=True)
    res.systems["llama.cpp"] = SystemResult()
    res.notes.append(f"llama.cpp: {tree.root} ({llamacpp.OUTTYPE[dtype]} GGUF of the same weights), llama-bench in "
                     "its own process between the rounds; prefill = its prompt test, decode = its generation "
                     "after a KV cache of the prompt's length")
    return tree, gguf, work


def _llama_cpp_round(lcpp: tuple[Any, Path, Path], prompt: int, new_tokens: int, res: ModelResult,
                     log: Callable[[str], None]) -> None:
    import torch

    from prism.bench import llamacpp
    r = res.systems["llama.cpp"]
    try:
        got = llamacpp.run(lcpp[0], lcpp[1], prompt, new_tokens, torch.get_num_threads())
    except Exception as e:
        r.status = f"failed: {type(e).__name__}: {str(e)[:200]}"
        return
    if "pp" in got:
        r.ttft_ms.append(prompt / got["pp"] * 1e3)
    if "tg" in got:
        r.tps.append(got["tg"])
    log(f"{res.name}: llama.cpp: prompt {got.get('pp', 0):.1f} tok/s, decode {got.get('tg', 0):.2f} tok/s")


def _f(x: float | None, spec: str = "{:.1f}") -> str:
    return spec.format(x) if x is not None else "-"


def markdown(results: list[ModelResult], meta: dict[str, Any]) -> str:
    lines = [f"Machine: {meta.get('cpu', '?')}, {meta.get('threads')} threads; load before {meta.get('load_before')}, "
             f"after {meta.get('load_after')}; {meta.get('rounds')} interleaved rounds"
             + ("; torch.compile(..., dynamic=True) for both compilers." if meta.get("dynamic") else ".")]
    for m in results:
        bw = min(m.bandwidth) / 1e9 if m.bandwidth else None
        lines += ["", f"**{m.name}** {m.dtype} ({m.spec['arch']}, {m.spec['layers']} layers, hidden "
                  f"{m.spec['hidden']}, MLP "
                  f"{m.spec['mlp']}, {m.spec['heads']}/{m.spec['kv_heads']} heads, vocab {m.spec['vocab']}; "
                  f"{m.decode_bytes / 1e9:.2f} GB read per decode step; read bandwidth {_f(bw)} GB/s; prompt "
                  f"{m.prompt} tokens, {m.new_tokens} new" + (f"; batch of {m.batch} sequences: tokens/s count "
                                                                 "every sequence's" if m.batch > 1 else "")
                  + ")", "",
                  "| system | start-up s | first token s, new process | warm-up s | new lengths s | memory added MiB | "
                  "prefill ms | prefill tok/s | decode tok/s | decode vs eager | roofline | decode tok/s, new KV "
                  "lengths | status |",
                  "|---|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---|"]
        eager_tps = m.decode_tps("eager") if "eager" in m.systems else None
        for s, r in m.systems.items():
            tps, ttft = m.decode_tps(s), r.ttft()
            lens = ", ".join(f"{x:.2f}" for x in r.new_length_s) or "-"
            lines.append(f"| {s} | {_f(r.startup_s)} | {_f(r.first_token_s, '{:.2f}')} | {_f(r.warmup_s)} | {lens} | "
                         f"{_f(r.memory_mib, '{:.0f}')} | "
                         f"{_f(ttft)} | "
                         f"{_f(m.prefill_tps(s))} | {_f(tps, '{:.2f}')} | "
                         f"{_f(tps / eager_tps if tps and eager_tps else None, '{:.2f}x')} | "
                         f"{_f(m.roofline(s), '{:.2f}')} | "
                         f"{_f(r.fresh_tps * m.batch if r.fresh_tps else None, '{:.2f}')} | {r.status} |")
        pair = m.paired("prism", "llama.cpp")
        if pair is not None:
            lines += ["", "Decode, Prism over llama.cpp round by round: " + ", ".join(f"{x:.2f}" for x in pair[0])
                      + f" (paired median **{pair[1]:.3f}**; the medians above may come from different minutes)"]
        p = m.systems.get("prism")
        if p is not None and p.share is not None:
            st = ", ".join(f"{k} {v}" for k, v in p.stats.items())
            lines += ["", f"Prism: {p.prism_pieces} pieces over the captured graphs; {p.share:.0%} of the compute "
                      f"operators on Prism; start-up: {st}. In PyTorch: " + ("; ".join(p.kept) or "nothing")]
            b = p.breakdown
            if b:
                lines += ["", f"Prism's decode step ({b['piece_calls']:.0f} pieces run, {b['kernel_calls']:.0f} "
                          f"kernel launches; consecutive pieces run as one call where chained, docs/frontend.md): "
                          f"{b['step_ms']:.2f} ms = kernels {b['kernel_ms']:.2f} + the pieces' own cost "
                          f"{b['piece_ms'] - b['kernel_ms']:.2f} (checks, allocation, launch, a chain's cache "
                          f"copies) + outside Prism {b['step_ms'] - b['piece_ms']:.2f} (the graph's PyTorch "
                          "operators, Dynamo, generate())"]
        lines += [f"{n}." for n in m.notes]
    return "\n".join(lines)


def plot(results: list[ModelResult], path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.5))
    for ax, what in zip(axes, ("decode tok/s", "prefill tok/s")):
        labels, values = [], []
        for m in results:
            for s in m.systems:
                v = m.decode_tps(s) if what.startswith("decode") else m.prefill_tps(s)
                labels.append(f"{m.name}\n{s}")
                values.append(v or 0.0)
        ax.bar(range(len(values)), values, color=["#888", "#48c", "#c62"] * len(results))
        ax.set_xticks(range(len(values)), labels, fontsize=7)
        ax.set_title(what)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(args: Any, threads: int) -> int:
    import torch
    try:
        import transformers  # noqa: F401
    except ImportError:
        print("prism bench --models needs transformers: pip install -e '.[models]'", file=sys.stderr)
        return 2
    if args.plot:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            print("prism bench --models --plot needs matplotlib: pip install -e '.[bench]'", file=sys.stderr)
            return 2
    torch.set_num_threads(threads)
    names = [n.strip() for n in args.models.split(",") if n.strip()] if args.models not in (None, "default") \
        else list(QUICK if args.quick else DEFAULT)
    unknown = [n for n in names if n not in MODELS]
    if unknown:
        print(f"prism bench --models: unknown model(s) {unknown}; known: {sorted(MODELS)}", file=sys.stderr)
        return 2
    rounds = args.rounds if args.rounds is not None else (2 if args.quick else 3)
    prompt = args.prompt
    new = args.new_tokens if args.new_tokens else (16 if args.quick else 32)
    if new < 2:
        print("prism bench --models: --new-tokens must be >= 2", file=sys.stderr)
        return 2
    from prism.bench.machine import machine_info
    meta = {"threads": threads, "rounds": rounds, "load_before": os.getloadavg()[0],
            "cpu": machine_info(threads).get("cpu"), "prism_cache": os.environ.get("PRISM_CACHE_DIR")}

    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)
    lengths = NEW_LENGTHS if args.new_lengths is None else tuple(
        int(x) for x in args.new_lengths.split(",") if x.strip() and x.strip() != "none")
    dtype = getattr(args, "dtype", "float32")
    if dtype not in DTYPES:
        print(f"prism bench --models: --dtype {dtype} is not supported for models (the frontend converts "
              f"{list(DTYPES)} models)", file=sys.stderr)
        return 2
    meta["dtype"] = dtype
    batch = getattr(args, "batch", 1)
    if batch < 1:
        print("prism bench --models: --batch must be >= 1", file=sys.stderr)
        return 2
    meta["batch"] = batch
    fresh = FRESH_TOKENS if getattr(args, "fresh_tokens", None) is None else args.fresh_tokens
    if fresh < 0:
        print("prism bench --models: --fresh-tokens must be >= 0", file=sys.stderr)
        return 2
    dynamic = True if getattr(args, "dynamic", False) else None
    meta["dynamic"] = dynamic
    results = [run_model(n, MODELS[n], prompt, new, rounds, log, lengths, dtype, fresh,
                         bool(getattr(args, "first_token", False)), batch, dynamic) for n in names]
    meta["load_after"] = os.getloadavg()[0]
    print(markdown(results, meta))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"meta": meta, "models": [asdict(r) for r in results]}, f, indent=1)
        print(f"wrote {args.json}", file=sys.stderr)
    if args.plot:
        plot(results, args.plot)
        print(f"wrote {args.plot}", file=sys.stderr)
    return 0
