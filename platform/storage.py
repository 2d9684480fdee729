"""Content-addressed adapter storage under `adapter_dir`.

Only `adapter_config.json` and `adapter_model.safetensors` are ever copied (no pickle, no other
file names). Paths are server-generated from the content hash, never from client input:

    adapter_dir/
      ab/abcdef....(sha256)/adapter_config.json
                            adapter_model.safetensors
      .staging-<random>/     (a copy in progress; renamed into place atomically)

The same content stored twice shares one directory.
"""

from __future__ import annotations

import os
import secrets
import shutil
from pathlib import Path

ADAPTER_FILES = ("adapter_config.json", "adapter_model.safetensors")
_STAGING = ".staging-"


class AdapterStore:
    def __init__(self, root: Path) -> None:
        self.root = root

    def path_for(self, content_hash: str) -> Path:
        if len(content_hash) != 64 or not all(c in "0123456789abcdef" for c in content_hash):
            raise ValueError("content hash must be 64 lowercase hex digits")
        return self.root / content_hash[:2] / content_hash

    def stage(self, source_dir: Path) -> Path:
        """Copy the adapter files of `source_dir` into a private staging directory."""
        staging = self.root / f"{_STAGING}{secrets.token_hex(8)}"
        staging.mkdir(parents=True)
        try:
            for name in ADAPTER_FILES:
                src = source_dir / name
                if not src.is_file():  # also refuses FIFOs and devices
                    raise FileNotFoundError(
                        f"{source_dir} has no {name} (PEFT safetensors format only; pickle "
                        "weight files are never read)"
                    )
                shutil.copyfile(src, staging / name, follow_symlinks=True)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        return staging

    def commit(self, staging: Path, content_hash: str) -> Path:
        """Move a validated staging directory to its content address (idempotent)."""
        final = self.path_for(content_hash)
        if final.is_dir():
            shutil.rmtree(staging, ignore_errors=True)
            return final
        final.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.rename(staging, final)
        except OSError:
            if not final.is_dir():
                raise
            shutil.rmtree(staging, ignore_errors=True)  # a concurrent commit won
        return final

    def discard(self, staging: Path) -> None:
        shutil.rmtree(staging, ignore_errors=True)

    def remove(self, content_hash: str) -> None:
        shutil.rmtree(self.path_for(content_hash), ignore_errors=True)

    def size_bytes(self, content_hash: str) -> int:
        root = self.path_for(content_hash)
        return sum((root / name).stat().st_size for name in ADAPTER_FILES)
