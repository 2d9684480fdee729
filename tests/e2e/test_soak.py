"""A bounded soak: mixed streaming and JSON traffic, completions and chat, several tenants and
adapters, random client disconnects at every stage, against a live server on PostgreSQL and
Redis (LORAPLEX_SOAK_S seconds, 180 by default). Afterwards nothing is left behind: no request
running or in flight, no KV block held by a request (resident adapters may keep theirs), no
adapter pin, no rate-limit reservation, no usage row pending; every request a client saw
complete is billed exactly what it received, and the rows add up to the engine's own count."""

from __future__ import annotations

import asyncio
import json
import os
import random
import secrets
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import redis
from sqlalchemy import select

from loraplex.platform import crud
from loraplex.platform.adapter_validator import engine_adapter_validator
from loraplex.platform.db import UsageRecord
from loraplex.platform.storage import AdapterStore
from tests.e2e.live_server import LiveServer, running_server
from tests.platform.platform_harness import make_settings, postgres_database, require_redis

SOAK_S = float(os.environ.get("LORAPLEX_SOAK_S", "180"))
NUM_CLIENTS = 12
TENANTS = {f"t{i}": {"max_concurrent_requests": 4} for i in range(4)}
OK_STATUSES = {200, 429}


@pytest.fixture
def soak_server(
    tmp_path: Path, tiny_model_dir: Path, adapter_sources: dict[str, Path]
) -> Iterator[LiveServer]:
    redis_url = require_redis()
    prefix = f"loraplex-soak-{secrets.token_hex(6)}:"
    with postgres_database() as database_url:
        settings = make_settings(
            tmp_path / "data",
            tiny_model_dir,
            database_url,
            redis_url=redis_url,
            redis_key_prefix=prefix,
            max_model_len=512,
            max_completion_tokens=128,
            max_num_seqs=16,
        )
        with running_server(settings, tiny_model_dir, adapter_sources["r4"], TENANTS) as server:
            with server.app_state.db.session() as session:  # a second adapter for two tenants
                for name in ("t2", "t3"):
                    crud.register_adapter(
                        session,
                        AdapterStore(settings.resolved_adapter_dir),
                        engine_adapter_validator(tiny_model_dir, settings.max_lora_rank),
                        tenant_id=server.tenant_id(name),
                        name="poet",
                        source_dir=adapter_sources["r8"],
                        base_model=tiny_model_dir.name,
                    )
            yield server
        client = redis.Redis.from_url(redis_url)
        for key in client.scan_iter(match=f"{prefix}*"):
            client.delete(key)
        client.close()


class Client:
    """One simulated user: random requests until the deadline; what it saw complete."""

    def __init__(self, server: LiveServer, seed: int) -> None:
        self.server = server
        self.rng = random.Random(seed)
        self.completed: dict[str, int] = {}  # request id -> completion tokens received
        self.statuses: list[int] = []

    def body(self, tenant: str) -> tuple[str, dict[str, object]]:
        models = ["tiny-llama", "bot", *(["poet"] if tenant in ("t2", "t3") else [])]
        fields: dict[str, object] = {
            "model": self.rng.choice(models),
            "max_tokens": self.rng.choice([None, self.rng.randint(1, 128)]),
            "ignore_eos": self.rng.random() < 0.7,
            "temperature": self.rng.choice([0.0, 1.0]),
        }
        if self.rng.random() < 0.5:
            return "/v1/completions", {**fields, "prompt": "Once upon a time " * 3}
        return "/v1/chat/completions", {**fields, "messages": [{"role": "user", "content": "Hi"}]}

    async def run(self, deadline: float) -> None:
        async with httpx.AsyncClient(base_url=self.server.base_url, timeout=60) as http:
            while time.monotonic() < deadline:
                tenant = self.rng.choice(list(TENANTS))
                headers = {"Authorization": f"Bearer {self.server.keys[tenant]}"}
                path, body = self.body(tenant)
                action = self.rng.random()
                if action < 0.3:
                    await self.complete(http, path, headers, body)
                elif action < 0.6:
                    await self.stream(http, path, headers, body, leave_after=None)
                elif action < 0.8:
                    await self.stream(http, path, headers, body, self.rng.randint(0, 6))
                elif action < 0.95:
                    await self.give_up(path, headers, body, self.rng.uniform(0.0, 0.3))
                else:
                    await self.hang_up(path, headers, body)

    async def complete(self, http: httpx.AsyncClient, path: str, headers: dict, body: dict) -> None:
        r = await http.post(path, headers=headers, json=body)
        self.statuses.append(r.status_code)
        if r.status_code == 200:
            self.completed[r.json()["id"]] = r.json()["usage"]["completion_tokens"]

    async def stream(
        self,
        http: httpx.AsyncClient,
        path: str,
        headers: dict,
        body: dict,
        leave_after: int | None,
    ) -> None:
        body = {**body, "stream": True, "stream_options": {"include_usage": True}}
        async with http.stream("POST", path, headers=headers, json=body) as r:
            self.statuses.append(r.status_code)
            lines = []
            async for line in r.aiter_lines():
                if leave_after is not None and len(lines) >= leave_after:
                    return  # closing the response drops the connection mid-stream
                if line:
                    lines.append(line)
        if r.status_code == 200:
            assert lines[-1] == "data: [DONE]" and '"error"' not in lines[-2], lines[-3:]
            usage = json.loads(lines[-2].removeprefix("data: "))
            self.completed[usage["id"]] = usage["usage"]["completion_tokens"]

    async def give_up(self, path: str, headers: dict, body: dict, after_s: float) -> None:
        """A JSON request whose client stops waiting (its connection closes)."""
        async with httpx.AsyncClient(base_url=self.server.base_url, timeout=60) as http:
            try:
                r = await asyncio.wait_for(http.post(path, headers=headers, json=body), after_s)
            except TimeoutError:
                return
        self.statuses.append(r.status_code)
        if r.status_code == 200:
            self.completed[r.json()["id"]] = r.json()["usage"]["completion_tokens"]

    async def hang_up(self, path: str, headers: dict, body: dict) -> None:
        """A socket closed right after sending its request."""
        host, port = self.server.base_url.removeprefix("http://").split(":")
        _, writer = await asyncio.open_connection(host, int(port))
        payload = json.dumps(body).encode()
        head = [
            f"POST {path} HTTP/1.1",
            "Host: loraplex",
            "Content-Type: application/json",
            f"Authorization: {headers['Authorization']}",
            f"Content-Length: {len(payload)}",
        ]
        writer.write(("\r\n".join(head) + "\r\n\r\n").encode() + payload)
        await writer.drain()
        writer.close()


def test_soak_leaves_nothing_behind(soak_server: LiveServer) -> None:
    server = soak_server
    clients = [Client(server, seed) for seed in range(NUM_CLIENTS)]

    async def soak() -> None:
        deadline = time.monotonic() + SOAK_S
        await asyncio.gather(*(client.run(deadline) for client in clients))

    asyncio.run(soak())
    statuses = [status for client in clients for status in client.statuses]
    assert set(statuses) <= OK_STATUSES, sorted(set(statuses))
    completed = {k: v for client in clients for k, v in client.completed.items()}
    assert len(completed) >= 20, "the soak barely ran"

    stats = server.wait_until_idle(timeout_s=30)
    print(
        f"soak {SOAK_S:.0f}s: {len(statuses)} answered ({statuses.count(429)} x 429), "
        f"{len(completed)} seen complete, {stats.num_generated_tokens} tokens generated"
    )
    engine = server.app_state.engine.engine.engine
    assert stats.num_running == stats.num_waiting == stats.num_swapped == 0
    assert stats.kv_blocks_used == 0  # resident adapters may keep their pages
    engine.kv_cache_manager.check_integrity()
    lora = engine.lora_manager
    assert lora is not None
    lora.check_integrity()
    assert (stats.lora.num_requests_holding, stats.lora.num_requests_pinning) == (0, 0)
    limiter = server.app_state.limiter
    assert limiter.redis is not None
    for name in TENANTS:
        tenant_id = str(server.tenant_id(name))
        assert limiter.local.num_inflight(tenant_id) == 0, name
        leases = limiter.redis.keys(tenant_id)[2]
        assert server.run(limiter.redis.client.zcard(leases)) == 0, name

    rows = server.usage_rows()
    assert server.app_state.usage.num_pending == 0
    by_id = {row.request_id: row for row in rows}
    wrong = {
        k: (v, by_id[k].completion_tokens if k in by_id else None) for k, v in completed.items()
    }
    assert all(seen == billed for seen, billed in wrong.values()), {
        k: v for k, v in wrong.items() if v[0] != v[1]
    }
    with server.app_state.db.session() as session:
        billed = sum(session.scalars(select(UsageRecord.completion_tokens)))
    assert billed == stats.num_generated_tokens  # the engine's own count, aborted ones too
