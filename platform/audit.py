"""The audit log's one writer: every admin mutation, over the API (`api/audit.py`), the
command line (`cli/commands.py`) or the demo's set-up (`demo/bootstrap.py`), runs inside
`recording(...)`, which writes its event once the mutation has ended, however it ended.

The event is written in a session of its own, after the mutation's own session has committed
or rolled back: a refused or rolled-back mutation still leaves its failed event, and a
successful one's event commits right after it (before the API answers). Only what the caller
puts in `detail` is kept, cut to small plain values, so a secret never gets there by accident
of a generic dump: callers add the fields they mean (never key material or tokens).
"""

from __future__ import annotations

import datetime as dt
import getpass
import logging
import os
import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from loraplex.platform import crud
from loraplex.platform.db import AuditAction, AuditEvent, AuditResult, Database

logger = logging.getLogger(__name__)

MAX_ACTOR = 128
MAX_TEXT = 200  # a detail's string value, an error message
MAX_ITEMS = 32  # a detail's list value


@dataclass(frozen=True)
class AuditFailure:
    """How a mutation failed, as its caller was told: the HTTP status (API only) and the error's
    code, with a message safe to show (the API's own answer)."""

    status_code: int | None
    error_code: str
    message: str


@dataclass
class AuditEntry:
    """The event being built while its mutation runs; the mutation fills in its target and
    detail as it learns them (the new row's id, the name it read)."""

    action: AuditAction
    actor: str
    target_id: int | None = None
    request_id: str | None = None
    detail: dict[str, Any] = field(default_factory=dict)

    def note(self, **values: Any) -> None:
        """Add to the detail (plain values only: strings, numbers, booleans, lists of them)."""
        self.detail.update(values)


Explain = Callable[[BaseException], AuditFailure]


def admin_actor(subject: str) -> str:
    """`admin:<subject>` from an admin token's `sub` (tokens this server issues already say
    `admin:...`)."""
    return _clean(subject if subject.startswith("admin:") else f"admin:{subject}", MAX_ACTOR)


def cli_actor() -> str:
    """`cli:<OS user>` for the command line."""
    try:
        user = getpass.getuser()
    except (OSError, KeyError):  # no login name and no passwd entry (some containers)
        user = f"uid-{os.getuid()}"
    return _clean(f"cli:{user}", MAX_ACTOR)


# RFC 3339's date-time, with the seconds and the offset optional, or a day alone: none of the
# other forms `fromisoformat` reads (20261201, week dates) that would take digits for a time.
_TIME = re.compile(
    r"\d{4}-\d{2}-\d{2}([T ]\d{2}:\d{2}(:\d{2}(\.\d{1,6})?)?)?(Z|[+-]\d{2}:\d{2})?", re.ASCII
)


def parse_time(text: str) -> dt.datetime:
    """An ISO 8601 time (`2026-12-01T09:30:00Z`, `2026-12-01`) as a UTC datetime, UTC when it
    has no offset; ValueError for anything else, including a Unix time and an offset that
    would move it off the calendar."""
    try:
        if not _TIME.fullmatch(text.upper()):
            raise ValueError(text)
        moment = dt.datetime.fromisoformat(text.upper())
        if moment.tzinfo is None:
            return moment.replace(tzinfo=dt.UTC)
        return moment.astimezone(dt.UTC)
    except (ValueError, OverflowError) as e:
        raise ValueError(
            f"{text[:64]!r} is not a time: use ISO 8601, e.g. 2026-12-01T09:30:00Z"
        ) from e


@contextmanager
def recording(
    db: Database, entry: AuditEntry, explain: Explain, *, ok_status: int | None = None
) -> Iterator[AuditEntry]:
    """Run a mutation (the block) and record its event: `ok` with `ok_status` when the block
    returns, `failed` as `explain` describes the exception when it raises (which then goes on).

    A failed mutation's event that cannot be written is logged whole and the mutation's own
    error goes on; a successful mutation's event that cannot be written raises, since an
    admin change must not go unrecorded without anyone being told."""
    try:
        yield entry
    except BaseException as exc:
        failure = explain(exc)
        entry.note(error=failure.message)
        event = _event(entry, AuditResult.FAILED, failure.status_code, failure.error_code)
        try:
            write_event(db, event)
        except Exception:
            logger.exception("audit event not recorded: %s", _describe(event))
        raise
    event = _event(entry, AuditResult.OK, ok_status, None)
    try:
        write_event(db, event)
    except Exception:
        logger.exception("audit event not recorded: %s", _describe(event))
        raise


def write_event(db: Database, event: AuditEvent) -> None:
    with db.session() as session:
        crud.insert_audit_event(session, event)


def _event(
    entry: AuditEntry, result: AuditResult, status_code: int | None, error_code: str | None
) -> AuditEvent:
    return AuditEvent(
        actor=_clean(entry.actor, MAX_ACTOR),
        action=entry.action.value,
        target_type=entry.action.target_type.value,
        target_id=entry.target_id,
        result=result.value,
        status_code=status_code,
        error_code=_clean(error_code, 64) if error_code else None,
        request_id=entry.request_id,
        detail={_clean(str(k), 64): _small(v) for k, v in entry.detail.items()},
    )


def _small(value: Any) -> Any:
    """A JSON value both databases store: short strings without NUL or lone surrogates."""
    if value is None or isinstance(value, bool | int | float):
        return value
    if isinstance(value, list | tuple):
        return [_small(v) for v in value[:MAX_ITEMS]]
    return _clean(str(value), MAX_TEXT)


def _clean(text: str, limit: int) -> str:
    # Client text may carry NUL bytes (PostgreSQL refuses them) or lone surrogates.
    return text.replace("\x00", "").encode("utf-8", "backslashreplace").decode("utf-8")[:limit]


def _describe(event: AuditEvent) -> str:
    return (
        f"{event.actor} {event.action} {event.target_type}:{event.target_id} {event.result} "
        f"status={event.status_code} error={event.error_code} request={event.request_id} "
        f"detail={event.detail}"
    )
