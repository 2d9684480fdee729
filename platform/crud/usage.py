"""Usage records: batched inserts and grouped reports."""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from typing import Any, Literal

from sqlalchemy import Date, cast, func, insert, select
from sqlalchemy.orm import Session
from sqlalchemy.sql.elements import ColumnElement

from loraplex.platform.db import UsageRecord
from loraplex.platform.schemas import UsageRow

GroupBy = Literal["day", "adapter"]


def insert_usage(session: Session, rows: Sequence[dict[str, Any]]) -> None:
    if rows:
        session.execute(insert(UsageRecord), list(rows))
        session.commit()


def _day(session: Session) -> ColumnElement[Any]:
    """The UTC calendar day of created_at, on each backend."""
    if session.get_bind().dialect.name == "postgresql":
        return cast(func.timezone("UTC", UsageRecord.created_at), Date)
    return func.date(UsageRecord.created_at)  # SQLite stores UTC text


def read_usage(
    session: Session,
    *,
    tenant_id: int | None,
    group_by: Sequence[GroupBy],
    start: dt.date | None = None,
    end: dt.date | None = None,
) -> list[UsageRow]:
    """Requests and tokens, grouped by tenant plus any of day / adapter; `end` inclusive."""
    day = _day(session).label("day")
    keys: list[Any] = [UsageRecord.tenant_id]
    if "day" in group_by:
        keys.append(day)
    if "adapter" in group_by:
        keys += [UsageRecord.adapter_id, UsageRecord.model]
    query = (
        select(
            *keys,
            func.count().label("requests"),
            func.coalesce(func.sum(UsageRecord.prompt_tokens), 0).label("prompt_tokens"),
            func.coalesce(func.sum(UsageRecord.completion_tokens), 0).label("completion_tokens"),
        )
        .group_by(*keys)
        .order_by(*keys)
    )
    if tenant_id is not None:
        query = query.where(UsageRecord.tenant_id == tenant_id)
    if start is not None:
        query = query.where(UsageRecord.created_at >= _midnight(start))
    if end is not None and end < dt.date.max:  # date.max: no day after it, no bound
        query = query.where(UsageRecord.created_at < _midnight(end + dt.timedelta(days=1)))
    rows = []
    for r in session.execute(query).mappings():
        day_value = r.get("day")
        if isinstance(day_value, str):
            day_value = dt.date.fromisoformat(day_value)
        rows.append(
            UsageRow(
                tenant_id=r["tenant_id"],
                date=day_value,
                adapter_id=r.get("adapter_id"),
                model=r.get("model"),
                requests=r["requests"],
                prompt_tokens=r["prompt_tokens"],
                completion_tokens=r["completion_tokens"],
                total_tokens=r["prompt_tokens"] + r["completion_tokens"],
            )
        )
    return rows


def _midnight(day: dt.date) -> dt.datetime:
    return dt.datetime.combine(day, dt.time(), tzinfo=dt.UTC)
