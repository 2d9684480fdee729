"""Admin API: the audit log of admin mutations (written by `api/audit.py` and the CLI)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Query

from loraplex.platform import crud
from loraplex.platform.api.deps import AdminDep, SessionDep, get_admin
from loraplex.platform.api.params import LimitQuery, SkipQuery, TimeQuery
from loraplex.platform.audit import MAX_ACTOR
from loraplex.platform.db import AuditAction, AuditResult, AuditTarget
from loraplex.platform.schemas import AuditEventPublic, AuditEventsPublic
from loraplex.platform.schemas.admin import MAX_ID

router = APIRouter(prefix="/admin/v1", tags=["admin"], dependencies=[Depends(get_admin)])


@router.get("/audit", response_model=AuditEventsPublic)
def read_audit_events(
    session: SessionDep,
    admin: AdminDep,
    skip: SkipQuery = 0,
    limit: LimitQuery = 100,
    actor: Annotated[
        str | None, Query(max_length=MAX_ACTOR, description="exactly this actor")
    ] = None,
    action: AuditAction | None = None,
    target_type: AuditTarget | None = None,
    target_id: Annotated[int | None, Query(ge=1, le=MAX_ID)] = None,
    result: AuditResult | None = None,
    since: TimeQuery = None,
    until: TimeQuery = None,
) -> AuditEventsPublic:
    """A page of admin mutations, newest first, that match every filter given (`since`
    inclusive, `until` exclusive); `count`: how many match in all."""
    where = crud.AuditFilter(
        actor=actor,
        action=action,
        target_type=target_type,
        target_id=target_id,
        result=result,
        since=since,
        until=until,
    )
    rows, count = crud.read_audit_events(session, where, skip, limit)
    return AuditEventsPublic(data=[AuditEventPublic.model_validate(r) for r in rows], count=count)
