"""RequestContextMiddleware: request ids, header and body caps, access logs, last-resort 500s,
each request bound to its connection, redirects kept on this server.

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
from urllib.parse import urlsplit, urlunsplit

import anyio
from starlette.types import ASGIApp, Message, Receive, Scope, Send

logger = logging.getLogger("loraplex.access")

request_id_var: contextvars.ContextVar[str] = contextvars.ContextVar("request_id", default="-")
_CLIENT_ID = re.compile(r"[A-Za-z0-9._:-]{1,64}")
# Logged for a request whose client left before its response started (nginx's code).
CLIENT_CLOSED = 499


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


def _relative_location(key: bytes, value: bytes) -> tuple[bytes, bytes]:
    """Redirects (Starlette's trailing-slash ones) point at a path of this server only: a
    `Location` built from the client's Host header would send clients, and caches, wherever
    that header says (open redirect, cache poisoning). Every redirect here is same-origin."""
    if key.lower() != b"location":
        return key, value
    url = urlsplit(value.decode("latin-1"))
    if not url.scheme and not url.netloc:
        return key, value
    return key, urlunsplit(("", "", url.path or "/", url.query, url.fragment)).encode("latin-1")


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
            # An upload reads its own body as it arrives; a client leaving ends that read.
            error = _check_length(scope, stream_limit)
            if error is not None:
                await reject(*error)
                return
            body = None
        else:
            body, error = await self._read_body(scope, receive)
            if error is not None:
                await reject(*error)
                return

        # Every other request is bound to its connection: a client that leaves before its
        # response starts cancels the handler wherever it is (planning, admission, queued in
        # the engine, generating), and the handler's own clean-up aborts the engine request
        # and settles its limits and usage. Once a response has started, Starlette's streaming
        # response watches the connection itself.
        replayed = False
        disconnected = anyio.Event()

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            await disconnected.wait()  # the watcher below owns the connection's receive
            return {"type": "http.disconnect"}

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                status_holder[0] = message["status"]
                message = {
                    **message,
                    "headers": [
                        *(_relative_location(k, v) for k, v in message.get("headers", ())),
                        (b"x-request-id", request_id.encode()),
                    ],
                }
            await send(message)

        async def run_app(app_receive: Receive) -> None:
            try:
                await self.app(scope, app_receive, send_with_id)
            except Exception:
                logger.exception("unhandled error")
                if status_holder[0]:
                    raise  # the response started; the server closes the connection
                await reject(500, "internal server error")

        if body is None:
            await run_app(receive)
            return
        async with anyio.create_task_group() as tg:

            async def watch_connection() -> None:
                while (await receive())["type"] != "http.disconnect":
                    pass
                disconnected.set()
                if not status_holder[0]:
                    status_holder[0] = CLIENT_CLOSED
                    tg.cancel_scope.cancel()

            tg.start_soon(watch_connection)
            try:
                await run_app(replay)
            finally:
                tg.cancel_scope.cancel()  # stop watching

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
