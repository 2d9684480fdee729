"""Validate a safetensors file's header ourselves before any library trusts it.

Layout: `[8-byte little-endian N][N bytes of JSON header][data section]`. The header maps each
tensor name to `{"dtype", "shape", "data_offsets": [begin, end]}`, offsets relative to the data
section. The checks stop the usual upload attacks: a header length that makes a reader allocate
gigabytes, offsets that point outside the file or overlap (two tensors aliasing the same bytes),
holes that smuggle a second payload (polyglot files), duplicate names that JSON parsers resolve
differently (the stdlib keeps the last one), dtypes we never expect in an adapter, and deeply
nested JSON that blows the parser's stack.
"""

from __future__ import annotations

import json
import math
import struct
from dataclasses import dataclass
from typing import Any

from loraplex.engine.errors import InvalidAdapterError

MAX_HEADER_BYTES = 100 * 1024 * 1024  # 100 MiB
# Bytes per element of the dtypes an adapter may store (bf16/fp16/fp32 weights only).
ALLOWED_DTYPES: dict[str, int] = {"F32": 4, "F16": 2, "BF16": 2}
_METADATA_KEY = "__metadata__"
_ENTRY_KEYS = frozenset({"dtype", "shape", "data_offsets"})


@dataclass(frozen=True)
class TensorInfo:
    """One validated header entry."""

    name: str
    dtype: str  # one of ALLOWED_DTYPES
    shape: tuple[int, ...]
    begin: int  # offsets into the data section, end exclusive
    end: int


def _reject_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj: dict[str, Any] = {}
    for key, value in pairs:
        if key in obj:
            raise InvalidAdapterError(f"duplicate key {key[:200]!r} in JSON")
        obj[key] = value
    return obj


def _reject_constant(token: str) -> Any:
    raise InvalidAdapterError(f"non-finite number {token} in JSON")


def loads_strict_json(data: bytes, what: str) -> Any:
    """Parse UTF-8 JSON, rejecting duplicate keys, NaN/Infinity and nesting deep enough to
    exhaust the parser's recursion."""
    try:
        return json.loads(
            data.decode("utf-8"),
            object_pairs_hook=_reject_duplicate_keys,
            parse_constant=_reject_constant,
        )
    except InvalidAdapterError as e:
        raise InvalidAdapterError(f"{what}: {e}") from None
    except (ValueError, RecursionError) as e:  # JSONDecodeError, UnicodeDecodeError
        raise InvalidAdapterError(f"{what} is not valid JSON: {str(e)[:200]}") from None


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _parse_entry(name: str, entry: Any, data_size: int) -> TensorInfo:
    where = f"safetensors tensor {name[:200]!r}"
    if not isinstance(entry, dict) or set(entry) != _ENTRY_KEYS:
        raise InvalidAdapterError(f"{where}: entry must have exactly {sorted(_ENTRY_KEYS)}")
    dtype, shape, offsets = entry["dtype"], entry["shape"], entry["data_offsets"]
    if dtype not in ALLOWED_DTYPES:
        raise InvalidAdapterError(
            f"{where}: dtype {str(dtype)[:20]!r} is not allowed (allowed: {sorted(ALLOWED_DTYPES)})"
        )
    if not isinstance(shape, list) or not all(_is_int(d) and d >= 0 for d in shape):
        raise InvalidAdapterError(f"{where}: shape must be a list of non-negative integers")
    if not (
        isinstance(offsets, list)
        and len(offsets) == 2
        and all(_is_int(o) for o in offsets)
        and 0 <= offsets[0] <= offsets[1]
    ):
        raise InvalidAdapterError(f"{where}: data_offsets must be [begin, end] with begin <= end")
    begin, end = offsets
    if end > data_size:
        raise InvalidAdapterError(
            f"{where}: data_offsets [{begin}, {end}] lie outside the data section "
            f"({data_size} bytes); the file is truncated or corrupt"
        )
    if math.prod(shape) * ALLOWED_DTYPES[dtype] != end - begin:
        raise InvalidAdapterError(
            f"{where}: shape {shape} of {dtype} needs {math.prod(shape) * ALLOWED_DTYPES[dtype]} "
            f"bytes but data_offsets span {end - begin}"
        )
    return TensorInfo(name, dtype, tuple(shape), begin, end)


def _check_layout(tensors: list[TensorInfo], data_size: int) -> None:
    # The data section must be tiled exactly: no overlaps (aliasing), no holes (hidden payloads).
    cursor = 0
    for t in sorted(tensors, key=lambda t: (t.begin, t.end)):
        if t.begin < cursor:
            raise InvalidAdapterError(
                f"safetensors tensor {t.name[:200]!r} overlaps another tensor's bytes "
                f"(begins at {t.begin}, previous tensor ends at {cursor})"
            )
        if t.begin > cursor:
            raise InvalidAdapterError(
                f"safetensors data section has unreferenced bytes [{cursor}, {t.begin})"
            )
        cursor = t.end
    if cursor != data_size:
        raise InvalidAdapterError(
            f"safetensors data section has {data_size - cursor} trailing unreferenced bytes"
        )


def data_section_start(data: bytes | memoryview) -> int:
    """Where the data section begins in a file that `parse_safetensors_header` accepted."""
    (header_len,) = struct.unpack("<Q", data[:8])
    return 8 + int(header_len)


def parse_safetensors_header(
    data: bytes | memoryview, file_size: int | None = None
) -> dict[str, TensorInfo]:
    """Validate the safetensors file `data`; return its tensors by name. With `file_size`,
    `data` may be the file's first bytes only (the 8-byte length and the header)."""
    file_size = len(data) if file_size is None else file_size
    if file_size < 8 or len(data) < 8:
        raise InvalidAdapterError("safetensors file is truncated: shorter than its 8-byte header")
    (header_len,) = struct.unpack("<Q", data[:8])
    if header_len > MAX_HEADER_BYTES:
        raise InvalidAdapterError(
            f"safetensors header length {header_len} exceeds the {MAX_HEADER_BYTES}-byte limit"
        )
    if header_len > file_size - 8 or header_len > len(data) - 8:
        raise InvalidAdapterError(
            f"safetensors header length {header_len} exceeds the file size ({file_size} bytes); "
            "the file is truncated or corrupt"
        )
    header = loads_strict_json(bytes(data[8 : 8 + header_len]), "safetensors header")
    if not isinstance(header, dict):
        raise InvalidAdapterError("safetensors header must be a JSON object")
    metadata = header.pop(_METADATA_KEY, {})
    if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
        raise InvalidAdapterError("safetensors __metadata__ must map strings to strings")
    data_size = file_size - 8 - header_len
    tensors = [_parse_entry(name, entry, data_size) for name, entry in header.items()]
    _check_layout(tensors, data_size)
    return {t.name: t for t in tensors}
