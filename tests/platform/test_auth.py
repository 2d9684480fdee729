"""Authentication and authorisation: every bad credential we know of (alg=none, HS/RS confusion,
wrong aud/iss, expired and future tokens, near-miss, revoked and doubled keys, suspended tenants),
and deny-by-default on every route of the app."""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import jwt
import pytest
from fastapi import FastAPI
from fastapi.dependencies.models import Dependant
from fastapi.routing import APIRoute

try:
    from fastapi.routing import iter_route_contexts
except ImportError:  # FastAPI before lazily included routers: app.routes is already flat

    def iter_route_contexts(routes: Any) -> Any:  # type: ignore[misc]
        return iter(routes)


from sqlalchemy import select, text

from loraplex.platform.api.deps import get_admin, get_current_tenant
from loraplex.platform.app import create_app
from loraplex.platform.db import ApiKey
from loraplex.platform.settings import Settings
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


def secret_cases() -> dict[str, dict[str, object]]:
    """Built when the test runs, not at import: a suite slower than the 300 s margins below
    would otherwise turn the "future" tokens into present ones."""
    now = int(time.time())
    return {
        "wrong audience": claims(aud="someone-else"),
        "wrong issuer": claims(iss="evil"),
        "expired": claims(iat=now - 1000, exp=now - 100),
        "not yet valid": claims(nbf=now + 300),
        "issued in the future": claims(iat=now + 300, exp=now + 600),
        "no exp": claims(exp=None),
        "no iat": claims(iat=None),
        "no sub": claims(sub=None),
        "no aud": claims(aud=None),
        "no iss": claims(iss=None),
        "unknown scope": claims(scope="root"),
        "ttl beyond the maximum": claims(exp=now + 30 * 24 * 3600),
        "tenant scope without tenant": claims(scope="tenant", sub="tenant:1"),
        "tenant that does not exist": claims(scope="tenant", sub="tenant:999", tid=999),
    }


async def test_bad_tokens_with_the_right_secret(server: Platform) -> None:
    for case, bad_claims in secret_cases().items():
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


# Routes anyone may call: liveness and readiness, and the API docs pages with their assets.
PUBLIC_PATHS = {"/health", "/ready"}
DOCS_PATHS = {"/openapi.json", "/docs", "/docs/oauth2-redirect", "/redoc", "/docs/assets"}
# Needs an admin token unless LORAPLEX_PUBLIC_METRICS is set (checked in the route itself).
METRICS_PATH = "/metrics"
# The admin console's static files (an app shell: every call it makes needs an admin token).
CONSOLE_PATH = "/admin"


@dataclass(frozen=True)
class ServedRoute:
    path: str
    methods: frozenset[str]
    dependant: Dependant | None  # None: not an APIRoute (FastAPI's docs pages)


def served_routes(app: FastAPI) -> list[ServedRoute]:
    """Every route the app answers, included routers flattened."""
    routes = []
    for context in iter_route_contexts(app.routes):
        original = getattr(context, "original_route", context)
        dependant = context.dependant if isinstance(original, APIRoute) else None
        routes.append(ServedRoute(context.path, frozenset(context.methods or ()), dependant))
    return routes


def depends_on(dependant: Dependant, target: Callable[..., Any]) -> bool:
    stack = list(dependant.dependencies)
    while stack:
        dep = stack.pop()
        if dep.call is target:
            return True
        stack.extend(dep.dependencies)
    return False


def test_every_route_declares_its_auth(tmp_path: Path) -> None:
    """Deny by default: a route of the real app without a tenant or admin dependency fails
    this test, unless it is on the short public list."""
    routes = served_routes(create_app(Settings(data_dir=tmp_path)))
    authenticated = {
        r.path
        for r in routes
        if r.dependant is not None
        and (depends_on(r.dependant, get_current_tenant) or depends_on(r.dependant, get_admin))
    }
    unauthenticated = {r.path for r in routes} - authenticated
    assert unauthenticated - DOCS_PATHS == PUBLIC_PATHS | {METRICS_PATH, CONSOLE_PATH}
    # FastAPI's docs pages are its own routes, never one of ours that forgot its auth.
    assert all(r.dependant is None for r in routes if r.path in DOCS_PATHS)
    assert len(authenticated) >= 15


async def test_unauthenticated_requests_are_denied_everywhere(server: Platform) -> None:
    c = server.client
    checked = 0
    for route in served_routes(server.app):
        if route.path in PUBLIC_PATHS | DOCS_PATHS | {CONSOLE_PATH}:
            continue
        path = re.sub(r"\{[^}]+\}", "1", route.path)
        for method in route.methods - {"HEAD"}:
            r = await c.request(method, path, json={})
            assert r.status_code == 401, (method, path, r.text)
            checked += 1
    assert checked >= 20
    assert (await c.get(METRICS_PATH, headers=server.admin)).status_code == 200
    for path in PUBLIC_PATHS:
        assert (await c.get(path)).status_code == 200, path


@pytest.mark.parametrize("settings_overrides", [{"public_metrics": True}])
async def test_metrics_can_be_made_public(server: Platform) -> None:
    assert (await server.client.get(METRICS_PATH)).status_code == 200
