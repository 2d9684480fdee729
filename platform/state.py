"""AppState: the long-lived objects one app instance owns, built and torn down by its lifespan."""

from __future__ import annotations

from dataclasses import dataclass, field

from loraplex.platform.auth import TokenCodec
from loraplex.platform.crud import AdapterValidator
from loraplex.platform.db import Database, check_migrated
from loraplex.platform.engine_client import EngineClient
from loraplex.platform.metrics import Metrics
from loraplex.platform.ratelimit import FailoverRateLimiter
from loraplex.platform.registry_cache import RegistryCache
from loraplex.platform.settings import Settings
from loraplex.platform.storage import AdapterStore
from loraplex.platform.uploads import UploadGuard
from loraplex.platform.usage import UsageWriter


@dataclass
class AppState:
    settings: Settings
    db: Database
    engine: EngineClient
    limiter: FailoverRateLimiter
    usage: UsageWriter
    metrics: Metrics
    tokens: TokenCodec
    adapter_store: AdapterStore
    api_key_secret: bytes
    validate_adapter: AdapterValidator  # the engine's own checks, against the served model
    registry_cache: RegistryCache  # watches `db`'s sessions
    uploads: UploadGuard = field(default_factory=UploadGuard)
    # The schema was found at the code's head (False while the database was down at start).
    schema_verified: bool = True

    def verify_schema(self) -> None:
        """A server that started while its database was down checks the schema when it is
        first used again (once). Raises DatabaseNotMigratedError, or the driver's error while
        the database still does not answer. Blocking: call it off the event loop."""
        if not self.schema_verified:
            check_migrated(self.db.engine)
            self.schema_verified = True
