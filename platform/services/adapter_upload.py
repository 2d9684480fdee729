"""POST /admin/v1/adapters: a streamed upload becomes a stored, registered, load-checked version.

    body ──stream──▶ staging dir (byte limits; archive expanded) ──▶ engine validator
         ──▶ content-addressed rename + row (`loading`) in one unit ──▶ load check ──▶ ready | failed

Any refusal before the row is committed leaves nothing behind: the staging directory goes on
exit, and files renamed into place for a row that did not commit are removed at once.
"""

from __future__ import annotations

import contextlib

import anyio
from starlette.requests import ClientDisconnect, Request

from loraplex.platform import crud
from loraplex.platform.audit import AuditEntry
from loraplex.platform.db import Adapter, AdapterStatus
from loraplex.platform.errors import InvalidRequestError
from loraplex.platform.services.adapter_check import check_adapter
from loraplex.platform.state import AppState
from loraplex.platform.uploads import UploadLimits, extract_adapter_archive, receive_upload


def _tenant_id(text: str) -> int:
    if not text.isascii() or not text.isdigit() or not 1 <= int(text) <= 2**31 - 1:
        raise InvalidRequestError("tenant_id must be a positive integer", param="tenant_id")
    return int(text)


async def upload_adapter(state: AppState, request: Request, audit: AuditEntry) -> Adapter:
    """The stored version, `ready` or `failed` by its load check; `audit` gets the fields as
    they arrive and the version's facts at the end."""
    settings = state.settings
    store = state.adapter_store
    limits = UploadLimits(max_bytes=settings.max_adapter_bytes)
    with contextlib.ExitStack() as held, store.staging() as staging:

        def on_fields(fields: dict[str, str]) -> None:  # before the files arrive
            audit.note(tenant_id=fields["tenant_id"], name=fields["name"])
            tenant_id = _tenant_id(fields["tenant_id"])
            crud.check_adapter_name(fields["name"])
            with state.db.session() as session:
                crud.read_tenant(session, tenant_id)
            held.enter_context(state.uploads.hold(tenant_id, fields["name"]))

        content_type = request.headers.get("content-type", "")
        try:
            received = await receive_upload(
                content_type, request.stream(), staging, limits, on_fields
            )
        except ClientDisconnect as e:
            raise InvalidRequestError("the upload was cut short (the client went away)") from e
        if received.archive is not None:
            await anyio.to_thread.run_sync(
                extract_adapter_archive, staging / received.archive, staging, limits.max_bytes
            )

        def register() -> Adapter:
            with state.db.session() as session:
                return crud.register_staged(
                    session,
                    store,
                    state.validate_adapter,
                    staging,
                    tenant_id=_tenant_id(received.fields["tenant_id"]),
                    name=received.fields["name"],
                    base_model=state.engine.model_name,
                    status=AdapterStatus.LOADING,
                )

        row = await anyio.to_thread.run_sync(register)
        audit.target_id = row.id
        audit.note(tenant_id=row.tenant_id, version=row.version, sha256=row.sha256)
        row = await check_adapter(state.db, state.engine, row.id)
        audit.note(status=row.status, status_reason=row.status_reason)
        return row
