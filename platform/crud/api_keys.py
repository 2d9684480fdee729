"""API key CRUD. The secret exists only in `create_api_key`'s return value."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from loraplex.platform.auth.api_keys import api_key_prefix, generate_api_key, hash_api_key
from loraplex.platform.crud.tenants import read_tenant
from loraplex.platform.db import ApiKey, utcnow
from loraplex.platform.errors import InvalidRequestError, NotFoundError
from loraplex.platform.schemas import ApiKeyCreate

_PREFIX_ATTEMPTS = 5


def create_api_key(
    session: Session, tenant_id: int, body: ApiKeyCreate, secret: bytes
) -> tuple[ApiKey, str]:
    """A new key row and the plaintext key (to show once)."""
    read_tenant(session, tenant_id)
    if body.expires_at is not None and body.expires_at <= utcnow():
        raise InvalidRequestError("expires_at must be in the future", param="expires_at")
    for _ in range(_PREFIX_ATTEMPTS):  # 48-bit prefixes: a collision is rare, never fatal
        key = generate_api_key()
        prefix = api_key_prefix(key)
        assert prefix is not None
        row = ApiKey(
            tenant_id=tenant_id,
            name=body.name,
            prefix=prefix,
            key_hash=hash_api_key(key, secret),
            expires_at=body.expires_at,
        )
        session.add(row)
        try:
            session.commit()
        except IntegrityError:
            session.rollback()
            continue
        return row, key
    raise RuntimeError("could not allocate a unique API key prefix")


def read_api_keys(session: Session, tenant_id: int) -> list[ApiKey]:
    read_tenant(session, tenant_id)
    return list(
        session.scalars(
            select(ApiKey).where(ApiKey.tenant_id == tenant_id).order_by(ApiKey.id)
        ).all()
    )


def revoke_api_key(session: Session, key_id: int) -> ApiKey:
    """Marks the key revoked (idempotent); tokens exchanged from it stop working too."""
    row = session.get(ApiKey, key_id)
    if row is None:
        raise NotFoundError(f"API key {key_id} not found")
    if row.revoked_at is None:
        row.revoked_at = utcnow()
        session.commit()
    return row
