"""`platform/audit.py`'s `recording`, the audit log's one writer, at its edges: client text
both databases store, a change cancelled mid-way, an event that cannot be written."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest
from sqlalchemy import select

from loraplex.platform.api.audit import explain_http
from loraplex.platform.audit import AuditEntry, recording
from loraplex.platform.db import AuditAction, AuditEvent, Database, upgrade
from loraplex.platform.errors import NotFoundError


@pytest.fixture(params=["sqlite", "postgres"])
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def entry() -> AuditEntry:
    return AuditEntry(action=AuditAction.TENANT_UPDATE, actor="admin:tests", request_id="r-1")


def events(db: Database) -> list[AuditEvent]:
    with db.session() as session:
        return list(session.scalars(select(AuditEvent).order_by(AuditEvent.id)))


def test_client_text_is_kept_small_and_storable(database_url: str) -> None:
    upgrade(database_url)
    db = Database(database_url)
    try:
        with recording(db, entry(), explain_http, ok_status=200) as audit:
            audit.note(name="a\x00b\ud800c", long="x" * 1000, ids=list(range(100)), none=None)
        [event] = events(db)
        assert event.detail == {
            "name": "ab\\ud800c",
            "long": "x" * 200,
            "ids": list(range(32)),
            "none": None,
        }
        assert (event.result, event.status_code, event.request_id) == ("ok", 200, "r-1")
    finally:
        db.dispose()


def test_a_cancelled_change_is_recorded_as_the_client_leaving(database_url: str) -> None:
    upgrade(database_url)
    db = Database(database_url)
    try:
        with (
            pytest.raises(asyncio.CancelledError),
            recording(db, entry(), explain_http, ok_status=200),
        ):
            raise asyncio.CancelledError
        [event] = events(db)
        assert (event.result, event.status_code, event.error_code) == (
            "failed",
            499,
            "client_closed",
        )
        assert "may have been made" in event.detail["error"]
    finally:
        db.dispose()


def test_an_event_that_cannot_be_written(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A refused change keeps its own error (the lost event is logged whole); a change that
    succeeded but whose event cannot be written is not silently unrecorded."""
    db = Database(f"sqlite:///{tmp_path / 'unmigrated.db'}")  # no audit_events table
    try:
        with (
            caplog.at_level(logging.ERROR, "loraplex.platform.audit"),
            pytest.raises(NotFoundError),
            recording(db, entry(), explain_http),
        ):
            raise NotFoundError("tenant 7 not found")
        assert "audit event not recorded: admin:tests tenant.update" in caplog.text
        assert "status=404 error=not_found" in caplog.text
        with pytest.raises(Exception, match="no such table"), recording(db, entry(), explain_http):
            pass
    finally:
        db.dispose()
