"""POST /v1/auth/token: exchange an API key for a short-lived tenant JWT."""

from __future__ import annotations

from fastapi import APIRouter

from loraplex.platform.api.deps import (
    CredentialDep,
    CurrentTenant,
    RateLimitHeaders,
    SettingsDep,
    StateDep,
)
from loraplex.platform.auth.api_keys import looks_like_api_key
from loraplex.platform.errors import PermissionDeniedError
from loraplex.platform.schemas import TokenResponse

router = APIRouter(prefix="/v1/auth", tags=["auth"])


@router.post("/token", response_model=TokenResponse, dependencies=[RateLimitHeaders])
def create_token(
    state: StateDep, settings: SettingsDep, credential: CredentialDep, tenant: CurrentTenant
) -> TokenResponse:
    # Only a key can be exchanged: a token minting tokens would never expire in practice.
    if not looks_like_api_key(credential):
        raise PermissionDeniedError("only an API key can be exchanged for a token")
    ttl = settings.tenant_token_ttl_s
    token = state.tokens.issue_tenant_token(tenant.tenant_id, tenant.api_key_id, ttl)
    return TokenResponse(access_token=token, expires_in=ttl)
