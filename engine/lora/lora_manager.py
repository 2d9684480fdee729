"""LoRAManager: adapter residency (disk -> CPU cache -> GPU pages) and each step's mapping.

Adapters are keyed internally by their content hash, never by name or id alone: re-adding an
id with new files gets new weights and new prefix-cache keys (vLLM #42125, #47724).

    registered   lora_int_id -> (name, path, content hash); `add_lora` also loads it now
    CPU cache    staged adapters, LRU (max_cpu_loras, in cpu_lora_cache_gb of pages pinned
                 at start: HostPagePool), read from disk on worker threads
    GPU          pages in the KV cache's blocks (AdapterPool): as many as memory allows

Each step `poll(waiting)` moves loads along without ever blocking: finished disk reads enter the
CPU cache; the adapters of waiting requests, in queue order, start their uploads; the disk reads
it asks for start in `start_loads`, once the GPU runs the step (a load's first Python work would
take the interpreter from the step's host work). The scheduler admits a request only once its
adapter is ready on the GPU (`is_ready`) and pins the adapter while the request is scheduled
(`on_scheduled` / `on_descheduled`). A failed load fails only its requests (`poll` returns it).

Requests in flight (queued or running) hold the adapter's registration (`pin` / `unpin`):
`remove_lora` unregisters the id at once (new requests fail) and lets them finish on its weights.
"""

from __future__ import annotations

import logging
import time
from collections import Counter, OrderedDict
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future
from dataclasses import replace
from itertools import islice

import torch

from loraplex.engine.config import LoRAConfig
from loraplex.engine.distributed.sharding import TPLayout
from loraplex.engine.distributed.tp_group import TPGroup
from loraplex.engine.errors import InvalidAdapterError
from loraplex.engine.kv_cache import KVCacheManager
from loraplex.engine.lora.adapter import ArchLike
from loraplex.engine.lora.adapter_loader import AdapterLoader, CpuAdapter
from loraplex.engine.lora.adapter_pool import AdapterPool
from loraplex.engine.lora.host_pages import create_host_pages
from loraplex.engine.lora.lora_batch import LoRABatch, LoRAWorkspace
from loraplex.engine.lora.page_layout import SLICES, max_adapter_pages
from loraplex.engine.lora.step_mapping import map_step
from loraplex.engine.request import LoRARequest, Request
from loraplex.engine.scheduler.output import ScheduledRequest
from loraplex.engine.stats import AdapterLoad, AdapterTier, LoRAStats, ResidentAdapter

logger = logging.getLogger(__name__)

# How many distinct adapters of the waiting queue (from its head) are prefetched each step,
# looking at most this many requests deep (the scan runs every step: a queue of thousands must
# not cost milliseconds of host time; requests further back move up as the head drains).
PREFETCH_DEPTH = 64
PREFETCH_WINDOW = 256


class LoRAManager:
    def __init__(
        self,
        config: LoRAConfig,
        arch: ArchLike,
        dtype: torch.dtype,
        kv_cache_manager: KVCacheManager,
        pages: torch.Tensor,  # [num_layers, num_blocks, page_size]: the KV cache's memory
        max_batch_loras: int,
        tp_layouts: Sequence[TPLayout] = (),
        reduce: TPGroup | None = None,
    ) -> None:
        """Tensor parallelism: `tp_layouts`, every rank's share (`pages` are rank 0's), and
        the group; adapters are packed per rank, the workers' shards queued in
        `pool.shard_uploads` for the next step's messages."""
        self.config = config
        self.device = pages.device
        self.max_batch_loras = max_batch_loras
        self.reduce = reduce
        layouts = list(tp_layouts)
        page_size = pages.shape[2]
        self.loader = AdapterLoader(
            arch, config.max_lora_rank, page_size, dtype, tp_layouts=layouts
        )
        self.max_pages = max_adapter_pages(
            config.max_lora_rank, self.loader.module_shapes, page_size
        )
        self.host_pages = create_host_pages(config, arch.num_hidden_layers, page_size, dtype,
                                            self.max_pages, pin=self.device.type == "cuda")  # fmt: skip
        self.loader.host_pages = self.host_pages
        self.pool = AdapterPool(
            kv_cache_manager, pages, min(config.max_gpu_loras, pages.shape[1]), self.max_pages
        )
        self.pool.shard_uploads = [[] for _ in layouts[1:]]
        kv_cache_manager.reclaim = self.pool.reclaim
        self.workspace = LoRAWorkspace(arch.num_hidden_layers, config.max_lora_rank, self.device)
        self._registered: dict[int, LoRARequest] = {}  # lora_int_id -> request, with hash
        self._sources: dict[str, LoRARequest] = {}  # content hash -> how to load it
        self._inflight: Counter[str] = Counter()  # requests queued or running, per hash
        self._cpu: OrderedDict[str, CpuAdapter] = OrderedDict()  # LRU
        self._loading: dict[str, Future[CpuAdapter]] = {}
        self._to_load: list[str] = []  # disk reads `poll` asked for, started by `start_loads`
        self._uploading: dict[str, float] = {}  # upload start (perf_counter)
        self._failed: dict[str, str] = {}  # content hash -> why its load failed
        self._modules: dict[str, frozenset[str]] = {}  # content hash -> targeted slices
        self._num_pages: dict[str, int] = {}  # content hash -> KV blocks it takes on the GPU
        self.stats: Counter[str] = Counter()
        # Called (in the engine thread) after every adapter load: metrics.
        self.on_adapter_load: Callable[[AdapterLoad], None] | None = None

    # ---- registry ------------------------------------------------------------------------

    def add_lora(self, lora_request: LoRARequest) -> LoRARequest:
        """Validate and load an adapter now (into the CPU cache); returns the request with its
        content hash set. Raises InvalidAdapterError for an unusable adapter."""
        cpu = self.loader.load(lora_request)
        resolved = replace(lora_request, content_hash=cpu.content_hash)
        self._register(resolved)
        self._failed.pop(cpu.content_hash, None)
        self._cache_on_cpu(cpu, "cpu")
        return resolved

    def resolve(self, lora_request: LoRARequest) -> LoRARequest:
        """The registered form of a request's adapter. One with a content hash (registered
        elsewhere, e.g. by the platform) is only recorded: it loads in the background when a
        request needs it. One without is loaded now, to learn its hash."""
        known = self._registered.get(lora_request.lora_int_id)
        if (
            known is not None
            and known.lora_path == lora_request.lora_path
            and lora_request.content_hash in (None, known.content_hash)
        ):
            return known
        if lora_request.content_hash is None:
            return self.add_lora(lora_request)
        self._register(lora_request)
        return lora_request

    def remove_lora(self, lora_int_id: int) -> bool:
        request = self._registered.pop(lora_int_id, None)
        if request is None:
            return False
        assert request.content_hash is not None
        self._maybe_drop(request.content_hash)
        return True

    def list_loras(self) -> list[int]:
        return sorted(self._registered)

    def is_registered(self, lora_request: LoRARequest) -> bool:
        """Its id still names these weights (not removed, not re-registered with others)."""
        known = self._registered.get(lora_request.lora_int_id)
        return known is not None and known.content_hash == lora_request.content_hash

    def _register(self, lora_request: LoRARequest) -> None:
        assert lora_request.content_hash is not None
        self._registered[lora_request.lora_int_id] = lora_request
        self._sources[lora_request.content_hash] = lora_request

    # ---- requests in flight --------------------------------------------------------------

    def pin(self, content_hash: str) -> None:
        self._inflight[content_hash] += 1

    def unpin(self, content_hash: str) -> None:
        self._inflight[content_hash] -= 1
        if self._inflight[content_hash] <= 0:
            del self._inflight[content_hash]
            self._maybe_drop(content_hash)

    # ---- the scheduler's gate (pure bookkeeping) -----------------------------------------

    def is_ready(self, request: Request) -> bool:
        """May the request join a step: no adapter, or its adapter is ready on the GPU."""
        lora = request.lora_request
        return lora is None or self.pool.is_ready(_hash(lora))

    def is_loading(self, request: Request) -> bool:
        """Its adapter is being read from disk or copied to the GPU right now."""
        lora = request.lora_request
        in_flight = (self._to_load, self._loading, self._uploading)
        return lora is not None and any(_hash(lora) in table for table in in_flight)

    def on_scheduled(self, request: Request) -> None:
        """The request is running: its adapter stays on the GPU until it stops."""
        if request.lora_request is not None:
            content_hash = _hash(request.lora_request)
            self.pool.pin(content_hash)
            self.pool.touch(content_hash)

    def on_descheduled(self, request: Request) -> None:
        """The request stopped running (finished, aborted or preempted)."""
        if request.lora_request is not None:
            self.pool.unpin(_hash(request.lora_request))

    # ---- per step ------------------------------------------------------------------------

    def poll(self, waiting: Iterable[Request], num_running: int) -> dict[str, str]:
        """Advance loads without blocking; returns {content hash: error} of adapters whose load
        failed that the head of the waiting queue names (the engine fails their requests)."""
        self._harvest_loads()
        self._report_finished_uploads()
        # Only this poll's asks: a step that never started the last poll's (it had nothing to
        # launch) must not start them later, after their adapter has reached the cache.
        self._to_load.clear()
        wanted: list[str] = []
        for request in islice(waiting, PREFETCH_WINDOW):
            if request.lora_request is not None:
                content_hash = _hash(request.lora_request)
                if content_hash not in wanted:
                    wanted.append(content_hash)
                    if len(wanted) == PREFETCH_DEPTH:
                        break
        failed = {h: self._failed[h] for h in wanted if h in self._failed}
        for i, content_hash in enumerate(wanted):
            if content_hash in failed:
                continue
            if content_hash in self.pool:
                self.pool.touch(content_hash)
                continue
            if (cpu := self._cpu.get(content_hash)) is None:
                if content_hash not in self._loading:
                    self._to_load.append(content_hash)  # read from disk: start_loads
                continue
            # Requests need a block each per step at most: leave them that much.
            if not self.pool.upload(cpu, keep=wanted[:i], reserve_blocks=num_running):
                break  # no room now; those behind it in the queue wait their turn
            self._uploading[content_hash] = time.perf_counter()
            self._modules[content_hash] = frozenset(
                SLICES[i] for i, first in enumerate(cpu.layout.first_a) if first >= 0
            )
        return failed

    def prepare(self, scheduled: Sequence[ScheduledRequest]) -> LoRABatch | None:
        """This step's token -> adapter mapping (tokens in the order of `scheduled`), every
        adapter in it ready on the GPU. None when no request of the step has an adapter (the
        base model pays nothing)."""
        hashes = [_hash(s.request.lora_request) if s.request.lora_request else None
                  for s in scheduled]  # fmt: skip
        tokens = [s.num_new_tokens for s in scheduled]
        args = (self.pool.resident_id, self.max_batch_loras, self.device)
        adapters, mapping = map_step(hashes, tokens, *args)
        if mapping is None:
            return None
        modules = set().union(*(self._modules[h] for h in adapters))
        return LoRABatch(self.pool, self.workspace, *mapping.tensors(), modules, self.reduce)

    def create_graph_batch(
        self,
        sorted_token_ids: torch.Tensor,
        slot_start_loc: torch.Tensor,
        slot_adapters: torch.Tensor,
        num_active_slots: torch.Tensor,
    ) -> LoRABatch:
        """A batch over static mapping buffers that launches for every module (CUDA graphs:
        the captured launches must serve whatever adapters a replayed step has)."""
        return LoRABatch(
            self.pool, self.workspace, sorted_token_ids, slot_start_loc, slot_adapters,
            num_active_slots, set(SLICES),
        )  # fmt: skip

    def get_stats(self) -> LoRAStats:
        resident = []
        for lora_int_id, request in sorted(self._registered.items()):
            content_hash = _hash(request)
            if content_hash in self.pool:
                resident.append(ResidentAdapter(lora_int_id, request.lora_name, "gpu"))
            elif content_hash in self._cpu:
                resident.append(ResidentAdapter(lora_int_id, request.lora_name, "cpu"))
        return LoRAStats(
            num_registered=len(self._registered),
            resident=tuple(resident),
            num_gpu_loads=self.pool.num_uploads,
            num_gpu_evictions=self.pool.num_evictions,
            num_cpu_loads=self.stats["cpu_loads"],
            num_cpu_evictions=self.stats["cpu_evictions"],
            num_load_failures=self.stats["load_failures"],
            num_requests_holding=sum(self._inflight.values()),
            num_requests_pinning=self.pool.num_pins,
        )

    def check_integrity(self) -> None:
        self.pool.check_integrity()
        self.host_pages.check_integrity()
        assert not set(self._loading) & set(self._cpu), "an adapter both loading and cached"

    def shutdown(self) -> None:
        self.loader.shutdown()

    # ---- internals -----------------------------------------------------------------------

    def start_loads(self) -> None:
        """Start the disk reads the last `poll` asked for (the engine calls this while the GPU
        runs a step, and again after it: only the first call of a step starts anything)."""
        for content_hash in dict.fromkeys(self._to_load):
            if content_hash in self._sources and content_hash not in self._loading:
                self._loading[content_hash] = self.loader.submit(self._sources[content_hash])
        self._to_load.clear()

    def _harvest_loads(self) -> None:
        for content_hash, future in list(self._loading.items()):
            if not future.done():
                continue
            del self._loading[content_hash]
            try:
                cpu = future.result()
            except InvalidAdapterError as exc:
                logger.error("adapter %s failed to load: %s", content_hash[:12], exc)
                self._failed[content_hash] = str(exc)
                self.stats["load_failures"] += 1
                continue
            if content_hash in self._sources:  # still wanted (not dropped meanwhile)
                self._cache_on_cpu(cpu, "cpu")
            else:
                self._free_host_run(cpu)

    def _report_finished_uploads(self) -> None:
        for content_hash, start in list(self._uploading.items()):
            if content_hash not in self.pool:
                del self._uploading[content_hash]  # evicted before anyone used it
            elif self.pool.is_ready(content_hash):
                del self._uploading[content_hash]
                self._report_load(content_hash, "gpu", time.perf_counter() - start)

    def adapter_blocks(self, lora_request: LoRARequest) -> int | None:
        """KV blocks the adapter takes on the GPU, once known (after its first load)."""
        return self._num_pages.get(_hash(lora_request))

    def _cache_on_cpu(self, cpu: CpuAdapter, tier: AdapterTier) -> None:
        self._num_pages[cpu.content_hash] = cpu.layout.num_pages
        self._drop_from_cpu(cpu.content_hash)  # re-added: the new copy replaces the old
        self._cpu[cpu.content_hash] = cpu
        self.stats["cpu_loads"] += 1
        self._report_load(cpu.content_hash, tier, cpu.load_seconds)
        while len(self._cpu) > self.config.max_cpu_loras:
            self._drop_from_cpu(next(iter(self._cpu)))
            self.stats["cpu_evictions"] += 1
        # Keep the largest adapter's pages free for the next load, least recently used first.
        room = min(self.max_pages, self.host_pages.num_pages)
        for content_hash in list(self._cpu)[:-1]:
            if self.host_pages.num_free_pages >= room:
                break
            if self._cpu[content_hash].host_run is not None:
                self._drop_from_cpu(content_hash)
                self.stats["cpu_evictions"] += 1

    def _drop_from_cpu(self, content_hash: str) -> None:
        """Out of the CPU cache; its pages come back once an upload reading them is done."""
        cpu = self._cpu.pop(content_hash, None)
        if cpu is not None:
            self._free_host_run(cpu)

    def _free_host_run(self, cpu: CpuAdapter) -> None:
        if cpu.host_run is not None:
            self.host_pages.free(cpu.host_run, after=self.pool.upload_event(cpu.content_hash))

    def _report_load(self, content_hash: str, tier: AdapterTier, seconds: float) -> None:
        source = self._sources.get(content_hash)
        if self.on_adapter_load is not None and source is not None:
            self.on_adapter_load(AdapterLoad(source.lora_name, tier, seconds))

    def _maybe_drop(self, content_hash: str) -> None:
        """Forget an adapter no registration and no request refers to any more."""
        registered = any(_hash(r) == content_hash for r in self._registered.values())
        if content_hash in self._inflight or registered:
            return
        self._drop_from_cpu(content_hash)
        for table in (self._sources, self._failed, self._modules, self._uploading, self._num_pages):
            table.pop(content_hash, None)
        if content_hash in self.pool and self.pool.is_ready(content_hash):
            self.pool.evict(content_hash)  # else its upload ends and LRU evicts it later


def _hash(lora_request: LoRARequest) -> str:
    assert lora_request.content_hash is not None, "requests carry resolved adapters"
    return lora_request.content_hash
