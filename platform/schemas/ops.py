"""Operations bodies: /health and /ready."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel

CheckName = Literal["database", "redis", "engine"]
CheckState = Literal["ok", "unavailable", "not_migrated", "draining"]

# Why a check is not ok, in words safe for a public endpoint (no hosts, no driver messages).
REASONS: dict[tuple[CheckName, CheckState], str] = {
    ("database", "unavailable"): "the registry database does not answer; requests get 503",
    ("database", "not_migrated"): (
        "the registry database is not at the code's migration head: run `loraplex db upgrade`"
    ),
    ("redis", "unavailable"): "Redis does not answer; rate limits are enforced per replica",
    ("engine", "unavailable"): "the engine is not running",
    ("engine", "draining"): "the server is shutting down",
}


class HealthPublic(BaseModel):
    status: Literal["ok"] = "ok"


class ReadinessPublic(BaseModel):
    """200 with every check ok; 503 otherwise, `reasons` saying why for each failing one."""

    status: Literal["ready", "not_ready"]
    checks: dict[CheckName, CheckState]
    reasons: dict[CheckName, str] = {}
