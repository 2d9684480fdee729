"""Tenant isolation: a tenant never sees nor uses another tenant's adapters, keys or usage,
and never shares prefix-cache blocks with it."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from tests.platform.platform_harness import Platform


@pytest.fixture(params=["sqlite", "postgres"])
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def completion(model: str, prompt: str = "Hello there", **fields: Any) -> dict[str, Any]:
    return {"model": model, "prompt": prompt, "max_tokens": 4, "temperature": 0, **fields}


async def test_adapters_keys_and_usage_are_private(server: Platform) -> None:
    c = server.client
    a, a_headers = await server.tenant("alpha")
    b, b_headers = await server.tenant("bravo")
    await server.add_adapter(a["id"], "a-bot")
    b_adapter = await server.add_adapter(b["id"], "secret-bot", source="r8")

    models = (await c.get("/v1/models", headers=a_headers)).json()["data"]
    ids = {m["id"] for m in models}
    assert ids == {server.model_name, "a-bot"}
    assert all(m.get("parent") == server.model_name for m in models if m["id"] == "a-bot")

    # Using B's adapter looks exactly like using a name that does not exist.
    unknown = await c.post("/v1/completions", headers=a_headers, json=completion("no-such-bot"))
    for name in ("secret-bot", "bravo/secret-bot", str(b_adapter["id"]), b_adapter["sha256"]):
        r = await c.post("/v1/completions", headers=a_headers, json=completion(name))
        assert r.status_code == 404, r.text
        error = r.json()["error"]
        assert error["code"] == "model_not_found"
        assert error["message"].replace(name, "X") == unknown.json()["error"]["message"].replace(
            "no-such-bot", "X"
        )
    chat = {"model": "secret-bot", "messages": [{"role": "user", "content": "hi"}]}
    r = await c.post("/v1/chat/completions", headers=a_headers, json=chat)
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"

    # B uses its adapter; A's usage shows only A's own requests.
    assert (
        await c.post("/v1/completions", headers=b_headers, json=completion("secret-bot"))
    ).status_code == 200
    assert (
        await c.post("/v1/completions", headers=a_headers, json=completion("a-bot"))
    ).status_code == 200
    await server.flush_usage()
    a_usage = (await c.get("/v1/usage", headers=a_headers)).json()["data"]
    assert [row["model"] for row in a_usage] == ["a-bot"]
    assert all(row["tenant_id"] == a["id"] for row in a_usage)
    b_usage = (await c.get("/v1/usage", headers=b_headers)).json()["data"]
    assert [row["model"] for row in b_usage] == ["secret-bot"]

    # Keys: tenants have no key routes; the admin ones refuse tenant credentials.
    r = await c.get(f"/admin/v1/tenants/{b['id']}/api-keys", headers=a_headers)
    assert r.status_code == 403


async def test_grants_share_an_adapter_until_revoked(server: Platform) -> None:
    c = server.client
    a, a_headers = await server.tenant("alpha")
    b, _ = await server.tenant("bravo")
    adapter = await server.add_adapter(b["id"], "shared-bot")
    r = await c.post(
        f"/admin/v1/adapters/{adapter['id']}/grants",
        json={"tenant_id": a["id"]},
        headers=server.admin,
    )
    assert r.status_code == 201, r.text
    ids = {m["id"] for m in (await c.get("/v1/models", headers=a_headers)).json()["data"]}
    assert "bravo/shared-bot" in ids and "shared-bot" not in ids
    r = await c.post("/v1/completions", headers=a_headers, json=completion("bravo/shared-bot"))
    assert r.status_code == 200, r.text
    assert (
        await c.post("/v1/completions", headers=a_headers, json=completion("shared-bot"))
    ).status_code == 404
    r = await c.delete(f"/admin/v1/adapters/{adapter['id']}/grants/{a['id']}", headers=server.admin)
    assert r.status_code == 204
    r = await c.post("/v1/completions", headers=a_headers, json=completion("bravo/shared-bot"))
    assert r.status_code == 404


async def test_prefix_cache_is_not_shared_across_tenants(server: Platform) -> None:
    c = server.client
    _, a_headers = await server.tenant("alpha")
    _, b_headers = await server.tenant("bravo")
    prompt = " ".join(["the quick brown fox jumps over the lazy dog"] * 3)

    async def cached_tokens(headers: dict[str, str]) -> int:
        engine = server.state.engine
        before = engine.get_stats()
        r = await c.post(
            "/v1/completions",
            headers=headers,
            json=completion(server.model_name, prompt, max_tokens=1),
        )
        assert r.status_code == 200, r.text
        # The engine thread publishes its stats just after the outputs: wait for this step's.
        for _ in range(100):
            after = engine.get_stats()
            if after.prefix_cache_queried_tokens > before.prefix_cache_queried_tokens:
                break
            await asyncio.sleep(0.01)
        return after.prefix_cache_hit_tokens - before.prefix_cache_hit_tokens

    await cached_tokens(a_headers)
    assert await cached_tokens(a_headers) > 0  # the cache works within a tenant...
    assert await cached_tokens(b_headers) == 0  # ...and never across tenants
