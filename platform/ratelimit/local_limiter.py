"""In-process rate limiter: the embedded default, and the fallback while Redis is down.

Same semantics as RedisRateLimiter, but the state lives in this process only, so several
replicas each enforce the full limit. Stops a tenant from monopolising this replica; it is
never "no limit".
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

from .bucket import judge, make_decision, refilled
from .limits import (
    DEFAULT_LEASE_TTL_S,
    DEFAULT_WINDOW_S,
    RateLimitDecision,
    Reservation,
    TenantLimits,
    validate_tokens,
)

# Above this many tenants, idle state (full buckets, no leases) is dropped on the next call.
_PRUNE_ABOVE = 10_000


@dataclass(slots=True)
class _Bucket:
    level: float
    updated_at: float
    capacity: int


@dataclass(slots=True)
class _TenantState:
    requests: _Bucket | None = None
    tokens: _Bucket | None = None
    leases: dict[str, float] = field(default_factory=dict)  # reservation id -> expiry


class LocalRateLimiter:
    """Token buckets and lease tables in a dict, guarded by one lock.

    The lock is a threading.Lock, not an asyncio.Lock: nothing inside awaits, so it is held
    for microseconds, and it stays correct across event loops and threads (tests and the
    app's lifespan may run on different loops).
    """

    def __init__(
        self,
        *,
        window_s: float = DEFAULT_WINDOW_S,
        lease_ttl_s: float = DEFAULT_LEASE_TTL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        assert window_s > 0 and lease_ttl_s > 0
        self.window_s = window_s
        self.lease_ttl_s = lease_ttl_s
        self._clock = clock
        self._lock = threading.Lock()
        self._tenants: dict[str, _TenantState] = {}

    async def acquire(self, tenant_id: str, limits: TenantLimits, tokens: int) -> RateLimitDecision:
        """All-or-nothing: 1 request + `tokens` + 1 lease, or nothing and the failing kind."""
        validate_tokens(tokens)
        with self._lock:
            now = self._clock()
            if len(self._tenants) > _PRUNE_ABOVE:
                self._prune(now)
            state = self._tenants.setdefault(tenant_id, _TenantState())
            req = self._level(state.requests, limits.requests_per_minute, now)
            tok = self._level(state.tokens, limits.tokens_per_minute, now)
            self._expire_leases(state, now)
            verdict = judge(limits, req, tok, len(state.leases), tokens, self.window_s)
            if verdict.kind is not None:
                return make_decision(
                    limits, verdict, req, tok, len(state.leases), self.window_s, None
                )
            if limits.requests_per_minute is not None:
                req -= 1
                state.requests = _Bucket(req, now, limits.requests_per_minute)
            if limits.tokens_per_minute is not None:
                tok -= tokens
                state.tokens = _Bucket(tok, now, limits.tokens_per_minute)
            reservation = Reservation(
                uuid.uuid4().hex, tenant_id, tokens, "local", limits.tokens_per_minute
            )
            state.leases[reservation.reservation_id] = now + self.lease_ttl_s
            return make_decision(
                limits, verdict, req, tok, len(state.leases), self.window_s, reservation
            )

    async def charge(self, reservation: Reservation, tokens: int) -> bool:
        """Take `tokens` more (debt allowed) while the lease is held."""
        validate_tokens(tokens)
        with self._lock:
            state = self._tenants.get(reservation.tenant_id)
            if state is None or reservation.reservation_id not in state.leases:
                return False
            self._add_tokens(state, reservation, -tokens)
            return True

    async def release(self, reservation: Reservation, tokens_used: int) -> bool:
        """Free the lease, settle the tokens. False if already released or expired."""
        with self._lock:
            state = self._tenants.get(reservation.tenant_id)
            if state is None or state.leases.pop(reservation.reservation_id, None) is None:
                return False
            self._add_tokens(state, reservation, reservation.tokens - max(0, tokens_used))
            return True

    def _add_tokens(self, state: _TenantState, reservation: Reservation, delta: int) -> None:
        """Refund (`delta` > 0) or charge (< 0) the tokens bucket; it never exceeds capacity
        and may go below zero."""
        capacity = reservation.tokens_per_minute
        if delta == 0 or capacity is None:
            return
        now = self._clock()
        level = self._level(state.tokens, capacity, now)
        state.tokens = _Bucket(min(capacity, level + delta), now, capacity)

    async def peek(self, tenant_id: str, limits: TenantLimits) -> RateLimitDecision:
        """Header numbers now; takes nothing (the verdict is for a 0-token request)."""
        with self._lock:
            now = self._clock()
            state = self._tenants.get(tenant_id) or _TenantState()
            req = self._level(state.requests, limits.requests_per_minute, now)
            tok = self._level(state.tokens, limits.tokens_per_minute, now)
            num_inflight = sum(1 for expiry in state.leases.values() if expiry > now)
            verdict = judge(limits, req, tok, num_inflight, 0, self.window_s)
            return make_decision(limits, verdict, req, tok, num_inflight, self.window_s, None)

    async def aclose(self) -> None:
        return None

    def num_inflight(self, tenant_id: str) -> int:
        """Live leases of a tenant."""
        with self._lock:
            state = self._tenants.get(tenant_id)
            if state is None:
                return 0
            self._expire_leases(state, self._clock())
            return len(state.leases)

    def _level(self, bucket: _Bucket | None, capacity: int | None, now: float) -> float:
        if capacity is None:
            return 0.0
        if bucket is None:
            return float(capacity)
        # The tenant's limit may have changed since the last write: refill towards the new one.
        return refilled(bucket.level, bucket.updated_at, capacity, now, self.window_s)

    @staticmethod
    def _expire_leases(state: _TenantState, now: float) -> None:
        expired = [rid for rid, expiry in state.leases.items() if expiry <= now]
        for rid in expired:
            del state.leases[rid]

    def _prune(self, now: float) -> None:
        idle = [
            tenant_id
            for tenant_id, state in self._tenants.items()
            if not state.leases
            and _is_full(state.requests, now, self.window_s)
            and _is_full(state.tokens, now, self.window_s)
        ]
        for tenant_id in idle:
            del self._tenants[tenant_id]


def _is_full(bucket: _Bucket | None, now: float, window_s: float) -> bool:
    if bucket is None:
        return True
    level = refilled(bucket.level, bucket.updated_at, bucket.capacity, now, window_s)
    return level >= bucket.capacity
