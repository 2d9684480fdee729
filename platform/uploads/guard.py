"""UploadGuard: one upload per (tenant, adapter name) at a time in this process."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

from loraplex.platform.errors import ConflictError


class UploadGuard:
    """One upload per (tenant, name) at a time in this process: a second one gets 409 at once
    (the database's unique version numbers refuse it across processes)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._active: set[tuple[int, str]] = set()

    @contextlib.contextmanager
    def hold(self, tenant_id: int, name: str) -> Iterator[None]:
        key = (tenant_id, name)
        with self._lock:
            if key in self._active:
                raise ConflictError(
                    f"an upload of {name!r} for tenant {tenant_id} is already in progress"
                )
            self._active.add(key)
        try:
            yield
        finally:
            with self._lock:
                self._active.discard(key)
