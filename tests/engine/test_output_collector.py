"""RequestOutputCollector: when the caller is woken (every step, or without `stream` only for
the first output and the last), unread steps merging into one output, and delta reads that never
change what they handed out."""

from __future__ import annotations

import asyncio

import pytest

from loraplex.engine.engine_core import CompletionDelta, OutputDelta
from loraplex.engine.output_collector import RequestOutputCollector
from loraplex.engine.request import Logprob


def step(token: int, finished: bool = False, error: Exception | None = None) -> OutputDelta:
    logprobs = [(Logprob(token, -0.5), [])]
    reason = "length" if finished else None
    piece = CompletionDelta(0, [token], f"t{token} ", logprobs, reason, None)
    return OutputDelta("r", [piece], finished, 0, error)


@pytest.fixture
def loop():
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


def collector(loop, **kwargs) -> RequestOutputCollector:
    return RequestOutputCollector(None, [1, 2], loop.create_future(), **kwargs)


def test_a_streaming_caller_is_woken_at_every_step(loop):
    c = collector(loop)
    c.apply(step(5))
    assert c.has_output and c.wake.is_set()
    assert c.read("r").outputs[0].token_ids == [5]
    c.wake.clear()
    c.apply(step(6))
    assert c.has_output and c.wake.is_set()


@pytest.mark.parametrize("delta", [False, True])
def test_without_stream_only_the_first_output_and_the_last_wake_the_caller(loop, delta):
    c = collector(loop, delta=delta, stream=False)
    assert not c.has_output
    c.apply(step(5))
    assert c.has_output and c.wake.is_set()  # the first output (time to first token)
    first = c.read("r")
    c.wake.clear()
    for token in range(6, 10):
        c.apply(step(token))
        assert c.unread and not c.has_output and not c.wake.is_set()
    c.apply(step(10, finished=True))
    assert c.has_output and c.wake.is_set()
    last = c.read("r")
    assert first.outputs[0].token_ids == [5]  # never changed by the later steps
    assert first.outputs[0].logprobs == [(Logprob(5, -0.5), [])]
    expected = list(range(6, 11)) if delta else list(range(5, 11))
    assert last.finished and last.outputs[0].token_ids == expected
    assert [lp[0].token_id for lp in last.outputs[0].logprobs] == expected
    assert last.outputs[0].text == "".join(f"t{t} " for t in expected)


def test_without_stream_an_error_wakes_the_caller(loop):
    c = collector(loop, stream=False)
    c.apply(step(5))
    c.read("r")
    c.wake.clear()
    c.apply(step(6, error=ValueError("bad")))
    assert c.has_output and c.wake.is_set()
    assert isinstance(c.read("r").error, ValueError)


def test_an_engine_failure_wakes_a_caller_waiting_for_the_last_output(loop):
    c = collector(loop, stream=False)
    c.apply(step(5))
    c.read("r")
    c.wake.clear()
    c.apply(step(6))
    c.fail(RuntimeError("engine died"))
    assert c.wake.is_set() and not c.has_output and c.failure is not None
