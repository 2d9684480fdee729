"""GET /admin/v1/tenants: server-side paging and name search (the console's tenants page)."""

from __future__ import annotations

import pytest

from tests.platform.platform_harness import Platform


@pytest.fixture(params=["sqlite", "postgres"])
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


async def test_paging_and_search(server: Platform) -> None:
    for name in ("acme", "Acme-Labs", "globex", "initech", "a_b", "ab"):
        await server.create_tenant(name)

    async def names(**query: object) -> tuple[list[str], int]:
        r = await server.client.get("/admin/v1/tenants", headers=server.admin, params=query)
        assert r.status_code == 200, r.text
        return [t["name"] for t in r.json()["data"]], r.json()["count"]

    assert await names(q="acme") == (["acme", "Acme-Labs"], 2)  # case-insensitive substring
    assert await names(q="ACME", limit=1) == (["acme"], 2)  # count: every match
    assert await names(q="ACME", skip=1, limit=1) == (["Acme-Labs"], 2)
    assert await names(q="_") == (["a_b"], 1)  # LIKE wildcards are literal
    assert await names(q="%") == ([], 0)
    assert await names(q="nobody") == ([], 0)
    assert (await names(skip=4, limit=10))[0] == ["a_b", "ab"]
    r = await server.client.get("/admin/v1/tenants", headers=server.admin, params={"q": "x" * 65})
    assert r.status_code == 400 and r.json()["error"]["param"] == "q"
