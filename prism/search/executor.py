"""Where independent search sub-trees run: a small executor interface.

Search hands out tasks (picklable: one first kernel move each, plus a shared payload set up once per
worker) and consumes results as they complete. Tasks come from an iterable that an in-process executor
consumes lazily (each task then gets the state budget left by the previous ones); a pool submits them all
at once, so there the state limit is per task, approximately. :class:`InlineExecutor` runs them in this process;
:class:`LocalProcessExecutor` in a process pool. A cluster engine (Ray, Dask) fits the same protocol:
``start(init, payload)`` once per worker, then ``run(fn, tasks)`` yielding results in completion order.
"""

from __future__ import annotations

import multiprocessing as mp
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from typing import Any, Protocol


class Executor(Protocol):
    """Runs search tasks. ``start`` is called once before any ``run``; ``close`` releases workers."""

    workers: int

    def start(self, init: Callable[[Any], None], payload: Any) -> None: ...

    def run(self, fn: Callable[[Any], Any], tasks: Iterable[Any]) -> Iterator[Any]: ...

    def close(self) -> None: ...


class InlineExecutor:
    """Runs every task in the calling process, in order."""

    workers = 1

    def start(self, init: Callable[[Any], None], payload: Any) -> None:
        init(payload)

    def run(self, fn: Callable[[Any], Any], tasks: Iterable[Any]) -> Iterator[Any]:
        for t in tasks:  # lazily: the caller may stop producing tasks after a result
            yield fn(t)

    def close(self) -> None:
        pass


class LocalProcessExecutor:
    """A pool of ``workers`` processes (spawned: the parent holds an egglog e-graph and threads that a
    fork would copy mid-flight). Results come back in completion order."""

    def __init__(self, workers: int = 2) -> None:
        if workers < 1:
            raise ValueError(f"workers must be >= 1, got {workers}")
        self.workers = workers
        self._pool: ProcessPoolExecutor | None = None

    def start(self, init: Callable[[Any], None], payload: Any) -> None:
        self.close()
        self._pool = ProcessPoolExecutor(self.workers, mp_context=mp.get_context("spawn"), initializer=init,
                                         initargs=(payload,))

    def run(self, fn: Callable[[Any], Any], tasks: Iterable[Any]) -> Iterator[Any]:
        if self._pool is None:
            raise RuntimeError("LocalProcessExecutor.run before start")
        pending: set[Future] = {self._pool.submit(fn, t) for t in tasks}
        try:
            while pending:
                done, pending = wait(pending, return_when=FIRST_COMPLETED)
                for f in done:
                    yield f.result()
        finally:
            for f in pending:
                f.cancel()

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(cancel_futures=True)
            self._pool = None


def make_executor(workers: int) -> Executor:
    return InlineExecutor() if workers <= 1 else LocalProcessExecutor(workers)
