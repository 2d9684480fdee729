"""When a request's output tokens reached the server: time to first token and one inter-token
gap per token, for the latency histograms."""

from __future__ import annotations

import time
from collections.abc import Callable


class TokenTimes:
    """Fed the cumulative token count at each read of a request's stream.

    A read can bring several tokens at once (outputs the reader had not taken yet merge into one,
    as in vLLM): the time since the previous read is then shared evenly among them, so the
    histogram gets one gap per token after the first and their mean is the true mean. Tokens
    that came with the first one have no gap to measure and are not observed.
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self.first_token_at: float | None = None
        self.gaps: list[float] = []
        self._last_read_at = 0.0
        self._num_tokens = 0

    def observe(self, num_tokens: int) -> None:
        """`num_tokens`: the request's output tokens so far (all its completions)."""
        new = num_tokens - self._num_tokens
        if new <= 0:
            return
        now = self._clock()
        if self.first_token_at is None:
            self.first_token_at = now
        else:
            self.gaps.extend([(now - self._last_read_at) / new] * new)
        self._last_read_at, self._num_tokens = now, num_tokens
