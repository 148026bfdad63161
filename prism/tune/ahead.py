"""Compiling tuning candidates ahead, on one background thread, while the main thread does other work.

A graph's pieces are searched one after another on the main thread (pure Python: one core), and each piece is
tuned at the graph's first call, when its candidates are compiled (gcc: both cores) while the main thread waits.
``SuperKernel.compile_ahead`` plans a piece's tuning (``tuner.plan``) as soon as its search is done and submits
the candidates here: gcc runs on the second core while the main thread searches the next pieces. The tuning then
takes the compiled kernels (``measure.compile_all`` -> :func:`take`) instead of compiling them.

Nothing here may run while something is timed: :func:`drain`, which the frontend calls before a compiled graph is
returned (and so before its first call's tunings measure anything), compiles what is still queued with the
caller's thread helping and waits for it. Jobs are keyed by the candidate graph's key: a candidate submitted twice
is compiled once. ``PRISM_AHEAD=0`` turns it off.

Measured need: llama-1b int8w-g32-bf16 at batch 8, the first ``generate()`` from empty caches (2026-11-30, Zen 5
VM): 7.8 s of its ~42 s were the main thread waiting for the tunings' compiles, while the searches before them
(9.1 s) kept one core of two busy.

A piece whose first call will derive its kernel from a tuning (a dynamic graph's pieces after their fixed-shape
twins: Dynamo's recompile at a model's first new prompt length) submits that derivation itself
(``SuperKernel._derive_early``, :func:`submit_call`): its compiles and checks, the result held in the kernel object
for the first call. A derivation measures nothing, so it may run beside the searches; :func:`drain` runs the queued
ones on two threads.

Work for shapes not yet asked for that a graph's *first call* would do after a tuning (``SuperKernel._prebuild``:
the next length's template and tails) is held (:func:`defer`) until the next graph compile starts
(:func:`release`, at the start of ``compile_graph``): it then runs beside that compile's searches, and that compile's
:func:`drain` finishes it. So it never runs while a first call's tunings measure, and never after a graph is
returned. Measured need: llama-1b int8w-g32-bf16 under ``dynamic=True``, the first ``generate()`` from empty caches
spent 7.6 s of its 29.7 s in the prefill graph's first call pre-building its 12 pieces' next length, one after
another on the main thread, before the decode graph's compile (2026-12-01, Zen 5 VM). A job never released (no
later compile) is simply not done: the first new value does that work itself, as with ``PRISM_PREBUILD=0``.
"""

from __future__ import annotations

import logging
import os
import threading
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field

from prism.ir.graph import Graph
from prism.runtime.kernel import compile as compile_graph
from prism.tune.stats import STATS


@dataclass
class _Job:
    run: Callable[[], object]
    future: Future = field(default_factory=Future)
    started: bool = False


LOG = logging.getLogger("prism")
_LOCK = threading.Lock()
_QUEUE: deque[_Job] = deque()
_JOBS: dict[str, _Job] = {}    # candidate key -> its job, until a tuning takes it or drain() drops it
_WORKER: list[threading.Thread] = []
_HELD: dict[str, Callable[[], object]] = {}   # key -> work held until the next graph compile (defer / release)


def enabled() -> bool:
    return os.environ.get("PRISM_AHEAD", "1").strip() != "0"


def _run(job: _Job) -> None:
    try:
        result: object = job.run()
    except Exception as e:  # a failure is the job's: a candidate's is reported by the tuning that takes it, a
        # derivation's is met again by the first call, which derives itself
        LOG.debug("prism: a job compiled ahead failed (its work is left to the first call): %r", e)
        result = e
    job.future.set_result(result)


def _work() -> None:
    while True:
        with _LOCK:
            if not _QUEUE:
                _WORKER.clear()
                return
            job = _QUEUE.popleft()
            job.started = True
        _run(job)


def submit(graphs: Sequence[Graph]) -> int:
    """Queue the compiles of ``graphs`` (concrete candidate graphs) on the background thread; returns how many
    were new."""
    new = _queue([(g.key, lambda g=g: compile_graph(g)) for g in graphs])
    STATS.compiled_ahead += new
    return new


def submit_call(key: str, fn: Callable[[], object]) -> int:
    """Queue ``fn`` (work whose result lands where its caller will look: a kernel's derivation) on the background
    thread under ``key``; 1 if it was new. Such jobs are not taken (:func:`forget` drops them once done)."""
    return _queue([(key, fn)])


def defer(key: str, fn: Callable[[], object]) -> bool:
    """Hold ``fn`` (work for later shapes, measuring nothing) until the next :func:`release`; False where nothing is
    held (``PRISM_AHEAD=0``: the caller runs it now)."""
    if not enabled():
        return False
    with _LOCK:
        _HELD.setdefault(key, fn)
    return True


def release() -> int:
    """Queue the held work on the background thread (a graph compile starts: nothing is timed until its
    :func:`drain`); returns how many jobs were new."""
    with _LOCK:
        jobs = list(_HELD.items())
        _HELD.clear()
    return _queue(jobs)


def drop_held() -> None:
    """Forget the held work (its kernels are forgotten: ``prism.api.clear_memory_caches``)."""
    with _LOCK:
        _HELD.clear()


def held() -> int:
    """Jobs held for the next graph compile."""
    with _LOCK:
        return len(_HELD)


def _queue(jobs: Sequence[tuple[str, Callable[[], object]]]) -> int:
    new = 0
    with _LOCK:
        for key, fn in jobs:
            if key in _JOBS:
                continue
            job = _Job(fn)
            _JOBS[key] = job
            _QUEUE.append(job)
            new += 1
        if new and not _WORKER:
            t = threading.Thread(target=_work, name="prism-ahead-cc", daemon=True)
            _WORKER.append(t)
            t.start()
    return new


def take(graph: Graph) -> Future | None:
    """The compile of ``graph`` submitted before, started or done (its future: a kernel or the exception); None
    where it was not submitted or has not started (then it is the caller's to compile, and no longer queued)."""
    with _LOCK:
        job = _JOBS.pop(graph.key, None)
        if job is None:
            return None
        if not job.started:
            _QUEUE.remove(job)
            return None
    STATS.ahead_taken += 1
    return job.future


def pending() -> int:
    """Jobs submitted and not yet finished."""
    with _LOCK:
        return sum(1 for j in _JOBS.values() if not j.future.done())


def drain() -> None:
    """Finish every submitted compile: the caller's thread compiles queued ones beside the background thread,
    then waits for the running ones. The kernels stay for the tunings to take (their shared objects are in the
    compile cache either way)."""
    while True:
        with _LOCK:
            job = _QUEUE.popleft() if _QUEUE else None
            if job is not None:
                job.started = True
            running = [j.future for j in _JOBS.values() if j.started and not j.future.done()]
        if job is not None:
            _run(job)
            continue
        for f in running:
            f.result()
        return


def forget() -> None:
    """Drop the finished jobs no tuning took (their kernels; the compile cache keeps the shared objects)."""
    with _LOCK:
        for k in [k for k, j in _JOBS.items() if j.future.done()]:
            del _JOBS[k]
