"""Chained cryptographic hashes of full KV blocks (prefix-cache keys).

    h(block i) = sha256(h(block i-1) || extra || token ids of block i)

`extra` carries everything that changes the KV besides the tokens: the adapter's content hash
and the tenant's cache salt, so no block is ever shared across adapters or tenants. SHA-256
(not Python's hash) because block hashes must not collide on crafted inputs (CVE-2025-25183).
"""

from __future__ import annotations

import hashlib
import struct

ROOT_HASH = b"loraplex-kv-v1"


def hash_block_extra(lora_content_hash: str | None, cache_salt: str | None) -> bytes:
    """The per-request key mixed into every block hash."""
    return f"lora={lora_content_hash or ''}\x00salt={cache_salt or ''}".encode()


def hash_block_tokens(parent_hash: bytes, extra: bytes, token_ids: list[int]) -> bytes:
    digest = hashlib.sha256()
    digest.update(parent_hash)
    digest.update(struct.pack("<I", len(extra)))
    digest.update(extra)
    digest.update(struct.pack(f"<{len(token_ids)}q", *token_ids))
    return digest.digest()


def hash_request_blocks(
    token_ids: list[int], block_size: int, extra: bytes, known: list[bytes] | None = None
) -> list[bytes]:
    """Hashes of every full block of `token_ids`, extending `known` (already computed ones)."""
    hashes = list(known or [])
    parent = hashes[-1] if hashes else ROOT_HASH
    for start in range(len(hashes) * block_size, len(token_ids) - block_size + 1, block_size):
        parent = hash_block_tokens(parent, extra, token_ids[start : start + block_size])
        hashes.append(parent)
    return hashes
