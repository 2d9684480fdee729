"""Admin resources: tenants, API keys, adapters, grants, usage, audit events (Create / Update /
Public).

Admin bodies reject unknown fields: a typo in a limit must not silently leave it unchanged.
"""

from __future__ import annotations

import datetime as dt
from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, Strict

from loraplex.engine.stats import EngineStats
from loraplex.platform.db import (
    AdapterStatus,
    AuditAction,
    AuditResult,
    AuditTarget,
    TenantStatus,
    TenantTier,
)
from loraplex.platform.ratelimit import Backend

# Ids are the registry's INTEGER columns (32-bit on PostgreSQL): larger ones cannot exist.
MAX_ID = 2**31 - 1
Id = Annotated[int, Strict(), Field(ge=1, le=MAX_ID)]
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"
Name = Annotated[str, Strict(), Field(pattern=NAME_PATTERN)]
Limit = Annotated[int, Strict(), Field(ge=1, le=1_000_000_000)]


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class _Public(BaseModel):
    model_config = ConfigDict(from_attributes=True)


class TenantBase(_Body):
    name: Name
    priority: TenantTier = TenantTier.STANDARD
    status: TenantStatus = TenantStatus.ACTIVE


class TenantCreate(TenantBase):
    """Limits left out take the server's defaults."""

    requests_per_minute: Limit | None = None
    tokens_per_minute: Limit | None = None
    max_concurrent_requests: Limit | None = None


class TenantUpdate(_Body):
    name: Name | None = None
    priority: TenantTier | None = None
    status: TenantStatus | None = None
    requests_per_minute: Limit | None = None
    tokens_per_minute: Limit | None = None
    max_concurrent_requests: Limit | None = None


class TenantPublic(_Public):
    id: int
    name: str
    priority: TenantTier
    status: TenantStatus
    requests_per_minute: int
    tokens_per_minute: int
    max_concurrent_requests: int
    created_at: datetime
    updated_at: datetime


class TenantsPublic(BaseModel):
    data: list[TenantPublic]
    count: int


class ApiKeyCreate(_Body):
    name: Annotated[str, Strict(), Field(max_length=64)] = ""
    expires_at: AwareDatetime | None = None


class ApiKeyPublic(_Public):
    id: int
    tenant_id: int
    name: str
    prefix: str
    created_at: datetime
    expires_at: datetime | None
    revoked_at: datetime | None
    last_used_at: datetime | None


class ApiKeyCreated(ApiKeyPublic):
    """Returned once, at creation: `key` is never stored nor shown again."""

    key: str


class ApiKeysPublic(BaseModel):
    data: list[ApiKeyPublic]
    count: int


Residency = Literal["gpu", "cpu", "disk"]


class AdapterPublic(_Public):
    """One version of an adapter. `is_latest`: the version its bare name resolves to (the
    latest ready one); `residency`: where its weights are now (GPU pages, the CPU cache, or
    only on disk); `status_reason`: why a version failed its load check."""

    id: int
    name: str
    version: int
    tenant_id: int
    base_model: str
    rank: int
    lora_alpha: float
    target_modules: list[str]
    sha256: str
    size_bytes: int
    status: AdapterStatus
    status_reason: str | None
    created_at: datetime
    is_latest: bool = False
    residency: Residency = "disk"


class AdaptersPublic(BaseModel):
    data: list[AdapterPublic]
    count: int


class AdapterGrantCreate(_Body):
    tenant_id: Id


class AdapterGrantPublic(_Public):
    adapter_id: int
    tenant_id: int
    created_at: datetime


class UsageRow(BaseModel):
    """One group of usage: `date` and/or `adapter` set according to the grouping."""

    tenant_id: int | None = None
    date: dt.date | None = None
    adapter_id: int | None = None
    model: str | None = None
    requests: int
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class UsagePublic(BaseModel):
    object: str = "list"
    data: list[UsageRow]


class AuditEventPublic(_Public):
    """One admin mutation: `actor` is `admin:<token subject>` (API) or `cli:<OS user>`;
    `status_code` the HTTP status answered (API only); `error_code` why it failed (the error
    body's `code`, else its `type`); `detail` the change's own small facts (never a secret)."""

    id: int
    created_at: datetime
    actor: str
    action: AuditAction
    target_type: AuditTarget
    target_id: int | None
    result: AuditResult
    status_code: int | None
    error_code: str | None
    request_id: str | None
    detail: dict[str, Any]


class AuditEventsPublic(BaseModel):
    data: list[AuditEventPublic]
    count: int


class EngineStatePublic(BaseModel):
    """GET /admin/v1/engine: the served model, the server's own state and the engine's last
    snapshot (`stats`: requests, KV blocks, preemptions, prefix cache, adapters)."""

    model: str
    max_model_len: int
    ratelimit_backend: Backend
    num_inflight_requests: int
    draining: bool
    kv_usage: float
    num_preemptions: int
    prefix_cache_hit_rate: float
    stats: EngineStats
