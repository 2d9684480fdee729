"""The one place errors become HTTP errors, all in OpenAI's shape:
`{"error": {"message", "type", "param", "code"}}`.

`describe(exc)` is the whole mapping: the app's exception handlers send it as a JSON response,
and a stream whose 200 already went out sends the same body as its last event
(`api/streaming.py`).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from sqlalchemy import exc as sa_exc
from starlette.exceptions import HTTPException as StarletteHTTPException

from loraplex.engine.errors import (
    AdapterRemovedError,
    EngineDeadError,
    InvalidAdapterError,
    InvalidParameterError,
    RequestTooLongError,
)
from loraplex.platform import errors as e
from loraplex.platform.api.deps import peek_rate_limit_headers
from loraplex.platform.schemas import ErrorDetail, ErrorResponse

logger = logging.getLogger(__name__)

INVALID_REQUEST = "invalid_request_error"
SERVER_ERROR = "server_error"

# Errors a client or the service causes on purpose -> (HTTP status, error type, error code).
# First match wins: subclasses before their bases.
_KNOWN: list[tuple[type[Exception], int, str, str | None]] = [
    (e.ContextLengthExceededError, 400, INVALID_REQUEST, "context_length_exceeded"),
    (e.RequestTooLargeError, 400, INVALID_REQUEST, "request_too_large"),
    (e.InvalidRequestError, 400, INVALID_REQUEST, None),
    (RequestTooLongError, 400, INVALID_REQUEST, "context_length_exceeded"),
    (InvalidParameterError, 400, INVALID_REQUEST, None),
    (e.AuthenticationError, 401, INVALID_REQUEST, "invalid_api_key"),
    (e.PermissionDeniedError, 403, "permission_error", "permission_denied"),
    (e.ModelNotFoundError, 404, INVALID_REQUEST, "model_not_found"),
    (AdapterRemovedError, 404, INVALID_REQUEST, "model_not_found"),
    (e.NotFoundError, 404, INVALID_REQUEST, "not_found"),
    (e.ConflictError, 409, INVALID_REQUEST, "conflict"),
    (e.PayloadTooLargeError, 413, INVALID_REQUEST, None),
    (e.EngineOverloadedError, 429, "engine_overloaded", "engine_overloaded"),
    (e.EngineFailureError, 500, SERVER_ERROR, "engine_error"),
    (e.ServiceUnavailableError, 503, SERVER_ERROR, "service_unavailable"),
]
# Failures whose own message must not reach the client: (status, code, message, headers).
_HIDDEN: list[tuple[tuple[type[Exception], ...], int, str | None, str, dict[str, str]]] = [
    # Registered adapters were validated; failing now means the stored files are damaged.
    (
        (InvalidAdapterError,),
        500,
        "adapter_load_failed",
        "the adapter could not be loaded; contact the operator",
        {},
    ),
    ((EngineDeadError,), 503, "service_unavailable", "the engine is not running", {}),
    # Last line of defence for numbers a schema forgot to bound (ids, offsets): the database
    # or its driver cannot hold the value, so no such row can exist.
    (
        (OverflowError, sa_exc.DataError),
        400,
        None,
        "a number in the request is out of range",
        {},
    ),
    # Authentication needs the registry: it fails closed, with a retryable 503.
    (
        (sa_exc.OperationalError, sa_exc.InterfaceError, sa_exc.TimeoutError),
        503,
        "service_unavailable",
        "the registry database is unavailable; retry later",
        {"retry-after": "5"},
    ),
]
# What the app's exception handlers take; anything else is a bug (the middleware's bare 500).
HANDLED: tuple[type[Exception], ...] = (
    e.LoraplexError,
    *(cls for cls, *_ in _KNOWN),
    *(cls for classes, *_ in _HIDDEN for cls in classes),
    RequestValidationError,
    StarletteHTTPException,
)


@dataclass(frozen=True)
class ApiError:
    """One error as the client sees it."""

    status: int
    type: str
    message: str
    param: str | None = None
    code: str | None = None
    headers: dict[str, str] = field(default_factory=dict)

    def body(self) -> ErrorResponse:
        return ErrorResponse(
            error=ErrorDetail(
                message=_safe(self.message),
                type=self.type,
                param=_safe(self.param) if self.param else None,
                code=self.code,
            )
        )


def describe(exc: Exception) -> ApiError:
    """What the client is told about `exc` (an unexpected one is a bare 500)."""
    if isinstance(exc, e.RateLimitedError):
        headers = {**exc.headers, "retry-after": _retry_after(exc.retry_after_s)}
        return ApiError(429, exc.kind, exc.message, code="rate_limit_exceeded", headers=headers)
    for cls, status, type_, code in _KNOWN:
        if isinstance(exc, cls):
            return ApiError(status, type_, _message(exc), _param(exc), code, _headers(exc))
    for classes, status, code, message, headers in _HIDDEN:
        if isinstance(exc, classes):
            type_ = INVALID_REQUEST if status < 500 else SERVER_ERROR
            return ApiError(status, type_, message, code=code, headers=headers)
    if isinstance(exc, RequestValidationError):
        return _validation_error(exc)
    if isinstance(exc, StarletteHTTPException):
        status = exc.status_code
        type_ = (
            "permission_error"
            if status == 403
            else INVALID_REQUEST
            if status < 500
            else SERVER_ERROR
        )
        code = "not_found" if status == 404 else None
        return ApiError(status, type_, str(exc.detail), code=code, headers=dict(exc.headers or {}))
    return ApiError(500, SERVER_ERROR, "internal server error")


def log_error(exc: Exception, error: ApiError) -> None:
    """Server-side failures are logged (with the traceback when unexpected); what a client got
    wrong is not."""
    if error.status < 500:
        return
    if isinstance(exc, HANDLED):
        logger.warning("%s: %s", type(exc).__name__, exc)
    else:
        logger.error("unhandled error", exc_info=exc)


def _message(exc: Exception) -> str:
    return exc.message if isinstance(exc, e.LoraplexError) else str(exc)


def _param(exc: Exception) -> str | None:
    return exc.param if isinstance(exc, e.LoraplexError | InvalidParameterError) else None


def _headers(exc: Exception) -> dict[str, str]:
    if isinstance(exc, e.EngineOverloadedError):
        return {"retry-after": _retry_after(exc.retry_after_s)}
    return {}


def _safe(text: str) -> str:
    # Client text (lone surrogates and all) may be echoed in messages; keep the JSON encodable.
    return text.encode("utf-8", "backslashreplace").decode("utf-8")[:2000]


def _retry_after(seconds: float) -> str:
    return str(max(1, math.ceil(seconds)))


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


def _validation_error(exc: RequestValidationError) -> ApiError:
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
    return ApiError(400, INVALID_REQUEST, message, param)


async def _handle(request: Request, exc: Exception) -> JSONResponse:
    error = describe(exc)
    log_error(exc, error)
    headers = dict(error.headers)
    tenant = getattr(request.state, "tenant", None)
    if tenant is not None and error.status != 429:  # a 429 carries its own x-ratelimit-*
        try:
            headers.update(await peek_rate_limit_headers(request.app.state.loraplex, tenant))
        except Exception:  # headers are a courtesy; never turn an error into a 500
            logger.exception("could not add rate-limit headers")
    return JSONResponse(
        error.body().model_dump(mode="json"), status_code=error.status, headers=headers
    )


Handler = Callable[[Request, Exception], Awaitable[JSONResponse]]


def install_error_handlers(app: FastAPI) -> None:
    """Every error the app answers goes through `describe` (plus x-ratelimit-* on a tenant's)."""
    handler: Handler = _handle
    for exc_class in HANDLED:
        app.add_exception_handler(exc_class, handler)
