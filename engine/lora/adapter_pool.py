"""AdapterPool: adapters resident on the GPU, in the KV cache's blocks (see page_layout.py).

A resident adapter holds KV blocks (its pages, the same block ids in every layer) and a
resident id: its row in the device tables the LoRA kernels read.

    page_table  [max_resident, max_pages] int32   the adapter's block ids, in page order
    first_a     [NUM_SLICES, max_resident] int32  first page of A_i (0 where not targeted)
    first_b     [NUM_SLICES, max_resident] int32  first page of B_i^T
    ranks       [NUM_SLICES, max_resident] int32  0 where the adapter does not target slice i
    scalings    [max_resident] float32

States of a resident adapter:

    uploading   the copy runs on the copy stream; not evictable, not usable yet
    ready       the copy's event completed: requests with it may be scheduled
    pinned      ready, with requests running (scheduled) on it: not evictable

Ready, unpinned adapters stay resident, least recently used first in line for eviction, until
their blocks are wanted: by another adapter's upload, or by requests (`reclaim`). The compute
stream never waits for an upload: a request joins a step only once its adapter is ready.
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from collections.abc import Collection
from dataclasses import dataclass

import torch

from loraplex.engine.kv_cache import KVCacheManager
from loraplex.engine.lora.adapter_loader import CpuAdapter
from loraplex.engine.lora.page_layout import (
    NUM_SLICES,
    AdapterPageLayout,
    transpose_staged_b,
)


@dataclass
class _Resident:
    resident_id: int
    num_pages: int
    ready: torch.cuda.Event | None  # None: the copy is done (or ran synchronously, on CPU)


@dataclass(frozen=True)
class SliceRows:
    """Rows of the device tables for a range of slices: views, [num_slices, max_resident]."""

    first_a: torch.Tensor
    first_b: torch.Tensor
    ranks: torch.Tensor


@dataclass(frozen=True)
class ShardUpload:
    """One adapter's upload as a tensor-parallel worker makes it: its shard's pages, into the
    same blocks and table row as rank 0's (engine/distributed/)."""

    resident_id: int
    block_ids: list[int]
    layout: AdapterPageLayout
    scaling: float
    packed: torch.Tensor  # [num_layers, num_pages, page_size], staged


class AdapterTables:
    """The pages and the device tables the LoRA kernels read (no residency decisions: a
    tensor-parallel worker holds only these, written as rank 0's pool decides)."""

    def __init__(
        self,
        pages: torch.Tensor,  # [num_layers, num_blocks, page_size]: the KV cache's memory
        max_resident: int,
        max_pages: int,
    ) -> None:
        self.pages = pages
        self.device = pages.device
        self.max_resident = max_resident
        self.max_pages = max_pages
        device = self.device
        self.page_table = torch.zeros(max_resident, max_pages, dtype=torch.int32, device=device)
        # Each slice's row starts 16-byte aligned (rows padded to 4 int32s): a launch reads a
        # view from its projection's first slice, and Triton compiles a kernel variant per
        # pointer alignment, which an eager step's range of slices must share with the graphs'.
        row = -(-max_resident // 4) * 4
        self.first_a, self.first_b, self.ranks = (
            torch.zeros(NUM_SLICES, row, dtype=torch.int32, device=device)[:, :max_resident]
            for _ in range(3)
        )
        self.scalings = torch.zeros(max_resident, dtype=torch.float32, device=device)
        # Views the LoRA launches take at every layer of every step, made once: a view costs
        # the host a few microseconds, and a step launches hundreds. The tables are only ever
        # written in place, so the views stay theirs.
        self.layer_pages = pages.unbind(0)  # num_layers x [num_blocks, page_size]
        self._slice_rows: dict[tuple[int, int], SliceRows] = {}

    def slice_rows(self, slices: slice) -> SliceRows:
        """The tables' rows of a contiguous range of slices (a projection's), as cached views."""
        key = (slices.start, slices.stop)
        rows = self._slice_rows.get(key)
        if rows is None:
            rows = SliceRows(self.first_a[slices], self.first_b[slices], self.ranks[slices])
            self._slice_rows[key] = rows
        return rows

    def write(
        self,
        packed: torch.Tensor,
        ids: torch.Tensor,
        layout: AdapterPageLayout,
        scaling: float,
        resident_id: int,
    ) -> None:
        """An adapter's staged pages (page_layout.stage_adapter) into blocks `ids`, transposed
        there into the kernels' layout, and its row of the tables."""
        device = self.device
        staged = _pages_to(packed, device)  # [L, P, page_size], a copy of its own
        transpose_staged_b(staged, layout)
        rows = table_rows(layout)
        # One small copy for the block ids and the row; from pinned memory on CUDA: a copy from
        # pageable memory makes the host wait for the copy stream, and so for the steps queued
        # on the compute stream before it.
        meta = torch.cat([ids, rows.flatten().to(torch.int64)])
        if device.type == "cuda":
            meta = meta.pin_memory()
        gpu_ids, gpu_rows = meta.to(device, non_blocking=True).split([ids.shape[0], rows.numel()])
        gpu_rows = gpu_rows.view(3, NUM_SLICES).to(torch.int32)
        self.pages.index_copy_(1, gpu_ids, staged)
        self.page_table[resident_id, : ids.shape[0]].copy_(gpu_ids.to(torch.int32))
        self.first_a[:, resident_id].copy_(gpu_rows[0])
        self.first_b[:, resident_id].copy_(gpu_rows[1])
        self.ranks[:, resident_id].copy_(gpu_rows[2])
        self.scalings[resident_id] = scaling

    def apply(self, upload: ShardUpload) -> None:
        ids = torch.tensor(upload.block_ids, dtype=torch.int64)
        self.write(upload.packed, ids, upload.layout, upload.scaling, upload.resident_id)


def table_rows(layout: AdapterPageLayout) -> torch.Tensor:
    """[3, NUM_SLICES] int32: the adapter's first_a, first_b and ranks columns of the tables
    (untargeted slices: first page 0, rank 0, never read)."""
    rows = torch.tensor([layout.first_a, layout.first_b, layout.ranks], dtype=torch.int32)
    return rows.clamp(min=0)


def _pages_to(packed: torch.Tensor, device: torch.device) -> torch.Tensor:
    """[num_layers, num_pages, page_size] on `device`, in one copy (always a copy, even on the
    host: the upload transposes it in place): a run of the host page pool (page-major in
    memory) travels as it lies and is viewed back on the device."""
    page_major = packed.transpose(0, 1)  # [P, L, page_size]
    if page_major.is_contiguous():
        return page_major.to(device, non_blocking=True, copy=True).transpose(0, 1)
    return packed.to(device, non_blocking=True, copy=True)


class AdapterPool(AdapterTables):
    def __init__(
        self,
        kv_cache_manager: KVCacheManager,
        pages: torch.Tensor,  # [num_layers, num_blocks, page_size]: the KV cache's memory
        max_resident: int,
        max_pages: int,
    ) -> None:
        super().__init__(pages, max_resident, max_pages)
        self.kv = kv_cache_manager
        device = self.device
        # Tensor parallelism: per worker rank, the uploads it has yet to make (sent with the
        # next step; empty otherwise).
        self.shard_uploads: list[list[ShardUpload]] = []
        self.copy_stream = torch.cuda.Stream(device) if device.type == "cuda" else None
        self._resident: OrderedDict[str, _Resident] = OrderedDict()  # LRU first
        self._free_ids = list(range(max_resident - 1, -1, -1))  # pop() gives the lowest id
        self._pins: Counter[str] = Counter()  # requests scheduled on each adapter
        self.num_uploads = 0
        self.num_evictions = 0

    # ---- queries -------------------------------------------------------------------------

    def __contains__(self, content_hash: str) -> bool:
        return content_hash in self._resident

    def is_ready(self, content_hash: str) -> bool:
        """Resident and its upload has finished (checked without blocking)."""
        resident = self._resident.get(content_hash)
        if resident is None:
            return False
        if resident.ready is not None and resident.ready.query():
            resident.ready = None
        return resident.ready is None

    def upload_event(self, content_hash: str) -> torch.cuda.Event | None:
        """The adapter's upload while it may still be in flight; None once done (or not
        resident)."""
        resident = self._resident.get(content_hash)
        return None if resident is None else resident.ready

    def resident_id(self, content_hash: str) -> int:
        return self._resident[content_hash].resident_id

    def resident_hashes(self) -> list[str]:
        return list(self._resident)

    @property
    def num_blocks_held(self) -> int:
        return sum(r.num_pages for r in self._resident.values())

    @property
    def num_pins(self) -> int:
        """Requests scheduled on resident adapters right now (each pins its adapter)."""
        return sum(self._pins.values())

    # ---- residency -----------------------------------------------------------------------

    def upload(self, cpu: CpuAdapter, keep: Collection[str], reserve_blocks: int = 0) -> bool:
        """Make `cpu` resident: take blocks (evicting idle adapters outside `keep`, least
        recently used first) and start the copy. False, changing nothing, if it cannot fit
        with `reserve_blocks` still free for requests."""
        content_hash = cpu.content_hash
        assert content_hash not in self._resident
        need = cpu.layout.num_pages
        victims = self._victims(need + reserve_blocks, keep, need_id=True)
        if victims is None:
            return False
        for victim in victims:
            self.evict(victim)
        block_ids = self.kv.allocate_adapter_blocks(content_hash, need)
        assert block_ids is not None, "the victims' blocks must cover the upload"
        resident_id = self._free_ids.pop()
        ready = self._copy_in(cpu, resident_id, block_ids)
        self._resident[content_hash] = _Resident(resident_id, need, ready)
        self.num_uploads += 1
        return True

    def touch(self, content_hash: str) -> None:
        """Mark as most recently used (it is in this step, or wanted soon)."""
        self._resident.move_to_end(content_hash)

    def pin(self, content_hash: str) -> None:
        assert self.is_ready(content_hash), "only a ready adapter can be scheduled"
        self._pins[content_hash] += 1

    def unpin(self, content_hash: str) -> None:
        self._pins[content_hash] -= 1
        assert self._pins[content_hash] >= 0
        if self._pins[content_hash] == 0:
            del self._pins[content_hash]

    def evict(self, content_hash: str) -> None:
        """Give an idle adapter's blocks and resident id back (no device work needed)."""
        assert content_hash not in self._pins, "a pinned adapter is in use"
        resident = self._resident.pop(content_hash)
        assert resident.ready is None or resident.ready.query(), "an upload is in flight"
        self.kv.free_adapter_blocks(content_hash)
        self._free_ids.append(resident.resident_id)
        self.num_evictions += 1

    def reclaim(self, num_blocks: int) -> None:
        """Free at least `num_blocks` blocks for requests by evicting idle adapters, least
        recently used first, as far as idle ones allow (KVCacheManager.reclaim)."""
        freed = 0
        for content_hash in list(self._resident):
            if freed >= num_blocks:
                return
            if self._is_idle(content_hash):
                freed += self._resident[content_hash].num_pages
                self.evict(content_hash)

    # ---- internals -----------------------------------------------------------------------

    def _is_idle(self, content_hash: str) -> bool:
        return content_hash not in self._pins and self.is_ready(content_hash)

    def _victims(self, num_blocks: int, keep: Collection[str], need_id: bool) -> list[str] | None:
        """Idle adapters to evict (LRU first) so that `num_blocks` blocks (and a resident id)
        are free; None if even evicting every candidate would not do."""
        free = self.kv.num_free_blocks
        ids_short = need_id and not self._free_ids
        victims: list[str] = []
        for content_hash, resident in self._resident.items():
            if free >= num_blocks and not ids_short:
                break
            if content_hash in keep or not self._is_idle(content_hash):
                continue
            victims.append(content_hash)
            free += resident.num_pages
            ids_short = False
        return victims if free >= num_blocks and not ids_short else None

    def _copy_in(
        self, cpu: CpuAdapter, resident_id: int, block_ids: list[int]
    ) -> torch.cuda.Event | None:
        """Write the pages and the tables' row; on CUDA asynchronously, on the copy stream."""
        layout = cpu.layout
        ids = torch.tensor(block_ids, dtype=torch.int64)
        for pending, packed in zip(self.shard_uploads, cpu.packed_shards, strict=True):
            pending.append(ShardUpload(resident_id, block_ids, layout, cpu.scaling, packed))
        stream = self.copy_stream
        if stream is None:
            self.write(cpu.packed, ids, layout, cpu.scaling, resident_id)
            return None
        # The blocks taken may still be read or written by steps queued on the compute stream.
        stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(stream):
            self.write(cpu.packed, ids, layout, cpu.scaling, resident_id)
            return stream.record_event()

    def check_integrity(self) -> None:
        """Resident ids are unique and disjoint from the free list; blocks match the KV
        manager's books; pins only on resident, ready adapters."""
        ids = [r.resident_id for r in self._resident.values()]
        assert len(ids) == len(set(ids)) and not set(ids) & set(self._free_ids)
        assert len(ids) + len(self._free_ids) == self.max_resident
        assert set(self.kv.adapter_blocks) == set(self._resident)
        for content_hash, resident in self._resident.items():
            assert len(self.kv.adapter_blocks[content_hash]) == resident.num_pages
        assert all(h in self._resident and self._pins[h] > 0 for h in self._pins)
