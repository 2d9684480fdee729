"""Admin API: registered adapters and grants (upload comes with the adapter-upload issue)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Query, status

from loraplex.platform import crud
from loraplex.platform.api.deps import AdminDep, SessionDep, StateDep, get_admin
from loraplex.platform.schemas import (
    AdapterGrantCreate,
    AdapterGrantPublic,
    AdapterPublic,
    AdaptersPublic,
)

router = APIRouter(prefix="/admin/v1", tags=["admin"], dependencies=[Depends(get_admin)])


@router.get("/adapters", response_model=AdaptersPublic)
def read_adapters(
    session: SessionDep, admin: AdminDep, tenant_id: Annotated[int | None, Query(ge=1)] = None
) -> AdaptersPublic:
    rows = crud.read_adapters(session, tenant_id)
    return AdaptersPublic(data=[AdapterPublic.model_validate(a) for a in rows], count=len(rows))


@router.get("/adapters/{adapter_id}", response_model=AdapterPublic)
def read_adapter(session: SessionDep, admin: AdminDep, adapter_id: int) -> AdapterPublic:
    return AdapterPublic.model_validate(crud.read_adapter(session, adapter_id))


@router.delete("/adapters/{adapter_id}", status_code=status.HTTP_204_NO_CONTENT)
def delete_adapter(session: SessionDep, state: StateDep, admin: AdminDep, adapter_id: int) -> None:
    crud.delete_adapter(session, state.adapter_store, adapter_id)


@router.post(
    "/adapters/{adapter_id}/grants",
    response_model=AdapterGrantPublic,
    status_code=status.HTTP_201_CREATED,
)
def create_grant(
    session: SessionDep, admin: AdminDep, adapter_id: int, body: AdapterGrantCreate
) -> AdapterGrantPublic:
    return AdapterGrantPublic.model_validate(crud.create_grant(session, adapter_id, body.tenant_id))


@router.delete("/adapters/{adapter_id}/grants/{tenant_id}", status_code=status.HTTP_204_NO_CONTENT)
def delete_grant(session: SessionDep, admin: AdminDep, adapter_id: int, tenant_id: int) -> None:
    crud.delete_grant(session, adapter_id, tenant_id)
