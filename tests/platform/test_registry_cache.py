"""The registry cache: what it keeps, for how long, and which commits clear it; and, through the
real app, that a repeated request reads nothing from the registry while every change made
through the server applies to the very next request."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import event, insert, select, update

from loraplex.platform import crud
from loraplex.platform.auth import TenantContext
from loraplex.platform.crud import AdapterRef
from loraplex.platform.db import (
    Adapter,
    ApiKey,
    Database,
    Tenant,
    TenantTier,
    UsageRecord,
    upgrade,
)
from loraplex.platform.registry_cache import CredentialEntry, ModelEntry, RegistryCache
from loraplex.platform.schemas import ApiKeyCreate, TenantCreate
from loraplex.platform.settings import Settings
from tests.platform.platform_harness import Platform


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def tenant_context(expires_at: datetime | None = None) -> TenantContext:
    return TenantContext(1, "acme", TenantTier.STANDARD, 10, 10, 10, 7, expires_at)


ADAPTER = AdapterRef(adapter_id=3, model_id="bot", path="/adapters/x", content_hash="ab" * 32)
KEY = CredentialEntry("digest")
MODEL = ModelEntry(1, "bot")


def test_entries_live_for_the_ttl_and_never_past_the_credential() -> None:
    clock = FakeClock()
    cache = RegistryCache(5.0, clock=clock)
    cache.put_tenant(KEY, tenant_context(), cache.generation)
    cache.put_adapter(MODEL, ADAPTER, cache.generation)
    clock.now += 4.9
    assert cache.tenant(KEY) == tenant_context() and cache.adapter(MODEL) == ADAPTER
    clock.now += 0.1
    assert cache.tenant(KEY) is None and cache.adapter(MODEL) is None
    assert len(cache) == 0  # expired entries are dropped when read

    # A credential that expires in 2 s is cached for (at most) 2 s, one that has expired not at all.
    soon = tenant_context(datetime.now(UTC) + timedelta(seconds=2))
    cache.put_tenant(KEY, soon, cache.generation)
    clock.now += 1.5
    assert cache.tenant(KEY) == soon
    clock.now += 1.0
    assert cache.tenant(KEY) is None
    cache.put_tenant(KEY, tenant_context(datetime.now(UTC) - timedelta(seconds=1)), 1)
    assert len(cache) == 0


def test_a_look_up_that_began_before_a_clear_is_not_stored() -> None:
    cache = RegistryCache(5.0)
    before = cache.generation
    cache.clear()  # e.g. a revocation committed while the look-up read the database
    cache.put_tenant(KEY, tenant_context(), before)
    assert cache.tenant(KEY) is None
    cache.put_tenant(KEY, tenant_context(), cache.generation)
    assert cache.tenant(KEY) is not None


def test_ttl_zero_caches_nothing_and_the_oldest_entry_goes_first() -> None:
    off = RegistryCache(0.0)
    off.put_adapter(MODEL, ADAPTER, off.generation)
    assert off.adapter(MODEL) is None and len(off) == 0

    cache = RegistryCache(5.0, max_entries=2)
    for i in range(3):
        cache.put_adapter(ModelEntry(1, f"bot{i}"), ADAPTER, cache.generation)
    assert len(cache) == 2
    assert cache.adapter(ModelEntry(1, "bot0")) is None
    assert cache.adapter(ModelEntry(1, "bot2")) == ADAPTER


@pytest.fixture
def watched_db(tmp_path: Path) -> Iterator[tuple[Database, RegistryCache]]:
    url = f"sqlite:///{tmp_path / 'registry.db'}"
    upgrade(url)
    db = Database(url)
    cache = RegistryCache(60.0)
    cache.watch(db.session_factory)
    yield db, cache
    db.dispose()


def _filled(cache: RegistryCache) -> int:
    cache.put_adapter(MODEL, ADAPTER, cache.generation)
    return cache.generation


def test_commits_that_change_registry_rows_clear_the_cache(
    watched_db: tuple[Database, RegistryCache],
) -> None:
    db, cache = watched_db
    settings = Settings()  # create_tenant reads only its default limits
    generation = _filled(cache)
    with db.session() as session:
        tenant = crud.create_tenant(session, TenantCreate(name="acme"), settings)
        tenant_id = tenant.id
    assert cache.adapter(MODEL) is None and cache.generation == generation + 1

    generation = _filled(cache)
    with db.session() as session:
        row = session.get(Tenant, tenant_id)
        assert row is not None
        row.tokens_per_minute = 5
        session.flush()
        assert cache.adapter(MODEL) == ADAPTER  # nothing is committed yet
        session.commit()
    assert cache.adapter(MODEL) is None and cache.generation == generation + 1


def test_commits_that_leave_the_answers_alone_keep_the_cache(
    watched_db: tuple[Database, RegistryCache],
) -> None:
    db, cache = watched_db
    settings = Settings()
    with db.session() as session:
        tenant = crud.create_tenant(session, TenantCreate(name="acme"), settings)
        key_row, _ = crud.create_api_key(session, tenant.id, ApiKeyCreate(), b"secret")
        key_id = key_row.id
    generation = _filled(cache)
    with db.session() as session:  # what authentication writes once a minute per key
        row = session.get(ApiKey, key_id)
        assert row is not None
        row.last_used_at = datetime.now(UTC)
        session.commit()
    with db.session() as session:  # usage rows, one by one or in bulk (the usage writer)
        session.add(_usage_row(tenant_id=tenant.id))
        session.commit()
        session.execute(insert(UsageRecord), [_usage_values(tenant.id)])
        session.commit()
    with db.session() as session:  # a change rolled back
        row = session.get(Tenant, tenant.id)
        assert row is not None
        row.status = "suspended"
        session.flush()
        session.rollback()
    assert cache.adapter(MODEL) == ADAPTER and cache.generation == generation


def _usage_values(tenant_id: int) -> dict[str, Any]:
    return {
        "request_id": "cmpl-1",
        "tenant_id": tenant_id,
        "model": "base",
        "endpoint": "completions",
        "prompt_tokens": 1,
        "completion_tokens": 1,
        "latency_ms": 1,
        "status": "ok",
    }


def _usage_row(tenant_id: int) -> UsageRecord:
    return UsageRecord(**_usage_values(tenant_id))


def completion(model: str) -> dict[str, Any]:
    return {"model": model, "prompt": "Hello there", "max_tokens": 2, "temperature": 0}


REGISTRY_TABLES = ("api_keys", "tenants", "adapters", "adapter_grants")


@pytest.fixture(params=["sqlite", "postgres"])
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


async def test_a_repeated_request_reads_nothing_from_the_registry(server: Platform) -> None:
    tenant, headers = await server.tenant("acme")
    await server.add_adapter(tenant["id"], "bot")
    c = server.client
    assert (await c.post("/v1/completions", headers=headers, json=completion("bot"))).is_success

    statements: list[str] = []

    def record(_conn: object, _cursor: object, statement: str, *_args: object) -> None:
        statements.append(statement)

    engine = server.state.db.engine
    event.listen(engine, "before_cursor_execute", record)
    try:
        for _ in range(3):
            r = await c.post("/v1/completions", headers=headers, json=completion("bot"))
            assert r.status_code == 200, r.text
    finally:
        event.remove(engine, "before_cursor_execute", record)
    registry_reads = [s for s in statements if any(t in s for t in REGISTRY_TABLES)]
    assert registry_reads == []
    assert any("usage_records" in s for s in statements)  # the listener did see this app's SQL


async def test_changes_through_the_server_apply_to_the_next_request(server: Platform) -> None:
    c = server.client
    admin = server.admin
    owner, owner_headers = await server.tenant("alpha")
    guest, guest_headers = await server.tenant("bravo")
    first = await server.add_adapter(owner["id"], "bot")
    url = f"/admin/v1/adapters/{first['id']}/grants"
    assert (await c.post(url, headers=admin, json={"tenant_id": guest["id"]})).status_code == 201
    assert (
        await c.post("/v1/completions", headers=guest_headers, json=completion("alpha/bot"))
    ).status_code == 200

    # A removed grant: 404 at once, though the guest's look-up was cached.
    assert (await c.delete(f"{url}/{guest['id']}", headers=admin)).status_code == 204
    r = await c.post("/v1/completions", headers=guest_headers, json=completion("alpha/bot"))
    assert r.status_code == 404, r.text

    # A new version: the name follows it at once.
    assert (
        await c.post("/v1/completions", headers=owner_headers, json=completion("bot"))
    ).status_code == 200
    second = await server.add_adapter(owner["id"], "bot", source="r8")
    assert (
        await c.post("/v1/completions", headers=owner_headers, json=completion("bot"))
    ).status_code == 200
    cached = server.state.registry_cache.adapter(ModelEntry(owner["id"], "bot"))
    assert cached is not None and cached.adapter_id == second["id"] != first["id"]

    # Lowered limits apply to the next request's admission.
    r = await c.patch(
        f"/admin/v1/tenants/{owner['id']}", json={"tokens_per_minute": 3}, headers=admin
    )
    assert r.status_code == 200
    r = await c.post("/v1/completions", headers=owner_headers, json=completion("bot"))
    assert r.status_code == 400 and "tokens per minute" in r.json()["error"]["message"], r.text


async def test_changes_by_another_process_apply_within_the_ttl(server: Platform) -> None:
    clock = FakeClock()
    cache = RegistryCache(5.0, clock=clock)
    cache.watch(server.state.db.session_factory)
    server.state.registry_cache = cache
    tenant, headers = await server.tenant("acme")
    c = server.client
    body = completion(server.model_name)
    assert (await c.post("/v1/completions", headers=headers, json=body)).status_code == 200

    # The CLI, or another server on this database: its commits are not this process's.
    other = Database(server.settings.resolved_database_url)
    try:
        with other.session() as session:
            session.execute(update(ApiKey).values(revoked_at=datetime.now(UTC)))
            session.commit()
            assert session.scalars(select(ApiKey.revoked_at)).one() is not None
    finally:
        other.dispose()
    clock.now += 4.0
    assert (await c.post("/v1/completions", headers=headers, json=body)).status_code == 200
    clock.now += 1.0
    r = await c.post("/v1/completions", headers=headers, json=body)
    assert r.status_code == 401, r.text


async def test_bulk_statements_through_the_server_clear_the_cache(server: Platform) -> None:
    tenant, headers = await server.tenant("acme")
    c = server.client
    body = completion(server.model_name)
    assert (await c.post("/v1/completions", headers=headers, json=body)).status_code == 200
    with server.state.db.session() as session:
        session.execute(update(ApiKey).values(revoked_at=datetime.now(UTC)))
        session.commit()
    r = await c.post("/v1/completions", headers=headers, json=body)
    assert r.status_code == 401, r.text

    # A new version inserted by a bulk statement: the name follows it at once.
    first = await server.add_adapter(tenant["id"], "bot")
    headers = {"Authorization": f"Bearer {await server.create_key(tenant['id'])}"}
    assert (await c.post("/v1/completions", headers=headers, json=completion("bot"))).is_success
    with server.state.db.session() as session:
        row = session.get(Adapter, first["id"])
        assert row is not None
        values = {c.key: getattr(row, c.key) for c in Adapter.__table__.columns if c.key != "id"}
        new_id = session.execute(
            insert(Adapter).values(**{**values, "version": row.version + 1}).returning(Adapter.id)
        ).scalar_one()
        session.commit()
    assert (await c.post("/v1/completions", headers=headers, json=completion("bot"))).is_success
    cached = server.state.registry_cache.adapter(ModelEntry(tenant["id"], "bot"))
    assert cached is not None and cached.adapter_id == new_id


async def test_a_burst_on_a_cold_cache_reads_the_registry_as_one_request_does(
    server: Platform,
) -> None:
    tenant, headers = await server.tenant("acme")
    await server.add_adapter(tenant["id"], "bot")
    c = server.client
    engine = server.state.db.engine

    async def registry_reads(num_requests: int) -> list[str]:
        server.state.registry_cache.clear()  # cold, as after the TTL
        statements: list[str] = []

        def record(_conn: object, _cursor: object, statement: str, *_args: object) -> None:
            statements.append(statement)

        event.listen(engine, "before_cursor_execute", record)
        try:
            responses = await asyncio.gather(
                *(c.post("/v1/completions", headers=headers, json=completion("bot"))
                  for _ in range(num_requests))
            )  # fmt: skip
        finally:
            event.remove(engine, "before_cursor_execute", record)
        assert all(r.status_code == 200 for r in responses)
        return [
            s
            for s in statements
            if s.lstrip().upper().startswith("SELECT") and any(t in s for t in REGISTRY_TABLES)
        ]

    one = await registry_reads(1)
    assert one  # the key, its tenant and the adapter were read
    assert len(await registry_reads(12)) == len(one)
