"""EngineStream.close(): it aborts only a request the engine may still be working on. The
engine's side is a scripted async generator here, so the test decides exactly when the
engine's stream ends relative to the close (tests/platform/test_disconnect_stages.py drives
the real engine)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator

from loraplex.engine.request import CompletionOutput, RequestOutput
from loraplex.platform.engine_stream import EngineStream


def output(num_tokens: int, finish_reason: str | None) -> RequestOutput:
    completion = CompletionOutput(0, "", list(range(num_tokens)), finish_reason)
    return RequestOutput("r", None, [1], [completion], finished=finish_reason is not None)


class ScriptedEngine:
    """Yields the given outputs, then holds its stream open until `end` is set; an abort
    ends it with a final output of finish reason "abort"."""

    def __init__(self, outputs: list[RequestOutput]) -> None:
        self.outputs = outputs
        self.end = asyncio.Event()
        self.num_aborts = 0
        self.num_done = 0

    async def stream(self) -> AsyncGenerator[RequestOutput, None]:
        for out in self.outputs:
            yield out
        await self.end.wait()
        if self.num_aborts:
            yield output(len(self.outputs[-1].outputs[0].token_ids), "abort")

    async def abort(self) -> None:
        self.num_aborts += 1
        self.end.set()

    def open(self) -> EngineStream:
        return EngineStream("r", self.stream(), abort=self.abort, on_done=self.on_done)

    def on_done(self) -> None:
        self.num_done += 1


async def test_closing_after_the_final_output_sends_no_abort() -> None:
    engine = ScriptedEngine([output(1, None), output(2, "length")])
    stream = engine.open()
    seen = []
    async for out in stream:
        seen.append(out)
        if out.finished:
            break  # as a handler does: the pump has not yet seen the stream end
    assert not stream.is_done
    closing = asyncio.ensure_future(stream.close())
    await asyncio.sleep(0.01)
    assert not closing.done()  # it waits for the pump, which waits for the engine
    engine.end.set()
    final = await asyncio.wait_for(closing, 5)
    assert engine.num_aborts == 0 and engine.num_done == 1
    assert final is seen[-1] and final.outputs[0].finish_reason == "length"


async def test_closing_mid_stream_aborts_once_and_returns_the_final_counts() -> None:
    engine = ScriptedEngine([output(1, None), output(3, None)])
    stream = engine.open()
    first = await anext(stream)
    assert not first.finished
    final = await asyncio.wait_for(stream.close(), 5)
    assert engine.num_aborts == 1 and engine.num_done == 1 and stream.is_done
    assert final is not None and final.outputs[0].finish_reason == "abort"
    assert len(final.outputs[0].token_ids) == 3  # what the engine generated, read or not
