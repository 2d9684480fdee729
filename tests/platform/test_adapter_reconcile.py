"""Crashes around an adapter's files and its row: after a restart nothing is orphaned.

Each crash is real: a child process dies (os._exit) at the injected point, so its locks go
with it, as they would in a crash; then the server starts on the same store and registry."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from loraplex.platform import crud
from loraplex.platform.db import Database, upgrade
from loraplex.platform.schemas import TenantCreate
from loraplex.platform.settings import Settings
from tests.platform.platform_harness import make_settings, running_platform
from tests.platform.upload_helpers import registered, store_entries

CRASHED = 3
# Runs in a child process: registers `source` for tenant 1, dying where CRASH_AT says.
CHILD = f"""
import os, sys
from pathlib import Path
from loraplex.platform import crud
from loraplex.platform.adapter_validator import engine_adapter_validator
from loraplex.platform.db import AdapterStatus, Database
from loraplex.platform.storage import AdapterStore

url, adapter_dir, model_dir, source, crash_at = sys.argv[1:]
store = AdapterStore(Path(adapter_dir))
if crash_at == "after-file-write":  # files renamed into place, row not committed
    commit = AdapterStore.commit
    def crash_after_commit(self, staging, content_hash):
        commit(self, staging, content_hash)
        os._exit({CRASHED})
    AdapterStore.commit = crash_after_commit
elif crash_at == "mid-staging":  # half the files copied
    def crash_mid_copy(self, source_dir, staging):
        (staging / "adapter_config.json").write_bytes(b"{{")
        os._exit({CRASHED})
    AdapterStore.copy_into = crash_mid_copy
db = Database(url)
validate = engine_adapter_validator(model_dir, 64)
with db.session() as session:
    if crash_at == "before-load-check":  # the upload's row committed as `loading`
        with store.staging() as staging:
            store.copy_into(Path(source), staging)
            crud.register_staged(session, store, validate, staging, tenant_id=1, name="bot",
                                 base_model="tiny-llama", status=AdapterStatus.LOADING)
        os._exit({CRASHED})
    crud.register_adapter(session, store, validate, tenant_id=1, name="bot",
                          source_dir=Path(source), base_model="tiny-llama")
"""


@pytest.fixture(params=["sqlite", "postgres"])
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def prepared(tmp_path: Path, model_dir: Path, database_url: str) -> Settings:
    settings = make_settings(tmp_path / "data", model_dir, database_url)
    upgrade(database_url)
    db = Database(database_url)
    with db.session() as session:
        crud.create_tenant(session, TenantCreate(name="acme"), settings)
    db.dispose()
    return settings


def crash(settings: Settings, model_dir: Path, source: Path, crash_at: str) -> None:
    args = [settings.resolved_database_url, str(settings.resolved_adapter_dir), str(model_dir)]
    child = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(CHILD), *args, str(source), crash_at],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert child.returncode == CRASHED, child.stderr


@pytest.mark.parametrize("crash_at", ["after-file-write", "mid-staging"])
async def test_a_crash_leaves_nothing_orphaned_after_restart(
    tmp_path: Path,
    tiny_model_dir: Path,
    adapter_sources: dict[str, Path],
    database_url: str,
    crash_at: str,
) -> None:
    settings = prepared(tmp_path, tiny_model_dir, database_url)
    crash(settings, tiny_model_dir, adapter_sources["r4"], crash_at)
    root = settings.resolved_adapter_dir
    left = {p.name for p in root.iterdir()} - {".commit.lock"}
    assert left, "the crash left something to clean up"
    async with running_platform(settings, tiny_model_dir, adapter_sources) as server:
        assert store_entries(server) == set()
        assert await registered(server) == []
        # The store works as before: the same adapter uploads and is served.
        tenant_headers = {"Authorization": f"Bearer {await server.create_key(1)}"}
        await server.add_adapter(1, "bot")
        r = await server.client.post(
            "/v1/completions",
            headers=tenant_headers,
            json={"model": "bot", "prompt": "Hi", "max_tokens": 2},
        )
        assert r.status_code == 200, r.text


async def test_a_load_check_cut_short_is_finished_at_start(
    tmp_path: Path, tiny_model_dir: Path, adapter_sources: dict[str, Path], database_url: str
) -> None:
    settings = prepared(tmp_path, tiny_model_dir, database_url)
    crash(settings, tiny_model_dir, adapter_sources["r4"], "before-load-check")
    async with running_platform(settings, tiny_model_dir, adapter_sources) as server:
        [adapter] = await registered(server)
        assert adapter["status"] == "ready" and adapter["is_latest"]
        assert len(store_entries(server)) == 1


async def test_a_row_whose_files_are_gone_is_marked_failed(
    tmp_path: Path, tiny_model_dir: Path, adapter_sources: dict[str, Path], database_url: str
) -> None:
    settings = prepared(tmp_path, tiny_model_dir, database_url)
    async with running_platform(settings, tiny_model_dir, adapter_sources) as server:
        row = await server.add_adapter(1, "bot")
    for file in Path(row["path"]).iterdir():
        file.unlink()
    Path(row["path"]).rmdir()
    async with running_platform(settings, tiny_model_dir, adapter_sources) as server:
        [adapter] = await registered(server)
        assert adapter["status"] == "failed" and "missing" in adapter["status_reason"]
