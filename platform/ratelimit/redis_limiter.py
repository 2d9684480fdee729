"""Rate limiter shared by every replica on one Redis: one atomic Lua script per operation."""

from __future__ import annotations

import uuid
from collections.abc import Sequence

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from . import scripts
from .bucket import Verdict, judge, make_decision
from .limits import (
    DEFAULT_LEASE_TTL_S,
    DEFAULT_WINDOW_S,
    RateLimitDecision,
    Reservation,
    TenantLimits,
    validate_tokens,
)

# An unreachable Redis must fail fast: the failover limiter then answers locally.
DEFAULT_SOCKET_TIMEOUT_S = 0.5


def create_redis_client(url: str, timeout_s: float = DEFAULT_SOCKET_TIMEOUT_S) -> aioredis.Redis:
    """A client that fails within `timeout_s` instead of redis-py's default 10 retries with
    backoff; one immediate retry reconnects a pooled connection that a Redis restart broke."""
    return aioredis.Redis.from_url(
        url,
        socket_timeout=timeout_s,
        socket_connect_timeout=timeout_s,
        retry=Retry(NoBackoff(), 1),
    )


class RedisRateLimiter:
    """Token buckets and lease ZSETs in Redis under `prefix`; see scripts.py for the layout.

    Two instances on the same Redis and prefix share every limit. Errors (Redis down, timeouts)
    propagate; FailoverRateLimiter turns them into local limiting.
    """

    def __init__(
        self,
        client: aioredis.Redis,
        prefix: str,
        *,
        window_s: float = DEFAULT_WINDOW_S,
        lease_ttl_s: float = DEFAULT_LEASE_TTL_S,
        owns_client: bool = False,
    ) -> None:
        assert window_s > 0 and lease_ttl_s > 0
        self.client = client
        self.prefix = prefix
        self.window_s = window_s
        self.lease_ttl_s = lease_ttl_s
        self._owns_client = owns_client
        self._acquire = client.register_script(scripts.ACQUIRE)
        self._release = client.register_script(scripts.RELEASE)
        self._charge = client.register_script(scripts.CHARGE)
        self._peek = client.register_script(scripts.PEEK)

    @classmethod
    def from_url(
        cls,
        url: str,
        prefix: str,
        *,
        window_s: float = DEFAULT_WINDOW_S,
        lease_ttl_s: float = DEFAULT_LEASE_TTL_S,
        timeout_s: float = DEFAULT_SOCKET_TIMEOUT_S,
    ) -> RedisRateLimiter:
        client = create_redis_client(url, timeout_s)
        return cls(client, prefix, window_s=window_s, lease_ttl_s=lease_ttl_s, owns_client=True)

    def keys(self, tenant_id: str) -> tuple[str, str, str]:
        """(requests bucket, tokens bucket, leases) of a tenant."""
        base = f"{self.prefix.rstrip(':')}:rl:{{{tenant_id}}}"
        return f"{base}:req", f"{base}:tok", f"{base}:leases"

    async def acquire(self, tenant_id: str, limits: TenantLimits, tokens: int) -> RateLimitDecision:
        """All-or-nothing: 1 request + `tokens` + 1 lease, or nothing and the failing kind."""
        validate_tokens(tokens)
        reservation_id = uuid.uuid4().hex
        raw = await self._acquire(
            keys=list(self.keys(tenant_id)),
            args=[
                _limit_arg(limits.requests_per_minute),
                _limit_arg(limits.tokens_per_minute),
                _limit_arg(limits.max_concurrent_requests),
                tokens,
                reservation_id,
                self.window_s * 1000,
                self.lease_ttl_s * 1000,
            ],
        )
        ok, req, tok, num_inflight = _parse(raw)
        if ok:
            reservation = Reservation(
                reservation_id, tenant_id, tokens, "redis", limits.tokens_per_minute
            )
            verdict = Verdict(None, 0.0, False)
            return make_decision(
                limits, verdict, req, tok, num_inflight, self.window_s, reservation
            )
        verdict = judge(limits, req, tok, num_inflight, tokens, self.window_s)
        # The script and `judge` run the same comparisons on the same doubles.
        assert verdict.kind is not None, (req, tok, num_inflight, limits, tokens)
        return make_decision(limits, verdict, req, tok, num_inflight, self.window_s, None)

    async def charge(self, reservation: Reservation, tokens: int) -> bool:
        """Take `tokens` more (debt allowed) while the lease is held."""
        validate_tokens(tokens)
        _, tok_key, leases_key = self.keys(reservation.tenant_id)
        held = await self._charge(
            keys=[tok_key, leases_key],
            args=[
                reservation.reservation_id,
                tokens,
                self.window_s * 1000,
                _limit_arg(reservation.tokens_per_minute),
            ],
        )
        return int(held) == 1

    async def release(self, reservation: Reservation, tokens_used: int) -> bool:
        """Free the lease, settle the tokens. False if already released, expired or lost
        (e.g. Redis was flushed)."""
        _, tok_key, leases_key = self.keys(reservation.tenant_id)
        freed = await self._release(
            keys=[tok_key, leases_key],
            args=[
                reservation.reservation_id,
                reservation.tokens - max(0, tokens_used),
                self.window_s * 1000,
                _limit_arg(reservation.tokens_per_minute),
            ],
        )
        return int(freed) == 1

    async def peek(self, tenant_id: str, limits: TenantLimits) -> RateLimitDecision:
        """Header numbers now; takes nothing (the verdict is for a 0-token request)."""
        raw = await self._peek(
            keys=list(self.keys(tenant_id)),
            args=[
                _limit_arg(limits.requests_per_minute),
                _limit_arg(limits.tokens_per_minute),
                self.window_s * 1000,
            ],
        )
        req, tok, num_inflight = float(raw[0]), float(raw[1]), int(raw[2])
        verdict = judge(limits, req, tok, num_inflight, 0, self.window_s)
        return make_decision(limits, verdict, req, tok, num_inflight, self.window_s, None)

    async def ping(self) -> bool:
        return bool(await self.client.ping())

    async def aclose(self) -> None:
        if self._owns_client:
            await self.client.aclose()


def _limit_arg(limit: int | None) -> int:
    return -1 if limit is None else limit


def _parse(raw: Sequence[bytes | str | int]) -> tuple[bool, float, float, int]:
    return int(raw[0]) == 1, float(raw[1]), float(raw[2]), int(raw[3])
