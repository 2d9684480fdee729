"""Alembic migrations: up from empty, down to base and up again, models == migrated schema;
the server refuses an unmigrated database."""

from __future__ import annotations

from pathlib import Path

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import inspect, text

from loraplex.platform.app import create_app
from loraplex.platform.db import (
    Base,
    DatabaseNotMigratedError,
    create_db_engine,
    upgrade,
    utcnow,
)
from loraplex.platform.db.migrate import current_revision, downgrade, head_revision
from tests.platform.platform_harness import make_settings

TABLES = {"tenants", "api_keys", "adapters", "adapter_grants", "usage_records", "audit_events"}


@pytest.fixture(params=["sqlite", "postgres"])
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def schema_diff(url: str) -> list[object]:
    engine = create_db_engine(url)
    try:
        with engine.connect() as conn:
            context = MigrationContext.configure(conn, opts={"compare_type": True})
            return list(compare_metadata(context, Base.metadata))
    finally:
        engine.dispose()


def tables(url: str) -> set[str]:
    engine = create_db_engine(url)
    try:
        return set(inspect(engine).get_table_names())
    finally:
        engine.dispose()


def rows(url: str, table: str) -> int:
    engine = create_db_engine(url)
    try:
        with engine.connect() as conn:
            return int(conn.execute(text(f"SELECT count(*) FROM {table}")).scalar_one())
    finally:
        engine.dispose()


def test_upgrade_downgrade_upgrade(database_url: str) -> None:
    assert tables(database_url) == set()
    upgrade(database_url)
    assert tables(database_url) >= TABLES
    engine = create_db_engine(database_url)
    assert current_revision(engine) == head_revision() is not None
    engine.dispose()
    assert schema_diff(database_url) == []  # the ORM models are exactly the migrated schema

    # One step down drops the audit log and nothing else; the registry's rows stay.
    engine = create_db_engine(database_url)
    with engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO tenants (name, priority, status, requests_per_minute, "
                "tokens_per_minute, max_concurrent_requests, created_at, updated_at) "
                "VALUES ('acme', 'standard', 'active', 1, 1, 1, :t, :t)"
            ),
            {"t": utcnow()},
        )
    engine.dispose()
    downgrade(database_url, "0002")
    assert tables(database_url) & TABLES == TABLES - {"audit_events"}
    assert rows(database_url, "tenants") == 1
    upgrade(database_url)
    assert schema_diff(database_url) == [] and rows(database_url, "audit_events") == 0

    downgrade(database_url, "base")
    assert tables(database_url) & TABLES == set()
    upgrade(database_url)
    assert schema_diff(database_url) == []


async def test_the_server_refuses_an_unmigrated_database(
    tmp_path: Path, tiny_model_dir: Path, database_url: str
) -> None:
    app = create_app(make_settings(tmp_path / "data", tiny_model_dir, database_url))
    with pytest.raises(DatabaseNotMigratedError, match="run `loraplex db upgrade`"):
        async with app.router.lifespan_context(app):
            pass
