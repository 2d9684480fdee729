"""Helpers shared by the auth tests: credentials, claims, forged and RSA-signed tokens."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import time
from typing import Any

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa


def bearer(credential: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {credential}"}


def assert_error(r: Any, status: int, code: str | None = None) -> dict[str, Any]:
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert r.headers["x-request-id"]
    if code is not None:
        assert error["code"] == code
    return dict(error)


def claims(**overrides: Any) -> dict[str, Any]:
    now = int(time.time())
    base = {
        "iss": "loraplex",
        "aud": "loraplex",
        "sub": "admin:tests",
        "scope": "admin",
        "iat": now,
        "exp": now + 300,
    }
    base.update(overrides)
    return {k: v for k, v in base.items() if v is not None}


def b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def forge(header: dict[str, Any], payload: dict[str, Any], key: bytes | None) -> str:
    signing_input = f"{b64(json.dumps(header).encode())}.{b64(json.dumps(payload).encode())}"
    signature = (
        b"" if key is None else hmac.new(key, signing_input.encode(), hashlib.sha256).digest()
    )
    return f"{signing_input}.{b64(signature)}"


def rsa_pem() -> tuple[bytes, bytes]:
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    private = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    public = key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    return private, public
