"""AdapterUploader: copies a packed adapter into its pages on the GPU, never on the step path.

Packed adapters wait in ordinary host memory (engine/lora/adapter_loader.py). An upload runs on
a worker thread: it copies the adapter through two pinned staging buffers, allocated once, to a
copy stream, chunk by chunk (host copy of chunk i+1 while chunk i crosses PCIe), then writes the
adapter's row of the pool's tables. The engine thread only hands the job over; nothing it does
waits for a copy, and no pinned memory is allocated while serving (allocating it locks the
whole CUDA context, stalling the engine's launches).

    engine thread:  take blocks + resident id | submit(job) ──────────────▶ Future[Event]
    worker thread:                               wait for queued compute | memcpy → staging
                                                 → H2D → index_copy_ into the pages | tables
"""

from __future__ import annotations

import math
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import torch

# Pinned staging: two buffers of this many bytes (a chunk of pages, every layer).
STAGING_BYTES = 64 << 20


@dataclass(frozen=True)
class UploadJob:
    packed: torch.Tensor  # [num_layers, num_pages, page_size] on the host
    block_ids: list[int]  # where its pages go
    rows: torch.Tensor  # [3, NUM_SLICES] int32: first_a, first_b, ranks (host)
    scaling: float
    resident_id: int
    after: torch.cuda.Event  # recorded on the compute stream: work that may use the blocks


class AdapterUploader:
    def __init__(
        self,
        pages: torch.Tensor,  # [num_layers, num_blocks, page_size]
        page_table: torch.Tensor,
        first_a: torch.Tensor,
        first_b: torch.Tensor,
        ranks: torch.Tensor,
        scalings: torch.Tensor,
    ) -> None:
        self.pages = pages
        self.tables = (page_table, first_a, first_b, ranks, scalings)
        self.device = pages.device
        num_layers, _, page_size = pages.shape
        page_bytes = num_layers * page_size * pages.element_size()
        self.pages_per_chunk = max(1, STAGING_BYTES // page_bytes)
        size = num_layers * self.pages_per_chunk * page_size
        self._staging = [torch.empty(size, dtype=pages.dtype, pin_memory=True) for _ in range(2)]
        self._staging_free: list[torch.cuda.Event | None] = [None, None]
        self.stream = torch.cuda.Stream(self.device)
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="lora-upload")

    def submit(self, job: UploadJob) -> Future[torch.cuda.Event]:
        """Start the upload; the future's event completes when the pages and tables are
        written."""
        return self._executor.submit(self._run, job)

    def _run(self, job: UploadJob) -> torch.cuda.Event:
        device, stream = self.device, self.stream
        num_layers, num_pages, page_size = job.packed.shape
        with torch.cuda.stream(stream):
            stream.wait_event(job.after)
            ids = torch.tensor(job.block_ids, dtype=torch.int64).to(device)
            for i, start in enumerate(range(0, num_pages, self.pages_per_chunk)):
                count = min(self.pages_per_chunk, num_pages - start)
                slot = i % 2
                previous = self._staging_free[slot]
                if previous is not None:
                    previous.synchronize()  # its last chunk has crossed
                shape = (num_layers, count, page_size)
                buf = self._staging[slot][: math.prod(shape)].view(shape)
                buf.copy_(job.packed[:, start : start + count])
                chunk = buf.to(device, non_blocking=True)
                self.pages.index_copy_(1, ids[start : start + count], chunk)
                self._staging_free[slot] = stream.record_event()
            page_table, first_a, first_b, ranks, scalings = self.tables
            rid = job.resident_id
            page_table[rid, :num_pages].copy_(ids.to(torch.int32))
            rows = job.rows.to(device)
            first_a[:, rid].copy_(rows[0])
            first_b[:, rid].copy_(rows[1])
            ranks[:, rid].copy_(rows[2])
            scalings[rid] = job.scaling
            return stream.record_event()

    def shutdown(self) -> None:
        self._executor.shutdown(wait=True)
