"""Turning a bearer credential into who is calling: a tenant (API key or tenant JWT) or an admin.

Fails closed: anything unexpected is a 401. A valid credential for a suspended tenant or used
outside its scope is a 403.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from sqlalchemy import select
from sqlalchemy.orm import Session, joinedload

from loraplex.platform.auth.api_keys import (
    api_key_matches,
    api_key_prefix,
    looks_like_api_key,
)
from loraplex.platform.auth.tokens import TokenCodec
from loraplex.platform.db import ApiKey, Tenant, TenantStatus, TenantTier, utcnow
from loraplex.platform.errors import AuthenticationError, PermissionDeniedError
from loraplex.platform.ratelimit import TenantLimits

# last_used_at is refreshed at most this often: one write per key per minute, not per request.
LAST_USED_RESOLUTION = timedelta(seconds=60)
_DUMMY_HASH = "0" * 64


@dataclass(frozen=True)
class TenantContext:
    """The calling tenant, as a plain snapshot (safe to use off the DB session)."""

    tenant_id: int
    name: str
    tier: TenantTier
    requests_per_minute: int
    tokens_per_minute: int
    max_concurrent_requests: int
    api_key_id: int | None
    # When the credential stops being valid by itself (the token's exp, the key's expires_at,
    # the earlier of the two); None: never. Caches of this context must not outlive it.
    expires_at: datetime | None = None

    @property
    def limits(self) -> TenantLimits:
        return TenantLimits(
            requests_per_minute=self.requests_per_minute,
            tokens_per_minute=self.tokens_per_minute,
            max_concurrent_requests=self.max_concurrent_requests,
        )

    @classmethod
    def of(
        cls, tenant: Tenant, key: ApiKey | None, token_expires_at: datetime | None = None
    ) -> TenantContext:
        expiries = [t for t in (token_expires_at, key.expires_at if key else None) if t]
        return cls(
            tenant_id=tenant.id,
            name=tenant.name,
            tier=TenantTier(tenant.priority),
            requests_per_minute=tenant.requests_per_minute,
            tokens_per_minute=tenant.tokens_per_minute,
            max_concurrent_requests=tenant.max_concurrent_requests,
            api_key_id=key.id if key else None,
            expires_at=min(expiries, default=None),
        )


@dataclass(frozen=True)
class AdminContext:
    subject: str


def authenticate_api_key(session: Session, key: str, secret: bytes) -> ApiKey:
    """The live key row for `key`, or AuthenticationError. Touches last_used_at."""
    prefix = api_key_prefix(key)
    row = None
    if prefix is not None:
        query = select(ApiKey).options(joinedload(ApiKey.tenant)).where(ApiKey.prefix == prefix)
        row = session.scalars(query).one_or_none()
    # Hash even when nothing matched, so a miss costs the same time as a wrong key.
    if not api_key_matches(key, row.key_hash if row else _DUMMY_HASH, secret) or row is None:
        raise AuthenticationError("invalid API key")
    now = utcnow()
    if row.revoked_at is not None:
        raise AuthenticationError("API key revoked")
    if row.expires_at is not None and row.expires_at <= now:
        raise AuthenticationError("API key expired")
    if row.last_used_at is None or now - row.last_used_at >= LAST_USED_RESOLUTION:
        row.last_used_at = now
        session.commit()
    return row


def authenticate_tenant(
    session: Session, credential: str, codec: TokenCodec, key_secret: bytes
) -> TenantContext:
    key: ApiKey | None
    token_expires_at = None
    if looks_like_api_key(credential):
        key = authenticate_api_key(session, credential, key_secret)
        tenant = key.tenant
    else:
        claims = codec.verify(credential)
        if claims.scope != "tenant" or claims.tenant_id is None:
            raise PermissionDeniedError("this route needs a tenant credential")
        maybe_tenant = session.get(Tenant, claims.tenant_id)
        if maybe_tenant is None:
            raise AuthenticationError("invalid token")
        tenant, key = maybe_tenant, None
        token_expires_at = datetime.fromtimestamp(claims.expires_at, UTC)
        if claims.api_key_id is not None:
            key = _key_still_valid(session, claims.api_key_id, tenant.id)
    if tenant.status != TenantStatus.ACTIVE:
        raise PermissionDeniedError("tenant suspended")
    return TenantContext.of(tenant, key, token_expires_at)


def _key_still_valid(session: Session, api_key_id: int, tenant_id: int) -> ApiKey:
    """A token exchanged from a key dies with the key: its revocation is not delayed until the
    token's own expiry (only, when the CLI revokes it, by the registry cache's TTL)."""
    key = session.get(ApiKey, api_key_id)
    now = utcnow()
    if (
        key is None
        or key.tenant_id != tenant_id
        or key.revoked_at is not None
        or (key.expires_at is not None and key.expires_at <= now)
    ):
        raise AuthenticationError("the API key this token came from is no longer valid")
    return key


def authenticate_admin(
    session: Session, credential: str, codec: TokenCodec, key_secret: bytes
) -> AdminContext:
    if looks_like_api_key(credential):
        authenticate_api_key(session, credential, key_secret)  # 401 if bad, else wrong scope
        raise PermissionDeniedError("admin routes need an admin token")
    claims = codec.verify(credential)
    if claims.scope != "admin":
        raise PermissionDeniedError("admin routes need an admin token")
    return AdminContext(subject=claims.subject)
