"""Schemathesis over /v1 and /admin/v1 of a live server on a tiny random model: seeded,
bounded examples per operation, every phase (examples, coverage, fuzzing, stateful). The build
fails on any 5xx, an undocumented status or content type, or a body that does not match the
schema (tests/e2e/schemathesis.toml)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import update

from loraplex.platform import crud
from loraplex.platform.adapter_validator import engine_adapter_validator
from loraplex.platform.db import Adapter, ApiKey, Database, Tenant, upgrade
from loraplex.platform.schemas import ApiKeyCreate, TenantCreate
from loraplex.platform.settings import Settings
from loraplex.platform.storage import AdapterStore
from tests.e2e.live_server import running_server
from tests.platform.platform_harness import make_settings, postgres_database

CONFIG = Path(__file__).with_name("schemathesis.toml")
CHECKS = ",".join(
    [
        "not_a_server_error",
        "status_code_conformance",
        "content_type_conformance",
        "response_schema_conformance",
        "response_headers_conformance",
        "negative_data_rejection",
        "ignored_auth",
        "use_after_free",
    ]
)
# The tenant whose key the tenant routes use, kept out of reach of generated ids (the admin
# routes delete and suspend whatever small ids the fuzzer picks).
FAR_ID = 1_000_003


def seed_far_tenant(settings: Settings, model_dir: Path, adapter_source: Path) -> str:
    upgrade(settings.resolved_database_url)
    db = Database(settings.resolved_database_url)
    try:
        with db.session() as session:
            tenant = crud.create_tenant(session, TenantCreate(name="acme"), settings)
            session.execute(update(Tenant).where(Tenant.id == tenant.id).values(id=FAR_ID))
            session.commit()
            row, key = crud.create_api_key(
                session, FAR_ID, ApiKeyCreate(), settings.api_key_hash_secret()
            )
            session.execute(update(ApiKey).where(ApiKey.id == row.id).values(id=FAR_ID))
            adapter = crud.register_adapter(
                session,
                AdapterStore(settings.resolved_adapter_dir),
                engine_adapter_validator(model_dir, settings.max_lora_rank),
                tenant_id=FAR_ID,
                name="bot",
                source_dir=adapter_source,
                base_model=model_dir.name,
            )
            session.execute(update(Adapter).where(Adapter.id == adapter.id).values(id=FAR_ID))
            session.commit()
    finally:
        db.dispose()
    return key


@pytest.fixture(params=["sqlite", "postgres"])
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "postgres":
        with postgres_database() as url:
            yield url
    else:
        yield f"sqlite:///{tmp_path / 'registry.db'}"


def test_schemathesis(
    tmp_path: Path, tiny_model_dir: Path, adapter_sources: dict[str, Path], database_url: str
) -> None:
    settings = make_settings(
        tmp_path / "data", tiny_model_dir, database_url, max_completion_tokens=8
    )
    key = seed_far_tenant(settings, tiny_model_dir, adapter_sources["r4"])
    with running_server(settings, tiny_model_dir, adapter_sources["r4"], {}) as server:
        admin_token = server.app_state.tokens.issue_admin_token("schemathesis", 3600)
        env = {
            **os.environ,
            "ST_TENANT_KEY": key,
            "ST_ADMIN_TOKEN": admin_token,
            "SCHEMATHESIS_HOOKS": "",
        }
        st = Path(sys.executable).with_name("st")
        result = subprocess.run(
            [
                str(st),
                "--config-file",
                str(CONFIG),
                "--no-color",
                "run",
                f"{server.base_url}/openapi.json",
                "--include-path-regex",
                "^/(v1|admin/v1)/",
                "--checks",
                CHECKS,
                "--report",
                "junit",
                "--report-dir",
                str(tmp_path / "report"),
            ],
            env=env,
            capture_output=True,
            text=True,
            timeout=900,
            cwd=tmp_path,
        )
    print(result.stdout[-5000:])  # the run's summary, shown with -s
    assert result.returncode == 0, result.stdout[-20000:] + result.stderr[-5000:]
