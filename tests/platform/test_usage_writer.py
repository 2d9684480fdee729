"""UsageWriter: batched inserts, retries through a database outage, nothing lost on stop."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select
from sqlalchemy.exc import OperationalError

from loraplex.platform import usage as usage_module
from loraplex.platform.db import Database, Tenant, UsageRecord, upgrade
from loraplex.platform.usage import UsageEvent, UsageWriter


@pytest.fixture
def db(tmp_path: Path) -> Iterator[Database]:
    url = f"sqlite:///{tmp_path / 'usage.db'}"
    upgrade(url)
    database = Database(url)
    with database.session() as session:
        session.add(
            Tenant(
                name="acme", requests_per_minute=1, tokens_per_minute=1, max_concurrent_requests=1
            )
        )
        session.commit()
    yield database
    database.dispose()


def event(i: int, tenant_id: int = 1, **fields: Any) -> UsageEvent:
    values: dict[str, Any] = {
        "request_id": f"r{i}",
        "tenant_id": tenant_id,
        "api_key_id": None,
        "adapter_id": None,
        "model": "m",
        "endpoint": "completions",
        "prompt_tokens": 3,
        "completion_tokens": i,
        "latency_ms": 5,
        "status": "ok",
    }
    values.update(fields)
    return UsageEvent(**values)


def request_ids(db: Database) -> list[str]:
    with db.session() as session:
        return list(session.scalars(select(UsageRecord.request_id).order_by(UsageRecord.id)))


async def test_batches_in_the_background(db: Database) -> None:
    writer = UsageWriter(db, batch_size=3, flush_interval_s=30)
    await writer.start()
    for i in range(3):
        writer.record(event(i))
    for _ in range(200):  # a full batch wakes the writer long before its interval
        if writer.num_written == 3:
            break
        await asyncio.sleep(0.01)
    assert request_ids(db) == ["r0", "r1", "r2"]
    writer.record(event(3))
    await writer.stop()  # flushes what is left
    assert request_ids(db) == ["r0", "r1", "r2", "r3"]


async def test_a_database_outage_loses_nothing(
    db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    writer = UsageWriter(db, batch_size=2, flush_interval_s=30)
    for i in range(5):
        writer.record(event(i))
    real_insert = usage_module.insert_usage
    calls = []

    def failing_insert(session: Any, rows: Any) -> None:
        calls.append(len(rows))
        if len(calls) == 2:
            raise OperationalError("INSERT", {}, Exception("database is down"))
        real_insert(session, rows)

    monkeypatch.setattr(usage_module, "insert_usage", failing_insert)
    assert await writer.flush() == 2  # the first batch went in, the second failed...
    assert writer.num_pending == 3  # ...and was kept, in order
    assert await writer.flush() == 3
    assert request_ids(db) == [f"r{i}" for i in range(5)]


async def test_rows_of_deleted_things(db: Database) -> None:
    writer = UsageWriter(db)
    writer.record(event(0))
    writer.record(event(1, tenant_id=999))  # tenant deleted since: dropped
    writer.record(event(2, adapter_id=999, api_key_id=999))  # adapter gone: row kept
    assert await writer.flush() == 2
    with db.session() as session:
        rows = session.scalars(select(UsageRecord).order_by(UsageRecord.id)).all()
    assert [(r.request_id, r.adapter_id) for r in rows] == [("r0", None), ("r2", None)]


async def test_overflow_drops_the_oldest(db: Database) -> None:
    writer = UsageWriter(db, max_pending=2)
    for i in range(3):
        writer.record(event(i))
    assert writer.num_dropped == 1
    await writer.flush()
    assert request_ids(db) == ["r1", "r2"]


async def test_write_returns_once_committed_sharing_one_insert(
    db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    writer = UsageWriter(db, batch_size=100, flush_interval_s=30)
    await writer.start()
    real_insert = usage_module.insert_usage
    calls: list[int] = []

    def counting_insert(session: Any, rows: Any) -> None:
        calls.append(len(rows))
        real_insert(session, rows)

    monkeypatch.setattr(usage_module, "insert_usage", counting_insert)
    results = await asyncio.gather(*(writer.write(event(i)) for i in range(10)))
    assert results == [True] * 10 and writer.num_pending == 0
    assert sorted(request_ids(db)) == sorted(f"r{i}" for i in range(10))
    assert sum(calls) == 10 and len(calls) <= 2  # group commit, not one insert per request
    await writer.stop()


async def test_write_gives_up_waiting_but_keeps_the_row(
    db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    writer = UsageWriter(db, flush_interval_s=30)
    await writer.start()
    real_insert = usage_module.insert_usage

    def down(session: Any, rows: Any) -> None:
        raise OperationalError("INSERT", {}, Exception("database is down"))

    monkeypatch.setattr(usage_module, "insert_usage", down)
    assert await writer.write(event(0), wait_s=0.2) is False
    assert writer.num_pending == 1 and request_ids(db) == []
    monkeypatch.setattr(usage_module, "insert_usage", real_insert)
    await writer.stop()
    assert request_ids(db) == ["r0"]
