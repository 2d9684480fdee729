"""The OpenAPI schema as the API behaves: who may call each operation (the security schemes of
`api/deps.py`), the errors it answers, all in OpenAI's error body, and no 422 (a request that
fails validation is a 400 here, `api/errors.py`).

Errors every operation of a family can answer are declared where the routers are mounted
(`api/main.py`); route-specific ones (a model that does not resolve, 429, an engine failure)
on the route. The rest follows from the operation itself, so a new route is described right
without anyone remembering to: a path parameter can name nothing (404), a body can be too
large (413), an admin write can collide with an existing name or grant (409).
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

from loraplex.platform.schemas import ErrorResponse

ERROR_DESCRIPTIONS: dict[int, str] = {
    400: "Invalid request: malformed body, a value out of range, a request that can never fit",
    401: "Missing, unknown, revoked, expired or forged credential",
    403: "Valid credential without permission (suspended tenant, wrong scope)",
    404: "No such resource, or no such model for this tenant",
    409: "A name or grant that already exists",
    413: "Body larger than LORAPLEX_MAX_BODY_BYTES",
    429: "Rate limited (the tenant's limits or the engine's queue); see retry-after",
    500: "The engine failed this request (the server lives on)",
    503: "Draining for shutdown, engine stopped or registry database unreachable",
}
_RETRY_HEADERS = {
    "retry-after": {"description": "Seconds to wait", "schema": {"type": "integer"}},
    "retry-after-ms": {"description": "Milliseconds to wait", "schema": {"type": "integer"}},
}
_ERROR_REF = {"$ref": "#/components/schemas/ErrorResponse"}
_WRITE_METHODS = ("post", "put", "patch")


def error_responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """`responses=` for routes and routers: OpenAI-style error bodies with their meaning."""
    responses: dict[int | str, dict[str, Any]] = {}
    for status in statuses:
        response: dict[str, Any] = {
            "model": ErrorResponse,
            "description": ERROR_DESCRIPTIONS[status],
        }
        if status in (429, 503):
            response["headers"] = _RETRY_HEADERS
        responses[status] = response
    return responses


def install_openapi(app: FastAPI) -> None:
    """Serve the schema built by `build_openapi` (once, on first request)."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            state = getattr(app.state, "loraplex", None)
            app.openapi_schema = build_openapi(app, state.engine.model_name if state else None)
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


def build_openapi(app: FastAPI, model_name: str | None = None) -> dict[str, Any]:
    """The app's schema; `model_name`, the served model, goes into the request examples."""
    schema = get_openapi(
        title=app.title,
        version=app.version,
        summary=app.summary,
        description=app.description,
        routes=app.routes,
    )
    components = schema.setdefault("components", {}).setdefault("schemas", {})
    for name in ("HTTPValidationError", "ValidationError"):
        components.pop(name, None)
    for name in ("CompletionRequest", "ChatCompletionRequest"):
        for example in components.get(name, {}).get("examples", ()):
            example["model"] = model_name or example["model"]
    for path, item in schema.get("paths", {}).items():
        for method, operation in item.items():
            _describe_errors(path, method, operation)
    return schema


def _describe_errors(path: str, method: str, operation: dict[str, Any]) -> None:
    responses: dict[str, Any] = operation.setdefault("responses", {})
    responses.pop("422", None)
    if "security" not in operation:
        return  # public: only what the route declares
    implied = [400, 401, 403, 503]
    if any(p.get("in") == "path" for p in operation.get("parameters", ())):
        implied.append(404)
    if "requestBody" in operation:
        implied.append(413)
    if path.startswith("/admin/") and method in _WRITE_METHODS:
        implied.append(409)
    for status in implied:
        responses.setdefault(
            str(status),
            {
                "description": ERROR_DESCRIPTIONS[status],
                "content": {"application/json": {"schema": _ERROR_REF}},
            },
        )
