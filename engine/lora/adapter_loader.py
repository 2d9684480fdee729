"""AdapterLoader: disk -> CPU, on worker threads, never on the engine's step path.

A load reads and validates the PEFT directory (engine/lora/adapter.py), then packs its weights
into the page layout they will have on the GPU (engine/lora/page_layout.py), in the model's
dtype and, on CUDA hosts, in pinned memory: the upload to the GPU is then one asynchronous copy.
"""

from __future__ import annotations

import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import torch

from loraplex.engine.errors import InvalidAdapterError
from loraplex.engine.lora.adapter import (
    ArchLike,
    has_non_finite,
    load_lora_adapter,
    lora_module_shapes,
)
from loraplex.engine.lora.page_layout import AdapterPageLayout, pack_adapter, plan_layout
from loraplex.engine.request import LoRARequest

# Disk reads and packing overlap each other and the engine's steps (torch ops and file reads
# release the GIL); more threads than this only compete for the same disk and memory bandwidth.
NUM_LOAD_THREADS = 4


@dataclass(frozen=True)
class CpuAdapter:
    """An adapter in host memory, packed as its GPU pages."""

    content_hash: str
    layout: AdapterPageLayout
    packed: torch.Tensor  # [num_layers, layout.num_pages, page_size], the model's dtype
    scaling: float
    load_seconds: float  # disk -> packed


class AdapterLoader:
    def __init__(
        self,
        arch: ArchLike,
        max_lora_rank: int,
        page_size: int,
        dtype: torch.dtype,
        pin_memory: bool,
    ) -> None:
        self.arch = arch
        self.max_lora_rank = max_lora_rank
        self.page_size = page_size
        self.dtype = dtype
        self.pin_memory = pin_memory
        self.module_shapes = lora_module_shapes(arch)
        self._executor = ThreadPoolExecutor(NUM_LOAD_THREADS, thread_name_prefix="lora-load")

    def submit(self, lora_request: LoRARequest) -> Future[CpuAdapter]:
        """Load in the background; the future raises InvalidAdapterError for a bad adapter."""
        return self._executor.submit(self.load, lora_request)

    def load(self, lora_request: LoRARequest) -> CpuAdapter:
        """Load now, in the calling thread."""
        start = time.perf_counter()
        adapter = load_lora_adapter(
            lora_request.lora_path, self.arch, self.max_lora_rank, lora_request.content_hash
        )
        layout = plan_layout(
            adapter.rank, adapter.target_modules, self.module_shapes, self.page_size
        )
        packed = pack_adapter(
            adapter, layout, self.arch.num_hidden_layers, self.page_size, self.dtype,
            pin_memory=self.pin_memory,
        )  # fmt: skip
        converted = any(a.dtype != self.dtype for a, _ in adapter.weights.values())
        if converted and has_non_finite(packed):  # fp32 weights beyond the model dtype's range
            raise InvalidAdapterError(
                f"{lora_request.lora_path}: weights overflow the model's dtype {self.dtype}"
            )
        return CpuAdapter(
            adapter.content_hash, layout, packed, adapter.scaling, time.perf_counter() - start
        )

    def shutdown(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)
