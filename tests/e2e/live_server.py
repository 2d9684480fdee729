"""A real uvicorn server on a free localhost port, in a thread, over a seeded registry."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import uvicorn

from loraplex.platform import crud
from loraplex.platform.adapter_validator import engine_adapter_validator
from loraplex.platform.app import create_app
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


@contextlib.contextmanager
def serving(settings: Settings, keys: dict[str, str]) -> Iterator[LiveServer]:
    """The app on a free localhost port (uvicorn in a thread), ready when it yields."""
    app = create_app(settings)
    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=port, log_config=None, access_log=False)
    )
    thread = threading.Thread(target=server.run, name="uvicorn", daemon=True)
    thread.start()
    base_url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        try:
            if httpx.get(f"{base_url}/ready", timeout=1).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        assert thread.is_alive() and time.monotonic() < deadline, "the server did not start"
        time.sleep(0.05)
    try:
        yield LiveServer(base_url, keys, settings, server, app.state.loraplex)
    finally:
        server.should_exit = True
        thread.join(timeout=30)
