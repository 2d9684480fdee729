"""Pydantic schemas: admin resources and the OpenAI protocol."""

from loraplex.platform.schemas.admin import (
    AdapterGrantCreate,
    AdapterGrantPublic,
    AdapterPublic,
    AdaptersPublic,
    ApiKeyCreate,
    ApiKeyCreated,
    ApiKeyPublic,
    ApiKeysPublic,
    AuditEventPublic,
    AuditEventsPublic,
    EngineStatePublic,
    TenantCreate,
    TenantPublic,
    TenantsPublic,
    TenantUpdate,
    UsagePublic,
    UsageRow,
)
from loraplex.platform.schemas.openai_requests import (
    ChatCompletionRequest,
    ChatMessage,
    CompletionRequest,
)
from loraplex.platform.schemas.openai_responses import (
    ErrorDetail,
    ErrorResponse,
    ModelList,
    TokenResponse,
)

__all__ = [
    "EngineStatePublic",
    "AdapterGrantCreate",
    "AdapterGrantPublic",
    "AdapterPublic",
    "AdaptersPublic",
    "ApiKeyCreate",
    "ApiKeyCreated",
    "ApiKeyPublic",
    "ApiKeysPublic",
    "AuditEventPublic",
    "AuditEventsPublic",
    "ChatCompletionRequest",
    "ChatMessage",
    "CompletionRequest",
    "ErrorDetail",
    "ErrorResponse",
    "ModelList",
    "TenantCreate",
    "TenantPublic",
    "TenantUpdate",
    "TenantsPublic",
    "TokenResponse",
    "UsagePublic",
    "UsageRow",
]
