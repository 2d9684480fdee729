"""Admission on the inference routes: the three rate limits (429 with headers), refunds of
unused tokens, engine backpressure (429 engine_overloaded), and draining (503). Token budgets
(estimates, debt, requests that can never fit) are in test_token_budget.py."""

from __future__ import annotations

import asyncio

import pytest

from tests.platform.platform_harness import Platform

PROMPT = "The quick brown fox"


async def test_rate_limits_answer_429(server: Platform) -> None:
    c = server.client
    body = {"model": server.model_name, "prompt": PROMPT, "max_tokens": 2}
    _, headers = await server.tenant("rpm", requests_per_minute=2)
    for _ in range(2):
        assert (await c.post("/v1/completions", headers=headers, json=body)).status_code == 200
    r = await c.post("/v1/completions", headers=headers, json=body)
    assert r.status_code == 429
    error = r.json()["error"]
    assert error["code"] == "rate_limit_exceeded" and error["type"] == "requests"
    assert int(r.headers["retry-after"]) >= 1
    assert r.headers["x-ratelimit-remaining-requests"] == "0"

    _, headers = await server.tenant("tpm", tokens_per_minute=40)
    assert (
        await c.post("/v1/completions", headers=headers, json={**body, "max_tokens": 30})
    ).is_success
    r = await c.post("/v1/completions", headers=headers, json={**body, "max_tokens": 30})
    assert r.status_code == 429 and r.json()["error"]["type"] == "tokens"
    assert int(r.headers["retry-after"]) >= 1

    _, headers = await server.tenant("conc", max_concurrent_requests=1)
    long = {**body, "max_tokens": 60, "ignore_eos": True}
    results = await asyncio.gather(
        *(c.post("/v1/completions", headers=headers, json=long) for _ in range(3))
    )
    statuses = sorted(r.status_code for r in results)
    assert statuses[0] == 200 and 429 in statuses
    assert all(r.json()["error"]["type"] == "concurrency" for r in results if r.status_code == 429)


async def test_unused_tokens_are_refunded(server: Platform) -> None:
    tenant, headers = await server.tenant("acme", tokens_per_minute=10_000)
    r = await server.client.post(
        "/v1/completions",
        headers=headers,
        json={
            "model": server.model_name,
            "prompt": PROMPT,
            "max_tokens": 60,
            "temperature": 0,
            "stop": [" ", "e", "a", "o"],
        },
    )
    used = r.json()["usage"]["total_tokens"]
    assert r.json()["usage"]["completion_tokens"] < 60  # stopped early: something to refund
    remaining = int(r.headers["x-ratelimit-remaining-tokens"])
    assert remaining == 10_000 - (r.json()["usage"]["prompt_tokens"] + 60)  # reserved...
    r = await server.client.get("/v1/models", headers=headers)
    assert int(r.headers["x-ratelimit-remaining-tokens"]) >= 10_000 - used  # ...then refunded


@pytest.mark.parametrize("settings_overrides", [{"max_waiting_requests": 1, "max_num_seqs": 1}])
async def test_backpressure_answers_engine_overloaded(server: Platform) -> None:
    _, headers = await server.tenant("acme")
    body = {"model": server.model_name, "prompt": PROMPT, "max_tokens": 60, "ignore_eos": True}
    engine = server.state.engine
    tasks = [
        asyncio.create_task(server.client.post("/v1/completions", headers=headers, json=body))
        for _ in range(3)
    ]
    for _ in range(500):  # until the engine reports a queue
        if engine.get_stats().num_waiting >= 1:
            break
        await asyncio.sleep(0.002)
    r = await server.client.post("/v1/completions", headers=headers, json=body)
    assert r.status_code == 429, r.text
    assert r.json()["error"]["code"] == "engine_overloaded"
    assert int(r.headers["retry-after"]) >= 1
    assert all(r.status_code in (200, 429) for r in await asyncio.gather(*tasks))


async def test_draining_refuses_new_work(server: Platform) -> None:
    _, headers = await server.tenant("acme")
    server.state.engine.start_draining()
    r = await server.client.post(
        "/v1/completions", headers=headers, json={"model": server.model_name, "prompt": "x"}
    )
    assert r.status_code == 503 and r.json()["error"]["code"] == "service_unavailable"
    ready = await server.client.get("/ready")
    assert ready.status_code == 503 and ready.json()["checks"]["engine"] == "draining"
    assert (await server.client.get("/health")).status_code == 200
