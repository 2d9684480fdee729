"""Admin API: usage reports and engine state."""

from __future__ import annotations

import datetime as dt
from typing import Annotated

from fastapi import APIRouter, Depends, Query

from loraplex.platform import crud
from loraplex.platform.api.deps import AdminDep, SessionDep, StateDep, get_admin
from loraplex.platform.crud.usage import GroupBy
from loraplex.platform.errors import InvalidRequestError
from loraplex.platform.schemas import EngineStatePublic, UsagePublic

router = APIRouter(prefix="/admin/v1", tags=["admin"], dependencies=[Depends(get_admin)])


@router.get("/usage", response_model=UsagePublic)
def read_usage(
    session: SessionDep,
    admin: AdminDep,
    tenant_id: Annotated[int | None, Query(ge=1)] = None,
    group_by: Annotated[str, Query(max_length=32)] = "day",
    start: Annotated[dt.date | None, Query()] = None,
    end: Annotated[dt.date | None, Query()] = None,
) -> UsagePublic:
    """`group_by`: day, adapter, or both comma-separated (always per tenant)."""
    keys = [k.strip() for k in group_by.split(",") if k.strip()]
    if not keys or any(k not in ("day", "adapter") for k in keys):
        raise InvalidRequestError("group_by must be day, adapter or day,adapter", param="group_by")
    groups: list[GroupBy] = ["day" if k == "day" else "adapter" for k in keys]
    rows = crud.read_usage(session, tenant_id=tenant_id, group_by=groups, start=start, end=end)
    return UsagePublic(data=rows)


@router.get("/engine", response_model=EngineStatePublic)
def read_engine(state: StateDep, admin: AdminDep) -> EngineStatePublic:
    """Running / waiting / swapped requests, KV blocks, loaded adapters, preemptions."""
    stats = state.engine.get_stats()
    return EngineStatePublic(
        model=state.engine.model_name,
        max_model_len=state.engine.max_model_len,
        ratelimit_backend=state.limiter.backend,
        num_inflight_requests=state.engine.num_inflight,
        draining=state.engine.is_draining,
        kv_usage=stats.kv_usage,
        num_preemptions=stats.num_preemptions,
        prefix_cache_hit_rate=stats.prefix_cache_hit_rate,
        stats=stats,
    )
