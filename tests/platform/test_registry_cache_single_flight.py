"""The registry cache's single flight: a burst of misses on one entry shares one look-up in
the thread pool; a waiter that leaves does not cancel it, a failure is not remembered, and a
miss after a clear starts its own look-up. (Through the app: test_registry_cache.py's
test_a_burst_on_a_cold_cache_reads_the_registry_as_one_request_does.)"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

from loraplex.platform.registry_cache import ModelEntry, RegistryCache
from tests.platform.test_registry_cache import ADAPTER, KEY, MODEL, tenant_context


class BlockingLoader:
    """A look-up that counts its calls and blocks (in its worker thread) until released."""

    def __init__(self, result: Any = None, error: Exception | None = None) -> None:
        self.result, self.error = result, error
        self.calls = 0
        self.release = threading.Event()

    def __call__(self) -> Any:
        self.calls += 1
        assert self.release.wait(10)
        if self.error is not None:
            raise self.error
        return self.result


async def test_a_burst_of_misses_is_looked_up_once() -> None:
    cache = RegistryCache(5.0)
    load = BlockingLoader(tenant_context())
    waiters = [asyncio.create_task(cache.load_tenant(KEY, load)) for _ in range(20)]
    await asyncio.sleep(0.05)
    load.release.set()
    assert await asyncio.gather(*waiters) == [tenant_context()] * 20
    assert load.calls == 1 and cache.tenant(KEY) == tenant_context()
    assert await cache.load_tenant(KEY, load) == tenant_context() and load.calls == 1  # a hit

    found = BlockingLoader(ADAPTER)  # adapters too; "no such adapter" is not remembered
    found.release.set()
    assert await cache.load_adapter(MODEL, found) == ADAPTER
    missing = BlockingLoader(None)
    missing.release.set()
    other = ModelEntry(1, "nope")
    assert await cache.load_adapter(other, missing) is None
    assert await cache.load_adapter(other, missing) is None and missing.calls == 2


async def test_a_waiter_that_leaves_does_not_cancel_the_look_up() -> None:
    cache = RegistryCache(5.0)
    load = BlockingLoader(tenant_context())
    first = asyncio.create_task(cache.load_tenant(KEY, load))
    second = asyncio.create_task(cache.load_tenant(KEY, load))
    await asyncio.sleep(0.05)
    first.cancel()  # the client of the request that started the look-up disconnected
    load.release.set()
    assert await second == tenant_context()
    assert first.cancelled() and load.calls == 1 and cache.tenant(KEY) == tenant_context()


async def test_a_failed_look_up_fails_its_waiters_and_is_not_remembered() -> None:
    cache = RegistryCache(5.0)
    load = BlockingLoader(error=ValueError("no such key"))
    waiters = [asyncio.create_task(cache.load_tenant(KEY, load)) for _ in range(3)]
    await asyncio.sleep(0.05)
    load.release.set()
    results = await asyncio.gather(*waiters, return_exceptions=True)
    assert [type(r) for r in results] == [ValueError] * 3 and load.calls == 1
    with pytest.raises(ValueError):
        await cache.load_tenant(KEY, load)  # looked up again
    assert load.calls == 2 and len(cache) == 0


async def test_a_miss_after_a_clear_does_not_wait_for_an_older_look_up() -> None:
    cache = RegistryCache(5.0)
    old = BlockingLoader(tenant_context())
    before = asyncio.create_task(cache.load_tenant(KEY, old))
    await asyncio.sleep(0.05)
    cache.clear()  # e.g. the key's revocation committed while `old` read the database
    new = BlockingLoader(error=ValueError("revoked"))
    new.release.set()
    with pytest.raises(ValueError):
        await cache.load_tenant(KEY, new)
    old.release.set()
    assert await before == tenant_context()  # it arrived before the clear
    assert cache.tenant(KEY) is None  # and its answer is not stored after it
    assert (old.calls, new.calls) == (1, 1)


async def test_ttl_zero_looks_up_every_miss() -> None:
    cache = RegistryCache(0.0)
    load = BlockingLoader(tenant_context())
    load.release.set()
    await asyncio.gather(*(cache.load_tenant(KEY, load) for _ in range(3)))
    assert load.calls == 3
