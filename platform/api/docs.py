"""The API docs pages, /docs (Swagger UI) and /redoc, served from vendored assets
(`docs_assets/`, with their licences): they load with no network access, unlike FastAPI's
defaults, which fetch their scripts from a CDN."""

from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI
from fastapi.openapi.docs import (
    get_redoc_html,
    get_swagger_ui_html,
    get_swagger_ui_oauth2_redirect_html,
)
from starlette.requests import Request
from starlette.responses import HTMLResponse
from starlette.staticfiles import StaticFiles

# resolve(): in the editable install this module is a link into the source tree, where the
# assets are real files (StaticFiles refuses links that lead outside its directory).
ASSETS_DIR = Path(__file__).resolve().parent / "docs_assets"
ASSETS_PATH = "/docs/assets"
OAUTH2_REDIRECT_PATH = "/docs/oauth2-redirect"


def install_docs(app: FastAPI) -> None:
    """/docs, /docs/oauth2-redirect, /redoc and their assets (public, outside the schema).
    The app is built with `docs_url=None, redoc_url=None` so FastAPI adds no CDN pages."""

    def root(request: Request) -> str:
        return str(request.scope.get("root_path", "")).rstrip("/")

    async def swagger_ui(request: Request) -> HTMLResponse:
        base = root(request)
        return get_swagger_ui_html(
            openapi_url=f"{base}{app.openapi_url}",
            title=f"{app.title} - Swagger UI",
            swagger_js_url=f"{base}{ASSETS_PATH}/swagger_ui/swagger-ui-bundle.js",
            swagger_css_url=f"{base}{ASSETS_PATH}/swagger_ui/swagger-ui.css",
            swagger_favicon_url=f"{base}{ASSETS_PATH}/swagger_ui/favicon-32x32.png",
            oauth2_redirect_url=f"{base}{OAUTH2_REDIRECT_PATH}",
        )

    async def oauth2_redirect(request: Request) -> HTMLResponse:
        return get_swagger_ui_oauth2_redirect_html()

    async def redoc(request: Request) -> HTMLResponse:
        base = root(request)
        return get_redoc_html(
            openapi_url=f"{base}{app.openapi_url}",
            title=f"{app.title} - ReDoc",
            redoc_js_url=f"{base}{ASSETS_PATH}/redoc/redoc.standalone.js",
            redoc_favicon_url=f"{base}{ASSETS_PATH}/swagger_ui/favicon-32x32.png",
            with_google_fonts=False,
        )

    app.mount(ASSETS_PATH, StaticFiles(directory=ASSETS_DIR), name="docs-assets")
    app.add_route("/docs", swagger_ui, include_in_schema=False)
    app.add_route(OAUTH2_REDIRECT_PATH, oauth2_redirect, include_in_schema=False)
    app.add_route("/redoc", redoc, include_in_schema=False)
