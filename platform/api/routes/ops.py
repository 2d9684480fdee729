"""Operations: /health (alive), /ready (database, Redis if configured, engine), /metrics."""

from __future__ import annotations

import anyio
from fastapi import APIRouter, Depends, Request, Response
from fastapi.responses import JSONResponse

from loraplex.platform.api.deps import (
    StateDep,
    declare_admin_credentials,
    get_admin,
    read_credential,
)
from loraplex.platform.api.openapi import error_responses
from loraplex.platform.db import DatabaseNotMigratedError
from loraplex.platform.schemas.ops import (
    REASONS,
    CheckName,
    CheckState,
    HealthPublic,
    ReadinessPublic,
)
from loraplex.platform.state import AppState

router = APIRouter(tags=["ops"])


@router.get("/health", response_model=HealthPublic)
def read_health() -> HealthPublic:
    """Public: says only that the process answers."""
    return HealthPublic()


@router.get(
    "/ready",
    response_model=ReadinessPublic,
    responses={503: {"model": ReadinessPublic, "description": "Not ready; `reasons` says why"}},
)
async def read_ready(state: StateDep) -> JSONResponse:
    """Public: 200 when every dependency answers, 503 (with which one failed and why)
    otherwise."""
    checks: dict[CheckName, CheckState] = {"database": await _database_check(state)}
    if state.settings.redis_url:
        checks["redis"] = "ok" if await state.limiter.ping() else "unavailable"
    checks["engine"] = (
        "draining" if state.engine.is_draining else "ok" if state.engine.is_ready else "unavailable"
    )
    ready = all(v == "ok" for v in checks.values())
    body = ReadinessPublic(
        status="ready" if ready else "not_ready",
        checks=checks,
        reasons={name: REASONS[name, check] for name, check in checks.items() if check != "ok"},
    )
    return JSONResponse(body.model_dump(mode="json"), status_code=200 if ready else 503)


async def _database_check(state: AppState) -> CheckState:
    """The database answers and, once per process, its schema is at the code's head (a server
    that started while the database was down checks it here, when it is back)."""
    try:
        if state.schema_verified:
            await anyio.to_thread.run_sync(state.db.ping)
        else:
            await anyio.to_thread.run_sync(state.verify_schema)
    except DatabaseNotMigratedError:
        return "not_migrated"
    except Exception:
        return "unavailable"
    return "ok"


@router.get(
    "/metrics",
    dependencies=[Depends(declare_admin_credentials)],
    responses=error_responses(400, 401, 403, 503),
)
def read_metrics(request: Request, state: StateDep) -> Response:
    """Prometheus exposition. Needs an admin token unless LORAPLEX_PUBLIC_METRICS is set:
    labels name tenants and adapters."""
    if not state.settings.public_metrics:
        get_admin(state, read_credential(request), None)
    state.metrics.update_engine_gauges(state.engine.get_stats())
    return Response(state.metrics.render(), media_type=state.metrics.content_type)
