"""The registry's tables: tenants, API keys, adapters, adapter grants, usage records and the
audit log."""

from __future__ import annotations

import enum
from datetime import datetime
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    CheckConstraint,
    Float,
    ForeignKey,
    Index,
    Integer,
    String,
    UniqueConstraint,
)
from sqlalchemy.orm import Mapped, mapped_column, relationship

from loraplex.platform.db.base import Base, UTCDateTime, utcnow

# SQLite only autoincrements INTEGER PRIMARY KEY; PostgreSQL gets a bigint.
BigIntPK = BigInteger().with_variant(Integer(), "sqlite")


class TenantTier(enum.StrEnum):
    """Scheduling tier; `engine_priority` is the engine's int (lower = more urgent)."""

    INTERACTIVE = "interactive"
    STANDARD = "standard"
    BATCH = "batch"

    @property
    def engine_priority(self) -> int:
        return {"interactive": 0, "standard": 1, "batch": 2}[self.value]


class TenantStatus(enum.StrEnum):
    ACTIVE = "active"
    SUSPENDED = "suspended"


class AdapterStatus(enum.StrEnum):
    """loading: stored, the engine's load check still running; ready: served; failed: the load
    check refused it (`status_reason` says why), never served; disabled: kept, not served."""

    LOADING = "loading"
    READY = "ready"
    FAILED = "failed"
    DISABLED = "disabled"


class AuditTarget(enum.StrEnum):
    """What an audited action acts on. A grant's target is its adapter (the grantee tenant is in
    the event's detail)."""

    TENANT = "tenant"
    API_KEY = "api_key"
    ADAPTER = "adapter"


class AuditAction(enum.StrEnum):
    """Every admin mutation there is, over the API and the command line."""

    TENANT_CREATE = "tenant.create"
    TENANT_UPDATE = "tenant.update"
    TENANT_DELETE = "tenant.delete"
    KEY_CREATE = "key.create"
    KEY_REVOKE = "key.revoke"
    ADAPTER_UPLOAD = "adapter.upload"  # a new version: an HTTP upload or `adapters add`
    ADAPTER_DELETE = "adapter.delete"
    GRANT_CREATE = "grant.create"
    GRANT_DELETE = "grant.delete"

    @property
    def target_type(self) -> AuditTarget:
        return _ACTION_TARGETS[self.value.partition(".")[0]]


_ACTION_TARGETS = {
    "tenant": AuditTarget.TENANT,
    "key": AuditTarget.API_KEY,
    "adapter": AuditTarget.ADAPTER,
    "grant": AuditTarget.ADAPTER,
}


class AuditResult(enum.StrEnum):
    OK = "ok"
    FAILED = "failed"


def _in(column: str, values: type[enum.StrEnum]) -> str:
    return f"{column} IN ({', '.join(repr(v.value) for v in values)})"


class Tenant(Base):
    __tablename__ = "tenants"
    __table_args__ = (
        CheckConstraint(_in("priority", TenantTier), name="priority"),
        CheckConstraint(_in("status", TenantStatus), name="status"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(64), unique=True)
    priority: Mapped[str] = mapped_column(String(16), default=TenantTier.STANDARD.value)
    status: Mapped[str] = mapped_column(String(16), default=TenantStatus.ACTIVE.value)
    requests_per_minute: Mapped[int] = mapped_column(Integer)
    tokens_per_minute: Mapped[int] = mapped_column(Integer)
    max_concurrent_requests: Mapped[int] = mapped_column(Integer)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow, onupdate=utcnow)

    api_keys: Mapped[list[ApiKey]] = relationship(
        back_populates="tenant", cascade="all, delete-orphan", passive_deletes=True
    )
    adapters: Mapped[list[Adapter]] = relationship(
        back_populates="tenant", cascade="all, delete-orphan", passive_deletes=True
    )


class ApiKey(Base):
    """Only a keyed hash of the secret is stored; `prefix` (shown to users) finds the row."""

    __tablename__ = "api_keys"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    tenant_id: Mapped[int] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"), index=True)
    name: Mapped[str] = mapped_column(String(64), default="")
    prefix: Mapped[str] = mapped_column(String(16), unique=True)
    key_hash: Mapped[str] = mapped_column(String(64))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    expires_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    revoked_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    last_used_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)

    tenant: Mapped[Tenant] = relationship(back_populates="api_keys")


class Adapter(Base):
    """One version of a registered PEFT LoRA adapter (`name@v<version>`); `path` is
    server-generated (content-addressed). `name` alone means the latest ready version."""

    __tablename__ = "adapters"
    __table_args__ = (
        UniqueConstraint("tenant_id", "name", "version", name="uq_adapters_tenant_id_name_version"),
        CheckConstraint(_in("status", AdapterStatus), name="status"),
        CheckConstraint("version >= 1", name="version"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    tenant_id: Mapped[int] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"), index=True)
    name: Mapped[str] = mapped_column(String(64))
    version: Mapped[int] = mapped_column(Integer, default=1)
    base_model: Mapped[str] = mapped_column(String(256))
    rank: Mapped[int] = mapped_column(Integer)
    lora_alpha: Mapped[float] = mapped_column(Float)
    target_modules: Mapped[list[str]] = mapped_column(JSON)
    sha256: Mapped[str] = mapped_column(String(64), index=True)
    size_bytes: Mapped[int] = mapped_column(BigInteger)
    path: Mapped[str] = mapped_column(String(1024))
    status: Mapped[str] = mapped_column(String(16), default=AdapterStatus.READY.value)
    status_reason: Mapped[str | None] = mapped_column(String(1024), nullable=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)

    tenant: Mapped[Tenant] = relationship(back_populates="adapters")
    grants: Mapped[list[AdapterGrant]] = relationship(
        back_populates="adapter", cascade="all, delete-orphan", passive_deletes=True
    )


class AdapterGrant(Base):
    """Lets `tenant_id` use another tenant's adapter."""

    __tablename__ = "adapter_grants"

    adapter_id: Mapped[int] = mapped_column(
        ForeignKey("adapters.id", ondelete="CASCADE"), primary_key=True
    )
    tenant_id: Mapped[int] = mapped_column(
        ForeignKey("tenants.id", ondelete="CASCADE"), primary_key=True, index=True
    )
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)

    adapter: Mapped[Adapter] = relationship(back_populates="grants")


class UsageRecord(Base):
    """One row per admitted request, written in batches by `UsageWriter`."""

    __tablename__ = "usage_records"
    __table_args__ = (Index("ix_usage_records_tenant_id_created_at", "tenant_id", "created_at"),)

    id: Mapped[int] = mapped_column(BigIntPK, primary_key=True, autoincrement=True)
    request_id: Mapped[str] = mapped_column(String(64))
    tenant_id: Mapped[int] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"))
    api_key_id: Mapped[int | None] = mapped_column(
        ForeignKey("api_keys.id", ondelete="SET NULL"), nullable=True
    )
    adapter_id: Mapped[int | None] = mapped_column(
        ForeignKey("adapters.id", ondelete="SET NULL"), nullable=True
    )
    model: Mapped[str] = mapped_column(String(256))
    endpoint: Mapped[str] = mapped_column(String(32))
    prompt_tokens: Mapped[int] = mapped_column(Integer, default=0)
    completion_tokens: Mapped[int] = mapped_column(Integer, default=0)
    latency_ms: Mapped[int] = mapped_column(Integer, default=0)
    status: Mapped[str] = mapped_column(String(16))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)


class AuditEvent(Base):
    """One admin mutation, whatever its outcome: who (`admin:<token subject>` for the admin API,
    `cli:<OS user>` for the command line), what, on which target, and how it ended. Written in
    a session of its own (`platform/audit.py`), so a mutation rolled back still leaves its
    failed event. No foreign keys: events outlive what they name. `detail` never holds a secret.
    """

    __tablename__ = "audit_events"
    __table_args__ = (
        CheckConstraint(_in("action", AuditAction), name="action"),
        CheckConstraint(_in("target_type", AuditTarget), name="target_type"),
        CheckConstraint(_in("result", AuditResult), name="result"),
        Index("ix_audit_events_target_type_target_id", "target_type", "target_id"),
    )

    id: Mapped[int] = mapped_column(BigIntPK, primary_key=True, autoincrement=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow, index=True)
    actor: Mapped[str] = mapped_column(String(128), index=True)
    action: Mapped[str] = mapped_column(String(32))
    target_type: Mapped[str] = mapped_column(String(16))
    target_id: Mapped[int | None] = mapped_column(Integer, nullable=True)
    result: Mapped[str] = mapped_column(String(16))
    status_code: Mapped[int | None] = mapped_column(Integer, nullable=True)  # HTTP only
    error_code: Mapped[str | None] = mapped_column(String(64), nullable=True)
    request_id: Mapped[str | None] = mapped_column(String(64), nullable=True)  # HTTP only
    detail: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
