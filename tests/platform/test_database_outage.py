"""PostgreSQL unreachable mid-run: requests get a retryable 503 (auth fails closed), /ready
says so, pending usage records are kept, and everything resumes when the database returns."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import psycopg
import pytest
from sqlalchemy import func, select
from sqlalchemy.engine import make_url

from loraplex.platform.db import UsageRecord
from tests.platform.platform_harness import POSTGRES_URL, Platform, _libpq_url


@pytest.fixture
def backend() -> str:
    return "postgres"


@pytest.fixture
def settings_overrides() -> dict[str, object]:
    return {"usage_flush_interval_s": 3600.0}  # flushes happen when the test says


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
    _, headers = await server.tenant("acme")
    body = {"model": server.model_name, "prompt": "Hello", "max_tokens": 2}
    assert (await c.post("/v1/completions", headers=headers, json=body)).status_code == 200
    assert server.state.usage.num_pending == 1

    start_outage()
    r = await c.post("/v1/completions", headers=headers, json=body)
    assert r.status_code == 503, r.text
    assert r.json()["error"]["code"] == "service_unavailable" and r.headers["retry-after"]
    ready = await c.get("/ready")
    assert ready.status_code == 503 and ready.json()["checks"]["database"] == "unavailable"
    assert (await c.get("/health")).status_code == 200
    assert await server.state.usage.flush() == 0
    assert server.state.usage.num_pending == 1  # kept for later, not lost

    end_outage()
    assert (await c.post("/v1/completions", headers=headers, json=body)).status_code == 200
    assert await server.state.usage.flush() == 2
    with server.state.db.session() as session:
        assert session.scalar(select(func.count()).select_from(UsageRecord)) == 2
    assert (await c.get("/ready")).status_code == 200
