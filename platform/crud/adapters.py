"""Adapter registry: registration from a local PEFT directory, grants, and model resolution.

Model names a tenant can use: the base model's name, its own adapters by name, and adapters
granted to it as `<owner tenant>/<adapter>`. Everything else — including another tenant's
adapter that exists — is `model_not_found`, so names cannot be probed across tenants.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from sqlalchemy import func, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from loraplex.platform.crud.tenants import read_tenant
from loraplex.platform.db import Adapter, AdapterGrant, AdapterStatus, Tenant
from loraplex.platform.errors import (
    ConflictError,
    InvalidRequestError,
    ModelNotFoundError,
    NotFoundError,
)
from loraplex.platform.schemas.admin import NAME_PATTERN
from loraplex.platform.storage import AdapterStore

MAX_MODEL_NAME = 256
_NAME_RE = re.compile(NAME_PATTERN)


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


@dataclass(frozen=True)
class AdapterRef:
    """An adapter as the engine needs it (a snapshot, safe off the session)."""

    adapter_id: int
    model_id: str
    path: str
    content_hash: str


@dataclass(frozen=True)
class UsableModel:
    model_id: str
    adapter: Adapter | None


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
    """Copy, validate (the stored copy: what we validate is what we serve) and register."""
    if not _NAME_RE.fullmatch(name):
        raise InvalidRequestError(f"adapter names must match {NAME_PATTERN}", param="name")
    read_tenant(session, tenant_id)
    try:
        staging = store.stage(source_dir)
    except FileNotFoundError as e:
        raise InvalidRequestError(str(e)) from e
    try:
        info = validate(staging)
    except ValueError as e:  # InvalidAdapterError: the message names the problem
        store.discard(staging)
        raise InvalidRequestError(f"invalid adapter: {e}") from e
    except BaseException:
        store.discard(staging)
        raise
    path = store.commit(staging, info.content_hash)
    row = Adapter(
        tenant_id=tenant_id,
        name=name,
        base_model=base_model,
        rank=info.rank,
        lora_alpha=info.lora_alpha,
        target_modules=list(info.target_modules),
        sha256=info.content_hash,
        size_bytes=store.size_bytes(info.content_hash),
        path=str(path),
        status=AdapterStatus.READY.value,
    )
    session.add(row)
    try:
        session.commit()
    except IntegrityError as e:
        session.rollback()
        _maybe_remove_files(session, store, info.content_hash)
        raise ConflictError(f"the tenant already has an adapter named {name!r}") from e
    except BaseException:
        session.rollback()
        _maybe_remove_files(session, store, info.content_hash)
        raise
    return row


def read_adapters(session: Session, tenant_id: int | None = None) -> list[Adapter]:
    query = select(Adapter).order_by(Adapter.id)
    if tenant_id is not None:
        query = query.where(Adapter.tenant_id == tenant_id)
    return list(session.scalars(query).all())


def read_adapter(session: Session, adapter_id: int) -> Adapter:
    adapter = session.get(Adapter, adapter_id)
    if adapter is None:
        raise NotFoundError(f"adapter {adapter_id} not found")
    return adapter


def delete_adapter(session: Session, store: AdapterStore, adapter_id: int) -> None:
    """Unregister; the files go too unless another registration shares the content."""
    adapter = read_adapter(session, adapter_id)
    content_hash = adapter.sha256
    session.delete(adapter)
    session.commit()
    _maybe_remove_files(session, store, content_hash)


def _maybe_remove_files(session: Session, store: AdapterStore, content_hash: str) -> None:
    in_use = session.scalar(select(func.count()).where(Adapter.sha256 == content_hash))
    if not in_use:
        store.remove(content_hash)


def create_grant(session: Session, adapter_id: int, tenant_id: int) -> AdapterGrant:
    adapter = read_adapter(session, adapter_id)
    read_tenant(session, tenant_id)
    if adapter.tenant_id == tenant_id:
        raise InvalidRequestError("a tenant cannot be granted its own adapter", param="tenant_id")
    grant = AdapterGrant(adapter_id=adapter_id, tenant_id=tenant_id)
    session.add(grant)
    try:
        session.commit()
    except IntegrityError as e:
        session.rollback()
        raise ConflictError("the tenant already has this grant") from e
    return grant


def delete_grant(session: Session, adapter_id: int, tenant_id: int) -> None:
    grant = session.get(AdapterGrant, (adapter_id, tenant_id))
    if grant is None:
        raise NotFoundError("no such grant")
    session.delete(grant)
    session.commit()


def read_usable_models(session: Session, tenant_id: int) -> list[UsableModel]:
    """The tenant's own adapters, then those granted to it (as owner/name)."""
    own = session.scalars(
        select(Adapter)
        .where(Adapter.tenant_id == tenant_id, Adapter.status == AdapterStatus.READY.value)
        .order_by(Adapter.id)
    ).all()
    granted = session.execute(
        select(Adapter, Tenant.name)
        .join(AdapterGrant, AdapterGrant.adapter_id == Adapter.id)
        .join(Tenant, Tenant.id == Adapter.tenant_id)
        .where(AdapterGrant.tenant_id == tenant_id, Adapter.status == AdapterStatus.READY.value)
        .order_by(Adapter.id)
    ).all()
    return [UsableModel(a.name, a) for a in own] + [
        UsableModel(f"{owner}/{a.name}", a) for a, owner in granted
    ]


def resolve_model(
    session: Session, tenant_id: int, model: str, base_model: str
) -> AdapterRef | None:
    """None for the base model, the adapter for an adapter name; else ModelNotFoundError."""
    if model == base_model:
        return None
    not_found = ModelNotFoundError(
        f"The model {model[:MAX_MODEL_NAME]!r} does not exist or you do not have access to it.",
        param="model",
    )
    owner, _, name = model.rpartition("/")
    # Only well-formed names reach the database (no NUL bytes, surrogates, floods).
    if not _NAME_RE.fullmatch(name) or (owner and not _NAME_RE.fullmatch(owner)):
        raise not_found
    query = select(Adapter).where(Adapter.name == name, Adapter.status == AdapterStatus.READY.value)
    if not owner:
        query = query.where(Adapter.tenant_id == tenant_id)
    else:
        query = (
            query.join(Tenant, Tenant.id == Adapter.tenant_id)
            .join(AdapterGrant, AdapterGrant.adapter_id == Adapter.id)
            .where(Tenant.name == owner, AdapterGrant.tenant_id == tenant_id)
        )
    adapter = session.scalars(query).one_or_none()
    if adapter is None:
        raise not_found
    return AdapterRef(
        adapter_id=adapter.id, model_id=model, path=adapter.path, content_hash=adapter.sha256
    )
