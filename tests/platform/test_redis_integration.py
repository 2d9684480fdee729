"""The app with Redis: limits shared by two app instances; Redis unreachable fails open to
the in-process limiter (requests keep flowing) while /ready reports it."""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from tests.platform.platform_harness import make_settings, require_redis, running_platform


@pytest.fixture
def redis_prefix() -> Iterator[tuple[str, str]]:
    url = require_redis()
    prefix = f"loraplex-test-{secrets.token_hex(6)}:"
    yield url, prefix
    client = redis.Redis.from_url(url)
    keys = list(client.scan_iter(match=f"{prefix}*"))
    if keys:
        client.delete(*keys)
    client.close()


async def test_two_instances_share_limits(
    tmp_path: Path,
    tiny_model_dir: Path,
    adapter_sources: dict[str, Path],
    redis_prefix: tuple[str, str],
) -> None:
    url, prefix = redis_prefix
    settings = make_settings(
        tmp_path / "data",
        tiny_model_dir,
        f"sqlite:///{tmp_path / 'shared.db'}",
        redis_url=url,
        redis_key_prefix=prefix,
    )
    body = {"model": "tiny-llama", "prompt": "hi", "max_tokens": 1}
    async with (
        running_platform(settings, tiny_model_dir, adapter_sources) as one,
        running_platform(settings, tiny_model_dir, adapter_sources) as two,
    ):
        _, headers = await one.tenant("acme", requests_per_minute=2)
        for server in (one, two):
            ready = await server.client.get("/ready")
            assert ready.json()["checks"]["redis"] == "ok"
            r = await server.client.post("/v1/completions", headers=headers, json=body)
            assert r.status_code == 200, r.text
        assert one.state.limiter.backend == "redis"
        for server in (one, two):  # the two requests above used the shared budget up
            r = await server.client.post("/v1/completions", headers=headers, json=body)
            assert r.status_code == 429 and r.json()["error"]["type"] == "requests"
    assert redis.Redis.from_url(url).keys(f"{prefix}*")


async def test_redis_down_fails_open_to_local_limits(
    tmp_path: Path, tiny_model_dir: Path, adapter_sources: dict[str, Path]
) -> None:
    settings = make_settings(
        tmp_path / "data",
        tiny_model_dir,
        f"sqlite:///{tmp_path / 'r.db'}",
        redis_url="redis://127.0.0.1:1/0",
    )
    async with running_platform(settings, tiny_model_dir, adapter_sources) as server:
        _, headers = await server.tenant("acme", requests_per_minute=2)
        body = {"model": "tiny-llama", "prompt": "hi", "max_tokens": 1}
        for _ in range(2):
            r = await server.client.post("/v1/completions", headers=headers, json=body)
            assert r.status_code == 200, r.text
        r = await server.client.post("/v1/completions", headers=headers, json=body)
        assert r.status_code == 429  # still limited: locally, not unlimited
        ready = await server.client.get("/ready")
        assert ready.status_code == 503 and ready.json()["checks"]["redis"] == "unavailable"
        r = await server.client.get("/metrics", headers=server.admin)
        [line] = [
            ln for ln in r.text.splitlines() if ln.startswith("loraplex_ratelimit_fallback_total")
        ]
        assert float(line.split()[-1]) >= 3
