"""Requests as the engine sees them: sampling parameters, lifecycle state, outputs."""

from __future__ import annotations

import enum
import math
import time
from dataclasses import dataclass, field
from typing import Any

from loraplex.engine.errors import InvalidParameterError

MAX_N = 16
MAX_LOGPROBS = 20
MAX_STOP_STRINGS = 16
MAX_STOP_STRING_LEN = 256
MAX_STOP_TOKEN_IDS = 64


def _check(ok: bool, param: str, message: str) -> None:
    if not ok:
        raise InvalidParameterError(message, param=param)


def _is_number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


@dataclass
class SamplingParams:
    """How to sample one request. Validated on construction (vLLM/OpenAI semantics)."""

    max_tokens: int = 16
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    min_p: float = 0.0
    n: int = 1
    # A str or None is accepted too (vLLM's and OpenAI's forms) and normalized to a list.
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    seed: int | None = None
    logprobs: int | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    min_tokens: int = 0
    detokenize: bool = True

    def __post_init__(self) -> None:
        stop: list[str] | str | None = self.stop
        self.stop = [stop] if isinstance(stop, str) else list(stop or [])
        self.stop_token_ids = list(self.stop_token_ids or [])
        _check(
            isinstance(self.max_tokens, int)
            and not isinstance(self.max_tokens, bool)
            and self.max_tokens >= 1,
            "max_tokens",
            "must be an integer >= 1",
        )
        for name in (
            "temperature",
            "top_p",
            "min_p",
            "presence_penalty",
            "frequency_penalty",
            "repetition_penalty",
        ):
            value = getattr(self, name)
            _check(_is_number(value) and math.isfinite(value), name, "must be a finite number")
        _check(0.0 <= self.temperature <= 100.0, "temperature", "must be in [0, 100]")
        _check(0.0 < self.top_p <= 1.0, "top_p", "must be in (0, 1]")
        _check(
            isinstance(self.top_k, int) and (self.top_k == -1 or self.top_k >= 1),
            "top_k",
            "must be -1 (off) or >= 1",
        )
        _check(0.0 <= self.min_p <= 1.0, "min_p", "must be in [0, 1]")
        _check(isinstance(self.n, int) and 1 <= self.n <= MAX_N, "n", f"must be in [1, {MAX_N}]")
        _check(-2.0 <= self.presence_penalty <= 2.0, "presence_penalty", "must be in [-2, 2]")
        _check(-2.0 <= self.frequency_penalty <= 2.0, "frequency_penalty", "must be in [-2, 2]")
        _check(0.0 < self.repetition_penalty <= 2.0, "repetition_penalty", "must be in (0, 2]")
        _check(len(self.stop) <= MAX_STOP_STRINGS, "stop", f"at most {MAX_STOP_STRINGS} strings")
        _check(
            all(isinstance(s, str) and 0 < len(s) <= MAX_STOP_STRING_LEN for s in self.stop),
            "stop",
            f"each stop string must have 1..{MAX_STOP_STRING_LEN} characters",
        )
        _check(
            len(self.stop_token_ids) <= MAX_STOP_TOKEN_IDS,
            "stop_token_ids",
            f"at most {MAX_STOP_TOKEN_IDS} ids",
        )
        _check(
            all(isinstance(t, int) and t >= 0 for t in self.stop_token_ids),
            "stop_token_ids",
            "must be non-negative integers",
        )
        _check(
            self.seed is None or (isinstance(self.seed, int) and 0 <= self.seed < 2**63),
            "seed",
            "must be an integer in [0, 2**63)",
        )
        _check(
            self.logprobs is None
            or (isinstance(self.logprobs, int) and 0 <= self.logprobs <= MAX_LOGPROBS),
            "logprobs",
            f"must be in [0, {MAX_LOGPROBS}]",
        )
        _check(
            isinstance(self.min_tokens, int) and 0 <= self.min_tokens <= self.max_tokens,
            "min_tokens",
            "must be in [0, max_tokens]",
        )

    @property
    def needs_penalties(self) -> bool:
        return (
            self.presence_penalty != 0.0
            or self.frequency_penalty != 0.0
            or self.repetition_penalty != 1.0
        )


@dataclass(frozen=True)
class LoRARequest:
    """Names a PEFT adapter directory. `lora_int_id` is the engine-wide id (> 0)."""

    lora_name: str
    lora_int_id: int
    lora_path: str
    # sha256 of the adapter's files; keys the prefix cache and the adapter cache, so a reload
    # under the same name never serves stale blocks or weights. Computed on load when None.
    content_hash: str | None = None

    def __post_init__(self) -> None:
        if self.lora_int_id <= 0:
            raise InvalidParameterError("must be > 0", param="lora_int_id")


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    PREEMPTED = "preempted"
    SWAPPED = "swapped"
    FINISHED_STOPPED = "finished_stopped"
    FINISHED_LENGTH = "finished_length"
    FINISHED_ABORTED = "finished_aborted"
    FINISHED_ERROR = "finished_error"

    @property
    def is_finished(self) -> bool:
        return self.name.startswith("FINISHED")

    @property
    def finish_reason(self) -> str | None:
        return {
            RequestStatus.FINISHED_STOPPED: "stop",
            RequestStatus.FINISHED_LENGTH: "length",
            RequestStatus.FINISHED_ABORTED: "abort",
            RequestStatus.FINISHED_ERROR: "error",
        }.get(self)


@dataclass
class Request:
    """One sequence being generated. `n > 1` is fanned out into n Requests by the engine."""

    request_id: str
    prompt_token_ids: list[int]
    sampling_params: SamplingParams
    eos_token_ids: frozenset[int] = frozenset()
    lora_request: LoRARequest | None = None
    priority: int = 0
    fairness_key: str = ""
    cache_salt: str | None = None
    arrival_time: float = field(default_factory=time.monotonic)
    status: RequestStatus = RequestStatus.WAITING
    output_token_ids: list[int] = field(default_factory=list)
    # Tokens whose K/V are in the cache, or being written by a step already scheduled
    # (prompt and output alike): the scheduler advances it when it schedules a step.
    num_computed_tokens: int = 0
    # Tokens sampled by scheduled steps whose results are not back yet (async scheduling: at
    # most 2, the step in flight's and the one just scheduled, before the first is read).
    num_output_placeholders: int = 0
    num_preemptions: int = 0
    num_lora_wait_steps: int = 0
    # When the scheduler first passed it over because its adapter was not on the GPU yet.
    adapter_wait_start: float | None = None
    # Checked once its adapter's size is known: the request fits the KV cache beside it.
    fits_beside_adapter: bool = False
    # Prompt tokens served from the prefix cache at first admission (usage reporting).
    num_cached_tokens: int = 0
    # n > 1: the sibling whose prompt blocks this request shares once its prefill is done.
    fork_parent_id: str | None = None
    # Why it ended with FINISHED_ERROR, when the engine knows (e.g. its adapter failed to load).
    error: Exception | None = None

    @property
    def all_token_ids(self) -> list[int]:
        return self.prompt_token_ids + self.output_token_ids

    def token_ids_between(self, start: int, end: int) -> list[int]:
        """all_token_ids[start:end] (0 <= start <= end) without building the whole list: a
        decode step reads one token per request."""
        num_prompt = len(self.prompt_token_ids)
        if start >= num_prompt:
            return self.output_token_ids[start - num_prompt : end - num_prompt]
        if end <= num_prompt:
            return self.prompt_token_ids[start:end]
        return self.prompt_token_ids[start:] + self.output_token_ids[: end - num_prompt]

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    @property
    def num_tokens_with_placeholders(self) -> int:
        """Known tokens plus the ones steps in flight are sampling: what the next step
        continues from."""
        return self.num_tokens + self.num_output_placeholders

    @property
    def is_finished(self) -> bool:
        return self.status.is_finished

    @property
    def lora_int_id(self) -> int:
        return self.lora_request.lora_int_id if self.lora_request else 0


@dataclass
class Logprob:
    token_id: int
    logprob: float


@dataclass
class CompletionOutput:
    index: int
    text: str
    token_ids: list[int]
    finish_reason: str | None = None
    # Per generated token: (sampled token's logprob, top-N alternatives).
    logprobs: list[tuple[Logprob, list[Logprob]]] | None = None
    stop_reason: str | int | None = None

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass
class RequestOutput:
    """What the engine returns for one user request (all n completions)."""

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool = False
    num_cached_tokens: int = 0
    # Set when the request failed for a known reason (AsyncEngine raises it to the caller).
    error: Exception | None = None


def join_output(earlier: RequestOutput, later: RequestOutput) -> RequestOutput:
    """`earlier` extended in place by `later`, the next delta output of the same request, and
    returned: per completion index, tokens, text and logprobs appended and the finish and stop
    reasons replaced; the request's state (finished, cached tokens, error) taken from `later`.
    `earlier` must not have been handed out: it changes."""
    by_index = {c.index: c for c in earlier.outputs}
    appended = False
    for new in later.outputs:
        old = by_index.get(new.index)
        if old is None:  # a completion `earlier` did not have (a delta lists the changed ones)
            earlier.outputs.append(new)
            by_index[new.index] = new
            appended = True
            continue
        old.token_ids.extend(new.token_ids)
        old.text += new.text
        if new.logprobs is not None:
            if old.logprobs is None:
                old.logprobs = []
            old.logprobs.extend(new.logprobs)
        old.finish_reason, old.stop_reason = new.finish_reason, new.stop_reason
    if appended:
        earlier.outputs.sort(key=lambda c: c.index)
    earlier.finished, earlier.num_cached_tokens = later.finished, later.num_cached_tokens
    earlier.error = later.error
    return earlier
