"""End-to-end fixtures: a real uvicorn server on a free localhost port, in a thread."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import uvicorn

from loraplex.platform.app import create_app
from tests.e2e.live_server import LiveServer, free_port, seed_registry
from tests.platform.platform_harness import make_settings, tiny_checkpoint, write_adapter_sources


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_checkpoint(tmp_path_factory)


@pytest.fixture(scope="session")
def adapter_sources(
    tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, Path]:
    return write_adapter_sources(tiny_model_dir, tmp_path_factory.mktemp("adapters"))


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
