"""EngineStream: one engine request, bound to whoever reads it.

The engine's stream is read by a task of its own (the pump), never by the request's handler.
A handler that goes away (its client disconnected: the handler is cancelled wherever it is)
therefore cannot take the engine's last word with it: `close()` asks the engine to abort and
waits, for a bounded time, until the pump has seen the request's final output. The request's
KV blocks, adapter pin and concurrency slot are all gone by then, and the final output's token
counts, tokens generated after the client left included, are the ones the tenant is billed.

    handler ──anext──▶ latest output ◀── pump ──async for──▶ AsyncEngine.generate(...)
    handler ──close()──▶ abort ──▶ engine core ──final output──▶ pump (done)
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncGenerator, Awaitable, Callable
from contextlib import aclosing

import anyio

from loraplex.engine.request import RequestOutput

logger = logging.getLogger(__name__)

# The engine applies an abort between two steps; a step is far shorter than this.
CLOSE_TIMEOUT_S = 60.0
_END = object()


class EngineStream:
    """Cumulative outputs of one engine request; iterate, then `close()` exactly once."""

    def __init__(
        self,
        request_id: str,
        source: AsyncGenerator[RequestOutput, None],
        *,
        abort: Callable[[], Awaitable[None]],
        on_done: Callable[[], None],
    ) -> None:
        self.request_id = request_id
        self.last: RequestOutput | None = None  # the engine's latest output, read or not
        self._abort = abort
        self._on_done = on_done
        # Outputs are cumulative: a reader that falls behind gets the latest one, not a backlog
        # (under load the handler then formats one event per read, not one per step).
        self._unread = False  # `last` came after the reader's latest read
        self._end: BaseException | object | None = None  # _END or an exception, after `last`
        self._wake = asyncio.Event()
        self._done = asyncio.Event()
        self._started = False
        self._pump_task = asyncio.create_task(self._pump(source), name=f"pump-{request_id}")
        # Also runs for a task cancelled before it started (whose body never runs).
        self._pump_task.add_done_callback(self._pump_done)

    async def _pump(self, source: AsyncGenerator[RequestOutput, None]) -> None:
        # Invariant that `close()` relies on: the engine's generate() queues the add of a
        # token-id prompt before its first suspension, so once `_started` is set an abort is
        # applied after the add (commands run in order), never before it.
        self._started = True
        try:
            async with aclosing(source):
                async for output in source:
                    self.last, self._unread = output, True
                    self._wake.set()
            self._finish(_END)
        except Exception as exc:  # the reader raises it; the engine holds nothing more
            self._finish(exc)

    def _finish(self, end: BaseException | object) -> None:
        if self._end is None:
            self._end = end
        self._wake.set()

    def _pump_done(self, task: asyncio.Task[None]) -> None:
        if task.cancelled():
            self._finish(asyncio.CancelledError())
        self._done.set()
        self._on_done()

    @property
    def is_done(self) -> bool:
        """The engine is finished with the request (completed, failed or aborted)."""
        return self._done.is_set()

    def __aiter__(self) -> EngineStream:
        return self

    async def __anext__(self) -> RequestOutput:
        while True:
            if self._unread:
                self._unread = False
                assert self.last is not None
                return self.last
            if self._end is _END:
                raise StopAsyncIteration
            if isinstance(self._end, BaseException):
                raise self._end
            self._wake.clear()
            await self._wake.wait()

    async def close(self) -> RequestOutput | None:
        """Abort the request unless the engine is done with it, wait for its final output and
        return the engine's last output (None if it never produced one). Never cancelled
        halfway: callers that are being cancelled still learn the final counts."""
        with anyio.CancelScope(shield=True):
            if not self._started:
                self._pump_task.cancel()  # it never reached the engine
            elif not self._done.is_set() and not (self.last is not None and self.last.finished):
                # A reader that stops at the final output usually gets here before the pump
                # has seen the engine's stream end: the engine holds nothing more by then, so
                # there is nothing to abort (an abort would cost a message to the engine core
                # per request).
                await self._abort()
            if not self._done.is_set():
                with anyio.move_on_after(CLOSE_TIMEOUT_S) as scope:
                    await self._done.wait()
                if scope.cancelled_caught:
                    logger.error(
                        "request %s: no final output %.0fs after its abort; billing what was seen",
                        self.request_id,
                        CLOSE_TIMEOUT_S,
                    )
                    self._pump_task.cancel()
        return self.last
