"""Authentication and authorisation: every auth bad input from REFERENCE.md."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from typing import Any

import jwt
import pytest
from fastapi.routing import APIRoute
from sqlalchemy import select, text

from loraplex.platform.api.deps import get_admin, get_current_tenant
from loraplex.platform.api.routes import (
    admin_adapters,
    admin_system,
    admin_tenants,
    auth,
    openai,
    ops,
    usage,
)
from loraplex.platform.db import ApiKey
from tests.platform.auth_helpers import assert_error, bearer, claims, forge, rsa_pem
from tests.platform.platform_harness import Platform


@pytest.fixture(params=["sqlite", "postgres"])
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


async def test_keys_and_missing_or_malformed_credentials(server: Platform) -> None:
    tenant, headers = await server.tenant("acme")
    key = headers["Authorization"].removeprefix("Bearer ")
    c = server.client
    assert (await c.get("/v1/models", headers=headers)).status_code == 200
    assert (await c.get("/v1/models", headers={"x-api-key": key})).status_code == 200

    assert_error(await c.get("/v1/models"), 401, "invalid_api_key")
    for value in (f"Basic {key}", "Bearer", "Bearer ", f"Bearer {key} extra", key):
        assert_error(await c.get("/v1/models", headers={"Authorization": value}), 401)
    # One character off, in the secret part and in the lookup prefix.
    for i in (len(key) - 1, 6):
        flipped = key[:i] + ("A" if key[i] != "A" else "B") + key[i + 1 :]
        assert_error(await c.get("/v1/models", headers=bearer(flipped)), 401, "invalid_api_key")
    assert_error(await c.get("/v1/models", headers=bearer(key[:-1])), 401)
    assert_error(await c.get("/v1/models", headers=bearer("lpx-" + "a" * 200)), 401)


async def test_two_credentials_at_once_are_refused(server: Platform) -> None:
    _, headers = await server.tenant("acme")
    key = headers["Authorization"].removeprefix("Bearer ")
    r = await server.client.get("/v1/models", headers={**headers, "x-api-key": key})
    assert_error(r, 400)
    r = await server.client.get(
        "/v1/models",
        headers=[("Authorization", f"Bearer {key}"), ("Authorization", f"Bearer {key}")],
    )
    assert_error(r, 400)


async def test_keys_are_stored_hashed_and_track_last_use(server: Platform) -> None:
    tenant, headers = await server.tenant("acme")
    key = headers["Authorization"].removeprefix("Bearer ")
    assert (await server.client.get("/v1/models", headers=headers)).status_code == 200
    with server.state.db.session() as session:
        row = session.scalars(select(ApiKey).where(ApiKey.tenant_id == tenant["id"])).one()
        assert row.last_used_at is not None
        assert key.startswith(row.prefix) and len(row.prefix) == 12
        assert row.key_hash != key and key[12:] not in row.key_hash
        dump = " ".join(str(v) for r in session.execute(text("SELECT * FROM api_keys")) for v in r)
        assert key not in dump and key[12:] not in dump


async def test_revoked_and_expired_keys(server: Platform) -> None:
    tenant, headers = await server.tenant("acme")
    c = server.client
    token = (await c.post("/v1/auth/token", headers=headers)).json()["access_token"]
    r = await c.get(f"/admin/v1/tenants/{tenant['id']}/api-keys", headers=server.admin)
    key_id = r.json()["data"][0]["id"]
    r = await c.delete(f"/admin/v1/api-keys/{key_id}", headers=server.admin)
    assert r.status_code == 200 and r.json()["revoked_at"]
    assert_error(await c.get("/v1/models", headers=headers), 401, "invalid_api_key")
    # A token exchanged from the key dies with it.
    assert_error(await c.get("/v1/models", headers=bearer(token)), 401)

    key2 = await server.create_key(tenant["id"])
    assert (await c.get("/v1/models", headers=bearer(key2))).status_code == 200
    with server.state.db.session() as session:
        row = session.scalars(select(ApiKey).where(ApiKey.revoked_at.is_(None))).one()
        row.expires_at = datetime.now(UTC) - timedelta(seconds=1)
        session.commit()
    assert_error(await c.get("/v1/models", headers=bearer(key2)), 401)
    # Creating an already-expired key is refused.
    past = (datetime.now(UTC) - timedelta(days=1)).isoformat()
    r = await c.post(
        f"/admin/v1/tenants/{tenant['id']}/api-keys",
        json={"expires_at": past},
        headers=server.admin,
    )
    assert_error(r, 400)


async def test_suspended_tenant_is_forbidden(server: Platform) -> None:
    tenant, headers = await server.tenant("acme")
    c = server.client
    token = (await c.post("/v1/auth/token", headers=headers)).json()["access_token"]
    r = await c.patch(
        f"/admin/v1/tenants/{tenant['id']}", json={"status": "suspended"}, headers=server.admin
    )
    assert r.status_code == 200
    for h in (headers, bearer(token)):
        assert_error(await c.get("/v1/models", headers=h), 403)
        r = await c.post(
            "/v1/completions",
            headers=h,
            json={"model": server.model_name, "prompt": "hi", "max_tokens": 2},
        )
        assert_error(r, 403)
    await c.patch(
        f"/admin/v1/tenants/{tenant['id']}", json={"status": "active"}, headers=server.admin
    )
    assert (await c.get("/v1/models", headers=headers)).status_code == 200


async def test_tenant_tokens(server: Platform) -> None:
    tenant, headers = await server.tenant("acme")
    c = server.client
    r = await c.post("/v1/auth/token", headers=headers)
    assert r.status_code == 200 and r.json()["token_type"] == "bearer"
    assert r.headers["x-ratelimit-limit-requests"]
    token = r.json()["access_token"]
    assert 0 < r.json()["expires_in"] <= 3600
    assert (await c.get("/v1/models", headers=bearer(token))).status_code == 200
    # Only an API key can be exchanged.
    assert_error(await c.post("/v1/auth/token", headers=bearer(token)), 403)
    # Scopes: tenant credentials on admin routes, admin tokens on tenant routes.
    for h in (headers, bearer(token)):
        assert_error(await c.get("/admin/v1/tenants", headers=h), 403)
    assert_error(await c.get("/v1/models", headers=server.admin), 403)
    assert_error(await c.get("/admin/v1/tenants", headers=bearer("lpx-" + "x" * 43)), 401)


SECRET_CASES = {
    "wrong audience": claims(aud="someone-else"),
    "wrong issuer": claims(iss="evil"),
    "expired": claims(iat=int(time.time()) - 1000, exp=int(time.time()) - 100),
    "not yet valid": claims(nbf=int(time.time()) + 300),
    "issued in the future": claims(iat=int(time.time()) + 300, exp=int(time.time()) + 600),
    "no exp": claims(exp=None),
    "no iat": claims(iat=None),
    "no sub": claims(sub=None),
    "no aud": claims(aud=None),
    "no iss": claims(iss=None),
    "unknown scope": claims(scope="root"),
    "ttl beyond the maximum": claims(exp=int(time.time()) + 30 * 24 * 3600),
    "tenant scope without tenant": claims(scope="tenant", sub="tenant:1"),
    "tenant that does not exist": claims(scope="tenant", sub="tenant:999", tid=999),
}


async def test_bad_tokens_with_the_right_secret(server: Platform) -> None:
    for case, bad_claims in SECRET_CASES.items():
        token = jwt.encode(bad_claims, server.settings.hs256_secret(), algorithm="HS256")
        route = "/v1/models" if "tenant" in case else "/admin/v1/tenants"
        r = await server.client.get(route, headers=bearer(token))
        assert r.status_code == 401, (case, r.text)
        assert_error(r, 401)
    # The same claims, fixed, pass: each case is about its one bad claim.
    good = jwt.encode(claims(), server.settings.hs256_secret(), algorithm="HS256")
    assert (await server.client.get("/admin/v1/tenants", headers=bearer(good))).status_code == 200


async def test_forged_tokens_on_an_hs256_server(server: Platform) -> None:
    c = server.client
    payload = claims()
    for alg in ("none", "None", "NONE"):
        forged = forge({"alg": alg, "typ": "JWT"}, payload, None)
        assert_error(await c.get("/admin/v1/tenants", headers=bearer(forged)), 401)
    wrong_secret = jwt.encode(payload, "not-the-secret-" + "x" * 32, algorithm="HS256")
    assert_error(await c.get("/admin/v1/tenants", headers=bearer(wrong_secret)), 401)
    private, _ = rsa_pem()
    rs = jwt.encode(payload, private, algorithm="RS256")
    assert_error(await c.get("/admin/v1/tenants", headers=bearer(rs)), 401)
    hs512 = jwt.encode(payload, server.settings.hs256_secret(), algorithm="HS512")
    assert_error(await c.get("/admin/v1/tenants", headers=bearer(hs512)), 401)
    assert_error(await c.get("/admin/v1/tenants", headers=bearer("a.b.c")), 401)
    assert_error(await c.get("/admin/v1/tenants", headers=bearer("x" * 9000)), 401)


ROUTERS = (openai, auth, usage, admin_tenants, admin_adapters, admin_system)


def test_every_route_declares_its_auth() -> None:
    """Deny by default: a route without a tenant or admin dependency fails this test."""

    def depends_on(route: APIRoute, target: Any) -> bool:
        stack = list(route.dependant.dependencies)
        while stack:
            dep = stack.pop()
            if dep.call is target:
                return True
            stack.extend(dep.dependencies)
        return False

    checked = 0
    for module in ROUTERS:
        for route in module.router.routes:
            assert isinstance(route, APIRoute)
            router_level = any(d.dependency is get_admin for d in module.router.dependencies)
            ok = (
                depends_on(route, get_current_tenant)
                or depends_on(route, get_admin)
                or router_level
            )
            assert ok, f"{route.path} has no auth dependency"
            checked += 1
    assert checked >= 20
    public = {r.path for r in ops.router.routes}  # type: ignore[attr-defined]
    assert public == {"/health", "/ready", "/metrics"}


async def test_unauthenticated_requests_are_denied_everywhere(server: Platform) -> None:
    for module in ROUTERS:
        for route in module.router.routes:
            assert isinstance(route, APIRoute)
            path = (
                route.path.replace("{tenant_id}", "1")
                .replace("{key_id}", "1")
                .replace("{adapter_id}", "1")
            )
            for method in route.methods:
                r = await server.client.request(method, path, json={})
                assert r.status_code == 401, (method, path, r.text)
    assert (await server.client.get("/metrics")).status_code == 401
    assert (await server.client.get("/metrics", headers=server.admin)).status_code == 200
    assert (await server.client.get("/health")).status_code == 200
