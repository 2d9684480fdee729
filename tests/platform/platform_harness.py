"""Test harness for the platform: real app, real engine (a tiny random checkpoint), real
databases. Imported by tests/platform/conftest.py and tests/e2e/conftest.py."""

from __future__ import annotations

import contextlib
import os
import secrets
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import httpx
import psycopg
import pytest
from fastapi import FastAPI
from sqlalchemy.engine import make_url

from loraplex.platform import crud
from loraplex.platform.adapter_validator import engine_adapter_validator
from loraplex.platform.app import create_app
from loraplex.platform.db import upgrade
from loraplex.platform.demo.adapters import write_random_adapter
from loraplex.platform.demo.tiny_checkpoint import write_random_checkpoint
from loraplex.platform.settings import Settings
from loraplex.platform.state import AppState

POSTGRES_URL = os.environ.get(
    "LORAPLEX_TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test"
)
REDIS_URL = os.environ.get("LORAPLEX_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
MAX_MODEL_LEN = 128
MODEL_NAME = "tiny-llama"


def _unavailable(what: str, error: Exception) -> None:
    # In CI the services are part of the contract: a missing one is a failure, not a skip.
    if os.environ.get("CI"):
        pytest.fail(f"{what} is required in CI but unreachable: {error}")
    pytest.skip(f"{what} unreachable: {error}")


def _libpq_url(url: str) -> str:
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


@contextlib.contextmanager
def postgres_database() -> Iterator[str]:
    """A fresh, empty PostgreSQL database (dropped afterwards); yields its SQLAlchemy URL."""
    admin_url = _libpq_url(POSTGRES_URL)
    try:
        admin = psycopg.connect(admin_url, autocommit=True, connect_timeout=3)
    except psycopg.OperationalError as e:
        _unavailable("PostgreSQL", e)
        raise
    name = f"loraplex_test_{secrets.token_hex(6)}"
    with admin:
        admin.execute(f'CREATE DATABASE "{name}"')
        try:
            yield make_url(POSTGRES_URL).set(database=name).render_as_string(hide_password=False)
        finally:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def require_redis() -> str:
    import redis

    try:
        redis.Redis.from_url(REDIS_URL, socket_connect_timeout=2).ping()
    except redis.RedisError as e:
        _unavailable("Redis", e)
    return REDIS_URL


def make_settings(data_dir: Path, model_dir: Path, database_url: str, **overrides: Any) -> Settings:
    values: dict[str, Any] = {
        "data_dir": data_dir,
        "database_url": database_url,
        "model": str(model_dir),
        "device": "cpu",
        "dtype": "float32",
        "max_model_len": MAX_MODEL_LEN,
        "max_num_seqs": 8,
        "engine_process": False,  # a thread: fast to start, and tests may inspect the engine
        "jwt_secret": "test-secret-" + secrets.token_hex(32),
        "api_key_secret": "test-key-secret-" + secrets.token_hex(16),
        "usage_flush_interval_s": 0.2,
        "shutdown_grace_s": 2.0,
        "max_completion_tokens": 64,
    }
    values.update(overrides)
    return Settings(**values)


@dataclass
class Platform:
    """The app under test and a client for it, plus shortcuts for the usual set-up."""

    app: FastAPI
    client: httpx.AsyncClient
    settings: Settings
    model_dir: Path
    adapter_sources: dict[str, Path] = field(default_factory=dict)

    @property
    def state(self) -> AppState:
        state: AppState = self.app.state.loraplex
        return state

    @property
    def model_name(self) -> str:
        return self.state.engine.model_name

    def admin_token(self, ttl_s: int = 600) -> str:
        return self.state.tokens.issue_admin_token("tests", ttl_s)

    @property
    def admin(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.admin_token()}"}

    async def create_tenant(self, name: str, **fields: Any) -> dict[str, Any]:
        r = await self.client.post(
            "/admin/v1/tenants", json={"name": name, **fields}, headers=self.admin
        )
        assert r.status_code == 201, r.text
        return dict(r.json())

    async def create_key(self, tenant_id: int, **fields: Any) -> str:
        r = await self.client.post(
            f"/admin/v1/tenants/{tenant_id}/api-keys", json=fields, headers=self.admin
        )
        assert r.status_code == 201, r.text
        return str(r.json()["key"])

    async def tenant(self, name: str, **fields: Any) -> tuple[dict[str, Any], dict[str, str]]:
        """A new tenant and the auth headers of a fresh key of it."""
        tenant = await self.create_tenant(name, **fields)
        key = await self.create_key(tenant["id"])
        return tenant, {"Authorization": f"Bearer {key}"}

    async def add_adapter(self, tenant_id: int, name: str, source: str = "r4") -> dict[str, Any]:
        """Registers one of the pre-written random adapters, as `loraplex adapters add` does."""

        def register() -> dict[str, Any]:
            with self.state.db.session() as session:
                row = crud.register_adapter(
                    session,
                    self.state.adapter_store,
                    engine_adapter_validator(self.model_dir, self.settings.max_lora_rank),
                    tenant_id=tenant_id,
                    name=name,
                    source_dir=self.adapter_sources[source],
                    base_model=self.model_name,
                )
                return {"id": row.id, "name": row.name, "sha256": row.sha256, "path": row.path}

        return await anyio.to_thread.run_sync(register)

    async def flush_usage(self) -> None:
        await self.state.usage.flush()


_TINY_MODEL: list[Path] = []


def tiny_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One tiny random Llama per test session (shared by tests/platform and tests/e2e)."""
    if not _TINY_MODEL:
        root = tmp_path_factory.mktemp("models") / MODEL_NAME
        _TINY_MODEL.append(write_random_checkpoint(root, arch="llama"))
    return _TINY_MODEL[0]


def write_adapter_sources(model_dir: Path, root: Path) -> dict[str, Path]:
    return {
        "r4": write_random_adapter(model_dir, root / "r4", rank=4, seed=1, b_std=0.5),
        "r8": write_random_adapter(
            model_dir,
            root / "r8",
            rank=8,
            seed=2,
            b_std=0.5,
            target_modules=("q_proj", "k_proj", "v_proj", "o_proj"),
        ),
    }


@contextlib.asynccontextmanager
async def running_platform(
    settings: Settings, model_dir: Path, adapter_sources: dict[str, Path]
) -> AsyncIterator[Platform]:
    await anyio.to_thread.run_sync(upgrade, settings.resolved_database_url)
    app = create_app(settings)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(
            transport=transport, base_url="http://testserver", timeout=60
        ) as client:
            yield Platform(app, client, settings, model_dir, adapter_sources)
