"""Every bad adapter upload we know of (../shared/REFERENCE.md's list and issue 10's): a 4xx
that says why, and nothing left behind — no file in the store, no row in the registry."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from loraplex.platform.demo.adapters import write_random_adapter
from tests.platform.platform_harness import Platform
from tests.platform.upload_helpers import (
    CONFIG,
    WEIGHTS,
    Files,
    adapter_files,
    assert_nothing_left,
    config_of,
    files_with,
    raw_safetensors,
    store_entries,
    tar_gz_of,
    tensors_of,
    upload,
    zip_of,
)

MAX_ADAPTER_BYTES = 256 * 1024
Q_A = "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"


@pytest.fixture
def settings_overrides() -> dict[str, object]:
    return {"max_adapter_bytes": MAX_ADAPTER_BYTES}


@dataclass(frozen=True)
class Case:
    files: Callable[[Path, Path], Files]  # (the good r4 adapter, the base model) -> files
    status: int
    reason: str  # a part of the error message
    name: str = "bot"


def _config(**changes: object) -> Callable[[Path, Path], Files]:
    return lambda src, _: files_with(src, config={**config_of(src), **changes})


def _tensors(change: Callable[[dict[str, np.ndarray]], None]) -> Callable[[Path, Path], Files]:
    def files(src: Path, _: Path) -> Files:
        tensors = tensors_of(src)
        change(tensors)
        return files_with(src, tensors=tensors)

    return files


def _weights(data: bytes) -> Callable[[Path, Path], Files]:
    return lambda src, _: files_with(src, weights=data)


def _archive(make: Callable[[Files], bytes], filename: str) -> Callable[[Path, Path], Files]:
    return lambda src, _: [(filename, make(adapter_files(src)))]


def _other_base_model(src: Path, model_dir: Path) -> Files:
    other = src.parent / "other-model"
    other.mkdir(exist_ok=True)
    config = json.loads((model_dir / "config.json").read_text())
    config.update(hidden_size=96, intermediate_size=192)
    (other / "config.json").write_text(json.dumps(config))
    return adapter_files(write_random_adapter(other, src.parent / "other-adapter", rank=4))


def _good(src: Path, _: Path) -> Files:
    return adapter_files(src)


def _header(tensors: str) -> bytes:
    return raw_safetensors("{" + tensors + "}", bytes(256))


def _entry(name: str, begin: int, end: int) -> str:
    return f'"{name}": {{"dtype": "F32", "shape": [4, 4], "data_offsets": [{begin}, {end}]}}'


def _set(key: str, value: np.ndarray) -> Callable[[dict[str, np.ndarray]], None]:
    return lambda t: t.__setitem__(key, value)


CASES: dict[str, Case] = {
    "a pickle .bin instead of safetensors": Case(
        lambda src, _: [(CONFIG, (src / CONFIG).read_bytes()), ("adapter_model.bin", b"\x80\x04.")],
        400,
        "pickle files are refused",
    ),
    "a safetensors header claiming a huge length": Case(
        _weights((1 << 40).to_bytes(8, "little") + b"{}"), 400, "header"
    ),
    "out-of-file offsets": Case(_weights(_header(_entry(Q_A, 0, 1 << 20))), 400, "invalid adapter"),
    "overlapping offsets": Case(
        _weights(_header(_entry(Q_A, 0, 64) + ", " + _entry(Q_A.replace("q_", "v_"), 32, 96))),
        400,
        "invalid adapter",
    ),
    "duplicate tensor names": Case(
        _weights(_header(_entry(Q_A, 0, 64) + ", " + _entry(Q_A, 64, 128))),
        400,
        "duplicate",
    ),
    "wrong shapes": Case(
        _tensors(_set(Q_A, np.zeros((4, 65), np.float32))), 400, "invalid adapter"
    ),
    "wrong dtype": Case(_tensors(_set(Q_A, np.zeros((4, 64), np.int32))), 400, "dtype"),
    "rank over the limit": Case(_config(r=512), 400, "max_lora_rank"),
    "unknown target modules": Case(_config(target_modules=["q_proj", "lm_head"]), 400, "lm_head"),
    "modules_to_save": Case(_config(modules_to_save=["lm_head"]), 400, "modules_to_save"),
    "DoRA": Case(_config(use_dora=True), 400, "dora"),
    "bias": Case(_config(bias="all"), 400, "bias"),
    "a huge JSON config": Case(_config(padding="x" * 100_000), 400, "adapter_config.json is over"),
    "a truncated weights file": Case(
        lambda src, _: files_with(src, weights=(src / WEIGHTS).read_bytes()[:-100]),
        400,
        "invalid adapter",
    ),
    "an adapter for another base model": Case(_other_base_model, 400, "invalid adapter"),
    "a path-traversal file name": Case(
        lambda src, _: [("../" + n, d) for n, d in adapter_files(src)], 400, "contains a path"
    ),
    "an unexpected file": Case(
        lambda src, _: [*adapter_files(src), ("run.sh", b"#!/bin/sh")], 400, "unexpected file"
    ),
    "the weights missing": Case(lambda src, _: adapter_files(src)[:1], 400, WEIGHTS),
    "an archive and the files together": Case(
        lambda src, _: [*adapter_files(src), ("a.zip", zip_of(dict(adapter_files(src))))],
        400,
        "either one archive",
    ),
    "over the byte limit": Case(
        lambda src, _: files_with(src, weights=bytes(MAX_ADAPTER_BYTES + 1)),
        413,
        "LORAPLEX_MAX_ADAPTER_BYTES",
    ),
    "zip slip": Case(
        _archive(lambda f: zip_of({f"../../{n}": d for n, d in f}), "a.zip"), 400, "unsafe path"
    ),
    "an absolute path in a tar": Case(
        _archive(lambda f: tar_gz_of({f"/etc/{n}": d for n, d in f}), "a.tar.gz"),
        400,
        "unsafe path",
    ),
    "a symlink in a zip": Case(
        _archive(lambda f: zip_of(dict(f[:1]), symlinks={WEIGHTS: "/etc/passwd"}), "a.zip"),
        400,
        "symlink",
    ),
    "a symlink in a tar": Case(
        _archive(lambda f: tar_gz_of(dict(f[:1]), symlinks={WEIGHTS: "/etc/passwd"}), "a.tgz"),
        400,
        "symlink",
    ),
    "a zip bomb": Case(
        _archive(lambda f: zip_of({**dict(f), "pad.bin.txt": bytes(4 << 20)}), "a.zip"),
        413,
        "expands to more than",
    ),
    "a pickle in an archive": Case(
        _archive(lambda f: zip_of({**dict(f), "model/evil.pkl": b"\x80\x04."}), "a.zip"),
        400,
        "pickle",
    ),
    "too many archive entries": Case(
        _archive(lambda f: zip_of({**dict(f), **{f"f{i}": b"" for i in range(20)}}), "a.zip"),
        400,
        "more than 16 entries",
    ),
    "a damaged archive": Case(_archive(lambda f: zip_of(dict(f))[:-40], "a.zip"), 400, "archive"),
    "a name with /": Case(
        adapter_files_of := (lambda src, _: adapter_files(src)), 400, "name", "a/b"
    ),
    "the name ..": Case(_good, 400, "adapter names must match", ".."),
    "a 300-character name": Case(_good, 400, "adapter names must match", "x" * 300),
    "a name with @": Case(_good, 400, "adapter names must match", "bot@v2"),
}


@pytest.mark.parametrize("case", list(CASES.values()), ids=list(CASES))
async def test_bad_upload(
    server: Platform, adapter_sources: dict[str, Path], tmp_path: Path, case: Case
) -> None:
    tenant = await server.create_tenant("acme")
    src = tmp_path / "r4"
    src.mkdir()
    for name, data in adapter_files(adapter_sources["r4"]):
        (src / name).write_bytes(data)
    before = store_entries(server)
    r = await upload(server, tenant["id"], case.name, case.files(src, server.model_dir))
    assert r.status_code == case.status, r.text
    error = r.json()["error"]
    assert error["type"] == "invalid_request_error"
    assert case.reason.lower() in error["message"].lower(), error
    await assert_nothing_left(server, before, 0)
    # The engine is unharmed: a good upload right after is served.
    r = await upload(server, tenant["id"], "good", adapter_files(adapter_sources["r4"]))
    assert r.status_code == 201 and r.json()["status"] == "ready", r.text
