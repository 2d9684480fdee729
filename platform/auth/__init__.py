"""Authentication: API keys (keyed hashes), JWTs (pinned algorithms), caller contexts."""

from loraplex.platform.auth.api_keys import generate_api_key, hash_api_key
from loraplex.platform.auth.service import (
    AdminContext,
    TenantContext,
    authenticate_admin,
    authenticate_api_key,
    authenticate_tenant,
)
from loraplex.platform.auth.tokens import TokenClaims, TokenCodec

__all__ = [
    "AdminContext",
    "TenantContext",
    "TokenClaims",
    "TokenCodec",
    "authenticate_admin",
    "authenticate_api_key",
    "authenticate_tenant",
    "generate_api_key",
    "hash_api_key",
]
