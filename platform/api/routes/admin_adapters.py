"""Admin API: adapter versions (upload, list, delete) and grants. Every change is recorded in
the audit log (`api/audit.py`)."""

from __future__ import annotations

from typing import Annotated, Any

import anyio
from fastapi import APIRouter, Depends, Request, status

from loraplex.platform import crud
from loraplex.platform.api.audit import audited
from loraplex.platform.api.deps import AdminDep, SessionDep, StateDep, get_admin
from loraplex.platform.api.openapi import error_responses
from loraplex.platform.api.params import IdPath, TenantIdQuery
from loraplex.platform.audit import AuditEntry
from loraplex.platform.db import Adapter, AuditAction
from loraplex.platform.schemas import (
    AdapterGrantCreate,
    AdapterGrantPublic,
    AdapterPublic,
    AdaptersPublic,
)
from loraplex.platform.schemas.admin import MAX_ID
from loraplex.platform.services.adapter_upload import upload_adapter
from loraplex.platform.state import AppState

router = APIRouter(prefix="/admin/v1", tags=["admin"], dependencies=[Depends(get_admin)])

_FILE = {"type": "string", "format": "binary"}
_UPLOAD_BODY: dict[str, Any] = {
    "requestBody": {
        "required": True,
        "content": {
            "multipart/form-data": {
                "schema": {
                    "type": "object",
                    "required": ["tenant_id", "name", "files"],
                    "properties": {
                        "tenant_id": {"type": "integer", "minimum": 1, "maximum": MAX_ID},
                        "name": {"type": "string"},
                        "files": {"type": "array", "items": _FILE},
                    },
                }
            }
        },
    }
}


def _public(state: AppState, rows: list[Adapter], latest_ids: set[int]) -> list[AdapterPublic]:
    tiers = {r.lora_int_id: r.tier for r in state.engine.get_stats().lora.resident}
    return [
        AdapterPublic.model_validate(row).model_copy(
            update={"is_latest": row.id in latest_ids, "residency": tiers.get(row.id, "disk")}
        )
        for row in rows
    ]


@router.post(
    "/adapters",
    response_model=AdapterPublic,
    status_code=status.HTTP_201_CREATED,
    openapi_extra=_UPLOAD_BODY,
    responses=error_responses(404),  # no such tenant
)
async def create_adapter(
    audit: Annotated[AuditEntry, audited(AuditAction.ADAPTER_UPLOAD)],
    request: Request,
    state: StateDep,
) -> AdapterPublic:
    """Upload a new version (multipart: `tenant_id`, `name`, then the two PEFT files or one
    .zip / .tar.gz). Answers once the load check is done: `status` is `ready` or `failed`."""
    row = await upload_adapter(state, request, audit)

    def latest() -> set[int]:
        with state.db.session() as session:
            return crud.read_latest_ready_ids(session)

    return _public(state, [row], await anyio.to_thread.run_sync(latest))[0]


@router.get("/adapters", response_model=AdaptersPublic)
def read_adapters(
    session: SessionDep,
    state: StateDep,
    admin: AdminDep,
    tenant_id: TenantIdQuery = None,
) -> AdaptersPublic:
    """Every version, by tenant, name and version, with where each one lives now."""
    rows = crud.read_adapters(session, tenant_id)
    data = _public(state, rows, crud.read_latest_ready_ids(session))
    return AdaptersPublic(data=data, count=len(data))


@router.get("/adapters/{adapter_id}", response_model=AdapterPublic)
def read_adapter(
    session: SessionDep, state: StateDep, admin: AdminDep, adapter_id: IdPath
) -> AdapterPublic:
    row = crud.read_adapter(session, adapter_id)
    return _public(state, [row], crud.read_latest_ready_ids(session))[0]


@router.delete("/adapters/{adapter_id}", status_code=status.HTTP_204_NO_CONTENT)
async def delete_adapter(
    audit: Annotated[AuditEntry, audited(AuditAction.ADAPTER_DELETE)],
    state: StateDep,
    adapter_id: IdPath,
) -> None:
    """Unregister one version: new requests naming it get 404 (a bare name falls back to the
    latest remaining ready version); requests in flight finish on it."""

    def delete() -> None:
        with state.db.session() as session:
            row = crud.read_adapter(session, adapter_id)
            audit.note(tenant_id=row.tenant_id, name=row.name, version=row.version)
            crud.delete_adapter(session, state.adapter_store, adapter_id)

    await anyio.to_thread.run_sync(delete)
    await state.engine.engine.remove_lora(adapter_id)


@router.get("/adapters/{adapter_id}/grants", response_model=list[AdapterGrantPublic])
def read_grants(
    session: SessionDep, admin: AdminDep, adapter_id: IdPath
) -> list[AdapterGrantPublic]:
    return [
        AdapterGrantPublic.model_validate(g) for g in crud.read_adapter(session, adapter_id).grants
    ]


@router.post(
    "/adapters/{adapter_id}/grants",
    response_model=AdapterGrantPublic,
    status_code=status.HTTP_201_CREATED,
)
def create_grant(
    audit: Annotated[AuditEntry, audited(AuditAction.GRANT_CREATE)],
    session: SessionDep,
    adapter_id: IdPath,
    body: AdapterGrantCreate,
) -> AdapterGrantPublic:
    audit.note(tenant_id=body.tenant_id)
    return AdapterGrantPublic.model_validate(crud.create_grant(session, adapter_id, body.tenant_id))


@router.delete("/adapters/{adapter_id}/grants/{tenant_id}", status_code=status.HTTP_204_NO_CONTENT)
def delete_grant(
    audit: Annotated[AuditEntry, audited(AuditAction.GRANT_DELETE)],
    session: SessionDep,
    adapter_id: IdPath,
    tenant_id: IdPath,
) -> None:
    crud.delete_grant(session, adapter_id, tenant_id)  # the path's tenant_id is in the detail
