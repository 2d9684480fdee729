"""An adapter upload's multipart body, streamed into a staging directory under byte limits.

The form holds `tenant_id`, `name` and the files: either `adapter_config.json` and
`adapter_model.safetensors`, or one `.zip` / `.tar.gz` of an adapter directory. Client file
names only choose which of these fixed names a part is stored under; they never become paths
(path traversal). Nothing is buffered in memory beyond one chunk: file parts go straight to
disk, and the body stops being read the moment it passes a limit (413), so a huge or endless
upload costs neither memory nor disk beyond `max_bytes`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

import anyio
from python_multipart.exceptions import MultipartParseError
from python_multipart.multipart import MultipartParser, parse_options_header

from loraplex.engine.lora.adapter import PICKLE_SUFFIXES
from loraplex.engine.lora.adapter_config import MAX_CONFIG_BYTES
from loraplex.platform.errors import InvalidRequestError, PayloadTooLargeError
from loraplex.platform.storage import ADAPTER_FILES

CONFIG_FILE, WEIGHTS_FILE = ADAPTER_FILES
ZIP_FILE, TAR_FILE = "upload.zip", "upload.tar.gz"
# Multipart framing (boundaries, part headers, the small fields) on top of the files.
FRAMING_BYTES = 64 * 1024


@dataclass(frozen=True)
class UploadLimits:
    max_bytes: int  # the files together (LORAPLEX_MAX_ADAPTER_BYTES)
    max_config_bytes: int = MAX_CONFIG_BYTES
    max_field_bytes: int = 1024
    max_parts: int = 8


@dataclass
class ReceivedUpload:
    fields: dict[str, str] = field(default_factory=dict)
    files: list[str] = field(default_factory=list)  # staged names, in arrival order

    @property
    def archive(self) -> str | None:
        return self.files[0] if self.files in ([ZIP_FILE], [TAR_FILE]) else None


FieldsCallback = Callable[[dict[str, str]], None]


def staged_name(filename: str) -> str:
    """The fixed name a client file is stored under, or a 400 saying what is accepted."""
    if not filename or any(c in filename for c in "/\\\0") or filename.startswith(".."):
        raise InvalidRequestError(
            f"file name {filename[:100]!r} contains a path; send the files themselves",
            param="files",
        )
    lower = filename.lower()
    if lower.endswith(PICKLE_SUFFIXES):
        raise InvalidRequestError(
            f"{filename[:100]!r}: pickle files are refused (loading one can run code); send "
            "adapter_model.safetensors",
            param="files",
        )
    if filename in ADAPTER_FILES:
        return filename
    if lower.endswith(".zip"):
        return ZIP_FILE
    if lower.endswith((".tar.gz", ".tgz")):
        return TAR_FILE
    raise InvalidRequestError(
        f"unexpected file {filename[:100]!r}: send adapter_config.json and "
        "adapter_model.safetensors, or one .zip or .tar.gz of the adapter's directory",
        param="files",
    )


class _FormWriter:
    """python-multipart callbacks: fields into memory (small), files into `staging`."""

    def __init__(self, staging: Path, limits: UploadLimits, on_fields: FieldsCallback) -> None:
        self.staging = staging
        self.limits = limits
        self.on_fields = on_fields
        self.received = ReceivedUpload()
        self.finished = False
        self._num_parts = 0
        self._fields_reported = False
        self._header_field = b""
        self._headers: dict[bytes, bytes] = {}
        self._field: str | None = None
        self._value = bytearray()
        self._file: BinaryIO | None = None
        self._file_name = ""
        self._file_bytes = 0
        self._total_file_bytes = 0

    def callbacks(self) -> dict[str, Callable[..., None]]:
        return {
            "on_part_begin": self._part_begin,
            "on_header_field": lambda d, s, e: self._add_header_field(d[s:e]),
            "on_header_value": lambda d, s, e: self._add_header_value(d[s:e]),
            "on_header_end": self._header_end,
            "on_headers_finished": self._headers_finished,
            "on_part_data": lambda d, s, e: self._part_data(d[s:e]),
            "on_part_end": self._part_end,
            "on_end": self._end,
        }

    def _part_begin(self) -> None:
        self._num_parts += 1
        if self._num_parts > self.limits.max_parts:
            raise InvalidRequestError(f"the form has more than {self.limits.max_parts} parts")
        self._headers, self._header_field = {}, b""

    def _add_header_field(self, data: bytes) -> None:
        self._header_field += data

    def _add_header_value(self, data: bytes) -> None:
        key = self._header_field.lower()
        self._headers[key] = self._headers.get(key, b"") + data

    def _header_end(self) -> None:
        self._header_field = b""

    def _headers_finished(self) -> None:
        _, options = parse_options_header(self._headers.get(b"content-disposition"))
        name = options.get(b"name", b"").decode("utf-8", "replace")
        filename = options.get(b"filename")
        if filename is None:
            if name in self.received.fields:
                raise InvalidRequestError(f"the form field {name!r} is repeated", param=name)
            self._field, self._value = name, bytearray()
            return
        stored = staged_name(filename.decode("utf-8", "replace"))
        if stored in self.received.files:
            raise InvalidRequestError(f"{stored} is sent twice", param="files")
        self.received.files.append(stored)
        self._file_name, self._file_bytes = stored, 0
        self._file = (self.staging / stored).open("xb")

    def _part_data(self, data: bytes) -> None:
        if self._file is None:
            self._value += data
            if len(self._value) > self.limits.max_field_bytes:
                raise InvalidRequestError(
                    f"the form field {self._field!r} is over {self.limits.max_field_bytes} bytes",
                    param=self._field,
                )
            return
        self._file_bytes += len(data)
        self._total_file_bytes += len(data)
        if self._file_name == CONFIG_FILE and self._file_bytes > self.limits.max_config_bytes:
            raise InvalidRequestError(
                f"adapter_config.json is over {self.limits.max_config_bytes} bytes",
                param="files",
            )
        if self._total_file_bytes > self.limits.max_bytes:
            raise _too_large(self.limits.max_bytes)
        self._file.write(data)

    def _part_end(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
            return
        assert self._field is not None
        try:
            self.received.fields[self._field] = self._value.decode("utf-8")
        except UnicodeDecodeError as e:
            raise InvalidRequestError(f"{self._field} is not UTF-8", param=self._field) from e
        self._field = None
        if not self._fields_reported and {"tenant_id", "name"} <= self.received.fields.keys():
            self._fields_reported = True
            self.on_fields(dict(self.received.fields))

    def _end(self) -> None:
        self.finished = True

    def close(self) -> None:
        if self._file is not None:
            self._file.close()


def _too_large(max_bytes: int) -> PayloadTooLargeError:
    return PayloadTooLargeError(
        f"the upload is over LORAPLEX_MAX_ADAPTER_BYTES ({max_bytes} bytes)", param="files"
    )


async def receive_upload(
    content_type: str,
    stream: AsyncIterator[bytes],
    staging: Path,
    limits: UploadLimits,
    on_fields: FieldsCallback,
) -> ReceivedUpload:
    """Parse the multipart body from `stream` into `staging`. `on_fields` runs (in a worker
    thread) as soon as both `tenant_id` and `name` have arrived, before the files: it may
    refuse the upload early. Raises InvalidRequestError (400) or PayloadTooLargeError (413)."""
    media_type, options = parse_options_header(content_type)
    boundary = options.get(b"boundary")
    if media_type != b"multipart/form-data" or not boundary:
        raise InvalidRequestError("send the adapter as multipart/form-data")
    writer = _FormWriter(staging, limits, on_fields)
    parser = MultipartParser(boundary, writer.callbacks())  # type: ignore[arg-type]
    max_body = limits.max_bytes + FRAMING_BYTES
    received = 0
    try:
        async for chunk in stream:
            received += len(chunk)
            if received > max_body:
                raise _too_large(limits.max_bytes)
            if chunk:
                await anyio.to_thread.run_sync(parser.write, chunk)
        parser.finalize()
    except MultipartParseError as e:
        raise InvalidRequestError(f"the multipart body is malformed: {e}") from e
    finally:
        writer.close()
    if not writer.finished:
        raise InvalidRequestError("the upload was cut short (the body ended mid-form)")
    return _check_form(writer.received)


def _check_form(received: ReceivedUpload) -> ReceivedUpload:
    for name in ("tenant_id", "name"):
        if name not in received.fields:
            raise InvalidRequestError(f"the form needs a {name!r} field", param=name)
    files = set(received.files)
    if received.archive is None and files != set(ADAPTER_FILES):
        if not files:
            raise InvalidRequestError("the form has no files", param="files")
        if files & {ZIP_FILE, TAR_FILE}:
            raise InvalidRequestError(
                "send either one archive or the two adapter files, not both", param="files"
            )
        missing = " and ".join(sorted(set(ADAPTER_FILES) - files))
        raise InvalidRequestError(f"the upload has no {missing}", param="files")
    return received
