"""Fixtures of the engine tests: a valid PEFT adapter directory, and fresh copies to break."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.engine.adapter_files import save_adapter


@pytest.fixture(scope="module")
def good_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("good") / "adapter"
    save_adapter(path, ["q_proj", "v_proj", "down_proj"], r=4, alpha=8)
    return path


@pytest.fixture
def bad_dir(good_dir: Path, tmp_path: Path) -> Path:
    """A fresh copy of a valid adapter for a test to break."""
    return Path(shutil.copytree(good_dir, tmp_path / "adapter"))
