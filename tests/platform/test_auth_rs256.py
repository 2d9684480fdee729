"""JWTs on a server configured for RS256: HS/RS algorithm confusion is refused."""

from __future__ import annotations

from pathlib import Path

import jwt
import pytest

from tests.platform.auth_helpers import assert_error, bearer, claims, forge, rsa_pem
from tests.platform.platform_harness import Platform


@pytest.fixture
def rsa_keys(tmp_path: Path) -> tuple[Path, Path]:
    private, public = rsa_pem()
    (tmp_path / "jwt.pem").write_bytes(private)
    (tmp_path / "jwt.pub").write_bytes(public)
    return tmp_path / "jwt.pem", tmp_path / "jwt.pub"


@pytest.fixture
def settings_overrides(rsa_keys: tuple[Path, Path]) -> dict[str, object]:
    return {
        "jwt_algorithm": "RS256",
        "jwt_private_key_file": rsa_keys[0],
        "jwt_public_key_file": rsa_keys[1],
    }


async def test_rs256_server_rejects_hs_rs_confusion(
    server: Platform, rsa_keys: tuple[Path, Path]
) -> None:
    c = server.client
    assert server.settings.jwt_algorithm == "RS256"
    assert (await c.get("/admin/v1/tenants", headers=server.admin)).status_code == 200
    public_pem = rsa_keys[1].read_bytes()
    # The classic confusion attack: HS256 "signed" with the public key as the HMAC secret.
    forged = forge({"alg": "HS256", "typ": "JWT"}, claims(), public_pem)
    assert_error(await c.get("/admin/v1/tenants", headers=bearer(forged)), 401)
    other_private, _ = rsa_pem()
    assert_error(
        await c.get(
            "/admin/v1/tenants", headers=bearer(jwt.encode(claims(), other_private, "RS256"))
        ),
        401,
    )
    # Tenant tokens are RS256 too.
    _, headers = await server.tenant("acme")
    token = (await c.post("/v1/auth/token", headers=headers)).json()["access_token"]
    assert jwt.get_unverified_header(token)["alg"] == "RS256"
    assert (await c.get("/v1/models", headers=bearer(token))).status_code == 200
