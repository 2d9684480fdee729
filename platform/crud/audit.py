"""Audit events: one insert per admin mutation (`platform/audit.py`), filtered pages newest
first."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import ColumnElement, func, select
from sqlalchemy.orm import Session

from loraplex.platform.db import AuditAction, AuditEvent, AuditResult, AuditTarget


@dataclass(frozen=True)
class AuditFilter:
    """Every field left None matches everything; `since` inclusive, `until` exclusive."""

    actor: str | None = None
    action: AuditAction | None = None
    target_type: AuditTarget | None = None
    target_id: int | None = None
    result: AuditResult | None = None
    since: datetime | None = None
    until: datetime | None = None

    def clauses(self) -> list[ColumnElement[bool]]:
        clauses: list[ColumnElement[bool]] = []
        if self.actor is not None:
            clauses.append(AuditEvent.actor == self.actor)
        if self.action is not None:
            clauses.append(AuditEvent.action == self.action.value)
        if self.target_type is not None:
            clauses.append(AuditEvent.target_type == self.target_type.value)
        if self.target_id is not None:
            clauses.append(AuditEvent.target_id == self.target_id)
        if self.result is not None:
            clauses.append(AuditEvent.result == self.result.value)
        if self.since is not None:
            clauses.append(AuditEvent.created_at >= self.since)
        if self.until is not None:
            clauses.append(AuditEvent.created_at < self.until)
        return clauses


def insert_audit_event(session: Session, event: AuditEvent) -> None:
    session.add(event)
    session.commit()


def read_audit_events(
    session: Session, where: AuditFilter, skip: int = 0, limit: int = 100
) -> tuple[list[AuditEvent], int]:
    """One page of the events that match, newest first, and how many match in all."""
    clauses = where.clauses()
    count = session.scalar(select(func.count()).select_from(AuditEvent).where(*clauses)) or 0
    rows = session.scalars(
        select(AuditEvent).where(*clauses).order_by(AuditEvent.id.desc()).offset(skip).limit(limit)
    ).all()
    return list(rows), count
