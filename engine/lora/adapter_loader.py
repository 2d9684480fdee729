"""AdapterLoader: disk -> CPU, on worker threads, never on the engine's step path.

A load reads and validates the PEFT directory (engine/lora/adapter.py), then stages its weights
in the pages they will take on the GPU (engine/lora/page_layout.py: B untransposed, the upload
transposes it), in the model's dtype, into a run of the CPU cache's pages (engine/lora/
host_pages.py: pinned once at start, so a load makes no CUDA call and its upload is
asynchronous). A file in the model's dtype, of an adapter whose content hash is known, is read
into those pages directly (engine/lora/staged_read.py); any other through a read buffer, then
staged from it. When no run is free, the adapter is staged into memory of its own (pageable:
correct, but its upload waits for the host).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, replace

import torch

from loraplex.engine.distributed.lora_sharding import shard_adapter, shard_module_shapes
from loraplex.engine.distributed.sharding import TPLayout
from loraplex.engine.errors import InvalidAdapterError
from loraplex.engine.lora.adapter import (
    DTYPES,
    ArchLike,
    has_non_finite,
    load_lora_adapter,
    lora_module_shapes,
    read_adapter_header,
)
from loraplex.engine.lora.host_pages import HostPagePool, HostRun
from loraplex.engine.lora.page_layout import AdapterPageLayout, plan_layout, stage_adapter
from loraplex.engine.lora.staged_read import read_staged
from loraplex.engine.request import LoRARequest

# Disk reads and packing overlap each other and the engine's steps (torch ops and file reads
# release the GIL); more threads than this only compete for the same disk and memory bandwidth.
NUM_LOAD_THREADS = 4


@dataclass(frozen=True)
class CpuAdapter:
    """An adapter in host memory, staged as its GPU pages (page_layout.stage_adapter)."""

    content_hash: str
    layout: AdapterPageLayout
    packed: torch.Tensor  # [num_layers, layout.num_pages, page_size] staged, the model's dtype
    scaling: float
    load_seconds: float  # disk -> packed
    # Tensor parallelism: `packed` is rank 0's shard; these are ranks 1 .. N-1's.
    packed_shards: tuple[torch.Tensor, ...] = ()
    host_run: HostRun | None = None  # where `packed` lives in the HostPagePool, if there


class AdapterLoader:
    def __init__(
        self,
        arch: ArchLike,
        max_lora_rank: int,
        page_size: int,
        dtype: torch.dtype,
        host_pages: HostPagePool | None = None,
        tp_layouts: Sequence[TPLayout] = (),
    ) -> None:
        """`host_pages`: where packed adapters go (else each into memory of its own).
        `tp_layouts`: every rank's share under tensor parallelism (each rank's shard of an
        adapter is packed; the layout is the same for all; rank 0's into `host_pages`)."""
        self.arch = arch
        self.max_lora_rank = max_lora_rank
        self.page_size = page_size
        self.dtype = dtype
        self.host_pages = host_pages
        self.tp_layouts = tuple(tp_layouts)
        self.module_shapes = lora_module_shapes(arch)
        if self.tp_layouts:
            self.module_shapes = shard_module_shapes(self.module_shapes, self.tp_layouts[0])
        self._executor = ThreadPoolExecutor(NUM_LOAD_THREADS, thread_name_prefix="lora-load")
        self._thread = threading.local()  # each thread's read buffer

    def submit(self, lora_request: LoRARequest) -> Future[CpuAdapter]:
        """Load in the background; the future raises InvalidAdapterError for a bad adapter."""
        return self._executor.submit(self.load, lora_request)

    def load(self, lora_request: LoRARequest) -> CpuAdapter:
        """Load now, in the calling thread."""
        start = time.perf_counter()
        cpu = (
            self._read_into_pages(lora_request) if self._can_read_into_pages(lora_request) else None
        )
        if cpu is None:
            cpu = self._load_and_stage(lora_request)
        return replace(cpu, load_seconds=time.perf_counter() - start)

    def _can_read_into_pages(self, lora_request: LoRARequest) -> bool:
        # Reading into pages skips hashing (the hash must be known) and sharding.
        return (
            lora_request.content_hash is not None
            and self.host_pages is not None
            and not self.tp_layouts
        )

    def _read_into_pages(self, lora_request: LoRARequest) -> CpuAdapter | None:
        """The file read straight into a run of the CPU cache's pages (staged_read.py), when
        it stores the model's dtype and a run is free. None: load it with `_load_and_stage`
        (which also names the tensor when this finds a NaN or an Inf)."""
        pool = self.host_pages
        assert pool is not None and lora_request.content_hash is not None
        header = read_adapter_header(lora_request.lora_path, self.arch, self.max_lora_rank)
        if any(DTYPES[t.dtype] != self.dtype for t in header.tensors.values()):
            return None  # converted on the way: staged from a buffer
        config = header.config
        layout = plan_layout(config.rank, config.target_modules, self.module_shapes, self.page_size)
        run = pool.allocate(layout.num_pages)
        if run is None:
            return None
        try:
            read_staged(header, layout, pool.run_pages(run))
            is_finite = not has_non_finite(pool.run_pages(run))
        except BaseException:
            pool.free(run)
            raise
        if not is_finite:
            pool.free(run)
            return None
        return CpuAdapter(
            lora_request.content_hash, layout, pool.view(run), config.scaling, 0.0, (), run
        )

    def _load_and_stage(self, lora_request: LoRARequest) -> CpuAdapter:
        """Read the whole file into this thread's buffer, check it, then stage it (converted
        to the model's dtype, sharded under tensor parallelism)."""
        adapter = load_lora_adapter(
            lora_request.lora_path,
            self.arch,
            self.max_lora_rank,
            lora_request.content_hash,
            self._read_buffer,
        )
        layout = plan_layout(
            adapter.rank, adapter.target_modules, self.module_shapes, self.page_size
        )
        shares = [shard_adapter(adapter, tp) for tp in self.tp_layouts] or [adapter]
        pool = self.host_pages
        run = pool.allocate(layout.num_pages) if pool is not None else None
        rank0_out = pool.view(run) if pool is not None and run is not None else None
        num_layers = self.arch.num_hidden_layers
        try:
            packed = [
                stage_adapter(share, layout, num_layers, self.page_size, self.dtype,
                              out=rank0_out if i == 0 else None)
                for i, share in enumerate(shares)
            ]  # fmt: skip
            converted = any(a.dtype != self.dtype for a, _ in adapter.weights.values())
            if converted and any(map(has_non_finite, packed)):  # fp32 beyond the model dtype
                raise InvalidAdapterError(
                    f"{lora_request.lora_path}: weights overflow the model's dtype {self.dtype}"
                )
        except BaseException:
            if pool is not None and run is not None:
                pool.free(run)
            raise
        return CpuAdapter(
            adapter.content_hash,
            layout,
            packed[0],
            adapter.scaling,
            0.0,
            tuple(packed[1:]),
            run,
        )

    def _read_buffer(self, num_bytes: int) -> torch.Tensor:
        """This thread's buffer for adapter files, grown to the largest read so far: a file
        read into fresh memory pays a page fault per 4 KB (as long as the read itself, ~60 ms
        for 84 MB on an H200 host). A load packs the adapter before this thread reads again."""
        buffer: torch.Tensor | None = getattr(self._thread, "buffer", None)
        if buffer is None or buffer.numel() < num_bytes:
            buffer = torch.empty(num_bytes, dtype=torch.uint8)
            self._thread.buffer = buffer
        return buffer

    def shutdown(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)
