"""Model names a tenant can use, and their resolution to one adapter version.

A tenant may name the base model, its own adapters, and adapters granted to it as
`<owner tenant>/<adapter>`; each adapter name may pin a version, `<adapter>@v<N>`. A name
without a version means its latest ready version, looked up per request: a request keeps the
version it started with, and the next one follows a newer upload. Anything else — including
another tenant's adapter that exists — is `model_not_found`, so names cannot be probed across
tenants.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from sqlalchemy import Select, select
from sqlalchemy.orm import Session

from loraplex.platform.crud.adapters import NAME_RE
from loraplex.platform.db import Adapter, AdapterGrant, AdapterStatus, Tenant
from loraplex.platform.errors import ModelNotFoundError

MAX_MODEL_NAME = 256
_VERSION_RE = re.compile(r"v([1-9][0-9]{0,8})")


@dataclass(frozen=True)
class AdapterRef:
    """An adapter version as the engine needs it (a snapshot, safe off the session)."""

    adapter_id: int
    model_id: str
    path: str
    content_hash: str


@dataclass(frozen=True)
class UsableModel:
    model_id: str
    adapter: Adapter | None


def read_usable_models(session: Session, tenant_id: int) -> list[UsableModel]:
    """The tenant's own adapter names, then those granted to it (as owner/name), each once with
    its latest ready version (`name@vN` pins are callable but not listed)."""
    ready = Adapter.status == AdapterStatus.READY.value
    own = session.scalars(
        select(Adapter)
        .where(Adapter.tenant_id == tenant_id, ready)
        .order_by(Adapter.name, Adapter.version)
    ).all()
    granted = session.execute(
        select(Adapter, Tenant.name)
        .join(AdapterGrant, AdapterGrant.adapter_id == Adapter.id)
        .join(Tenant, Tenant.id == Adapter.tenant_id)
        .where(AdapterGrant.tenant_id == tenant_id, ready)
        .order_by(Tenant.name, Adapter.name, Adapter.version)
    ).all()
    latest: dict[str, Adapter] = {}  # in version order: the last one wins
    for adapter in own:
        latest[adapter.name] = adapter
    for adapter, owner in granted:
        latest[f"{owner}/{adapter.name}"] = adapter
    return [UsableModel(model_id, adapter) for model_id, adapter in latest.items()]


def resolve_model(
    session: Session, tenant_id: int, model: str, base_model: str
) -> AdapterRef | None:
    """None for the base model, the adapter version for an adapter name; else
    ModelNotFoundError."""
    if model == base_model:
        return None
    not_found = ModelNotFoundError(
        f"The model {model[:MAX_MODEL_NAME]!r} does not exist or you do not have access to it.",
        param="model",
    )
    owner, _, pinned = model.rpartition("/")
    name, at, version_text = pinned.partition("@")
    version_match = _VERSION_RE.fullmatch(version_text)
    # Only well-formed names reach the database (no NUL bytes, surrogates, floods).
    if (
        not NAME_RE.fullmatch(name)
        or (owner and not NAME_RE.fullmatch(owner))
        or (at and version_match is None)
    ):
        raise not_found
    query = _ready_versions(tenant_id, name, owner)
    if version_match is not None:
        query = query.where(Adapter.version == int(version_match.group(1)))
    adapter = session.scalars(query.order_by(Adapter.version.desc()).limit(1)).first()
    if adapter is None:
        raise not_found
    return AdapterRef(
        adapter_id=adapter.id, model_id=model, path=adapter.path, content_hash=adapter.sha256
    )


def _ready_versions(tenant_id: int, name: str, owner: str) -> Select[Adapter]:
    query = select(Adapter).where(Adapter.name == name, Adapter.status == AdapterStatus.READY.value)
    if not owner:
        return query.where(Adapter.tenant_id == tenant_id)
    return (
        query.join(Tenant, Tenant.id == Adapter.tenant_id)
        .join(AdapterGrant, AdapterGrant.adapter_id == Adapter.id)
        .where(Tenant.name == owner, AdapterGrant.tenant_id == tenant_id)
    )
