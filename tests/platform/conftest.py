"""Fixtures for the platform tests: see platform_harness.py."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from tests.platform.platform_harness import (
    Platform,
    make_settings,
    postgres_database,
    running_platform,
    tiny_checkpoint,
    write_adapter_sources,
)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_checkpoint(tmp_path_factory)


@pytest.fixture(scope="session")
def adapter_sources(
    tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, Path]:
    return write_adapter_sources(tiny_model_dir, tmp_path_factory.mktemp("adapters"))


@pytest.fixture
def backend() -> str:
    """Override with params=["sqlite", "postgres"] in a module to run it on both."""
    return "sqlite"


@pytest.fixture
def database_url(backend: str, tmp_path: Path) -> Iterator[str]:
    if backend == "postgres":
        with postgres_database() as url:
            yield url
    else:
        yield f"sqlite:///{tmp_path / 'registry.db'}"


@pytest.fixture
def settings_overrides() -> dict[str, object]:
    """Override in a module (or parametrize) to change the app's settings."""
    return {}


@pytest.fixture
async def server(
    tmp_path: Path,
    tiny_model_dir: Path,
    adapter_sources: dict[str, Path],
    database_url: str,
    settings_overrides: dict[str, object],
) -> AsyncIterator[Platform]:
    settings = make_settings(tmp_path / "data", tiny_model_dir, database_url, **settings_overrides)
    async with running_platform(settings, tiny_model_dir, adapter_sources) as p:
        yield p
