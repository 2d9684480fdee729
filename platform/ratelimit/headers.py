"""OpenAI-style rate-limit headers from a decision (pure functions)."""

from __future__ import annotations

import math

from .limits import LimitState, RateLimitDecision


def format_reset(seconds: float) -> str:
    """Go-style duration as OpenAI sends it: "0s", "120ms", "1s", "1.5s", "6m0s", "1h0m0s"."""
    total_ms = max(0, math.ceil(seconds * 1000 - 1e-6))
    if total_ms == 0:
        return "0s"
    if total_ms < 1000:
        return f"{total_ms}ms"
    hours, rest = divmod(total_ms, 3_600_000)
    minutes, rest = divmod(rest, 60_000)
    whole_s, frac_ms = divmod(rest, 1000)
    secs = f"{whole_s}.{frac_ms:03d}".rstrip("0") if frac_ms else f"{whole_s}"
    out = f"{hours}h" if hours else ""
    if hours or minutes:
        out += f"{minutes}m"
    return f"{out}{secs}s"


def rate_limit_headers(decision: RateLimitDecision) -> dict[str, str]:
    """`x-ratelimit-{limit,remaining,reset}-{requests,tokens}` for the limited kinds, plus
    `retry-after` (whole seconds) and `retry-after-ms` when refused."""
    headers: dict[str, str] = {}
    _add(headers, "requests", decision.requests)
    _add(headers, "tokens", decision.tokens)
    retry_after = decision.retry_after
    if retry_after is not None and decision.retry_after_s is not None:
        headers["retry-after"] = str(retry_after)
        # The official OpenAI client prefers the precise value when both are present.
        headers["retry-after-ms"] = str(max(1, math.ceil(decision.retry_after_s * 1000)))
    return headers


def _add(headers: dict[str, str], suffix: str, state: LimitState | None) -> None:
    if state is None:
        return
    headers[f"x-ratelimit-limit-{suffix}"] = str(state.limit)
    headers[f"x-ratelimit-remaining-{suffix}"] = str(max(0, state.remaining))
    headers[f"x-ratelimit-reset-{suffix}"] = format_reset(state.reset_s)
