"""LoRAManager: adapter residency, disk → CPU cache (LRU) → GPU slot (LRU).

Adapters are keyed internally by their content hash, never by name or id alone: re-adding an
id with new files gets new weights and new prefix-cache keys (vLLM #42125, #47724).

    add_lora / first use:  validate + load from disk into the CPU cache   (max_cpu_loras, LRU)
    each step:             the step's adapters take GPU slots            (max_loras, LRU)

An adapter with requests in flight is pinned: it is never evicted from the CPU cache, and its
GPU slot is never taken while a request of this step uses it. `remove_lora` unregisters the id
at once (new requests fail) and lets requests in flight finish on the pinned weights.
"""

from __future__ import annotations

import logging
import time
from collections import Counter, OrderedDict
from collections.abc import Callable
from dataclasses import replace

import torch

from loraplex.engine.config import LoRAConfig
from loraplex.engine.errors import InvalidAdapterError
from loraplex.engine.lora.adapter import ArchLike, LoRAAdapter, load_lora_adapter
from loraplex.engine.lora.lora_batch import LoRABatch
from loraplex.engine.lora.lora_slots import LoRASlots
from loraplex.engine.request import LoRARequest
from loraplex.engine.stats import AdapterLoad, AdapterTier, LoRAStats, ResidentAdapter
from loraplex.kernels import build_lora_mapping

logger = logging.getLogger(__name__)


class LoRAManager:
    def __init__(
        self, config: LoRAConfig, arch: ArchLike, dtype: torch.dtype, device: torch.device
    ) -> None:
        self.config = config
        self.arch = arch
        self.device = device
        self.slots = LoRASlots(arch, config.max_loras, config.max_lora_rank, dtype, device)
        self._registered: dict[int, LoRARequest] = {}  # lora_int_id -> request, with hash
        self._cpu_cache: OrderedDict[str, LoRAAdapter] = OrderedDict()  # LRU, by content hash
        self._paths: dict[str, str] = {}  # content hash -> path, to reload after eviction
        self._gpu_slots: OrderedDict[str, int] = OrderedDict()  # LRU, content hash -> slot
        self._pins: Counter[str] = Counter()  # requests in flight per content hash
        self._names: dict[str, str] = {}  # content hash -> the name it was last registered as
        self.stats: Counter[str] = Counter()
        # Called (in the engine thread) after every adapter load: metrics.
        self.on_adapter_load: Callable[[AdapterLoad], None] | None = None

    # ---- registry ------------------------------------------------------------------------

    def add_lora(self, lora_request: LoRARequest) -> LoRARequest:
        """Validate and load an adapter; returns the request with its content hash set."""
        start = time.perf_counter()
        adapter = load_lora_adapter(lora_request.lora_path, self.arch, self.config.max_lora_rank)
        if lora_request.content_hash not in (None, adapter.content_hash):
            # The caller registered other files than those now on disk: refuse, never serve
            # weights nobody validated under that hash.
            raise InvalidAdapterError(
                f"{lora_request.lora_path}: content hash {adapter.content_hash} differs from "
                f"the registered {lora_request.content_hash}"
            )
        self._names[adapter.content_hash] = lora_request.lora_name
        self._cache_on_cpu(adapter, lora_request.lora_path)
        self._report_load(adapter.content_hash, "cpu", start)
        resolved = replace(lora_request, content_hash=adapter.content_hash)
        self._registered[lora_request.lora_int_id] = resolved
        return resolved

    def resolve(self, lora_request: LoRARequest) -> LoRARequest:
        """The registered form of a request's adapter, loading it on first use."""
        known = self._registered.get(lora_request.lora_int_id)
        if (
            known is not None
            and known.lora_path == lora_request.lora_path
            and (lora_request.content_hash in (None, known.content_hash))
        ):
            return known
        return self.add_lora(lora_request)

    def remove_lora(self, lora_int_id: int) -> bool:
        request = self._registered.pop(lora_int_id, None)
        if request is None:
            return False
        assert request.content_hash is not None
        self._maybe_drop(request.content_hash)
        return True

    def list_loras(self) -> list[int]:
        return sorted(self._registered)

    # ---- pins: requests in flight ----------------------------------------------------------

    def pin(self, content_hash: str) -> None:
        self._pins[content_hash] += 1

    def unpin(self, content_hash: str) -> None:
        self._pins[content_hash] -= 1
        if self._pins[content_hash] <= 0:
            del self._pins[content_hash]
            self._maybe_drop(content_hash)

    # ---- per step --------------------------------------------------------------------------

    def prepare(self, token_lora_hashes: list[str | None]) -> LoRABatch | None:
        """Give this step's adapters GPU slots and build the token → slot mapping.

        None when no token uses an adapter (the base model pays nothing).
        """
        needed = {h for h in token_lora_hashes if h is not None}
        if not needed:
            return None
        assert len(needed) <= self.config.max_loras, "the scheduler caps adapters per step"
        slot_of = {h: self._activate(h, needed) for h in needed}
        token_slots = [-1 if h is None else slot_of[h] for h in token_lora_hashes]
        # Built on the host, then one copy: a handful of tiny CPU ops instead of as many GPU
        # launches (and a sort) ahead of every step.
        sorted_token_ids, slot_start_loc = build_lora_mapping(
            torch.tensor(token_slots, dtype=torch.int32), self.config.max_loras
        )
        packed = torch.cat([slot_start_loc, sorted_token_ids]).to(self.device, non_blocking=True)
        slot_start_loc, sorted_token_ids = packed.split(
            [slot_start_loc.shape[0], sorted_token_ids.shape[0]]
        )
        modules = self.slots.modules_in_use(set(slot_of.values()))
        return LoRABatch(self.slots, sorted_token_ids, slot_start_loc, modules)

    def create_graph_batch(
        self, sorted_token_ids: torch.Tensor, slot_start_loc: torch.Tensor
    ) -> LoRABatch:
        """A batch over static mapping buffers that launches for every module (CUDA graphs:
        the captured launches must serve whatever adapters a replayed step has)."""
        return LoRABatch(
            self.slots, sorted_token_ids, slot_start_loc, set(self.slots.module_shapes)
        )

    def get_stats(self) -> LoRAStats:
        resident = []
        for lora_int_id, request in sorted(self._registered.items()):
            if request.content_hash in self._gpu_slots:
                resident.append(ResidentAdapter(lora_int_id, request.lora_name, "gpu"))
            elif request.content_hash in self._cpu_cache:
                resident.append(ResidentAdapter(lora_int_id, request.lora_name, "cpu"))
        return LoRAStats(
            num_registered=len(self._registered),
            resident=tuple(resident),
            num_gpu_loads=self.stats["gpu_loads"],
            num_gpu_evictions=self.stats["gpu_evictions"],
            num_gpu_hits=self.stats["gpu_hits"],
            num_cpu_loads=self.stats["cpu_loads"],
            num_cpu_evictions=self.stats["cpu_evictions"],
            num_cpu_hits=self.stats["cpu_hits"],
        )

    # ---- internals -------------------------------------------------------------------------

    def _activate(self, content_hash: str, keep: set[str]) -> int:
        if content_hash in self._gpu_slots:
            self._gpu_slots.move_to_end(content_hash)
            self.stats["gpu_hits"] += 1
            return self._gpu_slots[content_hash]
        adapter = self._get_cpu(content_hash)
        if len(self._gpu_slots) < self.config.max_loras:
            used = set(self._gpu_slots.values())
            slot = next(s for s in range(self.config.max_loras) if s not in used)
        else:
            victim = next(h for h in self._gpu_slots if h not in keep)  # LRU first
            slot = self._gpu_slots.pop(victim)
            self.stats["gpu_evictions"] += 1
        start = time.perf_counter()
        self.slots.load(slot, adapter)
        self._gpu_slots[content_hash] = slot
        self.stats["gpu_loads"] += 1
        self._report_load(content_hash, "gpu", start)
        return slot

    def _get_cpu(self, content_hash: str) -> LoRAAdapter:
        adapter = self._cpu_cache.get(content_hash)
        if adapter is not None:
            self._cpu_cache.move_to_end(content_hash)
            self.stats["cpu_hits"] += 1
            return adapter
        path = self._paths[content_hash]
        start = time.perf_counter()
        adapter = load_lora_adapter(path, self.arch, self.config.max_lora_rank)
        if adapter.content_hash != content_hash:
            raise InvalidAdapterError(f"{path}: the adapter files changed on disk while in use")
        self._cache_on_cpu(adapter, path)
        self._report_load(content_hash, "cpu", start)
        return adapter

    def _report_load(self, content_hash: str, tier: AdapterTier, start: float) -> None:
        if self.on_adapter_load is not None:
            name = self._names.get(content_hash, content_hash[:12])
            self.on_adapter_load(AdapterLoad(name, tier, time.perf_counter() - start))

    def _cache_on_cpu(self, adapter: LoRAAdapter, path: str) -> None:
        self._cpu_cache[adapter.content_hash] = adapter
        self._cpu_cache.move_to_end(adapter.content_hash)
        self._paths[adapter.content_hash] = path
        self.stats["cpu_loads"] += 1
        while len(self._cpu_cache) > self.config.max_cpu_loras:
            victim = next(
                (h for h in self._cpu_cache if h not in self._pins and h not in self._gpu_slots),
                None,
            )
            if victim is None:
                break  # everything cached is in use; allow a temporary overshoot
            del self._cpu_cache[victim]
            self.stats["cpu_evictions"] += 1

    def _maybe_drop(self, content_hash: str) -> None:
        """Forget an adapter no registration and no request refers to any more."""
        if content_hash in self._pins:
            return
        if any(r.content_hash == content_hash for r in self._registered.values()):
            return
        self._cpu_cache.pop(content_hash, None)
        self._paths.pop(content_hash, None)
        self._names.pop(content_hash, None)
        slot = self._gpu_slots.pop(content_hash, None)
        if slot is not None:
            self.slots.clear(slot)
