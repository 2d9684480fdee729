"""Rate-limit semantics, run against both the local limiter and the Redis limiter (real Redis).

Outside CI the Redis half skips when Redis is unreachable; with CI set it fails instead.
"""

from __future__ import annotations

import asyncio
import os
import re
import uuid
from collections.abc import AsyncIterator, Callable

import pytest
import redis.asyncio as aioredis
from redis.exceptions import RedisError

from loraplex.platform.ratelimit import (
    LocalRateLimiter,
    RateLimitDecision,
    RateLimiter,
    RedisRateLimiter,
    TenantLimits,
    rate_limit_headers,
)
from loraplex.platform.ratelimit.redis_limiter import create_redis_client

REDIS_URL = os.environ.get("LORAPLEX_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
RESET_RE = re.compile(r"^(\d+ms|(\d+h)?(\d+m)?\d+(\.\d+)?s)$")

Factory = Callable[..., RateLimiter]


@pytest.fixture
async def redis_client() -> AsyncIterator[tuple[aioredis.Redis, str]]:
    """A client on the shared test Redis and a fresh key prefix; deletes its keys after."""
    client = create_redis_client(REDIS_URL)
    try:
        await client.ping()
    except (RedisError, OSError) as exc:
        await client.aclose()
        if os.environ.get("CI"):
            pytest.fail(f"Redis at {REDIS_URL} is required in CI: {exc}")
        pytest.skip(f"Redis at {REDIS_URL} unreachable: {exc}")
    prefix = f"test-rl-{uuid.uuid4().hex}"
    yield client, prefix
    keys = [key async for key in client.scan_iter(match=f"{prefix}:*")]
    if keys:
        await client.delete(*keys)
    await client.aclose()


@pytest.fixture(params=["local", "redis"])
def make_limiter(request: pytest.FixtureRequest) -> Factory:
    """`make_limiter(window_s=..., lease_ttl_s=...)`; each Redis limiter shares one prefix."""
    if request.param == "local":

        def make_local(**kwargs: float) -> RateLimiter:
            return LocalRateLimiter(**kwargs)

        return make_local
    client, prefix = request.getfixturevalue("redis_client")

    def make_redis(**kwargs: float) -> RateLimiter:
        return RedisRateLimiter(client, prefix, **kwargs)

    return make_redis


def _assert_headers(decision: RateLimitDecision, kind: str, limit: int, remaining: int) -> None:
    headers = rate_limit_headers(decision)
    assert headers[f"x-ratelimit-limit-{kind}"] == str(limit)
    assert headers[f"x-ratelimit-remaining-{kind}"] == str(remaining)
    assert RESET_RE.match(headers[f"x-ratelimit-reset-{kind}"]), headers


async def test_requests_limit(make_limiter: Factory) -> None:
    limiter = make_limiter()
    limits = TenantLimits(requests_per_minute=3, tokens_per_minute=1000)
    for i in range(3):
        decision = await limiter.acquire("t", limits, 10)
        assert decision.allowed and decision.reservation is not None
        _assert_headers(decision, "requests", 3, 2 - i)
    refused = await limiter.acquire("t", limits, 10)
    assert not refused.allowed and refused.reservation is None
    assert refused.kind == "requests" and not refused.exceeds_capacity
    assert refused.retry_after == 20  # one request refills every 60 s / 3
    headers = rate_limit_headers(refused)
    assert headers["retry-after"] == "20"
    _assert_headers(refused, "requests", 3, 0)
    _assert_headers(refused, "tokens", 1000, 970)  # the refusal took no tokens


async def test_tokens_limit(make_limiter: Factory) -> None:
    limiter = make_limiter()
    limits = TenantLimits(requests_per_minute=10, tokens_per_minute=100)
    assert (await limiter.acquire("t", limits, 60)).allowed
    refused = await limiter.acquire("t", limits, 50)
    assert not refused.allowed and refused.kind == "tokens"
    assert refused.retry_after == 6  # 10 missing tokens at 100 per 60 s
    _assert_headers(refused, "tokens", 100, 40)
    _assert_headers(refused, "requests", 10, 9)  # the refusal took no request
    assert rate_limit_headers(refused)["retry-after"] == "6"
    assert (await limiter.acquire("t", limits, 40)).allowed


async def test_tokens_beyond_capacity_can_never_pass(make_limiter: Factory) -> None:
    limiter = make_limiter()
    refused = await limiter.acquire("t", TenantLimits(tokens_per_minute=100), 101)
    assert not refused.allowed and refused.kind == "tokens" and refused.exceeds_capacity
    assert refused.retry_after == 60


async def test_concurrency_limit(make_limiter: Factory) -> None:
    limiter = make_limiter()
    limits = TenantLimits(requests_per_minute=100, max_concurrent_requests=2)
    first = await limiter.acquire("t", limits, 0)
    second = await limiter.acquire("t", limits, 0)
    assert first.allowed and second.allowed
    refused = await limiter.acquire("t", limits, 0)
    assert not refused.allowed and refused.kind == "concurrency"
    assert refused.retry_after == 1 and rate_limit_headers(refused)["retry-after"] == "1"
    _assert_headers(refused, "requests", 100, 98)  # the refusal took no request
    assert first.reservation is not None
    assert await limiter.release(first.reservation, 0)
    assert (await limiter.acquire("t", limits, 0)).allowed


async def test_first_failing_kind_named_and_longest_wait_given(make_limiter: Factory) -> None:
    limiter = make_limiter()
    limits = TenantLimits(requests_per_minute=1, tokens_per_minute=60, max_concurrent_requests=1)
    assert (await limiter.acquire("t", limits, 60)).allowed
    refused = await limiter.acquire("t", limits, 30)
    assert refused.kind == "requests"
    assert refused.retry_after == 60  # requests wait 60 s, tokens 30 s: the longer one


async def test_refund_of_unused_tokens_restores_capacity(make_limiter: Factory) -> None:
    limiter = make_limiter()
    limits = TenantLimits(tokens_per_minute=100)
    decision = await limiter.acquire("t", limits, 80)
    assert decision.reservation is not None and decision.reservation.tokens == 80
    assert not (await limiter.acquire("t", limits, 70)).allowed
    assert await limiter.release(decision.reservation, 30)  # 50 unused tokens come back
    peek = await limiter.peek("t", limits)
    assert peek.tokens is not None and peek.tokens.remaining == 70
    assert (await limiter.acquire("t", limits, 70)).allowed


async def test_release_is_idempotent(make_limiter: Factory) -> None:
    limiter = make_limiter()
    limits = TenantLimits(tokens_per_minute=100, max_concurrent_requests=1)
    held = await limiter.acquire("t", limits, 50)
    assert held.reservation is not None
    assert await limiter.release(held.reservation, 0)
    assert not await limiter.release(held.reservation, 0)  # no second refund or slot
    other = await limiter.acquire("t", limits, 10)
    assert other.allowed
    peek = await limiter.peek("t", limits)
    assert peek.tokens is not None and peek.tokens.remaining == 90
    assert not (await limiter.acquire("t", limits, 1)).allowed  # the one slot is taken


async def test_used_beyond_reserved_goes_into_debt(make_limiter: Factory) -> None:
    limiter = make_limiter()
    limits = TenantLimits(tokens_per_minute=100)
    decision = await limiter.acquire("t", limits, 40)
    assert decision.reservation is not None
    assert await limiter.release(decision.reservation, 500)  # 460 more than it held
    peek = await limiter.peek("t", limits)
    assert peek.tokens is not None and peek.tokens.remaining == 0
    refused = await limiter.acquire("t", limits, 1)
    assert refused.kind == "tokens" and not refused.exceeds_capacity
    # The debt is repaid by waiting: 400 below zero, 100 tokens a minute.
    assert refused.retry_after_s is not None and 239 < refused.retry_after_s <= 241


async def test_charges_while_held(make_limiter: Factory) -> None:
    limiter = make_limiter()
    limits = TenantLimits(tokens_per_minute=100)
    held = (await limiter.acquire("t", limits, 30)).reservation
    assert held is not None and held.tokens_per_minute == 100
    assert await limiter.charge(held, 50)
    peek = await limiter.peek("t", limits)
    assert peek.tokens is not None and peek.tokens.remaining == 20
    assert await limiter.charge(held, 50)  # below zero: debt
    assert not (await limiter.acquire("t", limits, 1)).allowed
    # Settled at release: it held 30 + 50 + 50 and used 70, so 60 come back.
    grown = type(held)(held.reservation_id, "t", 130, held.backend, 100)
    assert await limiter.release(grown, 70)
    peek = await limiter.peek("t", limits)
    assert peek.tokens is not None and peek.tokens.remaining == 30
    assert not await limiter.charge(held, 1)  # released: nothing more is taken


async def test_refill_over_time(make_limiter: Factory) -> None:
    limiter = make_limiter(window_s=1.0)  # 2 requests per second: one every 0.5 s
    limits = TenantLimits(requests_per_minute=2)
    assert (await limiter.acquire("t", limits, 0)).allowed
    assert (await limiter.acquire("t", limits, 0)).allowed
    refused = await limiter.acquire("t", limits, 0)
    assert not refused.allowed and refused.retry_after_s is not None
    assert 0.3 < refused.retry_after_s <= 0.5
    await asyncio.sleep(refused.retry_after_s + 0.1)
    assert (await limiter.acquire("t", limits, 0)).allowed
    assert not (await limiter.acquire("t", limits, 0)).allowed


async def test_concurrency_leases_expire(make_limiter: Factory) -> None:
    limiter = make_limiter(lease_ttl_s=0.3)  # as if the replica holding it had crashed
    limits = TenantLimits(max_concurrent_requests=1)
    held = await limiter.acquire("t", limits, 0)
    assert held.allowed and held.reservation is not None
    assert not (await limiter.acquire("t", limits, 0)).allowed
    await asyncio.sleep(0.4)
    assert (await limiter.acquire("t", limits, 0)).allowed
    assert not await limiter.release(held.reservation, 0)  # expired: nothing left to free


async def test_unlimited_tenant(make_limiter: Factory) -> None:
    limiter = make_limiter()
    for _ in range(20):
        decision = await limiter.acquire("t", TenantLimits(), 10_000)
        assert decision.allowed and decision.reservation is not None
        assert rate_limit_headers(decision) == {}


async def test_zero_limit_admits_nothing(make_limiter: Factory) -> None:
    limiter = make_limiter()
    refused = await limiter.acquire("t", TenantLimits(requests_per_minute=0), 0)
    assert refused.kind == "requests" and refused.exceeds_capacity


async def test_tenants_are_independent(make_limiter: Factory) -> None:
    limiter = make_limiter()
    limits = TenantLimits(requests_per_minute=1)
    assert (await limiter.acquire("a", limits, 0)).allowed
    assert not (await limiter.acquire("a", limits, 0)).allowed
    assert (await limiter.acquire("b", limits, 0)).allowed


async def test_concurrent_acquires_never_overshoot(make_limiter: Factory) -> None:
    first = make_limiter()
    # Redis: two replicas on one Redis; local state is per process, so one object.
    limiters = [first, first if isinstance(first, LocalRateLimiter) else make_limiter()]
    limits = TenantLimits(requests_per_minute=100, tokens_per_minute=1000)
    decisions = await asyncio.gather(*(limiters[i % 2].acquire("t", limits, 30) for i in range(60)))
    assert sum(d.allowed for d in decisions) == 33  # 1000 // 30 tokens


async def test_peek_takes_nothing(make_limiter: Factory) -> None:
    limiter = make_limiter()
    limits = TenantLimits(requests_per_minute=2, tokens_per_minute=10)
    for _ in range(3):
        peek = await limiter.peek("t", limits)
        assert peek.allowed and peek.reservation is None
        _assert_headers(peek, "requests", 2, 2)
        _assert_headers(peek, "tokens", 10, 10)


async def test_invalid_arguments(make_limiter: Factory) -> None:
    limiter = make_limiter()
    with pytest.raises(ValueError):
        await limiter.acquire("t", TenantLimits(), -1)
    with pytest.raises(ValueError):
        TenantLimits(requests_per_minute=-1)


async def test_two_redis_instances_share_limits(redis_client: tuple[aioredis.Redis, str]) -> None:
    client, prefix = redis_client
    one = RedisRateLimiter.from_url(REDIS_URL, prefix)
    two = RedisRateLimiter.from_url(REDIS_URL, prefix)
    try:
        limits = TenantLimits(requests_per_minute=2, tokens_per_minute=100)
        held = await one.acquire("t", limits, 60)
        assert (await two.acquire("t", limits, 40)).allowed
        refused = await two.acquire("t", limits, 1)
        assert refused.kind == "requests"
        _assert_headers(refused, "tokens", 100, 0)
        assert held.reservation is not None
        assert await two.release(held.reservation, 10)  # released by the other replica
        assert not await one.release(held.reservation, 10)
        peek = await one.peek("t", limits)
        assert peek.tokens is not None and peek.tokens.remaining == 50
    finally:
        await one.aclose()
        await two.aclose()


async def test_redis_keys_expire(redis_client: tuple[aioredis.Redis, str]) -> None:
    client, prefix = redis_client
    limiter = RedisRateLimiter(client, prefix, window_s=60.0, lease_ttl_s=600.0)
    limits = TenantLimits(requests_per_minute=5, tokens_per_minute=50, max_concurrent_requests=2)
    assert (await limiter.acquire("t", limits, 5)).allowed
    req_key, tok_key, leases_key = limiter.keys("t")
    assert 0 < await client.pttl(req_key) <= 61_000
    assert 0 < await client.pttl(tok_key) <= 61_000
    assert 0 < await client.pttl(leases_key) <= 601_000
