"""The rate limiter's contract: per-tenant limits in, an all-or-nothing decision out.

Three limits per tenant, as OpenAI and Anthropic define them: requests per minute, tokens per
minute (an estimate reserved at admission, tokens beyond it charged as they are generated, the
unused part refunded at the end: the bucket may go into debt, which later requests repay by
waiting) and concurrent requests. Each per-minute limit is a token bucket holding at most `limit` units and
refilling `limit` units per window (60 s), so a tenant may burst its whole minute at once but
never exceed the limit over any window.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal, Protocol

LimitKind = Literal["requests", "tokens", "concurrency"]
Backend = Literal["local", "redis"]

DEFAULT_WINDOW_S = 60.0
# A lease outlives any sane request; it only matters when a replica dies holding it.
DEFAULT_LEASE_TTL_S = 600.0


@dataclass(frozen=True, slots=True)
class TenantLimits:
    """A tenant's limits; None = unlimited. A limit of 0 admits nothing."""

    requests_per_minute: int | None = None
    tokens_per_minute: int | None = None
    max_concurrent_requests: int | None = None

    def __post_init__(self) -> None:
        for name in ("requests_per_minute", "tokens_per_minute", "max_concurrent_requests"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or value < 0):
                raise ValueError(f"{name} must be None or an integer >= 0, got {value!r}")


@dataclass(frozen=True, slots=True)
class Reservation:
    """What one admitted request holds: 1 concurrency lease and `tokens` tokens taken from
    the bucket (reserved at admission plus charged since)."""

    reservation_id: str
    tenant_id: str
    tokens: int
    backend: Backend  # which store holds the lease; release goes back to the same one
    tokens_per_minute: int | None = None  # the bucket's capacity when it was taken


@dataclass(frozen=True, slots=True)
class LimitState:
    """Numbers for one limit's headers. `reset_s`: seconds until the bucket is full again."""

    limit: int
    remaining: int
    reset_s: float


@dataclass(frozen=True, slots=True)
class RateLimitDecision:
    """The answer to `acquire` (or `peek`, which never holds a reservation).

    When refused, `kind` names the first limit that failed (requests, then tokens, then
    concurrency) and `retry_after_s` is the wait after which every failing per-minute limit
    would pass. `exceeds_capacity` means waiting cannot help (e.g. tokens > tokens_per_minute).
    `requests` / `tokens` / `concurrency` are None for unlimited kinds.
    """

    allowed: bool
    reservation: Reservation | None = None
    kind: LimitKind | None = None
    retry_after_s: float | None = None
    requests: LimitState | None = None
    tokens: LimitState | None = None
    concurrency: LimitState | None = None
    exceeds_capacity: bool = False

    @property
    def retry_after(self) -> int | None:
        """Whole seconds (>= 1) for the `retry-after` header; None when allowed."""
        if self.allowed or self.retry_after_s is None:
            return None
        return max(1, math.ceil(self.retry_after_s))


class RateLimiter(Protocol):
    """Per-tenant limiter shared by every replica that uses the same store."""

    async def acquire(self, tenant_id: str, limits: TenantLimits, tokens: int) -> RateLimitDecision:
        """Atomically check all three limits; take 1 request, `tokens` and a lease only if all
        pass."""
        ...

    async def charge(self, reservation: Reservation, tokens: int) -> bool:
        """Take `tokens` more from the bucket for a request still holding its lease; the level
        may go below zero (debt). False, and nothing taken, if the lease is gone."""
        ...

    async def release(self, reservation: Reservation, tokens_used: int) -> bool:
        """Free the lease and settle: give back `reservation.tokens - tokens_used` (or take
        the difference when negative). Idempotent: True the first time only."""
        ...

    async def peek(self, tenant_id: str, limits: TenantLimits) -> RateLimitDecision:
        """The current header numbers without taking anything."""
        ...

    async def aclose(self) -> None:
        """Release connections."""
        ...


def validate_tokens(tokens: int) -> None:
    if tokens < 0:
        raise ValueError(f"tokens must be >= 0, got {tokens}")
