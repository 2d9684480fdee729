"""Admin mutation routes record themselves in the audit log by taking one dependency:

    def delete_grant(audit: Annotated[AuditEntry, Audited(AuditAction.GRANT_DELETE)], ...)

`Audited` authenticates the admin (so refused credentials are not recorded), starts the event
with the actor, the request id and the target and other ids of the path, and runs the route
inside `platform/audit.py`'s `recording`: whatever the route raises (a 404, a 409, a body that
fails validation, a conflict its session rolled back) becomes a failed event with the status
and error code the client gets; a route that returns leaves an `ok` event with its status. The
dependency is function-scoped: the event is committed before the response is sent. Routes
only add what they learn (`audit.target_id = row.id`, `audit.note(name=...)`).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from fastapi import Depends, Request

from loraplex.platform.api.deps import AdminDep, StateDep
from loraplex.platform.api.errors import describe
from loraplex.platform.api.middleware import CLIENT_CLOSED
from loraplex.platform.audit import AuditEntry, AuditFailure, admin_actor, recording
from loraplex.platform.db import AuditAction, AuditTarget
from loraplex.platform.schemas.admin import MAX_ID

# The path parameter that names each kind of target; the path's other ids go in the detail.
TARGET_PARAMS = {
    AuditTarget.TENANT: "tenant_id",
    AuditTarget.API_KEY: "key_id",
    AuditTarget.ADAPTER: "adapter_id",
}


def explain_http(exc: BaseException) -> AuditFailure:
    """The failure as the client is told it (`api/errors.py`)."""
    if not isinstance(exc, Exception):  # cancelled: the client left before the answer
        return AuditFailure(
            CLIENT_CLOSED,
            "client_closed",
            "the client went away before the answer: the change may have been made",
        )
    error = describe(exc)
    return AuditFailure(error.status, error.code or error.type, error.message)


class Audited:
    """The dependency of one admin mutation route (`action`); see the module docstring."""

    def __init__(self, action: AuditAction) -> None:
        self.action = action

    def __call__(self, request: Request, state: StateDep, admin: AdminDep) -> Iterator[AuditEntry]:
        entry = AuditEntry(
            action=self.action,
            actor=admin_actor(admin.subject),
            request_id=getattr(request.state, "request_id", None),
        )
        target_param = TARGET_PARAMS[self.action.target_type]
        for name, raw in request.path_params.items():
            value = _id(raw)
            if name == target_param:
                entry.target_id = value
            else:
                entry.note(**{name: raw if value is None else value})
        route = request.scope.get("route")
        ok_status = getattr(route, "status_code", None) or 200
        with recording(state.db, entry, explain_http, ok_status=ok_status):
            yield entry


def audited(action: AuditAction) -> Any:
    """`Depends(Audited(action))`, exited before the response goes out."""
    return Depends(Audited(action), scope="function")


def _id(raw: object) -> int | None:
    """A path id as the route reads it, or None when the route refuses it (400)."""
    text = str(raw)
    if len(text) <= 10 and text.isascii() and text.isdigit() and 1 <= int(text) <= MAX_ID:
        return int(text)
    return None
