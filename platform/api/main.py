"""The API router: every route module, mounted once."""

from __future__ import annotations

from fastapi import APIRouter

from loraplex.platform.api.routes import (
    admin_adapters,
    admin_system,
    admin_tenants,
    auth,
    openai,
    ops,
    usage,
)

api_router = APIRouter()
for module in (openai, auth, usage, admin_tenants, admin_adapters, admin_system, ops):
    api_router.include_router(module.router)
