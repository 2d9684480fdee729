"""A failure after a stream's 200 went out: the last event carries the same OpenAI error body
that a JSON response would have (one mapping, `api/errors.describe`), then [DONE]."""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator

import pytest

from loraplex.engine.errors import (
    AdapterRemovedError,
    InvalidAdapterError,
    InvalidParameterError,
)
from loraplex.platform.api.errors import describe
from loraplex.platform.api.streaming import start_stream
from loraplex.platform.errors import (
    EngineFailureError,
    RateLimitedError,
    ServiceUnavailableError,
)

FAILURES: dict[str, tuple[Exception, int, str, str | None]] = {
    "engine failure": (
        EngineFailureError("the engine failed"),
        500,
        "server_error",
        "engine_error",
    ),
    "shutdown": (ServiceUnavailableError("aborted"), 503, "server_error", "service_unavailable"),
    "rate limited": (
        RateLimitedError("slow down", kind="tokens", retry_after_s=2.5),
        429,
        "tokens",
        "rate_limit_exceeded",
    ),
    "bad parameter": (
        InvalidParameterError("must be >= 1", param="n"),
        400,
        "invalid_request_error",
        None,
    ),
    "damaged adapter": (
        InvalidAdapterError("/secret/path: bad header"),
        500,
        "server_error",
        "adapter_load_failed",
    ),
    "adapter deleted while the request waited": (
        AdapterRemovedError("adapter 'support@v1' was deleted"),
        404,
        "invalid_request_error",
        "model_not_found",
    ),
    "a bug": (RuntimeError("/secret/path"), 500, "server_error", None),
}


async def _failing_after(event: str, exc: Exception) -> AsyncGenerator[str, None]:
    yield event
    raise exc


@pytest.mark.parametrize("case", FAILURES)
async def test_a_failure_mid_stream_is_the_last_event(case: str) -> None:
    exc, status, type_, code = FAILURES[case]
    events = [e async for e in await start_stream(_failing_after("data: {}\n\n", exc))]
    assert events[0] == "data: {}\n\n" and events[-1] == "data: [DONE]\n\n"
    assert len(events) == 3
    error = json.loads(events[1].removeprefix("data: "))["error"]
    expected = describe(exc)
    assert expected.status == status
    assert error == expected.body().model_dump()["error"]
    assert (error["type"], error["code"]) == (type_, code)
    assert "/secret/path" not in error["message"]  # internals never reach the client


async def test_a_failure_before_the_first_event_is_raised() -> None:
    async def refused() -> AsyncGenerator[str, None]:
        raise InvalidParameterError("token ids must be in [0, 512)", param="prompt")
        yield ""  # pragma: no cover

    with pytest.raises(InvalidParameterError):
        await start_stream(refused())
