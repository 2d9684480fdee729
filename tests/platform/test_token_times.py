"""TokenTimes: time to first token, and one inter-token gap per token when reads merge tokens."""

from __future__ import annotations

import pytest

from loraplex.platform.token_times import TokenTimes


def test_one_gap_per_token_shared_evenly_within_a_read() -> None:
    now = [10.0]
    times = TokenTimes(clock=lambda: now[0])
    times.observe(0)  # a read with no token yet (e.g. prefill progress): nothing
    assert times.first_token_at is None
    now[0] = 10.5
    times.observe(2)  # the first token and one more: no gap known for the second
    now[0] = 10.6
    times.observe(3)
    now[0] = 11.0
    times.observe(7)  # four tokens merged into one read, 0.4 s after the last
    times.observe(7)  # nothing new
    assert times.first_token_at == 10.5
    assert times.gaps == pytest.approx([0.1, 0.1, 0.1, 0.1, 0.1])
    assert sum(times.gaps) == pytest.approx(11.0 - 10.5)
