"""Operations: /health (alive), /ready (database, Redis if configured, engine), /metrics."""

from __future__ import annotations

from typing import Literal

import anyio
from fastapi import APIRouter, Depends, Request, Response
from fastapi.responses import JSONResponse

from loraplex.platform.api.deps import (
    StateDep,
    declare_admin_credentials,
    get_admin,
    get_credential,
)
from loraplex.platform.api.openapi import error_responses

router = APIRouter(tags=["ops"])


@router.get("/health")
def read_health() -> dict[str, str]:
    """Public: says only that the process answers."""
    return {"status": "ok"}


@router.get("/ready")
async def read_ready(state: StateDep) -> JSONResponse:
    """Public: 200 when every dependency answers, 503 (with which one failed) otherwise."""
    checks: dict[str, Literal["ok", "unavailable", "draining"]] = {}
    try:
        await anyio.to_thread.run_sync(state.db.ping)
        checks["database"] = "ok"
    except Exception:
        checks["database"] = "unavailable"
    if state.settings.redis_url:
        checks["redis"] = "ok" if await state.limiter.ping() else "unavailable"
    checks["engine"] = (
        "draining" if state.engine.is_draining else "ok" if state.engine.is_ready else "unavailable"
    )
    ready = all(v == "ok" for v in checks.values())
    return JSONResponse(
        {"status": "ready" if ready else "not_ready", "checks": checks},
        status_code=200 if ready else 503,
    )


@router.get(
    "/metrics",
    dependencies=[Depends(declare_admin_credentials)],
    responses=error_responses(400, 401, 403, 503),
)
def read_metrics(request: Request, state: StateDep) -> Response:
    """Prometheus exposition. Needs an admin token unless LORAPLEX_PUBLIC_METRICS is set:
    labels name tenants and adapters."""
    if not state.settings.public_metrics:
        get_admin(state, get_credential(request), None)
    state.metrics.update_engine_gauges(state.engine.get_stats())
    return Response(state.metrics.render(), media_type=state.metrics.content_type)
