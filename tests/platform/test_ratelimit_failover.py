"""FailoverRateLimiter against a Redis server this test starts, kills, restarts and flushes.

Never touches the machine's shared Redis. Without the redis-server binary the tests skip,
except in CI (env CI set), where they fail.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import socket
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator

import pytest
import redis
from redis.exceptions import ConnectionError as RedisConnectionError

from loraplex.platform.ratelimit import (
    FailoverRateLimiter,
    RateLimitDecision,
    Reservation,
    TenantLimits,
    create_rate_limiter,
)


class RedisServer:
    """A throwaway redis-server on a free localhost port, without persistence."""

    def __init__(self, binary: str) -> None:
        self.binary = binary
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            self.port = sock.getsockname()[1]
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        assert self.proc is None
        self.proc = subprocess.Popen(
            [self.binary, "--port", str(self.port), "--bind", "127.0.0.1"]
            + ["--save", "", "--appendonly", "no"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        client = redis.Redis(port=self.port, socket_connect_timeout=0.2)
        deadline = time.monotonic() + 10
        while True:
            try:
                client.ping()
                break
            except redis.exceptions.ConnectionError:
                if time.monotonic() > deadline or self.proc.poll() is not None:
                    raise RuntimeError(f"redis-server did not start on port {self.port}") from None
                time.sleep(0.05)
            finally:
                client.close()

    def stop(self) -> None:
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait(timeout=10)
        self.proc = None

    def sync_client(self) -> redis.Redis:
        return redis.Redis(port=self.port)


@pytest.fixture
def redis_server() -> Iterator[RedisServer]:
    binary = shutil.which("redis-server")
    if binary is None:
        if os.environ.get("CI"):
            pytest.fail("redis-server is required in CI")
        pytest.skip("redis-server binary not found")
    server = RedisServer(binary)
    server.start()
    yield server
    if server.proc is not None:
        server.stop()


class FakeClock:
    """Drives the probe schedule; bucket time comes from the Redis server."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _make(
    server: RedisServer, clock: FakeClock, on_fallback: Callable[[], None] | None = None
) -> FailoverRateLimiter:
    return FailoverRateLimiter(
        server.url,
        f"test-fo-{uuid.uuid4().hex}",
        probe_interval_s=5.0,
        timeout_s=0.3,
        clock=clock,
        on_fallback=on_fallback,
    )


def _held(decision: RateLimitDecision) -> Reservation:
    assert decision.allowed and decision.reservation is not None
    return decision.reservation


async def test_redis_killed_and_restarted(
    redis_server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    clock = FakeClock()
    fallbacks: list[int] = []
    limiter = _make(redis_server, clock, on_fallback=lambda: fallbacks.append(1))
    limits = TenantLimits(requests_per_minute=5)
    try:
        for _ in range(3):
            decision = await limiter.acquire("t", limits, 0)
            assert decision.allowed and decision.reservation is not None
            assert decision.reservation.backend == "redis"
        held = decision.reservation

        redis_server.stop()
        caplog.clear()
        with caplog.at_level(logging.WARNING):
            # Requests keep flowing, limited in-process: 5 per minute, not unlimited.
            local = [await limiter.acquire("t", limits, 0) for _ in range(6)]
            assert [d.allowed for d in local] == [True] * 5 + [False]
            assert local[-1].kind == "requests"
            assert {_held(d).backend for d in local[:5]} == {"local"}
            assert limiter.is_degraded and limiter.backend == "local"
            assert not await limiter.release(held, 0)  # queued for when Redis returns
            assert await limiter.release(_held(local[0]), 0)
        warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
        assert len(warnings) == 1  # once per outage, not once per request
        assert len(fallbacks) == 6 and limiter.num_fallbacks == 6

        redis_server.start()  # same port, empty data set
        # No probe before the interval: still the local limiter, whose bucket is spent.
        assert not (await limiter.acquire("t", limits, 0)).allowed
        assert limiter.backend == "local"
        clock.now += 5.0
        resumed = [await limiter.acquire("t", limits, 0) for _ in range(6)]
        assert {_held(d).backend for d in resumed[:5]} == {"redis"}
        assert [d.allowed for d in resumed] == [True] * 5 + [False]  # limits resume in Redis
        assert limiter.backend == "redis" and not limiter.is_degraded
        assert limiter.num_outages == 1
    finally:
        await limiter.aclose()


async def test_flushall_mid_run(redis_server: RedisServer) -> None:
    limiter = _make(redis_server, FakeClock())
    limits = TenantLimits(requests_per_minute=3, tokens_per_minute=100, max_concurrent_requests=2)
    try:
        held = await limiter.acquire("t", limits, 50)
        assert held.reservation is not None and held.reservation.backend == "redis"
        admin = redis_server.sync_client()
        admin.flushall()
        admin.script_flush()  # the scripts must reload themselves (NOSCRIPT)
        admin.close()
        assert not await limiter.release(held.reservation, 0)  # its lease is gone: no refund
        decisions = [await limiter.acquire("t", limits, 10) for _ in range(3)]
        assert [d.allowed for d in decisions] == [True, True, False]
        assert decisions[-1].kind == "concurrency"
        assert {_held(d).backend for d in decisions[:2]} == {"redis"}
        assert limiter.num_fallbacks == 0
    finally:
        await limiter.aclose()


async def test_release_queued_during_outage_is_replayed(redis_server: RedisServer) -> None:
    clock = FakeClock()
    limiter = _make(redis_server, clock)
    limits = TenantLimits(max_concurrent_requests=1)
    try:
        held = await limiter.acquire("t", limits, 0)
        assert held.reservation is not None and held.reservation.backend == "redis"
        assert limiter.redis is not None
        real_release = limiter.redis.release

        async def broken_release(reservation: Reservation, tokens_used: int) -> bool:
            raise RedisConnectionError("simulated outage")

        limiter.redis.release = broken_release  # type: ignore[method-assign,unused-ignore]
        assert not await limiter.release(held.reservation, 0)
        assert limiter.is_degraded
        limiter.redis.release = real_release  # type: ignore[method-assign,unused-ignore]
        clock.now += 5.0
        assert await limiter.ping()  # Redis answers: the queued release is replayed
        assert not limiter.is_degraded
        peek = await limiter.peek("t", limits)
        assert peek.concurrency is not None and peek.concurrency.remaining == 1
        assert (await limiter.acquire("t", limits, 0)).allowed
    finally:
        await limiter.aclose()


async def test_unreachable_at_start_fails_open_to_local(redis_server: RedisServer) -> None:
    redis_server.stop()
    limiter = _make(redis_server, FakeClock())
    try:
        started = time.monotonic()
        decisions = await asyncio.gather(
            *(limiter.acquire("t", TenantLimits(max_concurrent_requests=3), 0) for _ in range(4))
        )
        assert time.monotonic() - started < 2.0  # fails fast, no retry storm
        assert [d.allowed for d in decisions] == [True, True, True, False]
        assert not await limiter.ping()
    finally:
        await limiter.aclose()


async def test_without_url_is_local_only() -> None:
    fallbacks: list[int] = []
    limiter = create_rate_limiter(None, "unused", on_fallback=lambda: fallbacks.append(1))
    decision = await limiter.acquire("t", TenantLimits(requests_per_minute=1), 5)
    assert decision.allowed and decision.reservation is not None
    assert decision.reservation.backend == "local"
    assert not (await limiter.acquire("t", TenantLimits(requests_per_minute=1), 5)).allowed
    assert limiter.backend == "local" and not limiter.is_degraded and await limiter.ping()
    assert fallbacks == [] and limiter.num_fallbacks == 0
    assert await limiter.release(decision.reservation, 0)
    await limiter.aclose()
