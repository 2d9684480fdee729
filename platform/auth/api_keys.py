"""API key format and keyed hashing.

A key is `lpx-` + 43 url-safe characters (256 random bits). The database stores only
HMAC-SHA256(server secret, key): a leaked table cannot be replayed, and offline guessing needs
the server secret too. The first 12 characters (`lpx-` + 8) are the lookup prefix shown to users.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets

KEY_PREFIX = "lpx-"
PREFIX_LEN = len(KEY_PREFIX) + 8
_KEY_RE = re.compile(r"lpx-[A-Za-z0-9_-]{43}")


def generate_api_key() -> str:
    return KEY_PREFIX + secrets.token_urlsafe(32)


def looks_like_api_key(credential: str) -> bool:
    return credential.startswith(KEY_PREFIX)


def api_key_prefix(key: str) -> str | None:
    """The lookup prefix of a well-formed key, else None (malformed keys never reach the DB)."""
    return key[:PREFIX_LEN] if _KEY_RE.fullmatch(key) else None


def hash_api_key(key: str, secret: bytes) -> str:
    return hmac.new(secret, key.encode(), hashlib.sha256).hexdigest()


def api_key_matches(key: str, stored_hash: str, secret: bytes) -> bool:
    # Constant-time: a byte-by-byte compare would leak the hash prefix through timing.
    return hmac.compare_digest(hash_api_key(key, secret), stored_hash)
