"""A real uvicorn server on a free localhost port, in a thread, over a seeded registry."""

from __future__ import annotations

import socket
from dataclasses import dataclass
from pathlib import Path

import uvicorn

from loraplex.platform import crud
from loraplex.platform.adapter_validator import engine_adapter_validator
from loraplex.platform.db import Database, upgrade
from loraplex.platform.schemas import ApiKeyCreate, TenantCreate
from loraplex.platform.settings import Settings
from loraplex.platform.state import AppState
from loraplex.platform.storage import AdapterStore


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def seed_registry(
    settings: Settings, model_dir: Path, adapter_source: Path, tenants: dict[str, dict[str, object]]
) -> dict[str, str]:
    """Migrate, then create tenants (each with a key and an adapter named `bot`).
    Returns tenant name -> API key."""
    upgrade(settings.resolved_database_url)
    db = Database(settings.resolved_database_url)
    keys = {}
    try:
        with db.session() as session:
            for name, fields in tenants.items():
                tenant = crud.create_tenant(
                    session, TenantCreate.model_validate({"name": name, **fields}), settings
                )
                _, keys[name] = crud.create_api_key(
                    session, tenant.id, ApiKeyCreate(), settings.api_key_hash_secret()
                )
                crud.register_adapter(
                    session,
                    AdapterStore(settings.resolved_adapter_dir),
                    engine_adapter_validator(model_dir, settings.max_lora_rank),
                    tenant_id=tenant.id,
                    name="bot",
                    source_dir=adapter_source,
                    base_model=model_dir.name,
                )
    finally:
        db.dispose()
    return keys


@dataclass
class LiveServer:
    base_url: str
    keys: dict[str, str]
    settings: Settings
    server: uvicorn.Server
    app_state: AppState
