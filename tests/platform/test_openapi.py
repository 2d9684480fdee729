"""The OpenAPI schema says what the API does (security, errors in OpenAI's shape, no 422), the
docs pages load without a network, and no number a client can send becomes a 5xx."""

from __future__ import annotations

import re
from typing import Any

import pytest

from loraplex.platform.api.errors import describe
from loraplex.platform.schemas import ErrorResponse
from tests.platform.platform_harness import Platform

HUGE = 2**63  # past SQLite's INTEGER and PostgreSQL's bigint


@pytest.fixture(params=["sqlite", "postgres"])
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


async def openapi(p: Platform) -> dict[str, Any]:
    r = await p.client.get("/openapi.json")
    assert r.status_code == 200
    return dict(r.json())


@pytest.mark.parametrize("backend", ["sqlite"])
async def test_schema_declares_security_and_openai_errors(server: Platform) -> None:
    schema = await openapi(server)
    schemes = schema["components"]["securitySchemes"]
    assert schemes["TenantKey"] == {**schemes["TenantKey"], "type": "http", "scheme": "bearer"}
    assert schemes["TenantApiKey"]["name"] == "x-api-key"
    assert schemes["AdminToken"]["bearerFormat"] == "JWT"
    assert "HTTPValidationError" not in schema["components"]["schemas"]
    operations = 0
    for path, item in schema["paths"].items():
        for method, op in item.items():
            operations += 1
            security = {name for requirement in op.get("security", []) for name in requirement}
            if path.startswith("/v1/"):
                assert security == {"TenantKey", "TenantApiKey"}, (method, path)
            elif path.startswith("/admin/") or path == "/metrics":
                assert security == {"AdminToken"}, (method, path)
            else:
                assert not security, (method, path)
            responses = op["responses"]
            assert "422" not in responses, (method, path)  # validation errors are 400s
            errors = {int(s) for s in responses if s.isdigit() and int(s) >= 400}
            if security:
                assert {400, 401, 403, 503} <= errors, (method, path)
            if "{" in path:
                assert 404 in errors, (method, path)
            if "requestBody" in op:
                assert 413 in errors, (method, path)
            for status in errors - ({503} if path == "/ready" else set()):
                content = responses[str(status)]["content"]["application/json"]
                assert content["schema"] == {"$ref": "#/components/schemas/ErrorResponse"}
    assert operations >= 20
    for path in ("/v1/completions", "/v1/chat/completions"):
        responses = schema["paths"][path]["post"]["responses"]
        assert {"404", "429", "413"} <= set(responses)
        assert "retry-after" in responses["429"]["headers"]
        assert "text/event-stream" in responses["200"]["content"]
    # The body the error handler sends is the documented one.
    body = describe(OverflowError("x")).body().model_dump()
    assert ErrorResponse.model_validate(body).error.type == "invalid_request_error"


@pytest.mark.parametrize("backend", ["sqlite"])
async def test_docs_pages_load_from_local_assets(server: Platform) -> None:
    for page in ("/docs", "/redoc"):
        r = await server.client.get(page)
        assert r.status_code == 200 and "text/html" in r.headers["content-type"]
        urls = re.findall(r'(?:src|href)="([^"]+)"', r.text)
        assert urls and not [u for u in urls if "//" in u], urls  # nothing from a CDN
        assert "fonts.googleapis" not in r.text
        for url in urls:
            asset = await server.client.get(url)
            assert asset.status_code == 200, url
    for name in ("swagger_ui/LICENSE", "redoc/LICENSE"):
        assert (await server.client.get(f"/docs/assets/{name}")).status_code == 200
    assert (await server.client.get("/docs/oauth2-redirect")).status_code == 200


async def test_no_number_is_a_server_error(server: Platform) -> None:
    tenant, headers = await server.tenant("acme")
    adapter = await server.add_adapter(tenant["id"], "bot")
    admin = server.admin
    c = server.client
    requests: list[tuple[str, str, dict[str, Any] | None]] = [
        ("GET", f"/admin/v1/tenants/{HUGE}", None),
        ("PATCH", f"/admin/v1/tenants/{HUGE}", {"requests_per_minute": 5}),
        ("DELETE", f"/admin/v1/tenants/{HUGE}", None),
        ("GET", f"/admin/v1/tenants/{2**31}", None),
        ("POST", f"/admin/v1/tenants/{HUGE}/api-keys", {}),
        ("GET", f"/admin/v1/tenants/{HUGE}/api-keys", None),
        ("DELETE", f"/admin/v1/api-keys/{HUGE}", None),
        ("GET", f"/admin/v1/tenants?skip={HUGE}", None),
        ("GET", f"/admin/v1/usage?tenant_id={HUGE}", None),
        ("GET", "/admin/v1/usage?end=9999-12-31&start=0001-01-01", None),
        ("GET", f"/admin/v1/adapters?tenant_id={HUGE}", None),
        ("GET", f"/admin/v1/adapters/{HUGE}", None),
        ("DELETE", f"/admin/v1/adapters/{HUGE}", None),
        ("POST", f"/admin/v1/adapters/{adapter['id']}/grants", {"tenant_id": HUGE}),
        ("POST", f"/admin/v1/adapters/{HUGE}/grants", {"tenant_id": tenant["id"]}),
        ("DELETE", f"/admin/v1/adapters/{adapter['id']}/grants/{HUGE}", None),
        ("POST", "/admin/v1/tenants", {"name": "big", "tokens_per_minute": HUGE}),
    ]
    for method, path, body in requests:
        r = await c.request(method, path, headers=admin, json=body)
        if "9999" in path:
            assert r.status_code == 200, r.text  # the last day has no day after it
            continue
        assert r.status_code in (400, 404), (method, path, r.status_code, r.text)
        ErrorResponse.model_validate(r.json())
    tenant_requests: list[tuple[str, dict[str, Any]]] = [
        ("/v1/completions", {"prompt": [HUGE]}),
        ("/v1/completions", {"prompt": "x", "seed": HUGE}),
        ("/v1/completions", {"prompt": "x", "max_tokens": HUGE}),
        ("/v1/completions", {"prompt": "x", "stop_token_ids": [HUGE]}),
        ("/v1/completions", {"prompt": "x", "top_k": HUGE}),
        ("/v1/completions", {"prompt": "x", "min_tokens": HUGE}),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "n": HUGE}),
    ]
    for path, fields in tenant_requests:
        body = {"model": server.model_name, **fields}
        r = await c.post(path, headers=headers, json=body)
        assert r.status_code == 400, (path, fields, r.text)
    r = await c.get("/v1/usage?end=9999-12-31", headers=headers)
    assert r.status_code == 200
