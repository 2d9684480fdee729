"""The admin console: `admin-ui/`'s static files at /admin, with a strict Content-Security-Policy.

The files are public (an app shell); every call they make to /admin/v1 needs the admin token the
operator signs in with. The CSP allows scripts, styles and connections from this origin only: no
inline script or style, no eval, no framing (clickjacking), no other origin to send data to.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from starlette.staticfiles import StaticFiles
from starlette.types import Message, Receive, Scope, Send

# The wheel ships admin-ui/ as the data package `loraplex.admin_ui` (see setup.py).
ADMIN_UI_PACKAGE = "loraplex.admin_ui"
CONTENT_SECURITY_POLICY = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "font-src 'self'; connect-src 'self'; base-uri 'none'; form-action 'none'; "
    "frame-ancestors 'none'"
)
SECURITY_HEADERS = [
    (b"content-security-policy", CONTENT_SECURITY_POLICY.encode()),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
    (b"x-frame-options", b"DENY"),
    (b"cache-control", b"no-cache"),
]


def admin_ui_dir() -> Path:
    """Where the console's files are: the installed data package's folder. An editable install
    links each file from the source tree: serve the tree itself (StaticFiles refuses links
    that lead out of its directory)."""
    spec = importlib.util.find_spec(ADMIN_UI_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError(f"{ADMIN_UI_PACKAGE} is not installed (run `make setup`)")
    package_dir = Path(next(iter(spec.submodule_search_locations)))
    return (package_dir / "index.html").resolve().parent


class AdminConsole:
    """ASGI app for the /admin mount (the router redirects /admin to /admin/): the files, with
    the security headers."""

    def __init__(self, directory: Path) -> None:
        self.files = StaticFiles(directory=directory, html=True)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", ()), *SECURITY_HEADERS]}
            await send(message)

        await self.files(scope, receive, send_with_headers)
