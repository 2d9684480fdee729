"""The audit log: every admin mutation over the API leaves one event (actor, action, target,
result, status, request id, detail), failures included; no secret in any event; GET
/admin/v1/audit pages and filters them, newest first."""

from __future__ import annotations

import datetime as dt
import importlib
import json
import pkgutil
from typing import Any

import pytest
from fastapi.routing import APIRoute

from loraplex.platform.api import routes as api_routes
from loraplex.platform.api.audit import Audited
from loraplex.platform.db import ApiKey, AuditAction
from tests.platform.platform_harness import Platform
from tests.platform.upload_helpers import adapter_files


@pytest.fixture(params=["sqlite", "postgres"])
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


async def events(p: Platform, **query: Any) -> list[dict[str, Any]]:
    r = await p.client.get("/admin/v1/audit", headers=p.admin, params=query)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["count"] >= len(body["data"])
    return list(body["data"])


async def last_event(p: Platform) -> dict[str, Any]:
    return (await events(p, limit=1))[0]


def brief(event: dict[str, Any]) -> tuple[Any, ...]:
    return (
        event["action"],
        event["target_type"],
        event["target_id"],
        event["result"],
        event["status_code"],
        event["error_code"],
    )


async def test_every_admin_mutation_leaves_an_event(server: Platform) -> None:
    c, admin = server.client, server.admin

    async def check(response: Any, expected: tuple[Any, ...]) -> dict[str, Any]:
        """The newest event is `response`'s own, as `expected` says."""
        event = await last_event(server)
        assert brief(event) == expected, (event, response.text)
        assert event["actor"] == "admin:tests"
        assert event["request_id"] == response.headers["x-request-id"]
        return event

    r = await c.post("/admin/v1/tenants", headers=admin, json={"name": "acme", "rpm": 1})
    event = await check(
        r, ("tenant.create", "tenant", None, "failed", 400, "invalid_request_error")
    )
    assert "rpm" in event["detail"]["error"]
    r = await c.post(
        "/admin/v1/tenants", headers=admin, json={"name": "acme", "tokens_per_minute": 9}
    )
    acme = r.json()["id"]
    event = await check(r, ("tenant.create", "tenant", acme, "ok", 201, None))
    assert event["detail"] == {"name": "acme", "tokens_per_minute": 9}
    r = await c.post("/admin/v1/tenants", headers=admin, json={"name": "acme"})
    await check(r, ("tenant.create", "tenant", None, "failed", 409, "conflict"))
    other = (await c.post("/admin/v1/tenants", headers=admin, json={"name": "bravo"})).json()["id"]

    r = await c.patch(f"/admin/v1/tenants/{acme}", headers=admin, json={"status": "suspended"})
    event = await check(r, ("tenant.update", "tenant", acme, "ok", 200, None))
    assert event["detail"] == {"status": "suspended"}
    # A rename onto a taken name: the session rolled back, the failed event stays.
    r = await c.patch(f"/admin/v1/tenants/{acme}", headers=admin, json={"name": "bravo"})
    await check(r, ("tenant.update", "tenant", acme, "failed", 409, "conflict"))
    r = await c.patch("/admin/v1/tenants/abc", headers=admin, json={})
    await check(r, ("tenant.update", "tenant", None, "failed", 400, "invalid_request_error"))

    r = await c.post(f"/admin/v1/tenants/{acme}/api-keys", headers=admin, json={"name": "ci"})
    key = r.json()
    event = await check(r, ("key.create", "api_key", key["id"], "ok", 201, None))
    assert event["detail"] == {"tenant_id": acme, "name": "ci"}
    r = await c.post("/admin/v1/tenants/999/api-keys", headers=admin, json={})
    await check(r, ("key.create", "api_key", None, "failed", 404, "not_found"))
    r = await c.delete(f"/admin/v1/api-keys/{key['id']}", headers=admin)
    event = await check(r, ("key.revoke", "api_key", key["id"], "ok", 200, None))
    assert event["detail"] == {"tenant_id": acme, "name": "ci"}
    r = await c.delete("/admin/v1/api-keys/999", headers=admin)
    await check(r, ("key.revoke", "api_key", 999, "failed", 404, "not_found"))

    files = [("files", f) for f in adapter_files(server.adapter_sources["r4"])]
    r = await c.post(
        "/admin/v1/adapters", headers=admin, data={"tenant_id": acme, "name": "bot"}, files=files
    )
    adapter = r.json()
    event = await check(r, ("adapter.upload", "adapter", adapter["id"], "ok", 201, None))
    assert event["detail"] == {
        "tenant_id": acme,
        "name": "bot",
        "version": 1,
        "sha256": adapter["sha256"],
        "status": "ready",
        "status_reason": None,
    }
    r = await c.post(
        "/admin/v1/adapters", headers=admin, data={"tenant_id": 999, "name": "bot"}, files=files
    )
    event = await check(r, ("adapter.upload", "adapter", None, "failed", 404, "not_found"))
    assert event["detail"]["name"] == "bot"

    grants = f"/admin/v1/adapters/{adapter['id']}/grants"
    r = await c.post(grants, headers=admin, json={"tenant_id": other})
    event = await check(r, ("grant.create", "adapter", adapter["id"], "ok", 201, None))
    assert event["detail"] == {"tenant_id": other}
    r = await c.post(grants, headers=admin, json={"tenant_id": other})
    await check(r, ("grant.create", "adapter", adapter["id"], "failed", 409, "conflict"))
    r = await c.delete(f"{grants}/{other}", headers=admin)
    event = await check(r, ("grant.delete", "adapter", adapter["id"], "ok", 204, None))
    assert event["detail"] == {"tenant_id": other}
    r = await c.delete(f"{grants}/{other}", headers=admin)
    await check(r, ("grant.delete", "adapter", adapter["id"], "failed", 404, "not_found"))

    r = await c.delete(f"/admin/v1/adapters/{adapter['id']}", headers=admin)
    event = await check(r, ("adapter.delete", "adapter", adapter["id"], "ok", 204, None))
    assert event["detail"] == {"tenant_id": acme, "name": "bot", "version": 1}
    twin = await server.add_adapter(acme, "bot")
    r = await c.delete(f"/admin/v1/tenants/{acme}", headers=admin)
    event = await check(r, ("tenant.delete", "tenant", acme, "ok", 204, None))
    assert event["detail"] == {"name": "acme", "adapter_ids": [twin["id"]]}
    r = await c.delete(f"/admin/v1/tenants/{acme}", headers=admin)
    await check(r, ("tenant.delete", "tenant", acme, "failed", 404, "not_found"))

    # Refused credentials are not admin actions: nothing recorded; reads record nothing.
    before = await events(server, limit=1000)
    assert (await c.delete(f"/admin/v1/tenants/{other}")).status_code == 401
    tenant_key = await server.create_key(other)  # recorded: a key.create
    r = await c.delete(
        f"/admin/v1/tenants/{other}", headers={"Authorization": f"Bearer {tenant_key}"}
    )
    assert r.status_code == 403
    await c.get("/admin/v1/tenants", headers=admin)
    after = await events(server, limit=1000)
    assert [e["action"] for e in after[: len(after) - len(before)]] == ["key.create"]


async def test_no_secret_is_ever_recorded(server: Platform) -> None:
    tenant = await server.create_tenant("acme")
    token = server.admin_token()
    r = await server.client.post(
        f"/admin/v1/tenants/{tenant['id']}/api-keys",
        headers={"Authorization": f"Bearer {token}"},
        json={"name": "prod"},
    )
    key = r.json()["key"]
    await server.client.delete(
        f"/admin/v1/api-keys/{r.json()['id']}", headers={"Authorization": f"Bearer {token}"}
    )
    with server.state.db.session() as session:
        row = session.get(ApiKey, r.json()["id"])
        assert row is not None
        key_hash = row.key_hash
    recorded = json.dumps(await events(server))
    for secret in (key, key[4:], key_hash, token, token.split(".")[2]):
        assert secret not in recorded


async def test_paging_and_filters(server: Platform) -> None:
    start = dt.datetime.now(dt.UTC)
    for name in ("t1", "t2", "t3"):
        await server.create_tenant(name)
    await server.client.post("/admin/v1/tenants", headers=server.admin, json={"name": "t1"})
    t1 = (await events(server, action="tenant.create", result="ok"))[-1]
    other = {"Authorization": f"Bearer {server.state.tokens.issue_admin_token('ops', 60)}"}
    await server.client.delete(f"/admin/v1/tenants/{t1['target_id']}", headers=other)

    everything = await events(server)
    assert [e["id"] for e in everything] == sorted((e["id"] for e in everything), reverse=True)
    assert [(e["action"], e["result"]) for e in everything] == [
        ("tenant.delete", "ok"),
        ("tenant.create", "failed"),
        ("tenant.create", "ok"),
        ("tenant.create", "ok"),
        ("tenant.create", "ok"),
    ]

    async def page(**query: Any) -> tuple[list[int], int]:
        r = await server.client.get("/admin/v1/audit", headers=server.admin, params=query)
        assert r.status_code == 200, r.text
        return [e["id"] for e in r.json()["data"]], r.json()["count"]

    ids = [e["id"] for e in everything]
    assert await page(skip=1, limit=2) == (ids[1:3], 5)
    assert await page(skip=5) == ([], 5)
    assert await page(actor="admin:ops") == (ids[:1], 1)
    assert await page(actor="admin:op") == ([], 0)  # exact, not a prefix
    assert await page(action="tenant.create") == (ids[1:], 4)
    assert await page(result="failed") == (ids[1:2], 1)
    assert await page(target_type="tenant", target_id=t1["target_id"]) == ([ids[0], ids[4]], 2)
    assert await page(target_type="adapter") == ([], 0)
    assert (await page(since=start.isoformat()))[1] == 5
    later = dt.datetime.now(dt.UTC) + dt.timedelta(seconds=1)
    assert await page(since=later.isoformat()) == ([], 0)
    assert (await page(until=later.strftime("%Y-%m-%dT%H:%M:%S")))[1] == 5  # no offset: UTC
    assert (await page(until=later.strftime("%Y-%m-%dt%H:%M:%S.%fz")))[1] == 5
    assert (await page(since=start.strftime("%Y-%m-%d")))[1] == 5  # a day: its midnight, UTC
    assert (await page(since=(later + dt.timedelta(days=1)).strftime("%Y-%m-%d")))[1] == 0
    assert await page(until=start.isoformat()) == ([], 0)
    # Offsets are honoured: the same moments written in other time zones.
    assert (await page(since=start.astimezone(dt.timezone(dt.timedelta(hours=-5))).isoformat()))[
        1
    ] == 5
    assert await page(since=later.astimezone(dt.timezone(dt.timedelta(hours=5))).isoformat()) == (
        [],
        0,
    )

    for bad in (
        {"limit": 0},
        {"limit": 1001},
        {"skip": -1},
        {"skip": 2**63},
        {"target_id": 2**31},
        {"action": "tenant.explode"},
        {"result": "maybe"},
        {"target_type": "grant"},
        {"actor": "x" * 129},
        {"since": "0"},
        {"since": "yesterday"},
        {"since": "20261201"},  # ISO 8601, but digits a fuzzer may send for anything
        {"since": "2024-01-01T12:99:00Z"},
        {"until": "9999-12-31T23:59:59-23:59"},  # past the calendar in UTC
    ):
        r = await server.client.get("/admin/v1/audit", headers=server.admin, params=bad)
        assert r.status_code == 400, (bad, r.text)
        assert r.json()["error"]["param"] == next(iter(bad)), (bad, r.text)
    assert (await server.client.get("/admin/v1/audit")).status_code == 401


def test_every_admin_mutation_route_is_audited() -> None:
    """A new admin route that changes something cannot forget its audit event, and every
    action is used by some route."""
    routes = [
        route
        for module in pkgutil.iter_modules(api_routes.__path__)
        for route in importlib.import_module(f"{api_routes.__name__}.{module.name}").router.routes
        if isinstance(route, APIRoute) and route.path.startswith("/admin/")
    ]
    assert len(routes) >= 15
    actions = set()
    for route in routes:
        audits = [d.call for d in route.dependant.dependencies if isinstance(d.call, Audited)]
        if route.methods <= {"GET", "HEAD"}:
            assert not audits, route.path
        else:
            assert len(audits) == 1, (route.methods, route.path)
            actions.add(audits[0].action)
    assert actions == set(AuditAction)
