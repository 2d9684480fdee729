"""Admin API: usage reports and engine state."""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Depends, Query

from loraplex.platform import crud
from loraplex.platform.api.deps import AdminDep, SessionDep, StateDep, get_admin
from loraplex.platform.api.params import DayQuery, TenantIdQuery
from loraplex.platform.crud.usage import GroupBy
from loraplex.platform.schemas import EngineStatePublic, UsagePublic

router = APIRouter(prefix="/admin/v1", tags=["admin"], dependencies=[Depends(get_admin)])

# `group_by` as the query spells it -> the keys it groups by (always per tenant too).
UsageGrouping = Literal["day", "adapter", "day,adapter", "adapter,day"]
_GROUP_KEYS: dict[UsageGrouping, tuple[GroupBy, ...]] = {
    "day": ("day",),
    "adapter": ("adapter",),
    "day,adapter": ("day", "adapter"),
    "adapter,day": ("day", "adapter"),
}


@router.get("/usage", response_model=UsagePublic)
def read_usage(
    session: SessionDep,
    admin: AdminDep,
    tenant_id: TenantIdQuery = None,
    group_by: Annotated[UsageGrouping, Query()] = "day",
    start: DayQuery = None,
    end: DayQuery = None,
) -> UsagePublic:
    """`group_by`: day, adapter, or both comma-separated (always per tenant)."""
    keys = _GROUP_KEYS[group_by]
    rows = crud.read_usage(session, tenant_id=tenant_id, group_by=keys, start=start, end=end)
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
