"""The API router: every route module, mounted once, with the errors each family answers."""

from __future__ import annotations

from fastapi import APIRouter

from loraplex.platform.api.openapi import error_responses
from loraplex.platform.api.routes import (
    admin_adapters,
    admin_audit,
    admin_system,
    admin_tenants,
    auth,
    openai,
    ops,
    usage,
)

# Every authenticated route: a malformed request or credential, a refused one, no registry.
AUTHENTICATED_ERRORS = error_responses(400, 401, 403, 503)

api_router = APIRouter()
for module in (openai, auth, usage, admin_tenants, admin_adapters, admin_system, admin_audit):
    api_router.include_router(module.router, responses=AUTHENTICATED_ERRORS)
api_router.include_router(ops.router)
