"""Tenant CRUD."""

from __future__ import annotations

from sqlalchemy import ColumnElement, func, select, true
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from loraplex.platform.db import Tenant
from loraplex.platform.errors import ConflictError, NotFoundError
from loraplex.platform.schemas import TenantCreate, TenantUpdate
from loraplex.platform.settings import Settings


def create_tenant(session: Session, body: TenantCreate, settings: Settings) -> Tenant:
    tenant = Tenant(
        name=body.name,
        priority=body.priority.value,
        status=body.status.value,
        requests_per_minute=body.requests_per_minute or settings.default_requests_per_minute,
        tokens_per_minute=body.tokens_per_minute or settings.default_tokens_per_minute,
        max_concurrent_requests=(
            body.max_concurrent_requests or settings.default_max_concurrent_requests
        ),
    )
    session.add(tenant)
    _commit_unique(session, f"a tenant named {body.name!r} already exists")
    return tenant


def read_tenants(
    session: Session, skip: int = 0, limit: int = 100, search: str | None = None
) -> tuple[list[Tenant], int]:
    """One page of tenants by id, and how many match in all; `search`: a case-insensitive
    substring of the name."""
    match: ColumnElement[bool] = true()
    if search:
        escaped = search.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
        match = func.lower(Tenant.name).like(f"%{escaped.lower()}%", escape="\\")
    count = session.scalar(select(func.count()).select_from(Tenant).where(match)) or 0
    rows = session.scalars(
        select(Tenant).where(match).order_by(Tenant.id).offset(skip).limit(limit)
    ).all()
    return list(rows), count


def read_tenant(session: Session, tenant_id: int) -> Tenant:
    tenant = session.get(Tenant, tenant_id)
    if tenant is None:
        raise NotFoundError(f"tenant {tenant_id} not found")
    return tenant


def read_tenant_by_name(session: Session, name: str) -> Tenant:
    tenant = session.scalars(select(Tenant).where(Tenant.name == name)).one_or_none()
    if tenant is None:
        raise NotFoundError(f"tenant {name!r} not found")
    return tenant


def update_tenant(session: Session, tenant_id: int, body: TenantUpdate) -> Tenant:
    tenant = read_tenant(session, tenant_id)
    for field, value in body.model_dump(exclude_unset=True).items():
        if value is None:
            continue
        setattr(tenant, field, getattr(value, "value", value))
    _commit_unique(session, f"a tenant named {body.name!r} already exists")
    return tenant


def delete_tenant(session: Session, tenant_id: int) -> None:
    """Deletes the tenant with its keys, adapters, grants and usage (database cascades)."""
    session.delete(read_tenant(session, tenant_id))
    session.commit()


def _commit_unique(session: Session, message: str) -> None:
    try:
        session.commit()
    except IntegrityError as e:
        session.rollback()
        raise ConflictError(message) from e
