"""The official `openai` client against a running server: completions and chat, streaming
and not, an adapter as the model; a 429 it understands; disconnects abort engine work."""

from __future__ import annotations

import asyncio

import httpx
import openai
import pytest

from loraplex.platform.ratelimit import TenantLimits
from tests.e2e.live_server import LiveServer

MODEL = "tiny-llama"


def client(server: LiveServer, tenant: str = "acme") -> openai.OpenAI:
    return openai.OpenAI(
        base_url=f"{server.base_url}/v1", api_key=server.keys[tenant], max_retries=0, timeout=60
    )


def test_openai_client(live_server: LiveServer) -> None:
    c = client(live_server)
    ids = [m.id for m in c.models.list().data]
    assert ids == [MODEL, "bot"]

    completion = c.completions.create(
        model="bot",
        prompt="Once upon a time",
        max_tokens=8,
        temperature=0,
        extra_body={"ignore_eos": True},
    )
    assert completion.model == "bot" and completion.usage is not None
    assert completion.usage.completion_tokens == 8
    text = completion.choices[0].text
    streamed = "".join(
        chunk.choices[0].text
        for chunk in c.completions.create(
            model="bot",
            prompt="Once upon a time",
            max_tokens=8,
            temperature=0,
            stream=True,
            extra_body={"ignore_eos": True},
        )
        if chunk.choices
    )
    assert streamed == text

    messages = [{"role": "user", "content": "Tell me a story."}]
    chat = c.chat.completions.create(
        model="bot",
        messages=messages,  # type: ignore[arg-type]
        max_tokens=6,
        temperature=0,
        extra_body={"ignore_eos": True},
    )
    assert chat.choices[0].message.role == "assistant"
    assert chat.choices[0].finish_reason == "length"
    stream = c.chat.completions.create(
        model="bot",
        messages=messages,  # type: ignore[arg-type]
        max_tokens=6,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"ignore_eos": True},
    )
    chunks = list(stream)
    content = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert content == chat.choices[0].message.content
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 6

    with pytest.raises(openai.NotFoundError) as not_found:
        c.completions.create(model="someone-elses-bot", prompt="x", max_tokens=1)
    assert not_found.value.code == "model_not_found"
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(
            base_url=f"{live_server.base_url}/v1", api_key="lpx-wrong", max_retries=0
        ).models.list()
    with pytest.raises(openai.BadRequestError) as bad:
        c.completions.create(model=MODEL, prompt="x", max_tokens=1, n=1000)
    assert bad.value.param == "n"


def test_openai_client_sees_429_and_retry_after(live_server: LiveServer) -> None:
    c = client(live_server, "limited")
    c.completions.create(model=MODEL, prompt="x", max_tokens=1)
    with pytest.raises(openai.RateLimitError) as limited:
        c.completions.create(model=MODEL, prompt="x", max_tokens=1)
    response = limited.value.response
    assert int(response.headers["retry-after"]) >= 1
    assert response.headers["x-ratelimit-remaining-requests"] == "0"
    assert limited.value.code == "rate_limit_exceeded"


def test_client_disconnect_aborts_the_engine_request(live_server: LiveServer) -> None:
    headers = {"Authorization": f"Bearer {live_server.keys['acme']}"}
    body = {
        "model": "bot",
        "prompt": "Once upon a time",
        "max_tokens": 1000,
        "ignore_eos": True,
        "stream": True,
    }
    engine = live_server.app_state.engine
    with (
        httpx.Client(base_url=live_server.base_url, timeout=30) as http,
        http.stream("POST", "/v1/completions", headers=headers, json=body) as r,
    ):
        assert r.status_code == 200
        lines = r.iter_lines()
        for _ in range(3):
            next(lines)
        stats = engine.get_stats()
        assert stats.num_running == 1 and stats.kv_blocks_used > 0
    # Leaving the block closed the connection mid-stream.
    live_server.wait_until_idle()

    # The same for a non-streaming request: the client gives up, the engine stops at once.
    with (
        httpx.Client(base_url=live_server.base_url, timeout=0.5) as http,
        pytest.raises(httpx.ReadTimeout),
    ):
        http.post("/v1/completions", headers=headers, json={**body, "stream": False})
    live_server.wait_until_idle()

    rows = live_server.usage_rows()
    assert [r.status for r in rows] == ["aborted", "aborted"]
    assert all(0 < r.completion_tokens < 1000 for r in rows)
    # Billed exactly what the engine generated, tokens made after the client left included.
    generated = engine.get_stats().num_generated_tokens
    assert sum(r.completion_tokens for r in rows) == generated
    # Nothing leaked in the rate limiter either: the concurrency slots came back.
    limits = TenantLimits(None, None, live_server.settings.default_max_concurrent_requests)
    decision = live_server.run(live_server.app_state.limiter.peek(str(rows[0].tenant_id), limits))
    assert decision.concurrency is not None
    assert decision.concurrency.remaining == limits.max_concurrent_requests


def test_many_streams_opened_and_dropped(live_server: LiveServer) -> None:
    """Blocks, engine slots and rate-limit reservations all come back."""
    headers = {"Authorization": f"Bearer {live_server.keys['acme']}"}
    body = {
        "model": "bot",
        "prompt": "Once upon a time",
        "max_tokens": 500,
        "ignore_eos": True,
        "stream": True,
    }

    async def open_and_drop(http: httpx.AsyncClient, i: int) -> int:
        async with http.stream(
            "POST", "/v1/completions", headers=headers, json={**body, "seed": i}
        ) as r:
            if r.status_code == 200:
                async for _ in r.aiter_lines():
                    break
            return r.status_code

    async def run_all() -> list[int]:
        limits = httpx.Limits(max_connections=200)
        async with httpx.AsyncClient(
            base_url=live_server.base_url, timeout=60, limits=limits
        ) as http:
            return await asyncio.gather(*(open_and_drop(http, i) for i in range(100)))

    statuses = asyncio.run(run_all())
    assert statuses.count(200) >= 32 and set(statuses) <= {200, 429}
    live_server.wait_until_idle(timeout_s=30)
    rows = live_server.usage_rows()
    assert len(rows) == statuses.count(200)
    assert all(r.status == "aborted" and r.completion_tokens < 500 for r in rows)
    generated = live_server.app_state.engine.get_stats().num_generated_tokens
    assert sum(r.completion_tokens for r in rows) == generated
    limits = TenantLimits(None, None, live_server.settings.default_max_concurrent_requests)
    decision = live_server.run(live_server.app_state.limiter.peek(str(rows[0].tenant_id), limits))
    assert decision.concurrency is not None
    assert decision.concurrency.remaining == limits.max_concurrent_requests
