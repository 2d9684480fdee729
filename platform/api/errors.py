"""The one place errors become HTTP responses, all in OpenAI's shape:
`{"error": {"message", "type", "param", "code"}}`."""

from __future__ import annotations

import logging
import math
from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from sqlalchemy import exc as sa_exc
from starlette.exceptions import HTTPException as StarletteHTTPException

from loraplex.engine.errors import (
    EngineDeadError,
    InvalidAdapterError,
    InvalidParameterError,
    RequestTooLongError,
)
from loraplex.platform import errors as e

logger = logging.getLogger(__name__)

# exception class -> (HTTP status, error type, error code)
_STATUS: list[tuple[type[e.LoraplexError], int, str, str | None]] = [
    (e.ContextLengthExceededError, 400, "invalid_request_error", "context_length_exceeded"),
    (e.InvalidRequestError, 400, "invalid_request_error", None),
    (e.AuthenticationError, 401, "invalid_request_error", "invalid_api_key"),
    (e.PermissionDeniedError, 403, "permission_error", "permission_denied"),
    (e.ModelNotFoundError, 404, "invalid_request_error", "model_not_found"),
    (e.NotFoundError, 404, "invalid_request_error", "not_found"),
    (e.ConflictError, 409, "invalid_request_error", "conflict"),
    (e.EngineOverloadedError, 429, "engine_overloaded", "engine_overloaded"),
    (e.ServiceUnavailableError, 503, "server_error", "service_unavailable"),
    (e.EngineFailureError, 500, "server_error", "engine_error"),
]
_HTTP_TYPES = {
    400: "invalid_request_error",
    401: "invalid_request_error",
    403: "permission_error",
    404: "invalid_request_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    431: "invalid_request_error",
}


def _safe(text: str) -> str:
    # Client text (lone surrogates and all) may be echoed in messages; keep the JSON encodable.
    return text.encode("utf-8", "backslashreplace").decode("utf-8")[:2000]


def error_response(
    status: int,
    message: str,
    *,
    type: str,
    param: str | None = None,
    code: str | None = None,
    headers: dict[str, str] | None = None,
) -> JSONResponse:
    body = {
        "error": {
            "message": _safe(message),
            "type": type,
            "param": _safe(param) if param else None,
            "code": code,
        }
    }
    return JSONResponse(body, status_code=status, headers=headers)


def _retry_after(seconds: float) -> str:
    return str(max(1, math.ceil(seconds)))


async def _loraplex_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, e.LoraplexError)
    if isinstance(exc, e.RateLimitedError):
        limit_headers = {**exc.headers, "retry-after": _retry_after(exc.retry_after_s)}
        return error_response(
            429, exc.message, type=exc.kind, code="rate_limit_exceeded", headers=limit_headers
        )
    for cls, status, type_, code in _STATUS:
        if isinstance(exc, cls):
            headers: dict[str, str] | None = None
            if isinstance(exc, e.EngineOverloadedError):
                headers = {"retry-after": _retry_after(exc.retry_after_s)}
            if status >= 500:
                logger.warning("%s: %s", type(exc).__name__, exc.message)
            return error_response(
                status, exc.message, type=type_, param=exc.param, code=code, headers=headers
            )
    return await _unhandled(request, exc)


async def _engine_invalid_request(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, InvalidParameterError)
    code = "context_length_exceeded" if isinstance(exc, RequestTooLongError) else None
    return error_response(400, str(exc), type="invalid_request_error", param=exc.param, code=code)


async def _invalid_adapter(request: Request, exc: Exception) -> JSONResponse:
    # Registered adapters were validated; failing now means the stored files are damaged.
    logger.error("adapter failed to load: %s", exc)
    return error_response(
        500,
        "the adapter could not be loaded; contact the operator",
        type="server_error",
        code="adapter_load_failed",
    )


def _is_union_tag(part: object) -> bool:
    # pydantic names the union member in the location: ('prompt', 'list[int]', 0)
    text = str(part)
    return text in ("str", "int", "float", "bool", "none") or "[" in text or "-" in text


def _param_of(loc: tuple[object, ...] | list[object]) -> str | None:
    """The field an error is about: body/query/path and union member tags dropped."""
    parts: list[str] = []
    for part in loc:
        if part in ("body", "query", "path") and not parts:
            continue
        if _is_union_tag(part):
            break
        parts.append(str(part))
    return ".".join(parts) or None


async def _validation_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    errors = exc.errors()
    first: dict[str, Any] = errors[0] if errors else {}
    param = _param_of(first.get("loc", ()))
    message = str(first.get("msg", "invalid request"))
    if first.get("type") == "json_invalid":
        message, param = "the body is not valid JSON", None
    elif param is None and first.get("type") in ("model_attributes_type", "dict_type"):
        message = "the body must be a JSON object (Content-Type: application/json)"
    elif param:
        message = f"{param}: {message}"
    return error_response(400, message, type="invalid_request_error", param=param)


async def _http_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    status = exc.status_code
    return error_response(
        status,
        str(exc.detail),
        type=_HTTP_TYPES.get(status, "server_error"),
        code="not_found" if status == 404 else None,
        headers=dict(exc.headers or {}),
    )


async def _unhandled(request: Request, exc: Exception) -> JSONResponse:
    logger.exception("unhandled error", exc_info=exc)
    return error_response(500, "internal server error", type="server_error")


Handler = Callable[[Request, Exception], Awaitable[JSONResponse]]


def _with_rate_limit_headers(handler: Handler) -> Handler:
    """x-ratelimit-* on a tenant's error responses too (a 429 already has its own)."""

    async def wrapped(request: Request, exc: Exception) -> JSONResponse:
        response = await handler(request, exc)
        tenant = getattr(request.state, "tenant", None)
        if tenant is not None and response.status_code != 429:
            from loraplex.platform.ratelimit import rate_limit_headers
            from loraplex.platform.services.generation import tenant_limits

            try:
                limiter = request.app.state.loraplex.limiter
                decision = await limiter.peek(str(tenant.tenant_id), tenant_limits(tenant))
                response.headers.update(rate_limit_headers(decision))
            except Exception:  # headers are a courtesy; never turn an error into a 500
                logger.exception("could not add rate-limit headers")
        return response

    return wrapped


def install_error_handlers(app: FastAPI) -> None:
    async def _engine_dead(request: Request, exc: Exception) -> JSONResponse:
        logger.error("engine is dead: %s", exc)
        return error_response(
            503, "the engine is not running", type="server_error", code="service_unavailable"
        )

    async def _database_unavailable(request: Request, exc: Exception) -> JSONResponse:
        # Authentication needs the registry: it fails closed, with a retryable 503.
        logger.error("database unavailable: %s", exc)
        return error_response(
            503,
            "the registry database is unavailable; retry later",
            type="server_error",
            code="service_unavailable",
            headers={"retry-after": "5"},
        )

    handlers: list[tuple[type[Exception], Handler]] = [
        (sa_exc.OperationalError, _database_unavailable),
        (sa_exc.InterfaceError, _database_unavailable),
        (sa_exc.TimeoutError, _database_unavailable),
        (e.LoraplexError, _loraplex_error),
        (InvalidParameterError, _engine_invalid_request),
        (InvalidAdapterError, _invalid_adapter),
        (EngineDeadError, _engine_dead),
        (RequestValidationError, _validation_error),
        (StarletteHTTPException, _http_error),
    ]
    for exc_class, handler in handlers:
        app.add_exception_handler(exc_class, _with_rate_limit_headers(handler))
