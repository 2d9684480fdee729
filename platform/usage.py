"""UsageWriter: one usage record per request, written to the database in batches.

A request appends its record to an in-memory buffer (never failing) and, with `write`, waits
until the batch holding it is committed: the response a client sees complete always has its
row, even if the process is killed right after (group commit: concurrent requests share one
insert). A background task also inserts batches off the event loop. A failed insert keeps the
rows for the next attempt (waiters give up after a bounded wait and the row stays queued), so
a database outage loses nothing unless the buffer overflows (`max_pending`, oldest dropped,
and logged) or the process dies before the database returns. `stop()` flushes everything left.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import Literal

import anyio
from sqlalchemy.exc import IntegrityError, SQLAlchemyError

from loraplex.platform.crud import insert_usage
from loraplex.platform.db import Database, utcnow

logger = logging.getLogger(__name__)

Endpoint = Literal["completions", "chat.completions"]
# ok: finished; error: failed (the engine's fault or a request it refused); aborted: the client
# left or the server shut down before the end.
RequestStatus = Literal["ok", "error", "aborted"]
# How long a request waits for its row to be committed before answering anyway (the database
# is down: the row stays queued and is written when it returns).
DURABLE_WAIT_S = 2.0


@dataclass(frozen=True)
class UsageEvent:
    request_id: str
    tenant_id: int
    api_key_id: int | None
    adapter_id: int | None
    model: str
    endpoint: Endpoint
    prompt_tokens: int
    completion_tokens: int
    latency_ms: int
    status: RequestStatus
    created_at: datetime = field(default_factory=utcnow)


class UsageWriter:
    def __init__(
        self,
        db: Database,
        *,
        batch_size: int = 500,
        flush_interval_s: float = 1.0,
        max_pending: int = 100_000,
    ) -> None:
        self.db = db
        self.batch_size = batch_size
        self.flush_interval_s = flush_interval_s
        self._pending: deque[UsageEvent] = deque()
        self._committed: dict[str, asyncio.Future[None]] = {}  # request id -> its row is in
        self._max_pending = max_pending
        self._wakeup = asyncio.Event()
        self._lock = asyncio.Lock()
        self._task: asyncio.Task[None] | None = None
        self.num_written = 0
        self.num_dropped = 0

    @property
    def num_pending(self) -> int:
        return len(self._pending)

    def record(self, event: UsageEvent) -> None:
        """Queue one record; never blocks, never raises."""
        if len(self._pending) >= self._max_pending:
            dropped = self._pending.popleft()
            self._settle(dropped.request_id)
            self.num_dropped += 1
            logger.error("usage buffer full (%d): dropped the oldest record", self._max_pending)
        self._pending.append(event)
        if len(self._pending) >= self.batch_size:
            self._wakeup.set()

    async def write(self, event: UsageEvent, wait_s: float = DURABLE_WAIT_S) -> bool:
        """Queue one record and wait until it is committed (the next batch goes at once);
        False if that took longer than `wait_s` (it stays queued). Never raises."""
        committed = asyncio.get_running_loop().create_future()
        self._committed[event.request_id] = committed
        self.record(event)
        self._wakeup.set()
        try:
            await asyncio.wait_for(asyncio.shield(committed), wait_s)
        except TimeoutError:
            logger.warning("usage of %s not committed yet: kept for retry", event.request_id)
            return False
        return True

    def _settle(self, request_id: str) -> None:
        committed = self._committed.pop(request_id, None)
        if committed is not None and not committed.done():
            committed.set_result(None)

    async def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="usage-writer")

    async def stop(self) -> None:
        """Stop the background task and flush what is left (one last attempt)."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        await self.flush()
        if self._pending:
            logger.error("usage writer stopped with %d records unwritten", len(self._pending))

    async def flush(self) -> int:
        """Write everything pending now; returns the number of rows written."""
        written = 0
        async with self._lock:
            while self._pending:
                batch = [
                    self._pending.popleft() for _ in range(min(self.batch_size, len(self._pending)))
                ]
                try:
                    written += await anyio.to_thread.run_sync(self._write, batch)
                except (SQLAlchemyError, OSError):
                    logger.exception("usage insert failed; %d rows kept for retry", len(batch))
                    self._pending.extendleft(reversed(batch))
                    break
                for event in batch:  # committed (or dropped for good: its tenant is gone)
                    self._settle(event.request_id)
        self.num_written += written
        return written

    async def _run(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wakeup.wait(), self.flush_interval_s)
            self._wakeup.clear()
            await self.flush()

    def _write(self, batch: list[UsageEvent]) -> int:
        rows = [asdict(e) for e in batch]
        with self.db.session() as session:
            try:
                insert_usage(session, rows)
                return len(rows)
            except IntegrityError:
                session.rollback()
        # A row refers to something deleted since: keep what can be kept, one row at a time.
        written = 0
        for row in rows:
            for candidate in (row, {**row, "adapter_id": None, "api_key_id": None}):
                with self.db.session() as session:
                    try:
                        insert_usage(session, [candidate])
                    except IntegrityError:
                        continue
                written += 1
                break
            else:
                logger.warning(
                    "usage record %s dropped: its tenant no longer exists", row["request_id"]
                )
        return written
