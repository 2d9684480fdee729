"""Server-sent events as OpenAI streams them: `data: {json}\\n\\n`, ending with `data: [DONE]`."""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any

from loraplex.engine.errors import InvalidAdapterError, InvalidParameterError
from loraplex.platform.errors import LoraplexError
from loraplex.platform.services.outputs import DONE

logger = logging.getLogger(__name__)


def sse_error(exc: BaseException) -> str:
    """An error after the 200 headers went out: the stream's only way to say it failed."""
    error: dict[str, Any] = {
        "message": "internal error",
        "type": "server_error",
        "param": None,
        "code": None,
    }
    if isinstance(exc, LoraplexError):
        error.update(message=exc.message, param=exc.param)
    elif isinstance(exc, InvalidParameterError):
        error.update(message=str(exc), type="invalid_request_error", param=exc.param)
    elif isinstance(exc, InvalidAdapterError):
        error.update(
            message="the adapter could not be loaded; contact the operator",
            code="adapter_load_failed",
        )
    return f"data: {json.dumps({'error': error})}\n\n"


async def guard_stream(events: AsyncIterator[str]) -> AsyncIterator[str]:
    """Turns a failure mid-stream into an error event followed by [DONE]."""
    try:
        async for event in events:
            yield event
    except Exception as exc:
        if isinstance(exc, LoraplexError | InvalidParameterError | InvalidAdapterError):
            logger.warning("stream failed: %r", exc)
        else:
            logger.exception("stream failed")
        yield sse_error(exc)
        yield DONE


async def start_stream(events: AsyncGenerator[str, None]) -> AsyncIterator[str]:
    """Wait for the first event before the 200 goes out, so that what fails at admission to
    the engine (a prompt it refuses, an adapter that does not load) is a proper HTTP error;
    later failures become an error event."""
    first = await anext(events)

    async def rest() -> AsyncIterator[str]:
        try:
            yield first
            async for event in events:
                yield event
        finally:
            await events.aclose()

    return guard_stream(rest())
