"""Content-addressed adapter storage under `adapter_dir`.

Only `adapter_config.json` and `adapter_model.safetensors` are ever stored (no pickle, no other
file names). Paths are server-generated from the content hash, never from client input:

    adapter_dir/
      ab/abcdef....(sha256)/adapter_config.json
                            adapter_model.safetensors
      .staging-<random>/      an upload or copy in progress: renamed into place atomically
      .staging-<random>.lock  held (flock) by the process writing that staging directory
      .commit.lock            shared while a file is renamed in and its row committed;
                              exclusive while files are removed or reconciled

The same content stored twice shares one directory. A crash can leave a staging directory, or a
content directory whose row was never committed; `reconcile` removes both, and the locks keep
it (and deletions) from touching what a live process, this one or another, is still writing.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import secrets
import shutil
from collections.abc import Iterator
from pathlib import Path

ADAPTER_FILES = ("adapter_config.json", "adapter_model.safetensors")
_STAGING = ".staging-"
_HEX = frozenset("0123456789abcdef")


class AdapterStore:
    def __init__(self, root: Path) -> None:
        self.root = root

    def path_for(self, content_hash: str) -> Path:
        if len(content_hash) != 64 or not set(content_hash) <= _HEX:
            raise ValueError("content hash must be 64 lowercase hex digits")
        return self.root / content_hash[:2] / content_hash

    # ---- staging -----------------------------------------------------------------------

    @contextlib.contextmanager
    def staging(self) -> Iterator[Path]:
        """A private, locked staging directory, removed on exit unless `commit` moved it."""
        self.root.mkdir(parents=True, exist_ok=True)
        name = f"{_STAGING}{secrets.token_hex(8)}"
        lock_path = self.root / f"{name}.lock"
        with _locked(lock_path, fcntl.LOCK_EX):
            staging = self.root / name
            staging.mkdir()
            try:
                yield staging
            finally:
                shutil.rmtree(staging, ignore_errors=True)  # gone already once committed
                lock_path.unlink(missing_ok=True)

    def copy_into(self, source_dir: Path, staging: Path) -> None:
        """Copy the adapter files of a local directory (the CLI's path) into `staging`."""
        for name in ADAPTER_FILES:
            src = source_dir / name
            if not src.is_file():  # also refuses FIFOs and devices
                raise FileNotFoundError(
                    f"{source_dir} has no {name} (PEFT safetensors format only; pickle "
                    "weight files are never read)"
                )
            shutil.copyfile(src, staging / name, follow_symlinks=True)

    # ---- commit, removal -----------------------------------------------------------------

    @contextlib.contextmanager
    def committing(self) -> Iterator[None]:
        """Hold while renaming files in and committing their row: removal waits for it."""
        with _locked(self._commit_lock(), fcntl.LOCK_SH):
            yield

    @contextlib.contextmanager
    def removing(self) -> Iterator[None]:
        """Hold while deciding which content directories no row uses, and removing them."""
        with _locked(self._commit_lock(), fcntl.LOCK_EX):
            yield

    def commit(self, staging: Path, content_hash: str) -> Path:
        """Move a validated staging directory to its content address (idempotent). Call
        inside `committing()`, and commit the row before leaving it."""
        final = self.path_for(content_hash)
        for entry in staging.iterdir():
            if entry.name not in ADAPTER_FILES:
                entry.unlink()  # an uploaded archive, once expanded
        if final.is_dir():
            return final  # the same content is stored already; staging goes on exit
        final.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.rename(staging, final)
        except OSError:
            if not final.is_dir():
                raise
        return final

    def remove(self, content_hash: str) -> None:
        """Remove a content directory (inside `removing()`, after checking no row uses it)."""
        shutil.rmtree(self.path_for(content_hash), ignore_errors=True)

    def size_bytes(self, content_hash: str) -> int:
        root = self.path_for(content_hash)
        return sum((root / name).stat().st_size for name in ADAPTER_FILES)

    # ---- reconciliation ------------------------------------------------------------------

    def content_hashes(self) -> set[str]:
        """Every content directory on disk (call inside `removing()`)."""
        if not self.root.is_dir():
            return set()
        found = set()
        for prefix in self.root.iterdir():
            if len(prefix.name) != 2 or not prefix.is_dir():
                continue
            for entry in prefix.iterdir():
                if entry.name.startswith(prefix.name) and self._is_hash(entry.name):
                    found.add(entry.name)
        return found

    def remove_abandoned_staging(self) -> list[str]:
        """Remove staging directories whose writer died (its lock is free); names removed."""
        if not self.root.is_dir():
            return []
        removed = []
        for entry in sorted(self.root.iterdir()):
            if not entry.name.startswith(_STAGING) or entry.name.endswith(".lock"):
                continue
            lock_path = self.root / f"{entry.name}.lock"
            try:
                fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o600)
            except OSError:
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                continue  # a live writer holds it
            try:
                shutil.rmtree(entry, ignore_errors=True)
                lock_path.unlink(missing_ok=True)
                removed.append(entry.name)
            finally:
                os.close(fd)
        for lock_path in self.root.glob(f"{_STAGING}*.lock"):
            if not lock_path.with_suffix("").exists():
                with contextlib.suppress(OSError):  # its staging directory is gone
                    _remove_if_unlocked(lock_path)
        return removed

    def _commit_lock(self) -> Path:
        self.root.mkdir(parents=True, exist_ok=True)
        return self.root / ".commit.lock"

    @staticmethod
    def _is_hash(name: str) -> bool:
        return len(name) == 64 and set(name) <= _HEX


@contextlib.contextmanager
def _locked(path: Path, operation: int) -> Iterator[None]:
    """flock on `path` (its own open file: threads of one process exclude each other too).
    The OS drops it when its process dies, so a crash never leaves a lock behind."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, operation)
        yield
    finally:
        os.close(fd)


def _remove_if_unlocked(lock_path: Path) -> None:
    fd = os.open(lock_path, os.O_RDWR)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return  # a writer between taking its lock and making its directory
        lock_path.unlink(missing_ok=True)
    finally:
        os.close(fd)
