"""Per-tenant rate limits (requests/min, tokens/min, concurrent requests) and engine
backpressure. See limits.py for the contract and scripts.py for the Redis layout."""

from __future__ import annotations

from .backpressure import BackpressureGate
from .failover_limiter import FailoverRateLimiter, create_rate_limiter
from .headers import format_reset, rate_limit_headers
from .limits import (
    Backend,
    LimitKind,
    LimitState,
    RateLimitDecision,
    RateLimiter,
    Reservation,
    TenantLimits,
)
from .local_limiter import LocalRateLimiter
from .redis_limiter import RedisRateLimiter

__all__ = [
    "Backend",
    "BackpressureGate",
    "FailoverRateLimiter",
    "LimitKind",
    "LimitState",
    "LocalRateLimiter",
    "RateLimitDecision",
    "RateLimiter",
    "RedisRateLimiter",
    "Reservation",
    "TenantLimits",
    "create_rate_limiter",
    "format_reset",
    "rate_limit_headers",
]
