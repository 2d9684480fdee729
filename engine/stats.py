"""What the engine reports about itself: one immutable snapshot per step.

`LLMEngine.get_stats()` builds an `EngineStats`; `AsyncEngine.get_stats()` hands the latest one
to the platform (metrics, backpressure, the admin engine page). Counters are cumulative since
the engine started; gauges are the state after the last step.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from typing import Literal

AdapterTier = Literal["gpu", "cpu"]


@dataclass(frozen=True)
class AdapterLoad:
    """One adapter load, reported to `on_adapter_load` observers (engine thread)."""

    lora_name: str
    tier: AdapterTier  # cpu: disk -> CPU cache (read + validate); gpu: CPU cache -> GPU slot
    seconds: float


@dataclass(frozen=True)
class ResidentAdapter:
    """A registered adapter that is in memory: on the GPU (and so in the CPU cache too) or in
    the CPU cache only."""

    lora_int_id: int
    lora_name: str
    tier: AdapterTier


@dataclass(frozen=True)
class LoRAStats:
    num_registered: int = 0
    resident: tuple[ResidentAdapter, ...] = ()
    num_gpu_loads: int = 0  # uploads into GPU pages
    num_gpu_evictions: int = 0
    num_cpu_loads: int = 0  # reads from disk into the CPU cache
    num_cpu_evictions: int = 0
    num_load_failures: int = 0
    # Requests admitted after waiting for their adapter (load, or the per-step cap), and the
    # time they waited in all (cumulative).
    num_adapter_waits: int = 0
    adapter_wait_seconds: float = 0.0
    # Requests holding an adapter now: queued or running (the adapter's registration outlives
    # a removal while they do), and those running on its GPU pages (which pin it there).
    num_requests_holding: int = 0
    num_requests_pinning: int = 0

    def num_resident(self, tier: AdapterTier) -> int:
        return sum(1 for r in self.resident if r.tier == tier)


@dataclass(frozen=True)
class EngineStats:
    # Requests.
    num_running: int = 0
    num_waiting: int = 0
    num_swapped: int = 0
    num_waiting_tokens: int = 0  # prompt (and recomputed) tokens still to prefill
    # KV cache (GPU pool, CPU swap pool).
    kv_blocks_total: int = 0
    kv_blocks_used: int = 0  # held by requests
    kv_blocks_adapters: int = 0  # holding the weights of adapters resident on the GPU
    kv_blocks_cached: int = 0  # free but holding reusable prefix blocks
    kv_cpu_blocks_total: int = 0
    kv_cpu_blocks_used: int = 0
    # Preemptions and swap traffic (cumulative).
    num_preemptions_swap: int = 0
    num_preemptions_recompute: int = 0
    swap_bytes_out: int = 0
    swap_bytes_in: int = 0
    # Prefix cache (cumulative, per admitted request).
    prefix_cache_queried_tokens: int = 0
    prefix_cache_hit_tokens: int = 0
    # Work done.
    num_generated_tokens: int = 0
    num_steps: int = 0
    num_scheduled_tokens: int = 0  # computed by the steps: prefill and decode tokens
    step_seconds: float = 0.0  # wall time in its steps (not waiting for adapter loads)
    # Of step_seconds, blocked on the GPU's tokens. The rest is the host's own work, and also any
    # time a kernel launch blocked because CUDA's queue of pending launches was full.
    result_wait_seconds: float = 0.0
    # Of step_seconds, preparing and launching steps: the inputs, the LoRA mapping and every
    # kernel launch of the forward and the sampler (a launch that blocks on CUDA's full queue
    # counts here too).
    launch_seconds: float = 0.0
    throughput_tokens_per_s: float = 0.0  # over the last ~10 s
    lora: LoRAStats = field(default_factory=LoRAStats)

    @property
    def kv_usage(self) -> float:
        return self.kv_blocks_used / self.kv_blocks_total if self.kv_blocks_total else 0.0

    @property
    def num_preemptions(self) -> int:
        return self.num_preemptions_swap + self.num_preemptions_recompute

    @property
    def prefix_cache_hit_rate(self) -> float:
        queried = self.prefix_cache_queried_tokens
        return self.prefix_cache_hit_tokens / queried if queried else 0.0


class RateMeter:
    """Tokens per second over roughly the last `window_s` seconds."""

    def __init__(self, window_s: float = 10.0) -> None:
        self.window_s = window_s
        self._events: deque[tuple[float, int]] = deque()

    def add(self, num_tokens: int) -> None:
        now = time.monotonic()
        self._events.append((now, num_tokens))
        while self._events and now - self._events[0][0] > self.window_s:
            self._events.popleft()

    def rate(self) -> float:
        if len(self._events) < 2:
            return 0.0
        span = self._events[-1][0] - self._events[0][0]
        return sum(n for _, n in list(self._events)[1:]) / span if span > 0 else 0.0
