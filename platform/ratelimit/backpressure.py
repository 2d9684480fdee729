"""Engine backpressure: refuse new work (429 `engine_overloaded`) while the engine's waiting
queue is past a bound, instead of queueing without end. Stops a flood (from any mix of
tenants, each within its own limits) from growing the queue, and every tenant's latency,
without bound."""

from __future__ import annotations

import math

from loraplex.engine.stats import EngineStats

# Bounds on the advertised wait: at least the header's 1 s, at most a minute.
MIN_RETRY_AFTER_S = 1
MAX_RETRY_AFTER_S = 60


class BackpressureGate:
    """Admission check against `engine.get_stats()`; None bounds are unlimited."""

    def __init__(self, max_waiting_requests: int | None, max_waiting_tokens: int | None) -> None:
        for name, bound in (
            ("max_waiting_requests", max_waiting_requests),
            ("max_waiting_tokens", max_waiting_tokens),
        ):
            if bound is not None and bound < 0:
                raise ValueError(f"{name} must be None or >= 0, got {bound}")
        self.max_waiting_requests = max_waiting_requests
        self.max_waiting_tokens = max_waiting_tokens

    def check(self, stats: EngineStats) -> int | None:
        """Retry-after seconds when the queue is full (it already holds the bound), else None.

        The estimate is the time to drain the tokens queued past the bound (or one
        request's worth of them when only the request bound is hit), clamped to [1, 60] s.
        """
        num_waiting, num_waiting_tokens = stats.num_waiting, stats.num_waiting_tokens
        over_requests = (
            self.max_waiting_requests is not None and num_waiting >= self.max_waiting_requests
        )
        over_tokens = (
            self.max_waiting_tokens is not None and num_waiting_tokens >= self.max_waiting_tokens
        )
        if not (over_requests or over_tokens):
            return None
        throughput = stats.throughput_tokens_per_s
        if not math.isfinite(throughput) or throughput <= 0:
            return MIN_RETRY_AFTER_S
        excess = 0.0
        if over_tokens and self.max_waiting_tokens is not None:
            excess = num_waiting_tokens - self.max_waiting_tokens
        if over_requests and num_waiting > 0:
            excess = max(excess, num_waiting_tokens / num_waiting)
        seconds = math.ceil(excess / throughput) if excess > 0 else MIN_RETRY_AFTER_S
        return min(MAX_RETRY_AFTER_S, max(MIN_RETRY_AFTER_S, seconds))
