"""Prometheus metrics, one `Metrics` per app in its own CollectorRegistry (several apps in one
process, as in tests, never clash).

Label values come from tenants and adapters, i.e. from the database; `_BoundedLabel` caps each
label's distinct values (the rest read "other"), which stops a tenant creating adapters in a
loop from blowing up the scrape size and Prometheus' memory.

`update_engine_gauges(engine.get_stats())` copies the engine's `EngineStats` snapshot into
gauges, and its cumulative counts into counters (by their increase); `observe_adapter_load` is
the engine's adapter-load observer (`AsyncEngine.observe_adapter_loads`).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from typing import Literal, TypeVar

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)

from loraplex.engine.stats import AdapterLoad, AdapterTier, EngineStats
from loraplex.platform.ratelimit import LimitKind
from loraplex.platform.usage import RequestStatus

M = TypeVar("M", Counter, Gauge)
OTHER = "other"
DEFAULT_MAX_LABEL_VALUES = 1000

TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 10, 20, 40, 80)
ITL_BUCKETS = (0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.25, 0.5, 1, 2.5, 5)
E2E_BUCKETS = (0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 40, 60, 120, 300, 600)
LOAD_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)

# Why a request got a 429: one of the tenant's limits, or the engine's queue.
RefusalKind = LimitKind | Literal["engine_overloaded"]
ADAPTER_TIERS: tuple[AdapterTier, ...] = ("gpu", "cpu")


class _BoundedLabel:
    """Passes the first `max_values` distinct values through, maps the rest to "other"."""

    def __init__(self, max_values: int) -> None:
        self._max_values = max_values
        self._seen: set[str] = set()
        self._lock = threading.Lock()

    def __call__(self, value: str) -> str:
        if value in self._seen:
            return value
        with self._lock:
            if len(self._seen) >= self._max_values:
                return OTHER
            self._seen.add(value)
        return value


# Engine gauges: (name, help, its value in an `EngineStats` snapshot).
_ENGINE_GAUGES: tuple[tuple[str, str, Callable[[EngineStats], float]], ...] = (
    ("num_requests_running", "Requests in the running batch.", lambda s: s.num_running),
    ("num_requests_waiting", "Requests queued for admission.", lambda s: s.num_waiting),
    ("num_requests_swapped", "Preempted requests swapped to CPU.", lambda s: s.num_swapped),
    ("num_waiting_tokens", "Tokens of queued requests.", lambda s: s.num_waiting_tokens),
    ("kv_blocks_used", "KV cache blocks in use.", lambda s: s.kv_blocks_used),
    ("kv_blocks_total", "KV cache blocks in the pool.", lambda s: s.kv_blocks_total),
    ("kv_usage_ratio", "Fraction of KV cache blocks in use.", lambda s: s.kv_usage),
    ("prefix_cache_hit_rate", "Prefix cache hit rate.", lambda s: s.prefix_cache_hit_rate),
    ("throughput_tokens_per_second", "Recent tok/s.", lambda s: s.throughput_tokens_per_s),
)


class Metrics:
    """Every Loraplex metric, registered in `self.registry`."""

    content_type = CONTENT_TYPE_LATEST

    def __init__(
        self, namespace: str = "loraplex", max_label_values: int = DEFAULT_MAX_LABEL_VALUES
    ) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self._namespace = namespace
        self._tenant = _BoundedLabel(max_label_values)
        self._adapter = _BoundedLabel(max_label_values)
        self._last_cumulative: dict[tuple[Counter, str], float] = {}
        self._resident: dict[AdapterTier, set[str]] = {}  # tier -> adapters with a residency series
        ta = ("tenant", "adapter")

        self.requests = self._metric(Counter, "requests", "Finished requests.", (*ta, "status"))
        self.tokens = self._metric(
            Counter, "tokens", "Prompt and completion tokens.", (*ta, "kind")
        )
        self.time_to_first_token = self._histogram(
            "time_to_first_token_seconds", "Arrival to first output token.", ta, TTFT_BUCKETS
        )
        self.inter_token_latency = self._histogram(
            "inter_token_latency_seconds", "Gap between consecutive output tokens.", ta, ITL_BUCKETS
        )
        self.e2e_latency = self._histogram(
            "e2e_request_latency_seconds", "Arrival to last byte of the response.", ta, E2E_BUCKETS
        )
        self.requests_in_flight = self._metric(
            Gauge, "requests_in_flight", "Admitted requests not yet finished.", ("tenant",)
        )
        self.rate_limited = self._metric(
            Counter, "rate_limited", "Requests refused with 429, by limit kind.", ("tenant", "kind")
        )
        self.ratelimit_fallback = self._metric(
            Counter,
            "ratelimit_fallback",
            "Rate-limit decisions made in-process while Redis was down.",
        )
        self.adapter_load_seconds = self._histogram(
            "adapter_load_seconds",
            "Adapter load time: disk to CPU cache (read, validate), CPU cache to GPU slot.",
            ("adapter", "tier"),
            LOAD_BUCKETS,
        )
        # The engine's own state, from its stats snapshots.
        self.engine_gauges = [
            (self._metric(Gauge, name, doc, subsystem="engine"), value_of)
            for name, doc, value_of in _ENGINE_GAUGES
        ]
        self.loaded_adapters = self._metric(
            Gauge, "loaded_adapters", "Adapters resident, by tier.", ("tier",), subsystem="engine"
        )
        self.adapter_resident = self._metric(
            Gauge,
            "adapter_resident",
            "1 while the adapter is resident in the tier.",
            ("adapter", "tier"),
            subsystem="engine",
        )
        self.preemptions = self._metric(
            Counter, "preemptions", "Preempted requests, by mode.", ("mode",), subsystem="engine"
        )
        self.adapter_events = self._metric(
            Counter,
            "adapter_events",
            "Adapter uploads to and evictions from the GPU.",
            ("event",),
            subsystem="engine",
        )
        self.steps = self._metric(Counter, "steps", "Engine steps run.", subsystem="engine")
        self.step_seconds = self._metric(
            Counter, "step_seconds", "Wall time the engine spent in its steps.", subsystem="engine"
        )
        self.scheduled_tokens = self._metric(
            Counter,
            "scheduled_tokens",
            "Tokens computed by the engine's steps (prefill and decode).",
            subsystem="engine",
        )
        self.adapter_waits = self._metric(
            Counter,
            "adapter_waits",
            "Requests admitted after waiting for their adapter to reach the GPU.",
            subsystem="engine",
        )
        self.adapter_wait_seconds = self._metric(
            Counter,
            "adapter_wait_seconds",
            "Time requests spent waiting for their adapter to reach the GPU.",
            subsystem="engine",
        )

    def _metric(
        self, kind: type[M], name: str, doc: str, labels: tuple[str, ...] = (), subsystem: str = ""
    ) -> M:
        return kind(
            name,
            doc,
            labels,
            namespace=self._namespace,
            subsystem=subsystem,
            registry=self.registry,
        )

    def _histogram(
        self, name: str, doc: str, labels: tuple[str, ...], buckets: tuple[float, ...]
    ) -> Histogram:
        return Histogram(
            name, doc, labels, namespace=self._namespace, registry=self.registry, buckets=buckets
        )

    # -- requests ------------------------------------------------------------------------

    def observe_request(
        self,
        tenant: str,
        adapter: str,
        status: RequestStatus,
        *,
        prompt_tokens: int = 0,
        completion_tokens: int = 0,
        ttft_s: float | None = None,
        e2e_s: float | None = None,
        inter_token_s: Iterable[float] = (),
    ) -> None:
        """Record one finished request (any status). `adapter`: the adapter name, or the base
        model's name for base-model requests."""
        labels = (self._tenant(tenant), self._adapter(adapter))
        self.requests.labels(*labels, status).inc()
        if prompt_tokens > 0:
            self.tokens.labels(*labels, "prompt").inc(prompt_tokens)
        if completion_tokens > 0:
            self.tokens.labels(*labels, "completion").inc(completion_tokens)
        if ttft_s is not None:
            self.time_to_first_token.labels(*labels).observe(ttft_s)
        if e2e_s is not None:
            self.e2e_latency.labels(*labels).observe(e2e_s)
        itl = self.inter_token_latency.labels(*labels)
        for gap in inter_token_s:
            itl.observe(gap)

    def observe_rate_limited(self, tenant: str, kind: RefusalKind) -> None:
        """One 429, by why."""
        self.rate_limited.labels(self._tenant(tenant), kind).inc()

    def observe_ratelimit_fallback(self) -> None:
        """Pass as `on_fallback` to create_rate_limiter."""
        self.ratelimit_fallback.inc()

    def request_started(self, tenant: str) -> None:
        self.requests_in_flight.labels(self._tenant(tenant)).inc()

    def request_finished(self, tenant: str) -> None:
        self.requests_in_flight.labels(self._tenant(tenant)).dec()

    def observe_adapter_load(self, load: AdapterLoad) -> None:
        """Pass to `AsyncEngine.observe_adapter_loads` (called from the engine thread)."""
        self.adapter_load_seconds.labels(self._adapter(load.lora_name), load.tier).observe(
            load.seconds
        )

    # -- engine --------------------------------------------------------------------------

    def update_engine_gauges(self, stats: EngineStats) -> None:
        """Refresh engine gauges and counters from `engine.get_stats()` (call on each scrape)."""
        for gauge, value_of in self.engine_gauges:
            gauge.set(value_of(stats))
        for tier in ADAPTER_TIERS:
            resident = {self._adapter(r.lora_name) for r in stats.lora.resident if r.tier == tier}
            self.loaded_adapters.labels(tier).set(stats.lora.num_resident(tier))
            for gone in self._resident.get(tier, set()) - resident:
                self.adapter_resident.remove(gone, tier)
            for adapter in resident:
                self.adapter_resident.labels(adapter, tier).set(1)
            self._resident[tier] = resident
        self._advance(self.preemptions, "swap", stats.num_preemptions_swap)
        self._advance(self.preemptions, "recompute", stats.num_preemptions_recompute)
        self._advance(self.adapter_events, "load", stats.lora.num_gpu_loads)
        self._advance(self.adapter_events, "evict", stats.lora.num_gpu_evictions)
        self._advance_total(self.steps, stats.num_steps)
        self._advance_total(self.step_seconds, stats.step_seconds)
        self._advance_total(self.scheduled_tokens, stats.num_scheduled_tokens)
        self._advance_total(self.adapter_waits, stats.lora.num_adapter_waits)
        self._advance_total(self.adapter_wait_seconds, stats.lora.adapter_wait_seconds)

    def _advance(self, counter: Counter, label: str, cumulative: float) -> None:
        """Feed an engine's cumulative count into a Prometheus counter by its increase. A
        drop means the engine restarted: its whole new count is the increase."""
        delta = self._increase(counter, label, cumulative)
        if delta > 0:
            counter.labels(label).inc(delta)

    def _advance_total(self, counter: Counter, cumulative: float) -> None:
        """`_advance` for a counter without labels."""
        delta = self._increase(counter, "", cumulative)
        if delta > 0:
            counter.inc(delta)

    def _increase(self, counter: Counter, label: str, cumulative: float) -> float:
        last = self._last_cumulative.get((counter, label), 0)
        self._last_cumulative[(counter, label)] = cumulative
        return cumulative - last if cumulative >= last else cumulative

    # -- exposition ----------------------------------------------------------------------

    def render(self) -> bytes:
        """The Prometheus text exposition of this registry (serve with `content_type`)."""
        return generate_latest(self.registry)
