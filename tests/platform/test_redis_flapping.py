"""Redis flapping during a load run: every request is answered (200 or an honest 429, never a
5xx), limits fail over to the in-process limiter and back, and once Redis is steady again no
lease is left held in either place."""

from __future__ import annotations

import asyncio
import random
import secrets
from pathlib import Path

import redis
from sqlalchemy.engine import make_url

from tests.platform.platform_harness import (
    Platform,
    make_settings,
    require_redis,
    running_platform,
)
from tests.tcp_proxy import tcp_proxy


async def one_request(p: Platform, headers: dict[str, str], rng: random.Random) -> int:
    body = {"model": p.model_name, "prompt": "Once upon", "max_tokens": 24, "ignore_eos": True}
    if rng.random() < 0.5:
        r = await p.client.post("/v1/completions", headers=headers, json=body)
        return r.status_code
    async with p.client.stream(
        "POST", "/v1/completions", headers=headers, json={**body, "stream": True}
    ) as r:
        lines = [line async for line in r.aiter_lines() if line]
    if r.status_code == 200:
        assert lines[-1] == "data: [DONE]" and not any('"error"' in ln for ln in lines), lines
    return r.status_code


async def test_redis_flapping_under_load(
    tmp_path: Path, tiny_model_dir: Path, adapter_sources: dict[str, Path]
) -> None:
    url = make_url(require_redis())
    prefix = f"loraplex-flap-{secrets.token_hex(6)}:"
    with tcp_proxy(url.host or "127.0.0.1", url.port or 6379) as proxy:
        settings = make_settings(
            tmp_path / "data",
            tiny_model_dir,
            f"sqlite:///{tmp_path / 'r.db'}",
            redis_url=f"redis://127.0.0.1:{proxy.port}/{url.database or 0}",
            redis_key_prefix=prefix,
        )
        async with running_platform(settings, tiny_model_dir, adapter_sources) as server:
            tenants = [await server.tenant(f"t{i}", max_concurrent_requests=3) for i in range(3)]
            rng = random.Random(7)
            flapping = True

            async def flap() -> None:
                while flapping:
                    proxy.down()
                    await asyncio.sleep(rng.uniform(0.05, 0.3))
                    proxy.up()
                    await asyncio.sleep(rng.uniform(0.05, 0.3))

            async def tenant_load(headers: dict[str, str]) -> list[int]:
                statuses = []
                for _ in range(20):
                    statuses.append(await one_request(server, headers, rng))
                return statuses

            flapper = asyncio.create_task(flap())
            results = await asyncio.gather(
                *(tenant_load(headers) for _, headers in tenants for _ in range(4))
            )
            flapping = False
            await flapper
            proxy.up()
            statuses = [status for batch in results for status in batch]
            assert set(statuses) <= {200, 429}, sorted(set(statuses))
            assert statuses.count(200) >= len(statuses) // 3  # 4 clients, 3 slots a tenant
            limiter = server.state.limiter
            assert limiter.num_outages >= 1  # it did fail over

            # Steady again: back on Redis (after one probe interval), releases replayed.
            for _ in range(200):
                await server.client.get("/v1/models", headers=tenants[0][1])
                if limiter.backend == "redis":
                    break
                await asyncio.sleep(0.05)
            assert limiter.backend == "redis"
            client = redis.Redis.from_url(url.render_as_string(hide_password=False))
            for tenant, _ in tenants:
                leases = limiter.redis.keys(str(tenant["id"]))[2] if limiter.redis else ""
                assert client.zcard(leases) == 0, tenant
                assert limiter.local.num_inflight(str(tenant["id"])) == 0
            for key in client.scan_iter(match=f"{prefix}*"):
                client.delete(key)
            client.close()
            r = await server.client.post(
                "/v1/completions",
                headers=tenants[0][1],
                json={"model": server.model_name, "prompt": "x", "max_tokens": 2},
            )
            assert r.status_code == 200
