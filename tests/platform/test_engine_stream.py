"""EngineStream: close() aborts only a request the engine may still be working on and returns
the totals of everything the engine sent; a reader that falls behind gets the unread deltas
joined. The engine's side is a scripted async generator here, so the test decides exactly when
the engine's stream ends relative to the close (tests/platform/test_disconnect_stages.py drives
the real engine)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator

from loraplex.engine.request import CompletionOutput, RequestOutput
from loraplex.platform.engine_stream import EngineStream


def output(new_tokens: list[int], finish_reason: str | None) -> RequestOutput:
    """A delta output: `new_tokens` generated since the previous one."""
    text = "".join(f"<{t}>" for t in new_tokens)
    completion = CompletionOutput(0, text, list(new_tokens), finish_reason)
    return RequestOutput("r", None, [1], [completion], finished=finish_reason is not None)


class ScriptedEngine:
    """Yields the given delta outputs, then holds its stream open until `end` is set; an abort
    ends it with a final output of finish reason "abort" and no new tokens."""

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
            yield output([], "abort")

    async def abort(self) -> None:
        self.num_aborts += 1
        self.end.set()

    def open(self) -> EngineStream:
        return EngineStream("r", self.stream(), abort=self.abort, on_done=self.on_done)

    def on_done(self) -> None:
        self.num_done += 1


async def test_closing_after_the_final_output_sends_no_abort() -> None:
    engine = ScriptedEngine([output([7], None), output([8], "length")])
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
    totals = await asyncio.wait_for(closing, 5)
    assert engine.num_aborts == 0 and engine.num_done == 1
    assert totals.finished and totals.finish_reasons == {0: "length"}
    assert totals.num_completion_tokens == 2
    # Both deltas arrived before the reader woke: it got them joined, once.
    assert [o.outputs[0].token_ids for o in seen] == [[7, 8]]
    assert seen[0].outputs[0].text == "<7><8>" and seen[0].outputs[0].finish_reason == "length"


async def test_closing_mid_stream_aborts_once_and_returns_the_final_counts() -> None:
    engine = ScriptedEngine([output([1], None), output([2, 3], None)])
    stream = engine.open()
    first = await anext(stream)
    assert not first.finished
    totals = await asyncio.wait_for(stream.close(), 5)
    assert engine.num_aborts == 1 and engine.num_done == 1 and stream.is_done
    assert totals.finished and totals.finish_reasons == {0: "abort"}
    assert totals.num_completion_tokens == 3  # what the engine generated, read or not


async def test_a_reader_that_falls_behind_gets_the_unread_deltas_joined() -> None:
    gate = asyncio.Event()

    async def source() -> AsyncGenerator[RequestOutput, None]:
        yield output([1], None)
        await gate.wait()
        yield output([2], None)
        yield output([3, 4], "stop")

    async def no_abort() -> None:
        raise AssertionError("a stream read to its end is not aborted")

    stream = EngineStream("r", source(), abort=no_abort, on_done=lambda: None)
    first = await asyncio.wait_for(anext(stream), 5)
    gate.set()
    await asyncio.sleep(0.01)  # the pump takes the other two while nobody reads
    rest = await asyncio.wait_for(anext(stream), 5)
    totals = await asyncio.wait_for(stream.close(), 5)
    assert first.outputs[0].token_ids == [1]  # an output handed out is never changed
    assert rest.outputs[0].token_ids == [2, 3, 4] and rest.outputs[0].text == "<2><3><4>"
    assert rest.finished and totals.num_completion_tokens == 4
