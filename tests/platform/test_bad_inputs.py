"""Every bad API input we know of: a clear 4xx in OpenAI's error shape, and the server
(and its engine) still serving afterwards."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.platform.platform_harness import MAX_MODEL_LEN, Platform

MODEL = "tiny-llama"
P = {"model": MODEL, "prompt": "Hello", "max_tokens": 2}
M = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}
LONG_PROMPT = "hello world " * MAX_MODEL_LEN

# name -> (path, JSON body, status, expected param or code)
CASES: dict[str, tuple[str, Any, int, str | None]] = {
    "huge n": ("/v1/completions", {**P, "n": 1000}, 400, "n"),
    "n zero": ("/v1/completions", {**P, "n": 0}, 400, "n"),
    "max_tokens zero": ("/v1/completions", {**P, "max_tokens": 0}, 400, "max_tokens"),
    "max_tokens negative": ("/v1/completions", {**P, "max_tokens": -1}, 400, "max_tokens"),
    "max_tokens fractional": ("/v1/completions", {**P, "max_tokens": 1.5}, 400, "max_tokens"),
    "max_tokens string": ("/v1/completions", {**P, "max_tokens": "5"}, 400, "max_tokens"),
    "max_tokens huge": ("/v1/completions", {**P, "max_tokens": 10**12}, 400, "max_tokens"),
    "max_tokens beyond the context": (
        "/v1/completions",
        {**P, "prompt": "hello " * 100, "max_tokens": 60},
        400,
        "context_length_exceeded",
    ),
    "chat max_completion_tokens zero": (
        "/v1/chat/completions",
        {**M, "max_completion_tokens": 0},
        400,
        "max_completion_tokens",
    ),
    "logprobs negative": ("/v1/completions", {**P, "logprobs": -1}, 400, "logprobs"),
    "logprobs huge": ("/v1/completions", {**P, "logprobs": 10**6}, 400, "logprobs"),
    "chat top_logprobs huge": (
        "/v1/chat/completions",
        {**M, "logprobs": True, "top_logprobs": 500},
        400,
        "top_logprobs",
    ),
    "chat top_logprobs without logprobs": (
        "/v1/chat/completions",
        {**M, "top_logprobs": 2},
        400,
        None,
    ),
    "empty prompt": ("/v1/completions", {**P, "prompt": ""}, 400, "prompt"),
    "empty token prompt": ("/v1/completions", {**P, "prompt": []}, 400, "prompt"),
    "empty prompt list": ("/v1/completions", {**P, "prompt": [""]}, 400, "prompt"),
    "batched prompts": ("/v1/completions", {**P, "prompt": ["a", "b"]}, 400, "prompt"),
    "token id out of vocabulary": ("/v1/completions", {**P, "prompt": [1, 10**9]}, 400, "prompt"),
    "negative token id": ("/v1/completions", {**P, "prompt": [1, -5]}, 400, "prompt"),
    "no prompt": ("/v1/completions", {"model": MODEL}, 400, "prompt"),
    "empty messages": ("/v1/chat/completions", {**M, "messages": []}, 400, "messages"),
    "prompt longer than the context": (
        "/v1/completions",
        {**P, "prompt": LONG_PROMPT},
        400,
        "context_length_exceeded",
    ),
    "chat longer than the context": (
        "/v1/chat/completions",
        {**M, "messages": [{"role": "user", "content": LONG_PROMPT}]},
        400,
        "context_length_exceeded",
    ),
    "combining-character flood": (
        "/v1/completions",
        {**P, "prompt": "e" + "\u0301" * 100_000},
        400,
        "context_length_exceeded",
    ),
    "lone surrogate in prompt": ("/v1/completions", {**P, "prompt": "a\ud800b"}, 400, "prompt"),
    "lone surrogate in chat": (
        "/v1/chat/completions",
        {**M, "messages": [{"role": "user", "content": "\udfff"}]},
        400,
        "messages[0].content",
    ),
    "lone surrogate in stop": ("/v1/completions", {**P, "stop": ["\ud800"]}, 400, "stop[0]"),
    "lone surrogate in model": ("/v1/completions", {**P, "model": "\ud800"}, 400, "model"),
    "NUL in model": ("/v1/completions", {**P, "model": "bot\u0000"}, 404, "model_not_found"),
    "negative temperature": ("/v1/completions", {**P, "temperature": -1}, 400, "temperature"),
    "huge temperature": ("/v1/completions", {**P, "temperature": 1e30}, 400, "temperature"),
    "top_p zero": ("/v1/completions", {**P, "top_p": 0}, 400, "top_p"),
    "top_p above one": ("/v1/completions", {**P, "top_p": 1.5}, 400, "top_p"),
    "top_k zero": ("/v1/completions", {**P, "top_k": 0}, 400, "top_k"),
    "min_p above one": ("/v1/completions", {**P, "min_p": 2}, 400, "min_p"),
    "repetition_penalty zero": (
        "/v1/completions",
        {**P, "repetition_penalty": 0},
        400,
        "repetition_penalty",
    ),
    "presence_penalty out of range": (
        "/v1/completions",
        {**P, "presence_penalty": 5},
        400,
        "presence_penalty",
    ),
    "negative seed": ("/v1/completions", {**P, "seed": -1}, 400, "seed"),
    "hundreds of stop strings": ("/v1/completions", {**P, "stop": ["x"] * 500}, 400, "stop"),
    "a huge stop string": ("/v1/completions", {**P, "stop": "x" * 10_000}, 400, "stop"),
    "thousands of stop items": ("/v1/completions", {**P, "stop": ["x"] * 5000}, 400, "stop"),
    "stop_token_ids flood": (
        "/v1/completions",
        {**P, "stop_token_ids": list(range(1000))},
        400,
        "stop_token_ids",
    ),
    "negative priority": ("/v1/completions", {**P, "priority": -1}, 400, "priority"),
    "priority as a word": ("/v1/completions", {**P, "priority": "high"}, 400, "priority"),
    "stream not a bool": ("/v1/completions", {**P, "stream": "yes"}, 400, "stream"),
    "stream_options without stream": (
        "/v1/completions",
        {**P, "stream_options": {"include_usage": True}},
        400,
        None,
    ),
    "echo": ("/v1/completions", {**P, "echo": True}, 400, None),
    "suffix": ("/v1/completions", {**P, "suffix": "x"}, 400, None),
    "best_of": ("/v1/completions", {**P, "best_of": 5}, 400, None),
    "logit_bias": ("/v1/completions", {**P, "logit_bias": {"1": 5}}, 400, None),
    "tools": ("/v1/chat/completions", {**M, "tools": [{"type": "function"}]}, 400, None),
    "json response_format": (
        "/v1/chat/completions",
        {**M, "response_format": {"type": "json_object"}},
        400,
        None,
    ),
    "unknown role": (
        "/v1/chat/completions",
        {**M, "messages": [{"role": "root", "content": "x"}]},
        400,
        None,
    ),
    "image content": (
        "/v1/chat/completions",
        {
            **M,
            "messages": [
                {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}
            ],
        },
        400,
        None,
    ),
    "too many messages": (
        "/v1/chat/completions",
        {**M, "messages": [{"role": "user", "content": "x"}] * 1100},
        400,
        "messages",
    ),
    "unknown model": ("/v1/completions", {**P, "model": "nope"}, 404, "model_not_found"),
    "model too long": ("/v1/completions", {**P, "model": "m" * 10_000}, 400, "model"),
    "body is a list": ("/v1/completions", [P], 400, None),
    "body is a number": ("/v1/completions", 5, 400, None),
    "nested prompt": ("/v1/completions", {**P, "prompt": [[[["deep"]]]]}, 400, "prompt"),
}

RAW_CASES: dict[str, tuple[bytes, dict[str, str], int]] = {
    "malformed JSON": (b'{"model": ', {}, 400),
    "NaN temperature": (b'{"model": "tiny-llama", "prompt": "x", "temperature": NaN}', {}, 400),
    "Infinity top_p": (b'{"model": "tiny-llama", "prompt": "x", "top_p": Infinity}', {}, 400),
    "JSON nesting bomb": (b"[" * 200_000 + b"]" * 200_000, {}, 400),
    "nesting bomb in a field": (
        b'{"model": "tiny-llama", "prompt": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
        {},
        400,
    ),
    "10 MB body": (b'{"prompt": "' + b"a" * 10_000_000 + b'"}', {}, 413),
    "invalid UTF-8": (b'{"model": "tiny-llama", "prompt": "\xff\xfe"}', {}, 400),
    "not JSON content type": (json.dumps(P).encode(), {"content-type": "text/plain"}, 400),
}


def check_error(r: Any, status: int, expected: str | None) -> None:
    assert r.status_code == status, r.text[:500]
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["message"] and error["type"]
    assert r.headers.get("x-request-id")
    if expected is not None:
        assert expected in (error["param"], error["code"]), error


async def assert_still_serving(server: Platform, headers: dict[str, str]) -> None:
    r = await server.client.post("/v1/completions", headers=headers, json={**P, "max_tokens": 3})
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["completion_tokens"] == 3
    stats = server.state.engine.get_stats()
    assert server.state.engine.num_inflight == 0 and stats.num_waiting == 0


async def test_bad_json_bodies(server: Platform) -> None:
    _, headers = await server.tenant("acme")
    failures = []
    for name, (path, body, status, expected) in CASES.items():
        # ensure_ascii: lone surrogates travel as \ud800 escapes, as a client would send them.
        r = await server.client.post(
            path,
            content=json.dumps(body, ensure_ascii=True),
            headers={**headers, "content-type": "application/json"},
        )
        try:
            check_error(r, status, expected)
            # An authenticated tenant's errors carry its rate-limit headers too.
            assert r.headers.get("x-ratelimit-limit-requests"), "no rate-limit headers"
        except (AssertionError, ValueError) as e:
            failures.append(f"{name}: {e}")
    assert not failures, "\n".join(failures)
    await assert_still_serving(server, headers)


async def test_bad_raw_bodies_and_headers(server: Platform) -> None:
    _, headers = await server.tenant("acme")
    failures = []
    for name, (content, extra, status) in RAW_CASES.items():
        h = {**headers, "content-type": "application/json", **extra}
        r = await server.client.post("/v1/completions", headers=h, content=content)
        try:
            check_error(r, status, None)
        except (AssertionError, ValueError) as e:
            failures.append(f"{name}: {e}")
    assert not failures, "\n".join(failures)
    r = await server.client.post(
        "/v1/completions", json=P, headers={**headers, "x-padding": "a" * 20_000}
    )
    check_error(r, 431, None)
    r = await server.client.get("/v1/completions", headers=headers)
    check_error(r, 405, None)
    r = await server.client.get("/v1/nothing-here", headers=headers)
    check_error(r, 404, None)
    await assert_still_serving(server, headers)


async def test_accepted_oddities(server: Platform) -> None:
    """Inputs that look odd but are valid text or ignorable: served, not refused."""
    _, headers = await server.tenant("acme")
    for body in (
        {**P, "prompt": "a\u0000b"},
        {**P, "unknown_field": {"x": [1, 2]}},
        {**P, "user": "someone"},
        {**P, "prompt": ["Hello"]},
        {**P, "prompt": [1, 2]},
        {
            **M,
            "messages": [
                {"role": "developer", "content": "be brief"},
                {"role": "user", "content": [{"type": "text", "text": "hi"}]},
            ],
        },
    ):
        path = "/v1/chat/completions" if "messages" in body else "/v1/completions"
        r = await server.client.post(path, headers=headers, json=body)
        assert r.status_code == 200, (body, r.text)
    await assert_still_serving(server, headers)


@pytest.mark.parametrize("settings_overrides", [{"max_prompt_tokens": 8}])
async def test_max_prompt_tokens_setting(server: Platform) -> None:
    _, headers = await server.tenant("acme")
    r = await server.client.post(
        "/v1/completions",
        headers=headers,
        json={**P, "prompt": "one two three four five six seven eight nine ten eleven"},
    )
    check_error(r, 400, "context_length_exceeded")
    await assert_still_serving(server, headers)


async def test_redirects_stay_on_this_server(server: Platform) -> None:
    """A trailing-slash redirect never takes its target from the Host header (open redirect,
    cache poisoning): the Location is a path on this server."""
    _, headers = await server.tenant("acme")
    r = await server.client.get("/v1/models/?x=1", headers={**headers, "host": "evil.example"})
    assert r.status_code == 307 and r.headers["location"] == "/v1/models?x=1"
