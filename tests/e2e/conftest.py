"""End-to-end fixtures: a real uvicorn server on a free localhost port, in a thread."""

from __future__ import annotations

import socket
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import uvicorn

# The platform test harness (tests/platform has no __init__.py by design: see DESIGN.md).
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "platform"))

from platform_harness import (  # noqa: E402
    make_settings,
    tiny_checkpoint,
    write_adapter_sources,
)

from loraplex.platform import crud  # noqa: E402
from loraplex.platform.adapters import engine_adapter_validator  # noqa: E402
from loraplex.platform.app import create_app  # noqa: E402
from loraplex.platform.db import Database, upgrade  # noqa: E402
from loraplex.platform.schemas import ApiKeyCreate, TenantCreate  # noqa: E402
from loraplex.platform.settings import Settings  # noqa: E402
from loraplex.platform.state import AppState  # noqa: E402
from loraplex.platform.storage import AdapterStore  # noqa: E402


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_checkpoint(tmp_path_factory)


@pytest.fixture(scope="session")
def adapter_sources(
    tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, Path]:
    return write_adapter_sources(tiny_model_dir, tmp_path_factory.mktemp("adapters"))


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


@pytest.fixture
def live_server(
    tmp_path: Path, tiny_model_dir: Path, adapter_sources: dict[str, Path]
) -> Iterator[LiveServer]:
    settings = make_settings(
        tmp_path / "data",
        tiny_model_dir,
        f"sqlite:///{tmp_path / 'registry.db'}",
        max_model_len=1024,
        max_completion_tokens=1000,
    )
    keys = seed_registry(
        settings,
        tiny_model_dir,
        adapter_sources["r4"],
        {"acme": {}, "limited": {"requests_per_minute": 1}},
    )
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
        assert time.monotonic() < deadline, "the server did not become ready"
        time.sleep(0.05)
    try:
        yield LiveServer(base_url, keys, settings, server, app.state.loraplex)
    finally:
        server.should_exit = True
        thread.join(timeout=30)
