"""Adapter grants: another tenant may use one version of an adapter (new versions inherit the
grants of the version before them, see `crud/adapters.py`)."""

from __future__ import annotations

from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from loraplex.platform.crud.adapters import read_adapter
from loraplex.platform.crud.tenants import read_tenant
from loraplex.platform.db import AdapterGrant
from loraplex.platform.errors import ConflictError, InvalidRequestError, NotFoundError


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
