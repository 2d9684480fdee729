"""End-to-end fixtures: a real uvicorn server on a free localhost port, in a thread."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.live_server import LiveServer, running_server
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
    tenants: dict[str, dict[str, object]] = {"acme": {}, "limited": {"requests_per_minute": 1}}
    with running_server(settings, tiny_model_dir, adapter_sources["r4"], tenants) as server:
        yield server
