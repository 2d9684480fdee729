"""JWTs: issuing and verifying tenant and admin tokens with PyJWT.

The algorithm is pinned by the server's configuration, never read from the token: that stops
`alg: none` and HS/RS confusion (an HS256 token "signed" with the RS256 public key). Every token
must carry exp, iat, aud, iss and sub; the scope claim says tenant or admin.
"""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass
from typing import Any, Literal

import jwt

from loraplex.platform.errors import AuthenticationError
from loraplex.platform.settings import Settings

Scope = Literal["tenant", "admin"]
MAX_TOKEN_BYTES = 8192
REQUIRED_CLAIMS = ["exp", "iat", "aud", "iss", "sub"]


@dataclass(frozen=True)
class TokenClaims:
    subject: str
    scope: Scope
    tenant_id: int | None
    api_key_id: int | None
    expires_at: int


class TokenCodec:
    """Signs and verifies tokens with the configured algorithm and keys."""

    def __init__(self, settings: Settings) -> None:
        self.algorithm = settings.jwt_algorithm
        self.audience = settings.jwt_audience
        self.issuer = settings.jwt_issuer
        self.leeway_s = settings.jwt_leeway_s
        self.max_ttl_s = settings.max_token_ttl_s
        self._settings = settings
        self._verification_key = settings.jwt_verification_key()

    def issue(
        self,
        *,
        scope: Scope,
        subject: str,
        ttl_s: int,
        tenant_id: int | None = None,
        api_key_id: int | None = None,
    ) -> str:
        if not 0 < ttl_s <= self.max_ttl_s:
            raise ValueError(f"ttl must be in (0, {self.max_ttl_s}] seconds")
        now = int(time.time())
        payload: dict[str, Any] = {
            "iss": self.issuer,
            "aud": self.audience,
            "sub": subject,
            "scope": scope,
            "iat": now,
            "nbf": now,
            "exp": now + ttl_s,
            "jti": secrets.token_hex(8),
        }
        if tenant_id is not None:
            payload["tid"] = tenant_id
        if api_key_id is not None:
            payload["akid"] = api_key_id
        return jwt.encode(payload, self._settings.jwt_signing_key(), algorithm=self.algorithm)

    def issue_tenant_token(self, tenant_id: int, api_key_id: int | None, ttl_s: int) -> str:
        return self.issue(
            scope="tenant",
            subject=f"tenant:{tenant_id}",
            ttl_s=ttl_s,
            tenant_id=tenant_id,
            api_key_id=api_key_id,
        )

    def issue_admin_token(self, subject: str, ttl_s: int) -> str:
        return self.issue(scope="admin", subject=f"admin:{subject}", ttl_s=ttl_s)

    def verify(self, token: str) -> TokenClaims:
        """The token's claims, or AuthenticationError (never a detail an attacker can use)."""
        if len(token) > MAX_TOKEN_BYTES:
            raise AuthenticationError("invalid token")
        try:
            claims = jwt.decode(
                token,
                self._verification_key,
                algorithms=[self.algorithm],
                audience=self.audience,
                issuer=self.issuer,
                leeway=self.leeway_s,
                options={"require": REQUIRED_CLAIMS, "verify_signature": True},
            )
        except jwt.ExpiredSignatureError as e:
            raise AuthenticationError("token expired") from e
        except jwt.PyJWTError as e:
            raise AuthenticationError("invalid token") from e
        return _parse_claims(claims, self.max_ttl_s + self.leeway_s)


def _parse_claims(claims: dict[str, Any], max_ttl_s: int) -> TokenClaims:
    scope, sub = claims.get("scope"), claims.get("sub")
    exp, iat = claims["exp"], claims["iat"]
    if scope not in ("tenant", "admin") or not isinstance(sub, str):
        raise AuthenticationError("invalid token")
    if exp - iat > max_ttl_s:  # a stolen signing key should not mint forever-tokens
        raise AuthenticationError("invalid token")
    tenant_id, api_key_id = claims.get("tid"), claims.get("akid")
    if scope == "tenant" and (not _is_id(tenant_id) or sub != f"tenant:{tenant_id}"):
        raise AuthenticationError("invalid token")
    if api_key_id is not None and not _is_id(api_key_id):
        raise AuthenticationError("invalid token")
    return TokenClaims(
        subject=sub,
        scope=scope,
        tenant_id=tenant_id if scope == "tenant" else None,
        api_key_id=api_key_id,
        expires_at=int(exp),
    )


def _is_id(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0
