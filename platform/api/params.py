"""Typed path and query parameters with the bounds the registry can hold: an id beyond the
database's integer columns is a 400 at the schema layer, never an overflow in a query."""

from __future__ import annotations

import datetime as dt
import re
from typing import Annotated

from fastapi import Path, Query
from pydantic import BeforeValidator

from loraplex.platform.audit import parse_time
from loraplex.platform.schemas.admin import MAX_ID

IdPath = Annotated[int, Path(ge=1, le=MAX_ID)]
TenantIdQuery = Annotated[int | None, Query(ge=1, le=MAX_ID, description="only this tenant")]
SkipQuery = Annotated[int, Query(ge=0, le=MAX_ID)]
LimitQuery = Annotated[int, Query(ge=1, le=1000)]


_DAY = re.compile(r"\d{4}-\d{2}-\d{2}")


def _iso_date(value: object) -> object:
    """Only YYYY-MM-DD: pydantic alone would also read `0` as 1970-01-01 (a Unix time)."""
    if isinstance(value, str) and not _DAY.fullmatch(value):
        raise ValueError(f"{value!r} is not a day: use YYYY-MM-DD")
    return value


DayQuery = Annotated[
    dt.date | None, BeforeValidator(_iso_date), Query(description="a UTC day, YYYY-MM-DD")
]


def _iso_datetime(value: object) -> object:
    """ISO 8601 only: pydantic alone would read `0` as a Unix time."""
    return parse_time(value) if isinstance(value, str) else value


TimeQuery = Annotated[
    dt.datetime | None,
    BeforeValidator(_iso_datetime),
    Query(description="an ISO 8601 time (UTC when it has no offset)"),
]
