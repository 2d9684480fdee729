"""Redis when it answers, the in-process limiter when it does not.

Fails open to *local* limiting (as Envoy, Kong and Stripe do), never to no limit: a Redis
outage must neither take the API down nor let one tenant flood the engine. While Redis is
down each replica enforces the full limits on its own, so the fleet-wide ceiling is
(replicas x limit) for the outage; it is back to shared limits when Redis answers again.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable
from typing import TypeVar

from redis.exceptions import RedisError

from .limits import (
    DEFAULT_LEASE_TTL_S,
    DEFAULT_WINDOW_S,
    Backend,
    RateLimitDecision,
    Reservation,
    TenantLimits,
    validate_tokens,
)
from .local_limiter import LocalRateLimiter
from .redis_limiter import DEFAULT_SOCKET_TIMEOUT_S, RedisRateLimiter

logger = logging.getLogger(__name__)

T = TypeVar("T")

DEFAULT_PROBE_INTERVAL_S = 5.0
# Releases of Redis leases that could not reach Redis; replayed when it returns. Bounded:
# beyond it, the lease simply expires after its TTL.
MAX_PENDING_RELEASES = 10_000
_REDIS_ERRORS = (RedisError, OSError, asyncio.TimeoutError)


class FailoverRateLimiter:
    """The platform's limiter: Redis-backed with a local fallback, or local only (no URL)."""

    def __init__(
        self,
        redis_url: str | None,
        prefix: str,
        *,
        window_s: float = DEFAULT_WINDOW_S,
        lease_ttl_s: float = DEFAULT_LEASE_TTL_S,
        probe_interval_s: float = DEFAULT_PROBE_INTERVAL_S,
        timeout_s: float = DEFAULT_SOCKET_TIMEOUT_S,
        on_fallback: Callable[[], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.local = LocalRateLimiter(window_s=window_s, lease_ttl_s=lease_ttl_s)
        self.redis = (
            RedisRateLimiter.from_url(
                redis_url, prefix, window_s=window_s, lease_ttl_s=lease_ttl_s, timeout_s=timeout_s
            )
            if redis_url
            else None
        )
        self.probe_interval_s = probe_interval_s
        # Covers the socket timeout plus the one reconnect retry.
        self._call_timeout_s = 2 * timeout_s + 0.5
        self._on_fallback = on_fallback
        self._clock = clock
        self._down_since: float | None = None
        self._next_probe_at = 0.0
        self._pending: deque[tuple[Reservation, int]] = deque(maxlen=MAX_PENDING_RELEASES)
        self.num_fallbacks = 0  # decisions made locally because Redis was unavailable
        self.num_outages = 0

    @property
    def backend(self) -> Backend:
        """Where decisions go now."""
        return "redis" if self.redis is not None and self._down_since is None else "local"

    @property
    def is_degraded(self) -> bool:
        """Redis is configured but not answering."""
        return self.redis is not None and self._down_since is not None

    async def acquire(self, tenant_id: str, limits: TenantLimits, tokens: int) -> RateLimitDecision:
        """All-or-nothing admission; see RateLimiter.acquire."""
        validate_tokens(tokens)
        redis = self._maybe_redis()
        if redis is not None:
            decision = await self._try(redis.acquire(tenant_id, limits, tokens))
            if decision is not None:
                return decision
        if self.redis is not None:
            self.num_fallbacks += 1
            if self._on_fallback is not None:
                self._on_fallback()
        return await self.local.acquire(tenant_id, limits, tokens)

    async def release(self, reservation: Reservation, tokens_used: int) -> bool:
        """Release where the lease was taken. A Redis lease released while Redis is down is
        queued and replayed on recovery (returns False meanwhile); idempotent either way."""
        if reservation.backend == "local":
            return await self.local.release(reservation, tokens_used)
        if self.redis is None:
            return False
        redis = self._maybe_redis()
        if redis is not None:
            freed = await self._try(redis.release(reservation, tokens_used))
            if freed is not None:
                return freed
        self._pending.append((reservation, tokens_used))
        return False

    async def charge(self, reservation: Reservation, tokens: int) -> bool:
        """Take more tokens where the lease was taken. Best effort: False when Redis cannot be
        reached (the release settles the difference later)."""
        if reservation.backend == "local":
            return await self.local.charge(reservation, tokens)
        redis = self._maybe_redis()
        if redis is None:
            return False
        return bool(await self._try(redis.charge(reservation, tokens)))

    async def peek(self, tenant_id: str, limits: TenantLimits) -> RateLimitDecision:
        redis = self._maybe_redis()
        if redis is not None:
            decision = await self._try(redis.peek(tenant_id, limits))
            if decision is not None:
                return decision
        return await self.local.peek(tenant_id, limits)

    async def ping(self) -> bool:
        """True when no Redis is configured or it answers (for /ready)."""
        if self.redis is None:
            return True
        return bool(await self._try(self.redis.ping()))

    async def aclose(self) -> None:
        if self.redis is not None:
            await self.redis.aclose()

    def _maybe_redis(self) -> RedisRateLimiter | None:
        """Redis if up, or if down and a probe is due (one caller probes; the rest go local)."""
        if self.redis is None:
            return None
        if self._down_since is not None:
            now = self._clock()
            if now < self._next_probe_at:
                return None
            self._next_probe_at = now + self.probe_interval_s
        return self.redis

    async def _try(self, call: Awaitable[T]) -> T | None:
        """Await a Redis call; None (and outage bookkeeping) on any Redis or network error."""
        try:
            result = await asyncio.wait_for(call, self._call_timeout_s)
        except _REDIS_ERRORS as exc:
            self._mark_down(exc)
            return None
        await self._mark_up()
        return result

    def _mark_down(self, exc: BaseException) -> None:
        now = self._clock()
        self._next_probe_at = now + self.probe_interval_s
        if self._down_since is None:
            self._down_since = now
            self.num_outages += 1
            logger.warning(
                "rate limiter: Redis unavailable (%s: %s); limiting in-process per replica, "
                "probing every %.0fs",
                type(exc).__name__,
                exc,
                self.probe_interval_s,
            )

    async def _mark_up(self) -> None:
        if self._down_since is None:
            return
        logger.warning(
            "rate limiter: Redis is back after %.1fs; shared limits resume",
            self._clock() - self._down_since,
        )
        self._down_since = None
        await self._replay_pending()

    async def _replay_pending(self) -> None:
        assert self.redis is not None
        while self._pending:
            reservation, tokens_used = self._pending[0]
            try:
                await asyncio.wait_for(
                    self.redis.release(reservation, tokens_used), self._call_timeout_s
                )
            except _REDIS_ERRORS as exc:
                self._mark_down(exc)
                return
            self._pending.popleft()


def create_rate_limiter(
    redis_url: str | None,
    prefix: str,
    *,
    on_fallback: Callable[[], None] | None = None,
    window_s: float = DEFAULT_WINDOW_S,
    lease_ttl_s: float = DEFAULT_LEASE_TTL_S,
    probe_interval_s: float = DEFAULT_PROBE_INTERVAL_S,
) -> FailoverRateLimiter:
    """The app's limiter: Redis with local fallback, or local only when `redis_url` is None.
    `on_fallback` is called once per decision made locally during an outage (for metrics)."""
    return FailoverRateLimiter(
        redis_url,
        prefix,
        window_s=window_s,
        lease_ttl_s=lease_ttl_s,
        probe_interval_s=probe_interval_s,
        on_fallback=on_fallback,
    )
