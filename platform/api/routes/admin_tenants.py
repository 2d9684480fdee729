"""Admin API: tenants and their API keys. Every change is recorded in the audit log
(`api/audit.py`)."""

from __future__ import annotations

from typing import Annotated

import anyio
from fastapi import APIRouter, Depends, Query, status

from loraplex.platform import crud
from loraplex.platform.api.audit import audited
from loraplex.platform.api.deps import AdminDep, SessionDep, SettingsDep, StateDep, get_admin
from loraplex.platform.api.params import IdPath, LimitQuery, SkipQuery
from loraplex.platform.audit import AuditEntry
from loraplex.platform.db import AuditAction
from loraplex.platform.schemas import (
    ApiKeyCreate,
    ApiKeyCreated,
    ApiKeyPublic,
    ApiKeysPublic,
    TenantCreate,
    TenantPublic,
    TenantsPublic,
    TenantUpdate,
)

router = APIRouter(prefix="/admin/v1", tags=["admin"], dependencies=[Depends(get_admin)])


@router.post("/tenants", response_model=TenantPublic, status_code=status.HTTP_201_CREATED)
def create_tenant(
    audit: Annotated[AuditEntry, audited(AuditAction.TENANT_CREATE)],
    session: SessionDep,
    settings: SettingsDep,
    body: TenantCreate,
) -> TenantPublic:
    audit.note(**body.model_dump(mode="json", exclude_unset=True))
    tenant = crud.create_tenant(session, body, settings)
    audit.target_id = tenant.id
    return TenantPublic.model_validate(tenant)


@router.get("/tenants", response_model=TenantsPublic)
def read_tenants(
    session: SessionDep,
    admin: AdminDep,
    skip: SkipQuery = 0,
    limit: LimitQuery = 100,
    q: Annotated[str | None, Query(max_length=64)] = None,
) -> TenantsPublic:
    """A page of tenants by id; `q`: only names containing it (case-insensitive); `count`:
    how many match in all."""
    rows, count = crud.read_tenants(session, skip, limit, q)
    return TenantsPublic(data=[TenantPublic.model_validate(t) for t in rows], count=count)


@router.get("/tenants/{tenant_id}", response_model=TenantPublic)
def read_tenant(session: SessionDep, admin: AdminDep, tenant_id: IdPath) -> TenantPublic:
    return TenantPublic.model_validate(crud.read_tenant(session, tenant_id))


@router.patch("/tenants/{tenant_id}", response_model=TenantPublic)
def update_tenant(
    audit: Annotated[AuditEntry, audited(AuditAction.TENANT_UPDATE)],
    session: SessionDep,
    tenant_id: IdPath,
    body: TenantUpdate,
) -> TenantPublic:
    audit.note(**body.model_dump(mode="json", exclude_unset=True))
    return TenantPublic.model_validate(crud.update_tenant(session, tenant_id, body))


@router.delete("/tenants/{tenant_id}", status_code=status.HTTP_204_NO_CONTENT)
async def delete_tenant(
    audit: Annotated[AuditEntry, audited(AuditAction.TENANT_DELETE)],
    state: StateDep,
    tenant_id: IdPath,
) -> None:
    def delete() -> list[int]:
        with state.db.session() as session:
            audit.note(name=crud.read_tenant(session, tenant_id).name)
            adapter_ids = [a.id for a in crud.read_adapters(session, tenant_id)]
            audit.note(adapter_ids=adapter_ids)
            for adapter_id in adapter_ids:
                crud.delete_adapter(session, state.adapter_store, adapter_id)  # files too
            crud.delete_tenant(session, tenant_id)
            return adapter_ids

    for adapter_id in await anyio.to_thread.run_sync(delete):
        await state.engine.engine.remove_lora(adapter_id)


@router.post(
    "/tenants/{tenant_id}/api-keys",
    response_model=ApiKeyCreated,
    status_code=status.HTTP_201_CREATED,
)
def create_api_key(
    audit: Annotated[AuditEntry, audited(AuditAction.KEY_CREATE)],
    session: SessionDep,
    state: StateDep,
    tenant_id: IdPath,
    body: ApiKeyCreate,
) -> ApiKeyCreated:
    audit.note(**body.model_dump(mode="json", exclude_unset=True))  # name, expires_at
    row, key = crud.create_api_key(session, tenant_id, body, state.api_key_secret)
    audit.target_id = row.id  # the secret itself is never noted
    public = ApiKeyPublic.model_validate(row)
    return ApiKeyCreated(**public.model_dump(), key=key)


@router.get("/tenants/{tenant_id}/api-keys", response_model=ApiKeysPublic)
def read_api_keys(session: SessionDep, admin: AdminDep, tenant_id: IdPath) -> ApiKeysPublic:
    rows = crud.read_api_keys(session, tenant_id)
    return ApiKeysPublic(data=[ApiKeyPublic.model_validate(k) for k in rows], count=len(rows))


@router.delete("/api-keys/{key_id}", response_model=ApiKeyPublic)
def delete_api_key(
    audit: Annotated[AuditEntry, audited(AuditAction.KEY_REVOKE)],
    session: SessionDep,
    key_id: IdPath,
) -> ApiKeyPublic:
    """Revokes the key (kept for the audit trail); tokens exchanged from it die with it."""
    row = crud.revoke_api_key(session, key_id)
    audit.note(tenant_id=row.tenant_id, name=row.name)
    return ApiKeyPublic.model_validate(row)
