"""RegistryCache: the registry rows that every inference request reads, held in memory briefly.

An inference request needs two things from the registry before it reaches the engine: who its
credential belongs to (the API key's row and its tenant), and which adapter version its `model`
names. Read from the database each time, these two look-ups cost more than the rest of
admission together. Each one also needs a trip through the thread pool. During a burst of
requests, new requests wait for them. So successful look-ups are cached:

- An entry lives at most `ttl_s` seconds (0: no cache), and never past its credential's own
  expiry (a token's `exp`, a key's `expires_at`).
- Any commit in this process that adds, changes or deletes a tenant, an API key, an adapter or a
  grant clears the whole cache. `watch` does this with SQLAlchemy session events: they see
  every ORM change and every INSERT, UPDATE or DELETE statement run through a session. Raw SQL
  text would not be seen; the platform runs none. So a revoked key, a suspended tenant, a
  changed limit, a new adapter version or a removed grant made through this server takes
  effect on the next request. Only a key's `last_used_at` changing does not count.
- While the database is down, credentials verified less than `ttl_s` ago are still served;
  any other credential gets a 503 (authentication fails closed).
- A change made by another process (the `loraplex` CLI, another server on the same database)
  takes effect within `ttl_s`.
- Failures are never cached: a wrong key, a suspended tenant or an unknown model reads the
  database every time. So a new adapter is usable at once, and bad credentials cannot fill the
  cache. There are at most `max_entries` entries; when it is full, the oldest goes first.
- A look-up started before a clear is not stored after it (`generation`). Without this, a row
  read just before a revocation's commit could be stored just after the clear, and outlive it.
- Misses are looked up once (`load_tenant`, `load_adapter`): requests that miss the same entry
  while its look-up is in flight wait for that look-up instead of starting their own. A burst
  of requests on a cold or expired entry (every request of a burst, once the TTL has passed
  since the last one) would otherwise send every one of them to the database through the
  thread pool, and admission would queue behind those look-ups. A request that arrives after a
  clear starts a look-up of its own, and a waiter that leaves (its client disconnected) does
  not cancel the look-up for the others. A look-up that fails fails every request waiting on
  it, and is not remembered.

Credentials are keyed by their HMAC under the server's API-key secret (for a key, what the
database stores), never by the credential itself.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypeVar, cast

import anyio
from sqlalchemy import event, inspect
from sqlalchemy.orm import InstanceState, ORMExecuteState, Session, sessionmaker

from loraplex.platform.auth import TenantContext
from loraplex.platform.crud import AdapterRef
from loraplex.platform.db import (
    Adapter,
    AdapterGrant,
    ApiKey,
    AuditEvent,
    Tenant,
    UsageRecord,
    utcnow,
)

# The rows whose changes can change a cached answer.
REGISTRY_ROWS = (Tenant, ApiKey, Adapter, AdapterGrant)
# Tables whose rows no cached answer depends on.
_OTHER_TABLES = frozenset({UsageRecord.__tablename__, AuditEvent.__tablename__})
# Columns whose change alone leaves every cached answer as it was.
_IGNORED_COLUMNS = frozenset({"last_used_at"})
_CHANGED = "loraplex_registry_changed"  # a key of Session.info


@dataclass(frozen=True)
class CredentialEntry:
    """The tenant of a credential (an API key or a tenant JWT), by the credential's HMAC. A
    token verified once is the same token the next time: only time can change its answer, and
    its entry never outlives its `exp`."""

    digest: str


@dataclass(frozen=True)
class ModelEntry:
    """What a tenant's `model` name resolves to."""

    tenant_id: int
    model: str


CacheKey = CredentialEntry | ModelEntry
Value = TypeVar("Value", TenantContext, AdapterRef | None)
KeyT = TypeVar("KeyT", CredentialEntry, ModelEntry)


class RegistryCache:
    """Thread-safe: read on the event loop, filled and cleared from worker threads. The
    `load_*` methods run on one event loop (the server's)."""

    def __init__(
        self,
        ttl_s: float,
        *,
        max_entries: int = 10_000,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.ttl_s = ttl_s
        self.max_entries = max_entries
        self._clock = clock
        self._lock = threading.Lock()
        self._entries: OrderedDict[CacheKey, tuple[float, TenantContext | AdapterRef]] = (
            OrderedDict()
        )
        self._generation = 0
        # Look-ups in flight, on the event loop: the generation each began at, and its task.
        self._loading: dict[CacheKey, tuple[int, asyncio.Task[Any]]] = {}

    @property
    def generation(self) -> int:
        """Counts the clears. `load_*` read it before a look-up and pass it to `put_*` after,
        which store nothing if a clear came in between."""
        return self._generation

    def __len__(self) -> int:
        return len(self._entries)

    def tenant(self, key: CredentialEntry) -> TenantContext | None:
        value = self._get(key)
        assert value is None or isinstance(value, TenantContext)
        return value

    def adapter(self, key: ModelEntry) -> AdapterRef | None:
        """The cached adapter; None when not cached (the base model is never looked up)."""
        value = self._get(key)
        assert value is None or isinstance(value, AdapterRef)
        return value

    def put_tenant(self, key: CredentialEntry, tenant: TenantContext, generation: int) -> None:
        self._put(key, tenant, generation, tenant.expires_at)

    def put_adapter(self, key: ModelEntry, adapter: AdapterRef, generation: int) -> None:
        self._put(key, adapter, generation, None)

    async def load_tenant(
        self, key: CredentialEntry, authenticate: Callable[[], TenantContext]
    ) -> TenantContext:
        """The cached tenant, else `authenticate()` run in the thread pool, once for all the
        callers that miss this entry together; its tenant is remembered, its error raised."""
        tenant = self.tenant(key)
        if tenant is not None:
            return tenant
        return await self._load_once(key, authenticate, self.put_tenant)

    async def load_adapter(
        self, key: ModelEntry, resolve: Callable[[], AdapterRef | None]
    ) -> AdapterRef | None:
        """`load_tenant` for a model name: the cached adapter, else `resolve()` (None: no such
        adapter, not remembered)."""
        adapter = self.adapter(key)
        if adapter is not None:
            return adapter

        def put(entry: ModelEntry, found: AdapterRef | None, generation: int) -> None:
            if found is not None:
                self.put_adapter(entry, found, generation)

        return await self._load_once(key, resolve, put)

    async def _load_once(
        self,
        key: KeyT,
        load: Callable[[], Value],
        put: Callable[[KeyT, Value, int], None],
    ) -> Value:
        if self.ttl_s <= 0:  # no cache: every caller reads the database itself
            return await anyio.to_thread.run_sync(load)
        generation = self._generation
        loading = self._loading.get(key)
        if loading is None or loading[0] != generation:  # none, or begun before a clear
            task = asyncio.create_task(self._load(key, load, put, generation))
            # Its error is its waiters'; with none left (all cancelled) it is dropped quietly.
            task.add_done_callback(lambda t: t.cancelled() or t.exception())
            loading = self._loading[key] = (generation, task)
        # Shielded: a caller that is cancelled leaves the look-up running for the others.
        return cast(Value, await asyncio.shield(loading[1]))

    async def _load(
        self,
        key: KeyT,
        load: Callable[[], Value],
        put: Callable[[KeyT, Value, int], None],
        generation: int,
    ) -> Value:
        try:
            value = await anyio.to_thread.run_sync(load)
            put(key, value, generation)
            return value
        finally:
            loading = self._loading.get(key)
            if loading is not None and loading[1] is asyncio.current_task():
                del self._loading[key]

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self._generation += 1

    def watch(self, session_factory: sessionmaker[Session]) -> None:
        """Clear the cache after every commit, by sessions of `session_factory`, that changed a
        registry row."""
        event.listen(session_factory, "after_flush", _note_registry_changes)
        event.listen(session_factory, "do_orm_execute", _note_bulk_changes)
        event.listen(session_factory, "after_commit", self._after_commit)

    def _after_commit(self, session: Session) -> None:
        if session.info.pop(_CHANGED, False):
            self.clear()

    def _get(self, key: CacheKey) -> TenantContext | AdapterRef | None:
        if self.ttl_s <= 0:
            return None
        with self._lock:
            found = self._entries.get(key)
            if found is None:
                return None
            deadline, value = found
            if self._clock() >= deadline:
                del self._entries[key]
                return None
            return value

    def _put(
        self,
        key: CacheKey,
        value: TenantContext | AdapterRef,
        generation: int,
        expires_at: datetime | None,
    ) -> None:
        if self.ttl_s <= 0:
            return
        lifetime = self.ttl_s
        if expires_at is not None:
            lifetime = min(lifetime, (expires_at - utcnow()).total_seconds())
        if lifetime <= 0:
            return
        with self._lock:
            if generation != self._generation:
                return  # a clear came after the look-up began: its row may be stale
            self._entries.pop(key, None)
            self._entries[key] = (self._clock() + lifetime, value)
            while len(self._entries) > self.max_entries:
                self._entries.popitem(last=False)


def _note_registry_changes(session: Session, _flush_context: object) -> None:
    # after_flush still sees the flushed objects in new / dirty / deleted. A flush whose
    # transaction is rolled back leaves the mark: the session's next commit clears for nothing.
    if _changes_registry(session.new, session.dirty, session.deleted):
        session.info[_CHANGED] = True


def _note_bulk_changes(execute_state: ORMExecuteState) -> None:
    # An INSERT, UPDATE or DELETE statement bypasses the flush. Usage rows are inserted this way
    # every second and change no answer; one on a registry table, or on a table it cannot name,
    # counts.
    if execute_state.is_insert or execute_state.is_update or execute_state.is_delete:
        table = getattr(execute_state.statement, "table", None)
        if getattr(table, "name", None) not in _OTHER_TABLES:
            execute_state.session.info[_CHANGED] = True


def _changes_registry(
    new: Iterable[object], dirty: Iterable[object], deleted: Iterable[object]
) -> bool:
    for obj in (*new, *deleted):
        if isinstance(obj, REGISTRY_ROWS):
            return True
    for obj in dirty:
        if isinstance(obj, REGISTRY_ROWS):
            state: InstanceState[object] = inspect(obj)
            changed = {a.key for a in state.attrs if a.history.has_changes()}
            if changed - _IGNORED_COLUMNS:
                return True
    return False
