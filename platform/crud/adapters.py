"""Adapter registry: versions registered from a staged PEFT directory, status changes,
deletion with the files no registration uses any more.

Registering a name the tenant already has adds a version (`name@v2`): the rows of one name are
its versions, `version` counting up from 1 (a failed version keeps its number). A new version
inherits the grants of the version before it. A row is committed only once its files are in
their content-addressed place, under the store's commit lock (see `storage.py`): never a row
without its files; files without a row (a crash in between) are removed at start-up.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

from sqlalchemy import func, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from loraplex.platform.crud.tenants import read_tenant
from loraplex.platform.db import Adapter, AdapterGrant, AdapterStatus
from loraplex.platform.errors import ConflictError, InvalidRequestError, NotFoundError
from loraplex.platform.schemas.admin import NAME_PATTERN
from loraplex.platform.storage import AdapterStore

NAME_RE = re.compile(NAME_PATTERN)
MAX_REASON = 1024


class ValidatedAdapter(Protocol):
    """What the engine's adapter validator reports (`engine.lora.adapter.LoRAAdapter` fits)."""

    @property
    def rank(self) -> int: ...
    @property
    def lora_alpha(self) -> float: ...
    @property
    def target_modules(self) -> tuple[str, ...]: ...
    @property
    def content_hash(self) -> str: ...


AdapterValidator = Callable[[Path], ValidatedAdapter]


def check_adapter_name(name: str) -> None:
    """Names are never paths: no '/', no leading '.', at most 64 characters."""
    if not NAME_RE.fullmatch(name):
        raise InvalidRequestError(
            f"adapter names must match {NAME_PATTERN} (letters, digits, '.', '_', '-'; "
            "at most 64 characters, no '/')",
            param="name",
        )


# Tries at the next version number when concurrent uploads of one name race for it (then 409).
VERSION_ATTEMPTS = 8


def register_adapter(
    session: Session,
    store: AdapterStore,
    validate: AdapterValidator,
    *,
    tenant_id: int,
    name: str,
    source_dir: Path,
    base_model: str,
) -> Adapter:
    """Copy a local PEFT directory (the CLI's path), validate the copy and register it ready."""
    check_adapter_name(name)
    read_tenant(session, tenant_id)
    with store.staging() as staging:
        try:
            store.copy_into(source_dir, staging)
        except FileNotFoundError as e:
            raise InvalidRequestError(str(e)) from e
        return register_staged(
            session,
            store,
            validate,
            staging,
            tenant_id=tenant_id,
            name=name,
            base_model=base_model,
            status=AdapterStatus.READY,
        )


def register_staged(
    session: Session,
    store: AdapterStore,
    validate: AdapterValidator,
    staging: Path,
    *,
    tenant_id: int,
    name: str,
    base_model: str,
    status: AdapterStatus,
) -> Adapter:
    """Validate the staged files (what we validate is what we serve), store them by content
    and commit the next version's row, in that order."""
    check_adapter_name(name)
    read_tenant(session, tenant_id)
    try:
        info = validate(staging)
    except ValueError as e:  # InvalidAdapterError: the message names the problem
        raise InvalidRequestError(f"invalid adapter: {e}") from e
    failure: BaseException | None = None
    with store.committing():
        path = store.commit(staging, info.content_hash)

        def new_row() -> Adapter:
            return Adapter(
                tenant_id=tenant_id,
                name=name,
                base_model=base_model,
                rank=info.rank,
                lora_alpha=info.lora_alpha,
                target_modules=list(info.target_modules),
                sha256=info.content_hash,
                size_bytes=store.size_bytes(info.content_hash),
                path=str(path),
                status=status.value,
            )

        try:
            row = _commit_next_version(session, new_row)
        except BaseException as exc:
            failure = exc
    if failure is not None:
        remove_unused_files(session, store, info.content_hash)
        if isinstance(failure, IntegrityError):
            raise ConflictError(
                f"another version of {name!r} was registered at the same time; retry"
            ) from failure
        raise failure
    return row


def _commit_next_version(session: Session, new_row: Callable[[], Adapter]) -> Adapter:
    """Commit a new row as the next version of its name. Concurrent uploads of one name race
    for that number (a unique key): the loser rolls back and numbers a fresh row again."""
    for attempt in range(VERSION_ATTEMPTS):
        row = new_row()
        try:
            _add_version(session, row)
            session.commit()
            return row
        except BaseException as exc:
            session.rollback()
            if not isinstance(exc, IntegrityError) or attempt == VERSION_ATTEMPTS - 1:
                raise
    raise AssertionError("unreachable")


def _add_version(session: Session, row: Adapter) -> None:
    """Number `row` as the next version of its name and give it the latest version's grants."""
    latest = session.scalars(
        select(Adapter)
        .where(Adapter.tenant_id == row.tenant_id, Adapter.name == row.name)
        .order_by(Adapter.version.desc())
        .limit(1)
    ).first()
    row.version = latest.version + 1 if latest else 1
    session.add(row)
    if latest is not None:
        session.flush()  # the id, for the grants
        for grant in latest.grants:
            session.add(AdapterGrant(adapter_id=row.id, tenant_id=grant.tenant_id))


def set_adapter_status(
    session: Session, adapter_id: int, status: AdapterStatus, reason: str | None = None
) -> Adapter:
    adapter = read_adapter(session, adapter_id)
    adapter.status = status.value
    adapter.status_reason = reason[:MAX_REASON] if reason else None
    session.commit()
    return adapter


def read_adapters(
    session: Session, tenant_id: int | None = None, status: AdapterStatus | None = None
) -> list[Adapter]:
    """Every version, by tenant, name and version."""
    query = select(Adapter).order_by(Adapter.tenant_id, Adapter.name, Adapter.version)
    if tenant_id is not None:
        query = query.where(Adapter.tenant_id == tenant_id)
    if status is not None:
        query = query.where(Adapter.status == status.value)
    return list(session.scalars(query).all())


def read_adapter(session: Session, adapter_id: int) -> Adapter:
    adapter = session.get(Adapter, adapter_id)
    if adapter is None:
        raise NotFoundError(f"adapter {adapter_id} not found")
    return adapter


def read_latest_ready_ids(session: Session) -> set[int]:
    """The ids `name` resolves to: the latest ready version of each name."""
    latest = (
        select(Adapter.tenant_id, Adapter.name, func.max(Adapter.version).label("version"))
        .where(Adapter.status == AdapterStatus.READY.value)
        .group_by(Adapter.tenant_id, Adapter.name)
        .subquery()
    )
    query = select(Adapter.id).join(
        latest,
        (Adapter.tenant_id == latest.c.tenant_id)
        & (Adapter.name == latest.c.name)
        & (Adapter.version == latest.c.version),
    )
    return set(session.scalars(query).all())


def delete_adapter(session: Session, store: AdapterStore, adapter_id: int) -> None:
    """Unregister one version; the files go too unless another registration shares them."""
    adapter = read_adapter(session, adapter_id)
    content_hash = adapter.sha256
    session.delete(adapter)
    session.commit()
    remove_unused_files(session, store, content_hash)


def remove_unused_files(session: Session, store: AdapterStore, content_hash: str) -> None:
    with store.removing():  # no registration of the same content can commit meanwhile
        in_use = session.scalar(select(func.count()).where(Adapter.sha256 == content_hash))
        session.rollback()  # end the read: the next one sees later commits
        if not in_use:
            store.remove(content_hash)
