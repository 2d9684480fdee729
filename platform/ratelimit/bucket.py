"""Token-bucket arithmetic shared by the local limiter (and mirrored line by line in the Lua
scripts of the Redis limiter, which must give the same answers).

A bucket of capacity C holds a level of at most C (below 0 when a request generated more tokens
than it had reserved: a debt that later requests repay by waiting) and refills C units per
window W:

    level(now) = min(C, level(t) + (now - t) * C / W)

An absent bucket is full. A request needing n units passes when level >= n; after it, the
bucket is full again after (C - level) * W / C seconds (the `reset` header).
"""

from __future__ import annotations

from dataclasses import dataclass

from .limits import LimitKind, LimitState, RateLimitDecision, Reservation, TenantLimits

# When a concurrency slot frees is unknowable (a request ends); suggest polling at 1 s.
CONCURRENCY_RETRY_S = 1.0


def refilled(level: float, updated_at: float, capacity: int, now: float, window_s: float) -> float:
    if capacity <= 0:
        return 0.0
    return min(float(capacity), level + max(0.0, now - updated_at) * capacity / window_s)


def reset_after(level: float, capacity: int, window_s: float) -> float:
    """Seconds until the bucket is full again."""
    if capacity <= 0:
        return 0.0
    return max(0.0, (capacity - level) * window_s / capacity)


@dataclass(frozen=True, slots=True)
class Verdict:
    kind: LimitKind | None  # None = every limit passes
    retry_after_s: float
    exceeds_capacity: bool


def judge(
    limits: TenantLimits,
    req_level: float,
    tok_level: float,
    num_inflight: int,
    tokens: int,
    window_s: float,
) -> Verdict:
    """Check requests, then tokens, then concurrency. The first failure names the kind; the
    wait is the longest of the failing ones so that a retry after it can pass."""
    kind: LimitKind | None = None
    wait = 0.0
    exceeds = False
    rpm = limits.requests_per_minute
    if rpm is not None and req_level < 1:
        kind = "requests"
        if rpm < 1:
            exceeds, wait = True, window_s
        else:
            wait = (1 - req_level) * window_s / rpm
    tpm = limits.tokens_per_minute
    if tpm is not None and tok_level < tokens:
        kind = kind or "tokens"
        if tokens > tpm:
            exceeds, tok_wait = True, window_s
        else:
            tok_wait = (tokens - tok_level) * window_s / tpm
        wait = max(wait, tok_wait)
    max_concurrent = limits.max_concurrent_requests
    if max_concurrent is not None and num_inflight >= max_concurrent:
        kind = kind or "concurrency"
        exceeds = exceeds or max_concurrent == 0
        wait = max(wait, CONCURRENCY_RETRY_S)
    return Verdict(kind, wait, exceeds)


def make_decision(
    limits: TenantLimits,
    verdict: Verdict,
    req_level: float,
    tok_level: float,
    num_inflight: int,
    window_s: float,
    reservation: Reservation | None,
) -> RateLimitDecision:
    """Levels and in-flight count are after the take when allowed, before it when refused."""
    rpm, tpm = limits.requests_per_minute, limits.tokens_per_minute
    max_concurrent = limits.max_concurrent_requests
    requests = (
        None
        if rpm is None
        else LimitState(rpm, max(0, int(req_level)), reset_after(req_level, rpm, window_s))
    )
    tokens = (
        None
        if tpm is None
        else LimitState(tpm, max(0, int(tok_level)), reset_after(tok_level, tpm, window_s))
    )
    concurrency = (
        None
        if max_concurrent is None
        else LimitState(max_concurrent, max(0, max_concurrent - num_inflight), 0.0)
    )
    allowed = verdict.kind is None
    return RateLimitDecision(
        allowed=allowed,
        reservation=reservation if allowed else None,
        kind=verdict.kind,
        retry_after_s=None if allowed else verdict.retry_after_s,
        requests=requests,
        tokens=tokens,
        concurrency=concurrency,
        exceeds_capacity=verdict.exceeds_capacity,
    )
