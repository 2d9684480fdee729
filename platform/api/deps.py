"""Typed dependencies: every route says who may call it (`CurrentTenant` or `AdminDep`).

The DB-touching ones are plain functions, which FastAPI runs in its thread pool: the
synchronous SQLAlchemy session never blocks the event loop. The ones that only read the request
or the app are `async def`: each sync dependency costs a trip through that pool on every request.
`CurrentTenant`, which every tenant request needs, is `async def` too: it reads the registry
cache and goes to the pool only on a miss.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from typing import Annotated

from fastapi import Depends, Request, Response, Security
from fastapi.security import APIKeyHeader, HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy.orm import Session

from loraplex.platform.auth import (
    AdminContext,
    TenantContext,
    authenticate_admin,
    authenticate_tenant,
    hash_api_key,
)
from loraplex.platform.db import DatabaseNotMigratedError
from loraplex.platform.errors import (
    AuthenticationError,
    InvalidRequestError,
    ServiceUnavailableError,
)
from loraplex.platform.ratelimit import rate_limit_headers
from loraplex.platform.registry_cache import CredentialEntry
from loraplex.platform.settings import Settings
from loraplex.platform.state import AppState

API_KEY_HEADER = "x-api-key"

# The security schemes of the OpenAPI schema. They only declare where credentials travel;
# `read_credential` reads them (and refuses two at once), `auth/` checks them.
TENANT_BEARER = HTTPBearer(
    scheme_name="TenantKey",
    description="An API key (`lpx-...`) or a tenant JWT from POST /v1/auth/token",
    auto_error=False,
)
TENANT_API_KEY = APIKeyHeader(
    name=API_KEY_HEADER,
    scheme_name="TenantApiKey",
    description="The same credential in x-api-key instead (never both)",
    auto_error=False,
)
ADMIN_BEARER = HTTPBearer(
    scheme_name="AdminToken",
    bearerFormat="JWT",
    description="An admin JWT (`loraplex admin token`)",
    auto_error=False,
)


async def declare_tenant_credentials(
    bearer: Annotated[HTTPAuthorizationCredentials | None, Security(TENANT_BEARER)],
    api_key: Annotated[str | None, Security(TENANT_API_KEY)],
) -> None:
    """Declares the tenant schemes on every route that authenticates a tenant."""


async def declare_admin_credentials(
    bearer: Annotated[HTTPAuthorizationCredentials | None, Security(ADMIN_BEARER)],
) -> None:
    """Declares the admin scheme on every route that authenticates an admin."""


async def get_state(request: Request) -> AppState:
    state: AppState = request.app.state.loraplex
    return state


StateDep = Annotated[AppState, Depends(get_state)]


async def get_settings(state: StateDep) -> Settings:
    return state.settings


SettingsDep = Annotated[Settings, Depends(get_settings)]


def get_db(state: StateDep) -> Iterator[Session]:
    with state.db.session() as session:
        yield session


SessionDep = Annotated[Session, Depends(get_db)]


def read_credential(request: Request) -> str:
    """The one bearer credential of the request. Two at once is refused outright: which one
    wins would otherwise depend on code order, a classic confused-deputy opening."""
    authorization = request.headers.getlist("authorization")
    api_keys = request.headers.getlist(API_KEY_HEADER)
    if len(authorization) + len(api_keys) > 1:
        raise InvalidRequestError("send exactly one credential (Authorization or x-api-key)")
    if api_keys:
        value = api_keys[0].strip()
    elif authorization:
        scheme, _, value = authorization[0].strip().partition(" ")
        if scheme.lower() != "bearer":
            raise AuthenticationError("use Authorization: Bearer <API key or token>")
        value = value.strip()
    else:
        raise AuthenticationError("missing credentials: send Authorization: Bearer <API key>")
    if not value or " " in value:
        raise AuthenticationError("malformed credential")
    return value


async def get_credential(request: Request) -> str:
    return read_credential(request)


CredentialDep = Annotated[str, Depends(get_credential)]


def require_schema(state: AppState) -> None:
    """Authentication reads the registry: a database that came back from an outage without
    its schema is a 503 that says what to do, not a 500 on a missing table."""
    try:
        state.verify_schema()
    except DatabaseNotMigratedError as exc:
        raise ServiceUnavailableError(
            "the registry database is not at this version's schema; the operator must run "
            "`loraplex db upgrade`"
        ) from exc


async def get_current_tenant(
    request: Request,
    state: StateDep,
    credential: CredentialDep,
    _: Annotated[None, Depends(declare_tenant_credentials)],
) -> TenantContext:
    """The caller's tenant: from the registry cache when it has this credential (no thread, no
    database), else authenticated in the thread pool (once for a burst of requests with this
    credential) and remembered."""
    entry = CredentialEntry(hash_api_key(credential, state.api_key_secret))
    tenant = await state.registry_cache.load_tenant(
        entry, functools.partial(_authenticate_tenant, state, credential)
    )
    request.state.tenant = tenant  # error responses carry the tenant's rate-limit headers too
    return tenant


def _authenticate_tenant(state: AppState, credential: str) -> TenantContext:
    require_schema(state)
    with state.db.session() as session:
        return authenticate_tenant(session, credential, state.tokens, state.api_key_secret)


CurrentTenant = Annotated[TenantContext, Depends(get_current_tenant)]


def get_admin(
    state: StateDep,
    credential: CredentialDep,
    _: Annotated[None, Depends(declare_admin_credentials)],
) -> AdminContext:
    require_schema(state)
    with state.db.session() as session:
        return authenticate_admin(session, credential, state.tokens, state.api_key_secret)


AdminDep = Annotated[AdminContext, Depends(get_admin)]


async def peek_rate_limit_headers(state: AppState, tenant: TenantContext) -> dict[str, str]:
    """The tenant's x-ratelimit-* headers now, spending nothing."""
    return rate_limit_headers(await state.limiter.peek(str(tenant.tenant_id), tenant.limits))


async def add_rate_limit_headers(
    response: Response, state: StateDep, tenant: CurrentTenant
) -> None:
    """x-ratelimit-* on tenant responses that do not spend the limits themselves."""
    response.headers.update(await peek_rate_limit_headers(state, tenant))


RateLimitHeaders = Depends(add_rate_limit_headers)
