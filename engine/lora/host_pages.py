"""HostPagePool: the CPU cache's memory for packed adapters, allocated once, pinned on CUDA.

An upload to the GPU is asynchronous only from pinned memory, and pinning memory when an
adapter loads (cudaHostAlloc) holds the CUDA driver: the engine's own CUDA calls stalled for
18-59 ms on an H200 host whenever a new adapter arrived. So the pool pins one slab when the
engine starts (cudaHostRegister, no power-of-two rounding) and hands out runs of it; after
that, loading an adapter makes no CUDA call, and its upload is one copy the engine never waits
for.

The slab is page-major: host page p holds one adapter page for every layer, so a run of pages
is one contiguous block, and its [num_layers, num_pages, page_size] view (`view`) is what
`stage_adapter` writes and what the upload copies.

    slab  [num_pages, num_layers, page_size]
    run   pages [start, start + num_pages), first fit

Runs are taken by loader threads and given back by the engine thread (under a lock). A run is
given back `after` an event: the upload reading it may still be queued on the copy stream;
its pages become free once the event completes (checked, never waited for).
"""

from __future__ import annotations

import threading
import weakref
from dataclasses import dataclass

import torch

from loraplex.engine.config import LoRAConfig


@dataclass(frozen=True)
class HostRun:
    start: int
    num_pages: int


class HostPagePool:
    def __init__(
        self, num_pages: int, num_layers: int, page_size: int, dtype: torch.dtype, pin: bool
    ) -> None:
        """`pin`: register the slab with CUDA (an asynchronous upload); else pageable."""
        self.num_pages = num_pages
        self.slab = torch.empty((num_pages, num_layers, page_size), dtype=dtype)
        self.is_pinned = pin and num_pages > 0
        if self.is_pinned:
            nbytes = self.slab.numel() * self.slab.element_size()
            error = torch.cuda.cudart().cudaHostRegister(self.slab.data_ptr(), nbytes, 0)
            if int(error) != 0:
                raise RuntimeError(f"cudaHostRegister of {nbytes} bytes failed: {error}")
            # Unregistered before the slab's memory can go back to the allocator.
            weakref.finalize(self, torch.cuda.cudart().cudaHostUnregister, self.slab.data_ptr())
        self._lock = threading.Lock()
        self._free: list[tuple[int, int]] = [(0, num_pages)] if num_pages else []  # by start
        self._allocated: dict[int, int] = {}  # start -> num_pages
        self._deferred: list[tuple[HostRun, torch.cuda.Event]] = []

    @property
    def num_free_pages(self) -> int:
        with self._lock:
            self._release_completed()
            return sum(n for _, n in self._free)

    def allocate(self, num_pages: int) -> HostRun | None:
        """A run of `num_pages` contiguous pages (first fit), or None if none is free."""
        assert num_pages > 0
        with self._lock:
            self._release_completed()
            for i, (start, length) in enumerate(self._free):
                if length >= num_pages:
                    if length == num_pages:
                        del self._free[i]
                    else:
                        self._free[i] = (start + num_pages, length - num_pages)
                    self._allocated[start] = num_pages
                    return HostRun(start, num_pages)
        return None

    def view(self, run: HostRun) -> torch.Tensor:
        """[num_layers, run.num_pages, page_size]: the run as a staged adapter."""
        return self.run_pages(run).transpose(0, 1)

    def run_pages(self, run: HostRun) -> torch.Tensor:
        """[run.num_pages, num_layers, page_size], contiguous: the run as it lies in memory."""
        return self.slab[run.start : run.start + run.num_pages]

    def free(self, run: HostRun, after: torch.cuda.Event | None = None) -> None:
        """Give the run back, once `after` (an upload that reads it) has completed."""
        with self._lock:
            assert self._allocated.pop(run.start, None) == run.num_pages, "not an allocated run"
            if after is not None and not after.query():
                self._deferred.append((run, after))
            else:
                self._insert(run)

    def check_integrity(self) -> None:
        """Free runs are sorted, disjoint, coalesced and inside the slab; free, allocated and
        deferred pages add up to the slab."""
        with self._lock:
            end = -1
            for start, length in self._free:
                assert length > 0 and start > end and start + length <= self.num_pages
                end = start + length
            held = sum(self._allocated.values()) + sum(r.num_pages for r, _ in self._deferred)
            assert held + sum(n for _, n in self._free) == self.num_pages

    def _release_completed(self) -> None:
        pending = []
        for run, event in self._deferred:
            if event.query():
                self._insert(run)
            else:
                pending.append((run, event))
        self._deferred = pending

    def _insert(self, run: HostRun) -> None:
        """Put a run back in the sorted free list, merged with its neighbours."""
        start, end = run.start, run.start + run.num_pages
        i = 0
        while i < len(self._free) and self._free[i][0] < start:
            i += 1
        if i > 0:
            prev_start, prev_len = self._free[i - 1]
            assert prev_start + prev_len <= start, "run freed twice"
            if prev_start + prev_len == start:
                start = prev_start
                i -= 1
                del self._free[i]
        if i < len(self._free):
            next_start, next_len = self._free[i]
            assert end <= next_start, "run freed twice"
            if end == next_start:
                end = next_start + next_len
                del self._free[i]
        self._free.insert(i, (start, end - start))


def create_host_pages(
    config: LoRAConfig,
    num_layers: int,
    page_size: int,
    dtype: torch.dtype,
    max_pages: int,
    pin: bool,
) -> HostPagePool:
    """The CPU cache's pages: room for max_cpu_loras of the largest adapters and one more
    loading, within cpu_lora_cache_gb (adapters that find no room are packed apart)."""
    page_bytes = num_layers * page_size * dtype.itemsize
    budget = int(config.cpu_lora_cache_gb * 2**30) // page_bytes
    num_pages = min((config.max_cpu_loras + 1) * max_pages, budget)
    return HostPagePool(num_pages, num_layers, page_size, dtype, pin)
