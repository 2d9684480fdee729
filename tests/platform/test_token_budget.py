"""Tokens-per-minute with the defaults: a request without max_tokens reserves an estimate, what
it generates beyond that is charged as it streams (the bucket may go into debt, repaid by
waiting), and a request that can never fit the tenant's limit is refused for good (400, no
retry-after), not with a 429 that no retry can satisfy."""

from __future__ import annotations

import json

import pytest

from tests.platform.platform_harness import Platform

PROMPT = "The quick brown fox"


@pytest.fixture
def settings_overrides() -> dict[str, object]:
    return {"reserved_completion_tokens": 8}


async def remaining_tokens(p: Platform, headers: dict[str, str]) -> int:
    r = await p.client.get("/v1/models", headers=headers)
    return int(r.headers["x-ratelimit-remaining-tokens"])


async def test_no_max_tokens_reserves_an_estimate_and_charges_as_it_streams(
    server: Platform,
) -> None:
    _, headers = await server.tenant("acme", tokens_per_minute=600)  # refills 10 tokens / s
    body = {
        "model": server.model_name,
        "prompt": PROMPT,
        "max_tokens": None,  # what the context leaves, capped at 64 here
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    num_chunks = 0
    remaining_mid_stream = None
    async with server.client.stream("POST", "/v1/completions", headers=headers, json=body) as r:
        assert r.status_code == 200
        # Only the estimate is held at admission.
        num_prompt = len(await server.state.engine.encode_text(PROMPT))
        assert int(r.headers["x-ratelimit-remaining-tokens"]) == 600 - num_prompt - 8
        async for line in r.aiter_lines():
            if line.startswith("data: {"):
                num_chunks += 1
                if num_chunks == 30:
                    remaining_mid_stream = await remaining_tokens(server, headers)
                chunk = json.loads(line.removeprefix("data: "))
    usage = chunk["usage"]
    assert usage["completion_tokens"] == 64 and usage["prompt_tokens"] == num_prompt
    # Tokens beyond the estimate were taken while it streamed, not only at the end.
    assert remaining_mid_stream is not None
    assert remaining_mid_stream < 600 - num_prompt - 8 - 20
    remaining = await remaining_tokens(server, headers)
    assert 600 - num_prompt - 64 <= remaining <= 600 - num_prompt - 64 + 20  # + refill


async def test_tokens_beyond_the_limit_are_debt_repaid_by_waiting(server: Platform) -> None:
    _, headers = await server.tenant("acme", tokens_per_minute=60)
    body = {"model": server.model_name, "prompt": PROMPT, "max_tokens": None, "ignore_eos": True}
    r = await server.client.post("/v1/completions", headers=headers, json=body)
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["total_tokens"] > 60  # it fit the estimate, then used more
    r = await server.client.post("/v1/completions", headers=headers, json=body)
    assert r.status_code == 429 and r.json()["error"]["type"] == "tokens"
    # Below zero: the wait covers the debt as well as this request's estimate.
    assert 15 < int(r.headers["retry-after"]) <= 60


@pytest.mark.parametrize(
    ("path", "extra", "param"),
    [
        ("/v1/completions", {"prompt": PROMPT, "max_tokens": 50}, "max_tokens"),
        ("/v1/completions", {"prompt": "fox " * 60, "max_tokens": None}, "prompt"),
        (
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": "Hi"}], "max_completion_tokens": 50},
            "max_completion_tokens",
        ),
    ],
)
async def test_a_request_that_can_never_fit_is_refused_for_good(
    server: Platform, path: str, extra: dict[str, object], param: str
) -> None:
    _, headers = await server.tenant("acme", tokens_per_minute=40)
    r = await server.client.post(path, headers=headers, json={"model": server.model_name, **extra})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert (error["code"], error["param"]) == ("request_too_large", param)
    assert "40 tokens per minute" in error["message"]
    assert "retry-after" not in r.headers and "retry-after-ms" not in r.headers
    assert r.headers["x-ratelimit-limit-tokens"] == "40"


@pytest.mark.parametrize(
    "settings_overrides", [{"max_model_len": 2048, "max_completion_tokens": 4096}]
)
async def test_the_readme_chat_fits_a_tenant_of_2000_tokens_per_minute(server: Platform) -> None:
    """No max_tokens: the budget is what the context leaves (~2,000 tokens here), far more
    than the tenant's minute; only the default estimate (256) is held."""
    _, headers = await server.tenant("acme", tokens_per_minute=2000)
    body = {"model": server.model_name, "messages": [{"role": "user", "content": "Hi!"}]}
    r = await server.client.post("/v1/chat/completions", headers=headers, json=body)
    assert r.status_code == 200, r.text
