"""RequestContextMiddleware: request ids, header and body caps, access logs, last-resort 500s.

A pure ASGI middleware (no BaseHTTPMiddleware) so that streaming responses and client
disconnects pass through untouched. Bodies are read up to `max_body_bytes` before the app sees
them: a 10 MB body is refused with 413 without being parsed, and nothing downstream has to
guard against a body that keeps coming. The routes in `streamed` (adapter uploads) are the
exception: they read their body as a stream and enforce their own, larger limit; here only a
Content-Length past that limit is refused up front.
"""

from __future__ import annotations

import contextvars
import json
import logging
import re
import secrets
import time
from collections.abc import Mapping
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

logger = logging.getLogger("loraplex.access")

request_id_var: contextvars.ContextVar[str] = contextvars.ContextVar("request_id", default="-")
_CLIENT_ID = re.compile(r"[A-Za-z0-9._:-]{1,64}")


class RequestIdLogFilter(logging.Filter):
    """Adds `request_id` to every log record (use %(request_id)s in formats)."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.request_id = request_id_var.get()
        return True


def _error_body(status: int, message: str, request_id: str) -> tuple[dict[str, Any], bytes]:
    body = json.dumps(
        {
            "error": {
                "message": message,
                "type": "invalid_request_error" if status < 500 else "server_error",
                "param": None,
                "code": None,
            }
        }
    ).encode()
    start = {
        "type": "http.response.start",
        "status": status,
        "headers": [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
            (b"x-request-id", request_id.encode()),
        ],
    }
    return start, body


class RequestContextMiddleware:
    def __init__(
        self,
        app: ASGIApp,
        *,
        max_body_bytes: int,
        max_header_bytes: int,
        streamed: Mapping[tuple[str, str], int] | None = None,
    ) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes
        self.max_header_bytes = max_header_bytes
        self.streamed = dict(streamed or {})  # (method, path) -> its own body limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request_id = self._request_id(scope)
        scope.setdefault("state", {})["request_id"] = request_id
        token = request_id_var.set(request_id)
        started_at = time.monotonic()
        status_holder = [0]
        try:
            await self._handle(scope, receive, send, request_id, status_holder)
        finally:
            logger.info(
                "%s %s %d %.1fms",
                scope.get("method"),
                scope.get("path"),
                status_holder[0],
                (time.monotonic() - started_at) * 1000,
            )
            request_id_var.reset(token)

    async def _handle(
        self, scope: Scope, receive: Receive, send: Send, request_id: str, status_holder: list[int]
    ) -> None:
        async def reject(status: int, message: str) -> None:
            status_holder[0] = status
            start, body = _error_body(status, message, request_id)
            await send(start)
            await send({"type": "http.response.body", "body": body})

        header_bytes = sum(len(k) + len(v) for k, v in scope["headers"])
        if header_bytes > self.max_header_bytes:
            await reject(431, f"request headers exceed {self.max_header_bytes} bytes")
            return
        stream_limit = self.streamed.get((scope["method"], scope["path"]))
        if stream_limit is not None:
            error = _check_length(scope, stream_limit)
            if error is not None:
                await reject(*error)
                return
            app_receive = receive
        else:
            body, error = await self._read_body(scope, receive)
            if error is not None:
                await reject(*error)
                return
            app_receive = _replay(body, receive)

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                status_holder[0] = message["status"]
                message = {
                    **message,
                    "headers": [
                        *message.get("headers", ()),
                        (b"x-request-id", request_id.encode()),
                    ],
                }
            await send(message)

        try:
            await self.app(scope, app_receive, send_with_id)
        except Exception:
            logger.exception("unhandled error")
            if status_holder[0]:
                raise  # the response started; the server closes the connection
            await reject(500, "internal server error")

    def _request_id(self, scope: Scope) -> str:
        for key, value in scope["headers"]:
            if key == b"x-request-id":
                text = str(value.decode("latin-1"))
                if _CLIENT_ID.fullmatch(text):
                    return text
                break
        return secrets.token_hex(16)

    async def _read_body(
        self, scope: Scope, receive: Receive
    ) -> tuple[bytes, tuple[int, str] | None]:
        too_large = (413, f"request body exceeds {self.max_body_bytes} bytes")
        error = _check_length(scope, self.max_body_bytes)
        if error is not None:
            return b"", error
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return b"", (400, "client disconnected")
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_body_bytes:
                return b"", too_large
            chunks.append(chunk)
            if not message.get("more_body", False):
                return b"".join(chunks), None


def _check_length(scope: Scope, max_bytes: int) -> tuple[int, str] | None:
    """A declared Content-Length past `max_bytes` (413) or malformed (400)."""
    for key, value in scope["headers"]:
        if key == b"content-length":
            try:
                if int(value) > max_bytes:
                    return 413, f"request body exceeds {max_bytes} bytes"
            except ValueError:
                return 400, "invalid content-length"
    return None


def _replay(body: bytes, receive: Receive) -> Receive:
    """A receive that hands the app the body read already, then the connection's events."""
    replayed = False

    async def replay() -> Message:
        nonlocal replayed
        if not replayed:
            replayed = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()  # after the body: waits for http.disconnect

    return replay
