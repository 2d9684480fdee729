"""Disconnects at the stages a socket test cannot aim at: while the prompt is being planned,
and while the rate limiter's answer is on its way back (the reservation exists, the handler
has not seen it yet). Driven through the ASGI interface, which says exactly when the client
leaves. The engine-side half: an EngineStream closed before or after its pump started, and one
read only after the engine finished (the deltas it missed are joined into one output)."""

from __future__ import annotations

import json
from typing import Any

import anyio
import pytest
from starlette.types import Message

from loraplex.engine.request import SamplingParams
from loraplex.platform.ratelimit import RateLimitDecision, TenantLimits
from tests.platform.platform_harness import Platform


async def post_then_leave(
    p: Platform,
    path: str,
    headers: dict[str, str],
    body: dict[str, Any],
    leave_after_s: float,
    leave_once: anyio.Event | None = None,
) -> list[Message]:
    """Send one request, disconnect `leave_after_s` later (after `leave_once` is set, if
    given: a stage reached, however slow the machine); what the app sent back."""
    sent: list[Message] = []
    delivered = False

    async def receive() -> Message:
        nonlocal delivered
        if not delivered:
            delivered = True
            return {"type": "http.request", "body": json.dumps(body).encode(), "more_body": False}
        if leave_once is not None:
            await leave_once.wait()
        await anyio.sleep(leave_after_s)
        return {"type": "http.disconnect"}

    async def send(message: Message) -> None:
        sent.append(message)

    scope = {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.3"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "root_path": "",
        "query_string": b"",
        "headers": [
            (b"content-type", b"application/json"),
            *((k.lower().encode(), v.encode()) for k, v in headers.items()),
        ],
        "client": ("127.0.0.1", 50000),
        "server": ("testserver", 80),
    }
    with anyio.fail_after(10):
        await p.app(scope, receive, send)
    return sent


async def assert_nothing_left(p: Platform, tenant_id: int, max_concurrent: int) -> None:
    with anyio.fail_after(5):
        while p.state.engine.num_inflight or p.state.engine.get_stats().num_running:
            await anyio.sleep(0.01)
    stats = p.state.engine.get_stats()
    assert stats.num_waiting == 0 and stats.kv_blocks_used == 0
    decision = await p.state.limiter.peek(str(tenant_id), TenantLimits(None, None, max_concurrent))
    assert decision.concurrency is not None
    assert decision.concurrency.remaining == max_concurrent


BODY = {"model": "tiny-llama", "prompt": "hello", "max_tokens": 50, "ignore_eos": True}


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
async def test_leaving_while_the_limiter_answers_strands_no_reservation(
    server: Platform, monkeypatch: pytest.MonkeyPatch, stream: bool
) -> None:
    tenant, headers = await server.tenant("acme", max_concurrent_requests=1)
    limiter = server.state.limiter
    acquire = limiter.acquire
    reserved = anyio.Event()

    async def slow_reply(*args: Any, **kwargs: Any) -> RateLimitDecision:
        decision = await acquire(*args, **kwargs)  # taken in the store...
        reserved.set()
        await anyio.sleep(0.3)  # ...and the client leaves before the answer is back
        return decision

    monkeypatch.setattr(limiter, "acquire", slow_reply)
    sent = await post_then_leave(
        server, "/v1/completions", headers, {**BODY, "stream": stream}, 0.05, reserved
    )
    assert sent == []  # nobody to answer
    await assert_nothing_left(server, tenant["id"], 1)
    await server.flush_usage()
    rows = (await server.client.get("/admin/v1/usage", headers=server.admin)).json()["data"]
    assert [(r["requests"], r["completion_tokens"]) for r in rows] == [(1, 0)]


async def test_leaving_while_planning_admits_nothing(
    server: Platform, monkeypatch: pytest.MonkeyPatch
) -> None:
    tenant, headers = await server.tenant("acme", max_concurrent_requests=1)
    engine = server.state.engine
    encode_text = engine.encode_text

    async def slow_tokenizer(text: str) -> list[int]:
        await anyio.sleep(0.3)
        return await encode_text(text)

    monkeypatch.setattr(engine, "encode_text", slow_tokenizer)
    assert await post_then_leave(server, "/v1/completions", headers, BODY, 0.1) == []
    await assert_nothing_left(server, tenant["id"], 1)
    await server.flush_usage()
    rows = (await server.client.get("/admin/v1/usage", headers=server.admin)).json()["data"]
    assert rows == []
    assert server.state.engine.get_stats().num_generated_tokens == 0


@pytest.mark.parametrize("started", [False, True], ids=["before-pump", "after-pump"])
async def test_a_closed_engine_stream_leaves_nothing_in_the_engine(
    server: Platform, started: bool
) -> None:
    engine = server.state.engine
    stream = engine.generate(
        request_id=f"close-{started}",
        prompt_token_ids=[1, 2, 3],
        sampling_params=SamplingParams(max_tokens=500, ignore_eos=True),
        adapter=None,
        priority=1,
        tenant_key="t",
    )
    if started:
        await anext(stream)
    totals = await stream.close()
    assert stream.is_done and engine.num_inflight == 0
    if started:
        assert totals.finished and totals.finish_reasons == {0: "abort"}
    else:
        assert not totals.finished and totals.num_completion_tokens == 0
    # Commands run in order: once a later request is done, any stray add would have run.
    later = engine.generate(
        request_id="later",
        prompt_token_ids=[4],
        sampling_params=SamplingParams(max_tokens=2),
        adapter=None,
        priority=1,
        tenant_key="t",
    )
    outputs = [o async for o in later]
    later_totals = await later.close()
    assert outputs[-1].finished and later_totals.num_completion_tokens == 2
    assert not engine.engine.engine.has_unfinished_requests()
    generated = engine.get_stats().num_generated_tokens
    assert generated == later_totals.num_completion_tokens + totals.num_completion_tokens


async def test_an_engine_stream_read_late_gives_the_missed_deltas_joined_not_a_backlog(
    server: Platform,
) -> None:
    stream = server.state.engine.generate(
        request_id="late-reader",
        prompt_token_ids=[1, 2, 3],
        sampling_params=SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True),
        adapter=None,
        priority=1,
        tenant_key="t",
    )
    try:
        first = await anext(stream)
        with anyio.fail_after(30):
            while not stream.is_done:  # the engine finishes while nobody reads
                await anyio.sleep(0.01)
        rest = [output async for output in stream]
    finally:
        totals = await stream.close()
    assert len(rest) == 1 and rest[0].finished and totals.num_completion_tokens == 12
    tokens = first.outputs[0].token_ids + rest[0].outputs[0].token_ids
    assert len(tokens) == 12 and len(first.outputs[0].token_ids) < 12
