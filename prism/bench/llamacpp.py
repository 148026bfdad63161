"""llama.cpp as a baseline of ``prism bench --models`` (not in CI).

Where ``PRISM_LLAMA_CPP`` names a llama.cpp source tree with ``build/bin/llama-bench`` built (the tree ships
in the ``llama-cpp-python`` sdist: ``cmake -B build -DGGML_NATIVE=ON -DLLAMA_CURL=OFF && cmake --build build
--target llama-bench``, ~9 minutes on 2 cores), the model benchmark writes the *same* random model as GGUF
and times it with ``llama-bench`` between its own rounds:

* the model (float32, the bench's seed) is saved with ``save_pretrained`` beside a small sentencepiece
  tokenizer (``sentencepiece`` must be installed; llama.cpp's converter pads the vocabulary to the model's),
  and the tree's own ``convert_hf_to_gguf.py`` (with its in-tree ``gguf-py``) writes the GGUF in the
  precision of the run: ``f32`` for float32, ``bf16`` for bfloat16, ``q8_0`` for int8w (llama.cpp's 8-bit
  format; it also quantizes the activations of its dot products, in blocks of 32, which Prism's int8
  weight-only does not and its ``w8a8`` does per row);
* ``llama-bench`` measures the prompt (``-p <prompt> -n 0``) and decode after the prompt
  (``-p 0 -n <new> -d <prompt>``, the KV cache as deep as Prism's) with the bench's thread count.

A separate process per call, so not one process with the others; the rounds alternate with theirs.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

OUTTYPE = {"float32": "f32", "bfloat16": "bf16", "float16": "f16", "int8w": "q8_0", "int8w-bf16": "q8_0",
           "w8a8": "q8_0", "int8w-g32": "q8_0", "int8w-g32-bf16": "q8_0"}


@dataclass(frozen=True)
class LlamaCpp:
    root: Path

    @property
    def bench(self) -> Path:
        return self.root / "build" / "bin" / "llama-bench"

    @property
    def convert(self) -> Path:
        return self.root / "convert_hf_to_gguf.py"


def find() -> tuple[LlamaCpp | None, str]:
    """The llama.cpp tree of ``PRISM_LLAMA_CPP``, or None and why not (for the report)."""
    raw = os.environ.get("PRISM_LLAMA_CPP", "").strip()
    if not raw:
        return None, ("llama.cpp: not set up (set PRISM_LLAMA_CPP to a llama.cpp tree with build/bin/llama-bench; "
                      "see prism/bench/llamacpp.py)")
    t = LlamaCpp(Path(raw).expanduser())
    missing = [str(p) for p in (t.bench, t.convert) if not p.exists()]
    if missing:
        return None, f"llama.cpp: PRISM_LLAMA_CPP={raw} lacks {', '.join(missing)}"
    try:
        import sentencepiece  # noqa: F401
    except ImportError:
        return None, "llama.cpp: the GGUF export needs sentencepiece (pip install sentencepiece)"
    return t, ""


def export_gguf(tree: LlamaCpp, model: Any, dtype: str, workdir: Path) -> Path:
    """``model`` (a float32 Hugging Face decoder) as GGUF in the precision of ``dtype`` under ``workdir``."""
    import sentencepiece as spm
    hf = workdir / "hf"
    out = workdir / f"model-{OUTTYPE[dtype]}.gguf"
    hf.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(hf, safe_serialization=True)
    text = workdir / "tokenizer.txt"
    text.write_text("\n".join(f"the quick brown fox {i} jumps over the lazy dog {i * 7}" for i in range(2000)))
    spm.SentencePieceTrainer.train(input=str(text), model_prefix=str(hf / "tokenizer"), vocab_size=200,
                                   model_type="bpe", bos_id=1, eos_id=2, unk_id=0, pad_id=-1,
                                   minloglevel=2)
    env = {**os.environ, "PYTHONPATH": str(tree.root / "gguf-py")}
    r = subprocess.run([sys.executable, str(tree.convert), str(hf), "--outtype", OUTTYPE[dtype], "--outfile",
                        str(out)], capture_output=True, text=True, env=env)
    if r.returncode != 0 or not out.exists():
        tail = (r.stderr or r.stdout).strip().splitlines()[-3:]
        raise RuntimeError(f"convert_hf_to_gguf.py failed: {' | '.join(tail)}")
    return out


def parse(output: str) -> dict[str, float]:
    """tokens/s of ``llama-bench -o json`` by test: ``pp`` (prompt) and ``tg`` (generation)."""
    res: dict[str, float] = {}
    for t in json.loads(output):
        kind = "pp" if t["n_prompt"] and not t["n_gen"] else "tg" if t["n_gen"] and not t["n_prompt"] else None
        if kind is not None:
            res[kind] = float(t["avg_ts"])
    return res


def run(tree: LlamaCpp, gguf: Path, prompt: int, new_tokens: int, threads: int) -> dict[str, float]:
    """One measurement: the prompt's tokens/s (``pp``) and decode's after it (``tg``)."""
    base = [str(tree.bench), "-m", str(gguf), "-t", str(threads), "-r", "1", "-o", "json"]
    res: dict[str, float] = {}
    for extra in (["-p", str(prompt), "-n", "0"], ["-p", "0", "-n", str(new_tokens), "-d", str(prompt)]):
        r = subprocess.run(base + extra, capture_output=True, text=True)
        if r.returncode != 0:
            raise RuntimeError(f"llama-bench failed: {(r.stderr or '').strip().splitlines()[-1:]}")
        res.update(parse(r.stdout))
    return res
