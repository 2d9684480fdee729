"""Adapter uploads for tests: the multipart call, adapter files (good and deliberately bad),
archives, and the check that a refused upload left nothing behind."""

from __future__ import annotations

import io
import json
import struct
import tarfile
import zipfile
from pathlib import Path
from typing import Any

import httpx
import numpy as np
from safetensors.numpy import load_file, save

from tests.platform.platform_harness import Platform

CONFIG, WEIGHTS = "adapter_config.json", "adapter_model.safetensors"
Files = list[tuple[str, bytes]]


async def upload(
    server: Platform, tenant_id: int | str, name: str, files: Files, **kwargs: Any
) -> httpx.Response:
    return await server.client.post(
        "/admin/v1/adapters",
        headers=server.admin,
        data={"tenant_id": str(tenant_id), "name": name},
        files=[("files", (filename, data)) for filename, data in files],
        **kwargs,
    )


def adapter_files(source: Path) -> Files:
    return [(CONFIG, (source / CONFIG).read_bytes()), (WEIGHTS, (source / WEIGHTS).read_bytes())]


def config_of(source: Path) -> dict[str, Any]:
    return dict(json.loads((source / CONFIG).read_text()))


def tensors_of(source: Path) -> dict[str, np.ndarray]:
    return dict(load_file(str(source / WEIGHTS)))


def files_with(
    source: Path,
    *,
    config: dict[str, Any] | None = None,
    tensors: dict[str, np.ndarray] | None = None,
    weights: bytes | None = None,
) -> Files:
    """The adapter's files with the config, the tensors or the raw weights bytes replaced."""
    config_bytes = json.dumps(config if config is not None else config_of(source)).encode()
    if weights is None:
        weights = save(tensors) if tensors is not None else (source / WEIGHTS).read_bytes()
    return [(CONFIG, config_bytes), (WEIGHTS, weights)]


def raw_safetensors(header: str, data: bytes = b"") -> bytes:
    """A safetensors file from a hand-written JSON header (to break what save() would not)."""
    encoded = header.encode()
    return struct.pack("<Q", len(encoded)) + encoded + data


def zip_of(entries: dict[str, bytes], symlinks: dict[str, str] | None = None) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, data in entries.items():
            zf.writestr(name, data)
        for name, target in (symlinks or {}).items():
            info = zipfile.ZipInfo(name)
            info.external_attr = (0o120777 << 16) | 0x20  # S_IFLNK
            zf.writestr(info, target)
    return buffer.getvalue()


def tar_gz_of(entries: dict[str, bytes], symlinks: dict[str, str] | None = None) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tf:
        for name, data in entries.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
        for name, target in (symlinks or {}).items():
            info = tarfile.TarInfo(name)
            info.type = tarfile.SYMTYPE
            info.linkname = target
            tf.addfile(info)
    return buffer.getvalue()


async def registered(server: Platform) -> list[dict[str, Any]]:
    r = await server.client.get("/admin/v1/adapters", headers=server.admin)
    assert r.status_code == 200, r.text
    return list(r.json()["data"])


def store_entries(server: Platform) -> set[str]:
    """What the adapter store holds besides its commit lock: content dirs, staging, locks."""
    root = server.settings.resolved_adapter_dir
    if not root.is_dir():
        return set()
    entries = set()
    for entry in root.iterdir():
        if entry.name == ".commit.lock":
            continue
        if len(entry.name) == 2 and entry.is_dir():
            entries |= {f"{entry.name}/{sub.name}" for sub in entry.iterdir()}
        else:
            entries.add(entry.name)
    return entries


async def assert_nothing_left(server: Platform, before: set[str], num_rows: int) -> None:
    """A refused upload: no new files in the store, no new row."""
    assert store_entries(server) == before
    assert len(await registered(server)) == num_rows
