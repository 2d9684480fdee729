"""The OpenAI-compatible inference routes on the real engine (tiny random checkpoint)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from sqlalchemy import select

from loraplex.platform.auth import TenantContext
from loraplex.platform.db import TenantTier, UsageRecord
from loraplex.platform.services.planning import resolve_priority
from tests.platform.platform_harness import Platform

PROMPT = "The quick brown fox"


def events(text: str) -> list[Any]:
    """The SSE payloads of a stream, [DONE] as the string."""
    assert text.endswith("data: [DONE]\n\n")
    out: list[Any] = []
    for block in text.strip().split("\n\n"):
        assert block.startswith("data: "), block
        data = block.removeprefix("data: ")
        out.append(data if data == "[DONE]" else json.loads(data))
    return out


async def test_completions(server: Platform) -> None:
    tenant, headers = await server.tenant("acme")
    await server.add_adapter(tenant["id"], "bot")
    c = server.client
    body = {"prompt": PROMPT, "max_tokens": 12, "temperature": 0, "ignore_eos": True}
    r = await c.post("/v1/completions", headers=headers, json={**body, "model": "bot"})
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["object"] == "text_completion" and out["model"] == "bot"
    assert out["id"].startswith("cmpl-")
    [choice] = out["choices"]
    assert choice["finish_reason"] == "length" and choice["index"] == 0
    assert out["usage"]["completion_tokens"] == 12
    assert out["usage"]["total_tokens"] == out["usage"]["prompt_tokens"] + 12
    for name in (
        "x-request-id",
        "x-ratelimit-limit-requests",
        "x-ratelimit-remaining-requests",
        "x-ratelimit-reset-requests",
        "x-ratelimit-limit-tokens",
        "x-ratelimit-remaining-tokens",
        "x-ratelimit-reset-tokens",
    ):
        assert r.headers.get(name), name
    again = await c.post("/v1/completions", headers=headers, json={**body, "model": "bot"})
    assert again.json()["choices"][0]["text"] == choice["text"]  # greedy is deterministic
    base = await c.post(
        "/v1/completions", headers=headers, json={**body, "model": server.model_name}
    )
    assert base.json()["choices"][0]["text"] != choice["text"]  # the adapter is applied

    # The same request streamed gives the same text, in deltas.
    r = await c.post(
        "/v1/completions", headers=headers, json={**body, "model": "bot", "stream": True}
    )
    assert r.headers["content-type"].startswith("text/event-stream")
    assert r.headers.get("x-ratelimit-limit-requests")
    chunks = events(r.text)
    assert chunks[-1] == "[DONE]" and all(ch["usage"] is None for ch in chunks[:-1])
    assert "".join(ch["choices"][0]["text"] for ch in chunks[:-1]) == choice["text"]
    assert chunks[-2]["choices"][0]["finish_reason"] == "length"


async def test_completion_options(server: Platform) -> None:
    _, headers = await server.tenant("acme")
    c = server.client
    base = {"model": server.model_name, "prompt": PROMPT, "max_tokens": 6, "ignore_eos": True}
    r = await c.post(
        "/v1/completions",
        headers=headers,
        json={**base, "n": 3, "temperature": 1.0, "seed": 7, "logprobs": 2},
    )
    out = r.json()
    assert [ch["index"] for ch in out["choices"]] == [0, 1, 2]
    assert out["usage"]["completion_tokens"] == 18
    for ch in out["choices"]:
        lp = ch["logprobs"]
        assert len(lp["tokens"]) == len(lp["token_logprobs"]) == len(lp["top_logprobs"]) == 6
        assert all(len(top) <= 2 for top in lp["top_logprobs"])
        assert all(v <= 0 for v in lp["token_logprobs"])
    again = await c.post(
        "/v1/completions",
        headers=headers,
        json={**base, "n": 3, "temperature": 1.0, "seed": 7, "logprobs": 2},
    )
    assert [ch["text"] for ch in again.json()["choices"]] == [ch["text"] for ch in out["choices"]]

    # Stop strings end the text before the stop.
    greedy = (
        await c.post(
            "/v1/completions", headers=headers, json={**base, "temperature": 0, "max_tokens": 12}
        )
    ).json()
    text = greedy["choices"][0]["text"]
    stop = text[len(text) // 2 : len(text) // 2 + 2]
    if stop.strip():
        r = await c.post(
            "/v1/completions",
            headers=headers,
            json={**base, "temperature": 0, "max_tokens": 12, "stop": [stop]},
        )
        stopped = r.json()["choices"][0]
        assert stopped["finish_reason"] == "stop" and stop not in stopped["text"]
        assert text.startswith(stopped["text"])

    # n > 1 streamed: every choice gets its deltas and its finish reason; usage at the end.
    r = await c.post(
        "/v1/completions",
        headers=headers,
        json={**base, "n": 2, "stream": True, "stream_options": {"include_usage": True}},
    )
    chunks = events(r.text)
    finished = {  # one chunk holds every choice that changed in one engine step
        choice["index"] for ch in chunks[:-2] for choice in ch["choices"] if choice["finish_reason"]
    }
    assert finished == {0, 1}
    assert chunks[-2]["choices"] == [] and chunks[-2]["usage"]["completion_tokens"] == 12


async def test_streamed_logprobs_of_held_back_text_go_out_with_it(server: Platform) -> None:
    """Text that could begin a stop string is held back: its tokens send no event then, and
    their logprobs go out with the event that later carries their text."""
    _, headers = await server.tenant("acme")
    body = {
        "model": server.model_name, "prompt": PROMPT, "max_tokens": 12, "temperature": 0,
        "ignore_eos": True, "logprobs": 1,
    }  # fmt: skip
    r = await server.client.post("/v1/completions", headers=headers, json=body)
    whole = r.json()["choices"][0]
    text, tokens = whole["text"], whole["logprobs"]["tokens"]
    # The second half of the text is a prefix of this stop string, which never matches whole:
    # the engine holds that half back until the request ends.
    held = text[len(text) // 2 :]
    assert held.strip() and "\u2603" not in text
    r = await server.client.post(
        "/v1/completions",
        headers=headers,
        json={**body, "stream": True, "stop": [held + "\u2603"]},
    )
    choices = [ch["choices"][0] for ch in events(r.text)[:-1] if ch["choices"]]
    assert "".join(c["text"] for c in choices) == text
    assert choices[-1]["finish_reason"] == "length" and choices[-1]["text"].endswith(held)
    assert [t for c in choices for t in c["logprobs"]["tokens"]] == tokens


async def test_chat_completions(server: Platform) -> None:
    tenant, headers = await server.tenant("acme")
    await server.add_adapter(tenant["id"], "bot", source="r8")
    c = server.client
    body = {
        "model": "bot",
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Hello!"},
        ],
        "max_tokens": 8,
        "temperature": 0,
        "ignore_eos": True,
    }
    r = await c.post("/v1/chat/completions", headers=headers, json=body)
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["object"] == "chat.completion" and out["id"].startswith("chatcmpl-")
    message = out["choices"][0]["message"]
    assert message["role"] == "assistant" and isinstance(message["content"], str)
    assert out["usage"]["completion_tokens"] == 8

    r = await c.post(
        "/v1/chat/completions",
        headers=headers,
        json={**body, "stream": True, "stream_options": {"include_usage": True}},
    )
    chunks = events(r.text)
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert all(ch["object"] == "chat.completion.chunk" for ch in chunks[:-1])
    text = "".join(ch["choices"][0]["delta"].get("content") or "" for ch in chunks[1:-2])
    assert text == message["content"]
    assert chunks[-3]["choices"][0]["finish_reason"] == "length"
    assert chunks[-2]["choices"] == []
    streamed_usage = dict(chunks[-2]["usage"])
    # The same prompt again: its full blocks now come from the prefix cache.
    assert streamed_usage.pop("prompt_tokens_details")["cached_tokens"] > 0
    assert streamed_usage == {k: v for k, v in out["usage"].items() if k != "prompt_tokens_details"}

    r = await c.post(
        "/v1/chat/completions",
        headers=headers,
        json={**body, "logprobs": True, "top_logprobs": 3, "max_tokens": 4},
    )
    content = r.json()["choices"][0]["logprobs"]["content"]
    assert len(content) == 4
    assert all(len(t["top_logprobs"]) == 3 and t["bytes"] is not None for t in content)

    # Without max_tokens, a chat completion may use what the context leaves (capped).
    r = await c.post(
        "/v1/chat/completions",
        headers=headers,
        json={"model": server.model_name, "messages": body["messages"], "ignore_eos": True},
    )
    usage = r.json()["usage"]
    assert usage["completion_tokens"] == min(
        server.settings.max_completion_tokens, 128 - usage["prompt_tokens"]
    )


async def test_usage_records(server: Platform) -> None:
    tenant, headers = await server.tenant("acme")
    adapter = await server.add_adapter(tenant["id"], "bot")
    c = server.client
    r1 = await c.post(
        "/v1/completions",
        headers=headers,
        json={"model": "bot", "prompt": PROMPT, "max_tokens": 5, "ignore_eos": True},
    )
    r2 = await c.post(
        "/v1/chat/completions",
        headers=headers,
        json={
            "model": server.model_name,
            "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 3,
            "ignore_eos": True,
            "stream": True,
        },
    )
    assert r1.status_code == r2.status_code == 200
    await server.flush_usage()
    with server.state.db.session() as session:
        rows = session.scalars(select(UsageRecord).order_by(UsageRecord.id)).all()
    assert [(r.endpoint, r.model, r.adapter_id, r.status, r.completion_tokens) for r in rows] == [
        ("completions", "bot", adapter["id"], "ok", 5),
        ("chat.completions", server.model_name, None, "ok", 3),
    ]
    assert rows[0].prompt_tokens == r1.json()["usage"]["prompt_tokens"]
    assert rows[0].request_id == r1.json()["id"]
    assert all(r.tenant_id == tenant["id"] and r.api_key_id is not None for r in rows)
    assert all(r.latency_ms >= 0 for r in rows)


async def test_the_engine_gets_tenant_priority_salt_and_adapter(server: Platform) -> None:
    tenant, headers = await server.tenant("acme", priority="standard")
    adapter = await server.add_adapter(tenant["id"], "bot")
    engine = server.state.engine.engine
    calls: list[dict[str, Any]] = []
    real_generate = engine.generate

    def spy(*args: Any, **kwargs: Any) -> Any:  # records the call, runs the real engine
        calls.append(kwargs)
        return real_generate(*args, **kwargs)

    engine.generate = spy  # type: ignore[method-assign]
    try:
        for priority in (None, 0, 2):
            body = {"model": "bot", "prompt": PROMPT, "max_tokens": 2}
            if priority is not None:
                body["priority"] = priority
            assert (
                await server.client.post("/v1/completions", headers=headers, json=body)
            ).status_code == 200
    finally:
        del engine.generate
    # A client may only make its request less urgent than its tier (standard = 1).
    assert [call["priority"] for call in calls] == [1, 1, 2]
    for call in calls:
        assert call["cache_salt"] == call["fairness_key"] == str(tenant["id"])
        lora = call["lora_request"]
        assert lora.lora_int_id == adapter["id"] and lora.content_hash == adapter["sha256"]
        assert lora.lora_path == adapter["path"]


async def test_a_non_streamed_request_reads_two_engine_outputs_a_streamed_one_each_step(
    server: Platform,
) -> None:
    _, headers = await server.tenant("acme")
    engine = server.state.engine.engine
    reads: dict[bool, int] = {}
    real_generate = engine.generate

    async def spy(*args: Any, **kwargs: Any) -> Any:  # counts the outputs the server reads
        stream = kwargs["stream"]
        reads[stream] = 0
        async for output in real_generate(*args, **kwargs):
            reads[stream] += 1
            yield output

    engine.generate = spy  # type: ignore[method-assign]
    try:
        body = {"model": server.model_name, "prompt": PROMPT, "max_tokens": 24, "temperature": 0}
        whole = await server.client.post("/v1/completions", headers=headers, json=body)
        streamed = await server.client.post(
            "/v1/completions", headers=headers, json={**body, "stream": True}
        )
    finally:
        del engine.generate
    assert whole.status_code == streamed.status_code == 200
    text = "".join(e["choices"][0]["text"] for e in events(streamed.text)[:-1] if e["choices"])
    assert whole.json()["choices"][0]["text"] == text
    assert whole.json()["usage"]["completion_tokens"] == 24
    # 24 steps: the non-streamed handler woke for the first output and the rest, not per step.
    assert reads[False] <= 2 and reads[True] > 2


def test_resolve_priority() -> None:
    def ctx(tier: TenantTier) -> TenantContext:
        return TenantContext(1, "t", tier, 1, 1, 1, None)

    assert resolve_priority(ctx(TenantTier.INTERACTIVE), None) == 0
    assert resolve_priority(ctx(TenantTier.BATCH), 0) == 2
    assert resolve_priority(ctx(TenantTier.INTERACTIVE), 5) == 5


async def test_a_corrupt_adapter_fails_only_its_request(server: Platform) -> None:
    tenant, headers = await server.tenant("acme")
    adapter = await server.add_adapter(tenant["id"], "bot", source="r8")
    (Path(adapter["path"]) / "adapter_model.safetensors").write_bytes(b"\x00" * 64)
    body = {"model": "bot", "prompt": PROMPT, "max_tokens": 2}
    r = await server.client.post("/v1/completions", headers=headers, json=body)
    assert r.status_code == 500 and r.json()["error"]["code"] == "adapter_load_failed"
    r = await server.client.post("/v1/completions", headers=headers, json={**body, "stream": True})
    assert r.status_code == 500 and r.json()["error"]["code"] == "adapter_load_failed"
    r = await server.client.post(
        "/v1/completions", headers=headers, json={**body, "model": server.model_name}
    )
    assert r.status_code == 200
    assert server.state.engine.num_inflight == 0


async def test_ready_and_metrics(server: Platform) -> None:
    r = await server.client.get("/ready")
    assert r.status_code == 200 and r.json()["checks"] == {"database": "ok", "engine": "ok"}
    _, headers = await server.tenant("acme")
    await server.client.post(
        "/v1/completions",
        headers=headers,
        json={"model": server.model_name, "prompt": PROMPT, "max_tokens": 3},
    )
    r = await server.client.get("/metrics", headers=server.admin)
    assert r.status_code == 200
    assert 'loraplex_requests_total{adapter="tiny-llama",status="ok",tenant="acme"} 1.0' in r.text
    assert "loraplex_engine_kv_blocks_total" in r.text
