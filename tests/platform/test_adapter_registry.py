"""The registry under concurrent registrations of one adapter name (the CLI, or several server
processes, have no per-name upload guard): every registration gets its own next version."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from loraplex.platform import crud
from loraplex.platform.adapter_validator import engine_adapter_validator
from loraplex.platform.db import Database, upgrade
from loraplex.platform.schemas import TenantCreate
from loraplex.platform.settings import Settings
from loraplex.platform.storage import AdapterStore

NUM_AT_ONCE = 8


@pytest.fixture(params=["sqlite", "postgres"])
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def test_concurrent_registrations_of_one_name_each_get_a_version(
    tmp_path: Path, tiny_model_dir: Path, adapter_sources: dict[str, Path], database_url: str
) -> None:
    upgrade(database_url)
    db = Database(database_url)
    try:
        with db.session() as session:
            tenant = crud.create_tenant(
                session, TenantCreate(name="acme"), Settings(data_dir=tmp_path / "data")
            )
            tenant_id = tenant.id
        store = AdapterStore(tmp_path / "adapters")
        validate = engine_adapter_validator(tiny_model_dir, 64)
        sources = sorted(adapter_sources.values())

        def register(i: int) -> int:
            with db.session() as session:
                row = crud.register_adapter(
                    session, store, validate, tenant_id=tenant_id, name="support",
                    source_dir=sources[i % len(sources)], base_model="tiny",
                )  # fmt: skip
                return row.version

        with ThreadPoolExecutor(NUM_AT_ONCE) as pool:
            versions = sorted(pool.map(register, range(NUM_AT_ONCE)))
        assert versions == list(range(1, NUM_AT_ONCE + 1))
    finally:
        db.dispose()
