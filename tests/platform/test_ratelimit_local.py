"""LocalRateLimiter with an injected clock: exact refill arithmetic and lease expiry."""

from __future__ import annotations

from loraplex.platform.ratelimit import LocalRateLimiter, TenantLimits, rate_limit_headers


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def test_requests_refill_one_per_interval() -> None:
    clock = FakeClock()
    limiter = LocalRateLimiter(clock=clock)
    limits = TenantLimits(requests_per_minute=60)
    for _ in range(60):
        assert (await limiter.acquire("t", limits, 0)).allowed
    refused = await limiter.acquire("t", limits, 0)
    assert refused.kind == "requests" and refused.retry_after_s == 1.0
    headers = rate_limit_headers(refused)
    assert headers["x-ratelimit-reset-requests"] == "1m0s"
    assert headers["retry-after"] == "1"
    clock.now += 0.5
    assert not (await limiter.acquire("t", limits, 0)).allowed
    clock.now += 0.5
    assert (await limiter.acquire("t", limits, 0)).allowed
    clock.now += 600  # long idle: the bucket is full, never above the limit
    for _ in range(60):
        assert (await limiter.acquire("t", limits, 0)).allowed
    assert not (await limiter.acquire("t", limits, 0)).allowed


async def test_tokens_reset_header_and_refund_after_refill() -> None:
    clock = FakeClock()
    limiter = LocalRateLimiter(clock=clock)
    limits = TenantLimits(tokens_per_minute=600)  # 10 tokens per second
    held = await limiter.acquire("t", limits, 300)
    assert held.reservation is not None
    assert rate_limit_headers(held)["x-ratelimit-reset-tokens"] == "30s"
    clock.now += 10  # +100 refilled: 400
    assert await limiter.release(held.reservation, 100)  # +200 refunded: 600, capped
    peek = await limiter.peek("t", limits)
    assert peek.tokens is not None and peek.tokens.remaining == 600
    assert peek.tokens.reset_s == 0.0


async def test_lease_expiry_with_clock() -> None:
    clock = FakeClock()
    limiter = LocalRateLimiter(lease_ttl_s=600, clock=clock)
    limits = TenantLimits(max_concurrent_requests=2)
    assert (await limiter.acquire("t", limits, 0)).allowed
    clock.now += 300
    assert (await limiter.acquire("t", limits, 0)).allowed
    assert not (await limiter.acquire("t", limits, 0)).allowed
    assert limiter.num_inflight("t") == 2
    clock.now += 300  # the first lease expires
    assert limiter.num_inflight("t") == 1
    assert (await limiter.acquire("t", limits, 0)).allowed


async def test_limit_lowered_between_calls() -> None:
    clock = FakeClock()
    limiter = LocalRateLimiter(clock=clock)
    assert (await limiter.acquire("t", TenantLimits(tokens_per_minute=1000), 10)).allowed
    lowered = TenantLimits(tokens_per_minute=100)
    peek = await limiter.peek("t", lowered)
    assert peek.tokens is not None and peek.tokens.remaining == 100  # capped at the new limit
    assert (await limiter.acquire("t", lowered, 100)).allowed
    assert not (await limiter.acquire("t", lowered, 1)).allowed
