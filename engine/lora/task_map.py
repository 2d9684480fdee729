"""TaskMap: how one adapter load splits its copies over threads.

A load is three memory-bound passes over the adapter's bytes (the read, the NaN/Inf check and
the pack into pages), each a list of independent pieces that `os.preadv` and torch run without
holding the GIL. `ThreadMap` runs the pieces of one pass on a pool of threads (and the calling
thread); `serial_map` runs them one after the other, for callers that have no pool.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor, wait
from typing import Protocol, TypeVar

_T = TypeVar("_T")
_R = TypeVar("_R")


class TaskMap(Protocol):
    def __call__(self, fn: Callable[[_T], _R], items: Sequence[_T], /) -> list[_R]:
        """[fn(item) for item in items], in any order or at once; returns when all are done."""
        ...


def serial_map(fn: Callable[[_T], _R], items: Sequence[_T], /) -> list[_R]:
    return [fn(item) for item in items]


class ThreadMap:
    """A TaskMap on `num_threads` pool threads plus the calling thread."""

    def __init__(self, num_threads: int, thread_name_prefix: str) -> None:
        assert num_threads >= 1
        self._executor = ThreadPoolExecutor(num_threads, thread_name_prefix=thread_name_prefix)

    def __call__(self, fn: Callable[[_T], _R], items: Sequence[_T], /) -> list[_R]:
        futures = [self._executor.submit(fn, item) for item in items[1:]]
        try:
            first = [fn(items[0])] if items else []
        finally:
            # Every piece has finished before any error propagates: none may still write into
            # a buffer its caller is about to reuse or give back.
            wait(futures)
        return first + [future.result() for future in futures]

    def shutdown(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)
