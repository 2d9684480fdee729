"""Streaming responses: the first event is awaited before the 200 goes out, and a failure after
it becomes the stream's last event, in the same OpenAI error body (`errors.describe`) that a
JSON response would have carried."""

from __future__ import annotations

import logging
from collections.abc import AsyncGenerator, AsyncIterator

from loraplex.platform.api.errors import describe, log_error
from loraplex.platform.services.outputs import DONE, sse

logger = logging.getLogger(__name__)


def sse_error(exc: Exception) -> str:
    """The error event of a stream whose 200 already went out: its only way to say it failed."""
    error = describe(exc)
    log_error(exc, error)
    return sse(error.body())


async def guard_stream(events: AsyncIterator[str]) -> AsyncIterator[str]:
    """Turns a failure mid-stream into an error event followed by [DONE]."""
    try:
        async for event in events:
            yield event
    except Exception as exc:
        logger.warning("stream failed: %r", exc)
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
