"""RequestOutputCollector: one request's outputs as its caller (`AsyncEngine.generate`) sees them.

The engine core's per-step `OutputDelta`s are applied here on the event loop, and the caller reads
its output when it wakes: cumulative (each output holds everything so far) or, with `delta`, only
what came since its last read. Steps the caller has not read yet merge into one output (vLLM's
output collector does the same): a reader that falls behind (a busy server) costs one output per
read, not one per step.

A caller that does not stream (`stream=False`: a non-streamed API request) is woken twice, for the
request's first output and for its last (or its error); the steps between merge into the last.
The first read still times the first token; the caller is not woken once per step for outputs it
only joins.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from loraplex.engine.engine_core import OutputDelta
from loraplex.engine.request import CompletionOutput, Logprob, RequestOutput


@dataclass
class _Completion:
    token_ids: list[int] = field(default_factory=list)
    # The text in pieces, joined at a read: steps nobody read cost no copy of the text so far.
    text_parts: list[str] = field(default_factory=list)
    logprobs: list[tuple[Logprob, list[Logprob]]] | None = None
    finish_reason: str | None = None
    stop_reason: str | int | None = None


@dataclass
class RequestOutputCollector:
    """A request as the caller sees it: its outputs so far (with `delta`: since the caller's
    last read), and whether there is one the caller should read now (`has_output`)."""

    prompt: str | None
    prompt_token_ids: list[int]
    added: asyncio.Future[Any]
    delta: bool = False
    stream: bool = True  # False: only the first output and the last wake the caller
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    completions: dict[int, _Completion] = field(default_factory=dict)
    unread: bool = False  # steps applied since the caller's last read
    finished: bool = False
    num_cached_tokens: int = 0
    error: Exception | None = None  # the request failed (its last output carries it)
    failure: BaseException | None = None  # the engine died
    was_read: bool = False  # the caller has read an output (its first)

    @property
    def has_output(self) -> bool:
        """Whether the caller should read now: steps it has not read, and (without `stream`)
        the first output or the last."""
        if not self.unread:
            return False
        return self.stream or not self.was_read or self.finished or self.error is not None

    def apply(self, delta: OutputDelta) -> None:
        for d in delta.completions:
            c = self.completions.setdefault(d.completion_index, _Completion())
            c.token_ids.extend(d.token_ids)
            c.text_parts.append(d.text)
            if d.logprobs is not None and self.delta and c.logprobs is not None:
                c.logprobs.extend(d.logprobs)  # not handed out yet: a read forgets c
            elif d.logprobs is not None:
                c.logprobs = (c.logprobs or []) + d.logprobs  # a new list: reads share it
            c.finish_reason, c.stop_reason = d.finish_reason, d.stop_reason
        self.finished, self.num_cached_tokens = delta.finished, delta.num_cached_tokens
        self.error = delta.error
        self.unread = True
        if self.has_output:
            self.wake.set()

    def fail(self, exc: BaseException) -> None:
        self.failure = exc
        self.wake.set()

    def read(self, request_id: str) -> RequestOutput:
        """The output now, marked read. Cumulative: new token lists, so outputs already handed
        out stay intact. Delta: the completions that changed since the last read, handed over
        and forgotten here (nothing is copied)."""
        self.unread = False
        self.was_read = True
        outputs = []
        for i, c in sorted(self.completions.items()):
            text = "".join(c.text_parts)
            c.text_parts = [text]
            token_ids = c.token_ids if self.delta else list(c.token_ids)
            outputs.append(
                CompletionOutput(i, text, token_ids, c.finish_reason, c.logprobs, c.stop_reason)
            )
        if self.delta:
            self.completions = {}
        return RequestOutput(
            request_id, self.prompt, self.prompt_token_ids, outputs, self.finished,
            self.num_cached_tokens, self.error,
        )  # fmt: skip
