"""Rate-limit header formatting (pure functions)."""

from __future__ import annotations

import pytest

from loraplex.platform.ratelimit import (
    LimitState,
    RateLimitDecision,
    format_reset,
    rate_limit_headers,
)


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0, "0s"),
        (-3, "0s"),
        (0.0004, "1ms"),
        (0.12, "120ms"),
        (1, "1s"),
        (1.5, "1.5s"),
        (59.817, "59.817s"),
        (60, "1m0s"),
        (360, "6m0s"),
        (90.25, "1m30.25s"),
        (3600, "1h0m0s"),
        (3723, "1h2m3s"),
    ],
)
def test_format_reset(seconds: float, text: str) -> None:
    assert format_reset(seconds) == text


def test_headers_of_refused_decision() -> None:
    decision = RateLimitDecision(
        allowed=False,
        kind="tokens",
        retry_after_s=2.2,
        requests=LimitState(limit=60, remaining=59, reset_s=1.0),
        tokens=LimitState(limit=1000, remaining=12, reset_s=59.0),
    )
    assert rate_limit_headers(decision) == {
        "x-ratelimit-limit-requests": "60",
        "x-ratelimit-remaining-requests": "59",
        "x-ratelimit-reset-requests": "1s",
        "x-ratelimit-limit-tokens": "1000",
        "x-ratelimit-remaining-tokens": "12",
        "x-ratelimit-reset-tokens": "59s",
        "retry-after": "3",
        "retry-after-ms": "2200",
    }


def test_retry_after_is_at_least_one_second() -> None:
    decision = RateLimitDecision(allowed=False, kind="requests", retry_after_s=0.01)
    assert decision.retry_after == 1
    assert rate_limit_headers(decision)["retry-after"] == "1"


def test_allowed_decision_has_no_retry_after() -> None:
    decision = RateLimitDecision(allowed=True, requests=LimitState(10, 9, 6.0))
    headers = rate_limit_headers(decision)
    assert "retry-after" not in headers and headers["x-ratelimit-remaining-requests"] == "9"
    assert "x-ratelimit-limit-tokens" not in headers  # unlimited kinds send nothing
