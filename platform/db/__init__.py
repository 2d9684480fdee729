"""The SQL registry: ORM models, the database handle and migrations."""

from loraplex.platform.db.base import Base, UTCDateTime, utcnow
from loraplex.platform.db.migrate import DatabaseNotMigratedError, check_migrated, upgrade
from loraplex.platform.db.models import (
    Adapter,
    AdapterGrant,
    AdapterStatus,
    ApiKey,
    AuditAction,
    AuditEvent,
    AuditResult,
    AuditTarget,
    Tenant,
    TenantStatus,
    TenantTier,
    UsageRecord,
)
from loraplex.platform.db.session import Database, create_db_engine

__all__ = [
    "Adapter",
    "AdapterGrant",
    "AdapterStatus",
    "ApiKey",
    "AuditAction",
    "AuditEvent",
    "AuditResult",
    "AuditTarget",
    "Base",
    "Database",
    "DatabaseNotMigratedError",
    "Tenant",
    "TenantStatus",
    "TenantTier",
    "UTCDateTime",
    "UsageRecord",
    "check_migrated",
    "create_db_engine",
    "upgrade",
    "utcnow",
]
