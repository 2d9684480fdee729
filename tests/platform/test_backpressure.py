"""The engine backpressure gate against `EngineStats` snapshots (pure functions)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from loraplex.engine.stats import EngineStats
from loraplex.platform.ratelimit import BackpressureGate


def test_backpressure_below_bounds() -> None:
    gate = BackpressureGate(max_waiting_requests=10, max_waiting_tokens=1000)
    assert gate.check(EngineStats(num_waiting=9, num_waiting_tokens=999)) is None
    assert gate.check(EngineStats()) is None
    assert BackpressureGate(None, None).check(EngineStats(num_waiting=10**6)) is None


def test_backpressure_request_bound() -> None:
    gate = BackpressureGate(max_waiting_requests=10, max_waiting_tokens=None)
    assert gate.check(EngineStats(num_waiting=10)) == 1  # no throughput known: poll in 1 s
    stats = EngineStats(num_waiting=10, num_waiting_tokens=5000, throughput_tokens_per_s=100.0)
    assert gate.check(stats) == 5  # one request's worth (500 tokens) at 100 tok/s


def test_backpressure_token_bound_estimate_is_clamped() -> None:
    gate = BackpressureGate(max_waiting_requests=None, max_waiting_tokens=1000)
    stats = EngineStats(num_waiting=3, num_waiting_tokens=3000, throughput_tokens_per_s=200.0)
    assert gate.check(stats) == 10  # 2000 excess tokens at 200 tok/s
    assert gate.check(replace(stats, throughput_tokens_per_s=1.0)) == 60
    assert gate.check(replace(stats, throughput_tokens_per_s=float("nan"))) == 1


def test_backpressure_rejects_negative_bounds() -> None:
    with pytest.raises(ValueError):
        BackpressureGate(max_waiting_requests=-1, max_waiting_tokens=None)
