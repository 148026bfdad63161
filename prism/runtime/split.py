"""A kernel that runs as several compiled kernels in turn, each on a range of rows (a *split*).

A row-separable program (prism/ir/rows.py) at a length ``n`` that no tuned grid divides -- a prime prompt
length -- is computed as calls of kernels at lengths that are divided: the tuned kernel on each of the first
``q`` runs of its own length, then the same sGraph with one block along the rows on each run of the tuned tile
and on the rows left. Each call gets its operands' and outputs' pointers
advanced to its first row; inputs without the row axis are passed whole. That is a grid with a remainder
block, made from kernels that are each compiled and checked at their own size.

The calls are made from one small C entry (:data:`SHIM`, compiled once per operand count into the kernel
cache), so a split is an ordinary :class:`~prism.runtime.kernel.Variant` to everything that calls kernels --
the C launcher, chains, ``Kernel.call`` -- with one word after the io pointers: the address of its list of
calls, ``[calls, then per call: entry address, its thread limit, its word count, per io slot of the callee (the
slot of this kernel's io, byte offset), the callee's own words]`` (an array the variant keeps). The parts share
the workspace (they run one after another), sized to the largest.

Measured need: llama-1b bf16 under Dynamo's default mode, a 157-token prompt after 128 and 141 tuned the fused
MLP piece again (2.9 s, and 1.2 s for its prebuilt neighbour) because its 2 row blocks divide no prime length
and one row per block reads its 34 MB of weights per row.
"""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Mapping, Sequence
from typing import Any

from prism.codegen.kernel import Generated
from prism.errors import InputError, PrismError
from prism.ir.graph import Graph
from prism.runtime import cache
from prism.runtime.kernel import ENTRY_POINTS, Kernel, Variant

MAX_WORDS = 16   # words of one callee (a template's runtime dims)

SHIM = r"""/* prism split entry: calls kernels in turn on ranges of rows (prism/runtime/split.py) */
#include <stdint.h>
typedef int (*pr_entry_fn)(void**, float*, int);
#define NIO {nio}
int prism_max_threads(void) {{ return {max_threads}; }}
int prism_entry(void** io, float* ws, int nth) {{
    const intptr_t* w = (const intptr_t*)io[NIO];
    intptr_t calls = w[0];
    const intptr_t* p = w + 1;
    void* args[NIO + {max_words}];
    for (intptr_t c = 0; c < calls; c++) {{
        pr_entry_fn fn = (pr_entry_fn)p[0];
        int limit = (int)p[1];
        intptr_t words = p[2];
        p += 3;
        for (int j = 0; j < NIO; j++, p += 2) args[j] = (char*)io[p[0]] + p[1];
        for (intptr_t j = 0; j < words; j++) args[NIO + j] = (void*)p[j];
        p += words;
        int rc = fn(args, ws, nth < limit ? nth : limit);
        if (rc) return rc;
    }}
    return 0;
}}
"""


class _Locks:
    """Every part's lock, taken in one order (a template's variants share their template's lock: its C entry
    keeps the dims in file-scope variables)."""

    def __init__(self, locks: Sequence[Any]) -> None:
        self.locks = sorted({id(x): x for x in locks}.values(), key=id)

    def __enter__(self) -> None:
        for x in self.locks:
            x.acquire()

    def __exit__(self, *exc: object) -> None:
        for x in reversed(self.locks):
            x.release()


def compose(names: Sequence[str], n_inputs: int, output_shapes: Sequence[tuple[int, ...]],
            calls: Sequence[tuple[Variant, Mapping[str, int]]], env: Mapping[str, int]) -> Variant:
    """A variant with io ``names`` (inputs then outputs) that runs each ``(variant, byte offsets by io name)`` of
    ``calls`` in turn, every pointer advanced by its offset (missing: 0)."""
    if not calls:
        raise PrismError("a split needs at least one call")
    names = tuple(names)
    words: list[int] = [len(calls)]
    for v, offsets in calls:
        own = tuple(v.gen.input_names) + tuple(v.gen.output_names)
        if sorted(own) != sorted(names):
            raise PrismError(f"a split part has io {own}, the split {names}")
        if len(v.words) > MAX_WORDS:
            raise PrismError(f"a split part passes {len(v.words)} words; at most {MAX_WORDS}")
        fn = ctypes.cast(v.fn, ctypes.c_void_p).value
        words += [int(fn or 0), v.max_threads, len(v.words)]
        for n in own:
            off = int(offsets.get(n, 0))
            if off < 0:
                raise PrismError(f"a split part's offset for {n!r} is negative ({off})")
            words += [names.index(n), off]
        words += [int(x) for x in v.words]
    first = calls[0][0]
    max_threads = max(v.max_threads for v, _ in calls)
    src = SHIM.format(nio=len(names), max_threads=max_threads, max_words=MAX_WORDS)
    lib, path = cache.load(src, ENTRY_POINTS)
    parts = "\n".join(f" *   {v.path.name} at {v.env or 'its fixed shape'}, offsets {dict(o)}" for v, o in calls)
    body = f"/* split at {dict(env)}: calls\n{parts}\n */\n{src}"
    gen = Generated(source=body, body=body, isa=first.gen.isa, input_names=names[:n_inputs],
                    output_names=names[n_inputs:], output_shapes=tuple(tuple(s) for s in output_shapes),
                    ws_floats=max(v.gen.ws_floats for v, _ in calls),
                    scratch_floats=max(v.gen.scratch_floats for v, _ in calls))
    table = (ctypes.c_ssize_t * len(words))(*words)
    out = Variant(gen, lib, path, dict(env), (ctypes.addressof(table),))
    out.table = table                   # type: ignore[attr-defined]
    out.parts = [v for v, _ in calls]   # type: ignore[attr-defined]   (keeps their libraries loaded)
    out.lock = _Locks([v.lock for v, _ in calls] + [threading.Lock()])   # type: ignore[assignment]
    return out


class SplitKernel(Kernel):
    """The kernel of one shape of a program served as a split (:func:`compose`)."""

    def __init__(self, program: Graph, env: Mapping[str, int], variant: Variant) -> None:
        super().__init__(program)
        self.env = dict(env)
        self._variants[tuple(sorted(self.env.items()))] = variant

    def specialize(self, **dims: int) -> Variant:
        v = self._variants.get(tuple(sorted(dims.items())))
        if v is None:
            raise InputError(f"this kernel is a split of the program at {self.env} and serves no other shape "
                             f"(asked for {dims})")
        return v
