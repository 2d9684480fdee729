"""The admin API: tenants, API keys, adapters, grants, usage, engine state."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.platform.platform_harness import Platform


@pytest.fixture(params=["sqlite", "postgres"])
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


async def test_tenant_crud(server: Platform) -> None:
    c, admin = server.client, server.admin
    r = await c.post(
        "/admin/v1/tenants",
        headers=admin,
        json={
            "name": "acme",
            "priority": "interactive",
            "requests_per_minute": 10,
            "tokens_per_minute": 1000,
            "max_concurrent_requests": 2,
        },
    )
    assert r.status_code == 201, r.text
    tenant = r.json()
    assert tenant["priority"] == "interactive" and tenant["status"] == "active"
    assert tenant["requests_per_minute"] == 10 and tenant["max_concurrent_requests"] == 2
    defaults = await server.create_tenant("defaults")
    assert defaults["requests_per_minute"] == server.settings.default_requests_per_minute

    assert (
        await c.post("/admin/v1/tenants", headers=admin, json={"name": "acme"})
    ).status_code == 409
    for bad in (
        {"name": "bad name"},
        {"name": ""},
        {"name": "x" * 65},
        {"name": "a/b"},
        {"name": "ok", "priority": "urgent"},
        {"name": "ok", "requests_per_minute": 0},
        {"name": "ok", "requests_per_minute": "5"},
        {"name": "ok", "surprise": 1},
    ):
        r = await c.post("/admin/v1/tenants", headers=admin, json=bad)
        assert r.status_code == 400, (bad, r.text)
        assert r.json()["error"]["type"] == "invalid_request_error"

    r = await c.get("/admin/v1/tenants", headers=admin)
    assert r.json()["count"] == 2 and [t["name"] for t in r.json()["data"]] == ["acme", "defaults"]
    r = await c.get("/admin/v1/tenants?skip=1&limit=1", headers=admin)
    assert [t["name"] for t in r.json()["data"]] == ["defaults"]
    r = await c.patch(
        f"/admin/v1/tenants/{tenant['id']}",
        headers=admin,
        json={"priority": "batch", "tokens_per_minute": 5},
    )
    assert r.status_code == 200 and r.json()["priority"] == "batch"
    assert r.json()["tokens_per_minute"] == 5 and r.json()["requests_per_minute"] == 10
    r = await c.patch(f"/admin/v1/tenants/{tenant['id']}", headers=admin, json={"name": "defaults"})
    assert r.status_code == 409
    assert (await c.get("/admin/v1/tenants/999", headers=admin)).status_code == 404
    assert (await c.get("/admin/v1/tenants/abc", headers=admin)).status_code == 400
    assert (await c.delete(f"/admin/v1/tenants/{tenant['id']}", headers=admin)).status_code == 204
    assert (await c.get(f"/admin/v1/tenants/{tenant['id']}", headers=admin)).status_code == 404


async def test_api_keys(server: Platform) -> None:
    c, admin = server.client, server.admin
    tenant = await server.create_tenant("acme")
    r = await c.post(
        f"/admin/v1/tenants/{tenant['id']}/api-keys", headers=admin, json={"name": "ci"}
    )
    assert r.status_code == 201
    created = r.json()
    assert created["key"].startswith("lpx-") and len(created["key"]) == 47
    assert created["key"].startswith(created["prefix"])
    r = await c.get(f"/admin/v1/tenants/{tenant['id']}/api-keys", headers=admin)
    listed = r.json()["data"]
    assert [k["name"] for k in listed] == ["ci"]
    assert "key" not in listed[0] and "key_hash" not in listed[0]
    assert (
        await c.post("/admin/v1/tenants/999/api-keys", headers=admin, json={})
    ).status_code == 404
    assert (await c.delete("/admin/v1/api-keys/999", headers=admin)).status_code == 404
    r = await c.delete(f"/admin/v1/api-keys/{created['id']}", headers=admin)
    assert r.status_code == 200 and r.json()["revoked_at"]
    # Revoking twice keeps the first revocation time.
    again = await c.delete(f"/admin/v1/api-keys/{created['id']}", headers=admin)
    assert again.json()["revoked_at"] == r.json()["revoked_at"]


async def test_adapters_and_grants(server: Platform) -> None:
    c, admin = server.client, server.admin
    a = await server.create_tenant("alpha")
    b = await server.create_tenant("bravo")
    first = await server.add_adapter(a["id"], "bot")
    twin = await server.add_adapter(b["id"], "bot")  # same content, other tenant: shared files
    assert first["path"] == twin["path"] and first["sha256"] == twin["sha256"]
    r = await c.get(f"/admin/v1/adapters?tenant_id={a['id']}", headers=admin)
    [adapter] = r.json()["data"]
    assert adapter["rank"] == 4 and adapter["target_modules"] == ["q_proj", "v_proj"]
    assert adapter["size_bytes"] > 0 and adapter["status"] == "ready"
    assert "path" not in adapter
    assert (await c.get("/admin/v1/adapters", headers=admin)).json()["count"] == 2
    r = await c.get(f"/admin/v1/adapters/{first['id']}", headers=admin)
    assert r.json()["sha256"] == first["sha256"]

    grant = {"tenant_id": b["id"]}
    url = f"/admin/v1/adapters/{first['id']}/grants"
    assert (await c.post(url, headers=admin, json=grant)).status_code == 201
    assert (await c.post(url, headers=admin, json=grant)).status_code == 409
    assert (await c.post(url, headers=admin, json={"tenant_id": a["id"]})).status_code == 400
    assert (await c.post(url, headers=admin, json={"tenant_id": 999})).status_code == 404
    assert (await c.delete(f"{url}/{b['id']}", headers=admin)).status_code == 204
    assert (await c.delete(f"{url}/{b['id']}", headers=admin)).status_code == 404

    # Files go with the last registration that uses them.
    assert (await c.delete(f"/admin/v1/adapters/{first['id']}", headers=admin)).status_code == 204
    assert Path(twin["path"]).is_dir()
    assert (await c.delete(f"/admin/v1/adapters/{twin['id']}", headers=admin)).status_code == 204
    assert not Path(twin["path"]).exists()
    assert (await c.get(f"/admin/v1/adapters/{first['id']}", headers=admin)).status_code == 404


async def test_usage_report_and_engine_state(server: Platform) -> None:
    c, admin = server.client, server.admin
    a, a_headers = await server.tenant("alpha")
    b, b_headers = await server.tenant("bravo")
    await server.add_adapter(a["id"], "bot")
    body = {"prompt": "Hello", "max_tokens": 3, "ignore_eos": True}
    for headers, model in (
        (a_headers, "bot"),
        (a_headers, "bot"),
        (a_headers, server.model_name),
        (b_headers, server.model_name),
    ):
        r = await c.post("/v1/completions", headers=headers, json={**body, "model": model})
        assert r.status_code == 200, r.text
    await server.flush_usage()

    rows = (await c.get("/admin/v1/usage?group_by=day", headers=admin)).json()["data"]
    assert {(r["tenant_id"], r["requests"]) for r in rows} == {(a["id"], 3), (b["id"], 1)}
    assert all(r["completion_tokens"] == 3 * r["requests"] for r in rows)
    rows = (
        await c.get(f"/admin/v1/usage?group_by=adapter&tenant_id={a['id']}", headers=admin)
    ).json()["data"]
    assert sorted((r["model"], r["requests"]) for r in rows) == [("bot", 2), (server.model_name, 1)]
    assert all(r["date"] is None for r in rows)
    rows = (
        await c.get(
            "/admin/v1/usage?group_by=day,adapter&start=2000-01-01&end=2000-01-02", headers=admin
        )
    ).json()["data"]
    assert rows == []
    r = await c.get("/admin/v1/usage?group_by=week", headers=admin)
    assert r.status_code == 400 and r.json()["error"]["param"] == "group_by"

    own = (await c.get("/v1/usage", headers=a_headers)).json()["data"]
    assert sum(r["requests"] for r in own) == 3
    assert all(r["total_tokens"] == r["prompt_tokens"] + r["completion_tokens"] for r in own)

    engine = (await c.get("/admin/v1/engine", headers=admin)).json()
    assert engine["model"] == server.model_name and engine["ratelimit_backend"]
    assert engine["num_inflight_requests"] == 0 and engine["draining"] is False
    assert engine["num_preemptions"] == 0 and 0 <= engine["kv_usage"] <= 1
    stats = engine["stats"]
    assert stats["num_running"] == 0 and stats["num_waiting"] == 0
    assert stats["num_generated_tokens"] > 0 and stats["kv_blocks_total"] > 0
    # Tenant alpha's adapter was loaded for its requests and is still resident.
    assert stats["lora"]["num_registered"] == 1
    assert {r["lora_name"] for r in stats["lora"]["resident"]} == {"bot"}
