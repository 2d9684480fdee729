"""GET /v1/usage: the calling tenant's own usage, by day and adapter."""

from __future__ import annotations

from fastapi import APIRouter

from loraplex.platform import crud
from loraplex.platform.api.deps import CurrentTenant, RateLimitHeaders, SessionDep
from loraplex.platform.api.params import DayQuery
from loraplex.platform.schemas import UsagePublic

router = APIRouter(prefix="/v1", tags=["usage"])


@router.get("/usage", response_model=UsagePublic, dependencies=[RateLimitHeaders])
def read_own_usage(
    session: SessionDep,
    tenant: CurrentTenant,
    start: DayQuery = None,
    end: DayQuery = None,
) -> UsagePublic:
    rows = crud.read_usage(
        session, tenant_id=tenant.tenant_id, group_by=("day", "adapter"), start=start, end=end
    )
    return UsagePublic(data=rows)
