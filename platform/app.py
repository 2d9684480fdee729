"""The one place the app is assembled: `create_app(settings)` and its lifespan.

Start-up: database (refusing an unmigrated schema), metrics, rate limiter (Redis or local),
engine (model loaded in a worker thread), usage writer. Shut-down, in reverse: stop admitting
(new requests get 503), let streams in flight finish within the grace period, flush usage,
stop the engine, close Redis and the database.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
from fastapi import FastAPI
from sqlalchemy import exc as sa_exc

from loraplex.engine.async_engine import AsyncEngine
from loraplex.platform.adapter_validator import engine_adapter_validator
from loraplex.platform.api import (
    RequestContextMiddleware,
    api_router,
    install_docs,
    install_error_handlers,
    install_openapi,
)
from loraplex.platform.api.admin_console import AdminConsole, admin_ui_dir
from loraplex.platform.auth import TokenCodec
from loraplex.platform.crud.adapters import AdapterValidator, ValidatedAdapter
from loraplex.platform.db import Database, check_migrated
from loraplex.platform.engine_client import EngineClient
from loraplex.platform.metrics import Metrics
from loraplex.platform.ratelimit import create_rate_limiter
from loraplex.platform.registry_cache import RegistryCache
from loraplex.platform.services.adapter_check import check_pending_adapters
from loraplex.platform.services.reconcile import reconcile_adapters
from loraplex.platform.settings import Settings, get_settings
from loraplex.platform.state import AppState
from loraplex.platform.storage import AdapterStore
from loraplex.platform.uploads import FRAMING_BYTES
from loraplex.platform.usage import UsageWriter

logger = logging.getLogger(__name__)


async def _load_engine(settings: Settings) -> AsyncEngine:
    model = settings.model
    if not model:
        raise RuntimeError(
            "no model: set LORAPLEX_MODEL, or run `loraplex serve --model PATH` "
            "or `loraplex serve --demo`"
        )
    logger.info("loading model %s", model)
    return await anyio.to_thread.run_sync(
        lambda: AsyncEngine.from_engine_args(model, **settings.engine_kwargs())
    )


async def _check_schema(db: Database) -> bool:
    """Refuse a database that answers with the wrong schema. One that does not answer yet is
    no reason not to start: requests get a retryable 503 meanwhile, /ready says why and checks
    the schema once the database is back. True if the schema was checked now."""
    try:
        await anyio.to_thread.run_sync(check_migrated, db.engine)
    except (sa_exc.OperationalError, sa_exc.InterfaceError) as e:
        logger.warning(
            "the registry database does not answer (%s); serving anyway: requests get 503 "
            "and /ready says why until it does",
            type(e.orig or e).__name__,
        )
        return False
    return True


async def start_state(settings: Settings, engine: AsyncEngine | None) -> AppState:
    db = Database(settings.resolved_database_url)
    store = AdapterStore(settings.resolved_adapter_dir)
    try:
        schema_verified = await _check_schema(db)
        if schema_verified:  # else skipped: the next start reconciles and finishes checks
            await anyio.to_thread.run_sync(reconcile_adapters, db, store)
        metrics = Metrics()
        limiter = create_rate_limiter(
            settings.redis_url,
            settings.redis_key_prefix,
            on_fallback=metrics.observe_ratelimit_fallback,
        )
        client = EngineClient(
            engine or await _load_engine(settings),
            max_waiting_requests=settings.max_waiting_requests,
            max_waiting_tokens=settings.max_waiting_tokens,
        )
        client.engine.observe_adapter_loads(metrics.observe_adapter_load)
        await client.start()
        if schema_verified:
            await check_pending_adapters(db, client)
        usage = UsageWriter(
            db,
            batch_size=settings.usage_batch_size,
            flush_interval_s=settings.usage_flush_interval_s,
            max_pending=settings.usage_max_pending,
        )
        await usage.start()
    except BaseException:
        db.dispose()
        raise
    return AppState(
        settings=settings,
        db=db,
        engine=client,
        limiter=limiter,
        usage=usage,
        metrics=metrics,
        tokens=TokenCodec(settings),
        adapter_store=store,
        api_key_secret=settings.api_key_hash_secret(),
        validate_adapter=_upload_validator(settings),
        registry_cache=_registry_cache(settings, db),
        schema_verified=schema_verified,
    )


def _registry_cache(settings: Settings, db: Database) -> RegistryCache:
    cache = RegistryCache(settings.registry_cache_ttl_s)
    cache.watch(db.session_factory)
    return cache


def _upload_validator(settings: Settings) -> AdapterValidator:
    """The engine's own checks against the served model's directory (read from the settings,
    not the engine: it may run in a process of its own)."""
    model = settings.model
    if model is None:  # an engine handed in without LORAPLEX_MODEL: nothing to check against

        def refuse(path: Path) -> ValidatedAdapter:
            raise ValueError("the server has no LORAPLEX_MODEL to validate adapters against")

        return refuse
    return engine_adapter_validator(model, int(settings.engine_kwargs()["max_lora_rank"]))


async def stop_state(state: AppState, *, owns_engine: bool) -> None:
    """Drain, flush, close. Each step runs even if an earlier one failed."""
    with anyio.CancelScope(shield=True):
        try:
            await state.engine.drain(state.settings.shutdown_grace_s)
        finally:
            try:
                await state.usage.stop()
            finally:
                try:
                    if owns_engine:
                        await state.engine.shutdown()
                finally:
                    await state.limiter.aclose()
                    state.db.dispose()


def create_app(settings: Settings | None = None, *, engine: AsyncEngine | None = None) -> FastAPI:
    """The Loraplex API app. `engine`: an already built engine (the caller owns it)."""
    settings = settings or get_settings()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        state = await start_state(settings, engine)
        app.state.loraplex = state
        logger.info("serving %s", state.engine.model_name)
        try:
            yield
        finally:
            await stop_state(state, owns_engine=engine is None)

    app = FastAPI(
        title="Loraplex",
        version="0.1.0",
        lifespan=lifespan,
        summary="Multi-tenant LoRA serving with an OpenAI-compatible API",
        docs_url=None,  # served from vendored assets instead of a CDN (api/docs.py)
        redoc_url=None,
    )
    install_error_handlers(app)
    app.include_router(api_router)
    install_openapi(app)
    install_docs(app)
    app.mount("/admin", AdminConsole(admin_ui_dir()), name="admin-console")
    app.add_middleware(
        RequestContextMiddleware,
        max_body_bytes=settings.max_body_bytes,
        max_header_bytes=settings.max_header_bytes,
        # Adapter uploads stream to disk under their own limit (services/adapter_upload.py).
        streamed={("POST", "/admin/v1/adapters"): settings.max_adapter_bytes + FRAMING_BYTES},
    )
    return app
