"""EngineStream: one engine request, bound to whoever reads it.

The engine's stream is read by a task of its own (the pump), never by the request's handler.
A handler that goes away (its client disconnected: the handler is cancelled wherever it is)
therefore cannot take the engine's last word with it: `close()` asks the engine to abort and
waits, for a bounded time, until the pump has seen the request's final output. The request's
KV blocks, adapter pin and concurrency slot are all gone by then, and the stream's totals,
tokens generated after the client left included, are the ones the tenant is billed.

Outputs are deltas (what the request gained since the previous one): a handler's work per step
does not grow with the output's length. A handler that falls behind gets the unread deltas
joined into one output, not a backlog.

    handler ──anext──▶ unread deltas, joined ◀── pump ──async for──▶ AsyncEngine.generate(...)
    handler ──close()──▶ abort ──▶ engine core ──final output──▶ pump (done)
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncGenerator, Awaitable, Callable
from contextlib import aclosing
from dataclasses import dataclass, field

import anyio

from loraplex.engine.request import RequestOutput, join_output

logger = logging.getLogger(__name__)

# The engine applies an abort between two steps; a step is far shorter than this.
CLOSE_TIMEOUT_S = 60.0
_END = object()


@dataclass
class StreamTotals:
    """What the engine has sent for one request so far, read by the handler or not."""

    num_completion_tokens: int = 0
    num_cached_tokens: int = 0
    finished: bool = False
    finish_reasons: dict[int, str] = field(default_factory=dict)  # completion index -> reason

    def add(self, output: RequestOutput) -> None:
        self.num_completion_tokens += sum(len(o.token_ids) for o in output.outputs)
        self.num_cached_tokens = output.num_cached_tokens
        self.finished = output.finished
        for o in output.outputs:
            if o.finish_reason is not None:
                self.finish_reasons[o.index] = o.finish_reason


class EngineStream:
    """Delta outputs of one engine request; iterate, then `close()` exactly once."""

    def __init__(
        self,
        request_id: str,
        source: AsyncGenerator[RequestOutput, None],
        *,
        abort: Callable[[], Awaitable[None]],
        on_done: Callable[[], None],
    ) -> None:
        self.request_id = request_id
        self.totals = StreamTotals()
        self._abort = abort
        self._on_done = on_done
        # The deltas after the reader's latest read, joined (the pump's own: not handed out).
        self._unread: RequestOutput | None = None
        self._end: BaseException | object | None = None  # _END or an exception, after those
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
                    self.totals.add(output)
                    self._unread = (
                        output if self._unread is None else join_output(self._unread, output)
                    )
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
            if self._unread is not None:
                output, self._unread = self._unread, None
                return output
            if self._end is _END:
                raise StopAsyncIteration
            if isinstance(self._end, BaseException):
                raise self._end
            self._wake.clear()
            await self._wake.wait()

    async def close(self) -> StreamTotals:
        """Abort the request unless the engine is done with it, wait for its final output and
        return the stream's totals. Never cancelled halfway: callers that are being cancelled
        still learn the final counts."""
        with anyio.CancelScope(shield=True):
            if not self._started:
                self._pump_task.cancel()  # it never reached the engine
            elif not self._done.is_set() and not self.totals.finished:
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
        return self.totals
