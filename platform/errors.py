"""Errors a client can cause, raised by services and mapped to HTTP in `api/errors.py` only."""

from __future__ import annotations

from loraplex.platform.ratelimit.limits import LimitKind


class LoraplexError(Exception):
    """Base class: `message` is safe to show to the client; `param` names the field."""

    def __init__(self, message: str, *, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param


class InvalidRequestError(LoraplexError):
    """400: a malformed or out-of-range request."""


class ContextLengthExceededError(InvalidRequestError):
    """400 `context_length_exceeded`: prompt + max_tokens cannot fit the model's context."""


class RequestTooLargeError(InvalidRequestError):
    """400 `request_too_large`: the request can never fit the tenant's limits, so waiting
    cannot help (unlike a 429)."""


class AuthenticationError(LoraplexError):
    """401: no credential, or one that is not valid (unknown, revoked, expired, forged)."""


class PermissionDeniedError(LoraplexError):
    """403: a valid credential that may not do this (suspended tenant, wrong scope)."""


class NotFoundError(LoraplexError):
    """404: no such resource (or one the caller may not see: never say which)."""


class ModelNotFoundError(NotFoundError):
    """404 `model_not_found`: not the base model, nor an adapter this tenant may use."""


class ConflictError(LoraplexError):
    """409: would break a uniqueness rule (a name already taken)."""


class PayloadTooLargeError(LoraplexError):
    """413: an upload past its byte limit (`LORAPLEX_MAX_ADAPTER_BYTES`)."""


class RateLimitedError(LoraplexError):
    """429 `rate_limit_exceeded` (`kind`: requests | tokens | concurrency)."""

    def __init__(
        self,
        message: str,
        *,
        kind: LimitKind,
        retry_after_s: float,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.kind = kind
        self.retry_after_s = retry_after_s
        self.headers = headers or {}


class EngineOverloadedError(LoraplexError):
    """429 `engine_overloaded`: the engine's waiting queue is past its bound."""

    def __init__(self, message: str, *, retry_after_s: float) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class ServiceUnavailableError(LoraplexError):
    """503: not ready, or draining for shutdown."""


class EngineFailureError(LoraplexError):
    """500: the engine failed this request (the engine itself lives on)."""
