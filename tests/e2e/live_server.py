"""A real uvicorn server on a free localhost port, in a thread, over a seeded registry."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
import time
from collections.abc import Coroutine, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import httpx
import uvicorn
from sqlalchemy import select

from loraplex.engine.stats import EngineStats
from loraplex.platform import crud
from loraplex.platform.adapter_validator import engine_adapter_validator
from loraplex.platform.app import create_app
from loraplex.platform.db import Database, UsageRecord, upgrade
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

    def run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        """Run `coroutine` on the server's event loop (its limiter, usage writer, ...)."""
        task = self.app_state.usage._task
        assert task is not None
        future = asyncio.run_coroutine_threadsafe(coroutine, task.get_loop())
        return future.result(timeout=30)

    def tenant_id(self, name: str) -> int:
        with self.app_state.db.session() as session:
            return crud.read_tenant_by_name(session, name).id

    def usage_rows(self) -> list[UsageRecord]:
        """Every usage record, after flushing what is pending."""
        self.run(self.app_state.usage.flush())
        with self.app_state.db.session() as session:
            return list(session.scalars(select(UsageRecord).order_by(UsageRecord.id)))

    def wait_until_idle(self, timeout_s: float = 10) -> EngineStats:
        """Nothing running, waiting or holding KV blocks, and nothing in flight."""
        deadline = time.monotonic() + timeout_s
        while True:
            stats = self.app_state.engine.get_stats()
            if (
                stats.num_running == 0
                and stats.num_waiting == 0
                and stats.kv_blocks_used == 0
                and self.app_state.engine.num_inflight == 0
            ):
                return stats
            assert time.monotonic() < deadline, f"engine still busy: {stats}"
            time.sleep(0.01)


T = TypeVar("T")


@contextlib.contextmanager
def running_server(
    settings: Settings,
    model_dir: Path,
    adapter_source: Path,
    tenants: dict[str, dict[str, object]],
) -> Iterator[LiveServer]:
    """Seed the registry, serve it with uvicorn in a thread until the block ends."""
    keys = seed_registry(settings, model_dir, adapter_source, tenants)
    with serving(settings, keys) as server:
        yield server


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
        assert thread.is_alive(), "the server did not start"
        assert time.monotonic() < deadline, "the server did not become ready"
        time.sleep(0.05)
    try:
        yield LiveServer(base_url, keys, settings, server, app.state.loraplex)
    finally:
        server.should_exit = True
        thread.join(timeout=30)
