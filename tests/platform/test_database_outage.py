"""PostgreSQL unreachable mid-run or at start: requests get a retryable 503 (auth fails closed
for every credential the registry cache does not hold), /ready says why, usage records of
requests that end meanwhile are kept, the server starts anyway, and everything resumes when the
database returns."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from pathlib import Path

import anyio
import httpx
import psycopg
import pytest
from sqlalchemy import func, select
from sqlalchemy.engine import make_url

from loraplex.platform import crud
from loraplex.platform.app import create_app
from loraplex.platform.db import Database, UsageRecord, upgrade
from loraplex.platform.schemas import ApiKeyCreate, TenantCreate
from tests.platform.platform_harness import (
    POSTGRES_URL,
    Platform,
    _libpq_url,
    make_settings,
)


@pytest.fixture
def backend() -> str:
    return "postgres"


@pytest.fixture
def settings_overrides() -> dict[str, object]:
    # Flushes happen when a request waits for its row or the test says; a long request can
    # still be running when the outage starts. Cached credentials live longer than the test.
    return {
        "usage_flush_interval_s": 3600.0,
        "max_model_len": 2048,
        "max_completion_tokens": 2000,
        "registry_cache_ttl_s": 300.0,
    }


@pytest.fixture
def outage(database_url: str) -> Iterator[tuple[Callable[[], None], Callable[[], None]]]:
    name = make_url(database_url).database
    admin = psycopg.connect(_libpq_url(POSTGRES_URL), autocommit=True)

    def start() -> None:
        admin.execute(f'ALTER DATABASE "{name}" WITH ALLOW_CONNECTIONS false')
        admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = %s AND pid <> pg_backend_pid()",
            (name,),
        )

    def end() -> None:
        admin.execute(f'ALTER DATABASE "{name}" WITH ALLOW_CONNECTIONS true')

    yield start, end
    end()
    admin.close()


async def test_postgres_down_mid_run(
    server: Platform, outage: tuple[Callable[[], None], Callable[[], None]]
) -> None:
    start_outage, end_outage = outage
    c = server.client
    tenant, headers = await server.tenant("acme")
    unused = {"Authorization": f"Bearer {await server.create_key(tenant['id'])}"}
    body = {"model": server.model_name, "prompt": "Hello", "max_tokens": 2}
    assert (await c.post("/v1/completions", headers=headers, json=body)).status_code == 200
    assert server.state.usage.num_pending == 0  # committed before the answer went out

    long = {**body, "max_tokens": 1500, "ignore_eos": True}
    running = asyncio.create_task(c.post("/v1/completions", headers=headers, json=long))
    while server.state.engine.get_stats().num_generated_tokens < 20:
        await asyncio.sleep(0.005)
    start_outage()  # while that request is generating
    # A key never checked before cannot be checked now: 503, never a guess.
    r = await c.post("/v1/completions", headers=unused, json=body)
    assert r.status_code == 503, r.text
    assert r.json()["error"]["code"] == "service_unavailable" and r.headers["retry-after"]
    # The key checked moments ago is in the registry cache: served, its row kept for later.
    r = await c.post("/v1/completions", headers=headers, json=body)
    assert r.status_code == 200, r.text
    # Its row is kept. The long request's row may be kept by now too: on a fast CPU it ends
    # while this request waits up to DURABLE_WAIT_S (platform/usage.py) for its row.
    assert server.state.usage.num_pending >= 1
    ready = await c.get("/ready")
    assert ready.status_code == 503 and ready.json()["checks"]["database"] == "unavailable"
    assert "does not answer" in ready.json()["reasons"]["database"]
    assert (await c.get("/health")).status_code == 200
    r = await running  # it ends during the outage: answered after a bounded wait for its row
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 1500
    assert server.state.usage.num_pending == 2  # their rows are kept for later, not lost
    assert await server.state.usage.flush() == 0

    end_outage()
    assert (await c.post("/v1/completions", headers=headers, json=body)).status_code == 200
    assert server.state.usage.num_pending == 0
    with server.state.db.session() as session:
        assert session.scalar(select(func.count()).select_from(UsageRecord)) == 4
    assert (await c.get("/ready")).status_code == 200


async def test_postgres_down_at_start(
    tmp_path: Path,
    tiny_model_dir: Path,
    database_url: str,
    outage: tuple[Callable[[], None], Callable[[], None]],
) -> None:
    """The server starts without its database, says why it is not ready, and serves as soon
    as the database answers."""
    start_outage, end_outage = outage
    settings = make_settings(tmp_path / "data", tiny_model_dir, database_url)
    await anyio.to_thread.run_sync(upgrade, database_url)
    db = Database(database_url)
    with db.session() as session:
        tenant = crud.create_tenant(session, TenantCreate(name="acme"), settings)
        _, key = crud.create_api_key(
            session, tenant.id, ApiKeyCreate(), settings.api_key_hash_secret()
        )
    db.dispose()
    headers = {"Authorization": f"Bearer {key}"}
    body = {"model": "tiny-llama", "prompt": "Hello", "max_tokens": 2}
    start_outage()
    app = create_app(settings)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as c:
            ready = await c.get("/ready")
            assert ready.status_code == 503, ready.text
            assert ready.json()["checks"] == {"database": "unavailable", "engine": "ok"}
            assert "does not answer" in ready.json()["reasons"]["database"]
            r = await c.post("/v1/completions", headers=headers, json=body)
            assert r.status_code == 503 and r.headers["retry-after"] == "5"

            end_outage()
            ready = await c.get("/ready")
            assert ready.status_code == 200, ready.text
            assert ready.json() == {
                "status": "ready",
                "checks": {"database": "ok", "engine": "ok"},
                "reasons": {},
            }
            r = await c.post("/v1/completions", headers=headers, json=body)
            assert r.status_code == 200, r.text


async def test_an_unmigrated_database_back_from_an_outage_is_a_503_that_says_what_to_do(
    tmp_path: Path,
    tiny_model_dir: Path,
    database_url: str,
    outage: tuple[Callable[[], None], Callable[[], None]],
) -> None:
    """Started while the database was down, the server could not check its schema; the
    database comes back empty (nobody ran `loraplex db upgrade`). Authenticated routes answer
    503 naming the fix (not a 500 on a missing table) until the schema is there."""
    start_outage, end_outage = outage
    settings = make_settings(tmp_path / "data", tiny_model_dir, database_url)
    start_outage()
    app = create_app(settings)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as c:
            end_outage()
            headers = {"Authorization": "Bearer lpx-" + "x" * 43}
            for method, route in (("GET", "/v1/models"), ("GET", "/admin/v1/tenants")):
                r = await c.request(method, route, headers=headers)
                assert r.status_code == 503, r.text
                assert "loraplex db upgrade" in r.json()["error"]["message"]
            ready = await c.get("/ready")
            assert ready.json()["checks"]["database"] == "not_migrated"

            await anyio.to_thread.run_sync(upgrade, database_url)
            assert (await c.get("/v1/models", headers=headers)).status_code == 401
            assert (await c.get("/ready")).status_code == 200
