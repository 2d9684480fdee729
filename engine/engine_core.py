"""EngineCore: the LLMEngine's step loop, and the messages it exchanges with AsyncEngine.

The loop applies the commands that arrived, runs one step, and sends one `StepMessage` per step
(or per batch of commands while idle): what each request gained since the last message (token
ids, text, logprobs: deltas, never the cumulative lists), the results of commands, adapter-load
events, and a stats snapshot every `STATS_INTERVAL_S`. Small messages keep the cost of a step's
hand-over constant however long the outputs grow, which matters when the core runs in a process
of its own (engine/core_transport.py).

    AsyncEngine ──Command──▶ EngineCore: apply commands, step(), send
                ◀──StepMessage (output deltas, command results, stats, adapter loads)──┘
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal, NamedTuple

from loraplex.engine.llm_engine import LLMEngine
from loraplex.engine.request import Logprob, LoRARequest, RequestOutput, SamplingParams
from loraplex.engine.stats import AdapterLoad, EngineStats

logger = logging.getLogger(__name__)

# While idle the loop waits this long for a command before checking that it should go on.
IDLE_WAIT_S = 0.05
# Stats ride on step messages when the requests' state changed (admissions, finishes, blocks),
# else at most this often (a snapshot lists every resident adapter).
STATS_INTERVAL_S = 0.02


# ---- commands (AsyncEngine -> core) --------------------------------------------------------


@dataclass(frozen=True)
class AddRequest:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    sampling_params: SamplingParams
    lora_request: LoRARequest | None
    priority: int
    fairness_key: str
    cache_salt: str | None


@dataclass(frozen=True)
class AbortRequest:
    request_id: str


@dataclass(frozen=True)
class AdapterCommand:
    """add_lora / remove_lora, answered by a `CommandResult` with this id."""

    command_id: int
    method: Literal["add_lora", "remove_lora"]
    lora_request: LoRARequest | None = None
    lora_int_id: int = 0


@dataclass(frozen=True)
class Shutdown:
    """Abort what is in flight, send a last message, stop."""


Command = AddRequest | AbortRequest | AdapterCommand | Shutdown


# ---- messages (core -> AsyncEngine) --------------------------------------------------------


# The per-request records of a step message are named tuples: StepMessage pickles them as
# plain tuples (see its __reduce__).
class CompletionDelta(NamedTuple):
    completion_index: int  # CompletionOutput.index (a tuple's `index` is a method)
    token_ids: list[int]  # new since the last message
    text: str  # new visible text since the last message
    logprobs: list[tuple[Logprob, list[Logprob]]] | None
    finish_reason: str | None
    stop_reason: str | int | None


class OutputDelta(NamedTuple):
    request_id: str
    completions: list[CompletionDelta]
    finished: bool
    num_cached_tokens: int
    error: Exception | None


@dataclass(frozen=True)
class CommandResult:
    request_id: str | None = None  # an AddRequest's, else None
    command_id: int = 0  # an AdapterCommand's
    value: object = None
    error: Exception | None = None


@dataclass
class StepMessage:
    deltas: list[OutputDelta] = field(default_factory=list)
    results: list[CommandResult] = field(default_factory=list)
    stats: EngineStats | None = None
    adapter_loads: list[AdapterLoad] = field(default_factory=list)
    died: str | None = None  # the core stopped on this error: every request fails

    def __reduce__(self) -> tuple[Callable[..., StepMessage], tuple[object, ...]]:
        """Pickled (the pipe of a core in its own process) with its deltas as plain tuples.

        A step's message carries one delta per running request, 64-256 of them, and plain
        tuples pickle faster than records. A message of 256 deltas takes 199 us to dump and
        325 us to load, against 423 and 484 us as dataclasses (medians of 15 runs, one CPU core
        here). The dump runs in the engine process beside the step loop. The load runs in the
        server process, where the reading thread holds the GIL that the event loop needs."""
        rows = [
            (d.request_id, [tuple(c) for c in d.completions], d.finished, d.num_cached_tokens,
             d.error)
            for d in self.deltas
        ]  # fmt: skip
        return _step_message, (rows, self.results, self.stats, self.adapter_loads, self.died)


_RawDelta = tuple[str, list[tuple[object, ...]], bool, int, Exception | None]


def _step_message(
    rows: list[_RawDelta],
    results: list[CommandResult],
    stats: EngineStats | None,
    adapter_loads: list[AdapterLoad],
    died: str | None,
) -> StepMessage:
    """A StepMessage from its pickled form (`StepMessage.__reduce__`)."""
    make = tuple.__new__  # the named tuples' own constructor, without its keyword handling
    deltas = [
        make(OutputDelta, (rid, [make(CompletionDelta, c) for c in cs], done, cached, error))
        for rid, cs, done, cached, error in rows
    ]
    return StepMessage(deltas, results, stats, adapter_loads, died)


class EngineCore:
    def __init__(
        self,
        engine: LLMEngine,
        receive: Callable[[float | None], Command | None],
        send: Callable[[StepMessage], None],
    ) -> None:
        """`receive(timeout)`: the next command, or None if none came (timeout None: do not
        wait); `send`: hand a message to AsyncEngine."""
        self.engine = engine
        self._receive = receive
        self._send = send
        assert engine.output_processor.deltas, "build the engine with output_deltas=True"
        self._live: set[str] = set()  # requests added and not finished or aborted
        self._loads: list[AdapterLoad] = []
        self._last_stats = 0.0
        self._last_state: tuple[int, int, int] = (-1, -1, -1)
        if engine.lora_manager is not None:
            engine.lora_manager.on_adapter_load = self._loads.append

    def run(self) -> None:
        """Serve until a Shutdown command. A bug in the engine ends the loop after a last
        message saying so (every request fails: never a hang)."""
        try:
            while self._serve_once():
                pass
        except BaseException as exc:
            logger.exception("engine core died")
            self._send(StepMessage(died=f"engine core died: {exc!r}"))
            raise

    def _serve_once(self) -> bool:
        message = StepMessage()
        busy = self.engine.has_unfinished_requests()
        command = self._receive(None if busy else IDLE_WAIT_S)
        while command is not None:
            if isinstance(command, Shutdown):
                self._abort_all(message)
                message.stats = self.engine.get_stats()
                self.engine.shutdown()
                self._send(message)
                return False
            self._apply(command, message)
            command = self._receive(None)
        if self.engine.has_unfinished_requests():
            self._add_outputs(self.engine.step(), message)
        now = time.monotonic()
        scheduler = self.engine.scheduler
        state = (
            len(scheduler.running),
            len(scheduler.waiting),
            self.engine.kv_cache_manager.num_free_blocks,
        )
        if state != self._last_state or now - self._last_stats >= STATS_INTERVAL_S:
            message.stats = self.engine.get_stats()
            self._last_stats, self._last_state = now, state
        message.adapter_loads, self._loads[:] = list(self._loads), []
        if message.deltas or message.results or message.adapter_loads or message.stats:
            self._send(message)
        if self.engine.dead is not None:  # its requests' errors are sent: now end the loop
            raise self.engine.dead
        return True

    def _apply(self, command: Command, message: StepMessage) -> None:
        engine = self.engine
        if isinstance(command, AddRequest):
            try:
                engine.add_request(
                    command.request_id,
                    {"prompt": command.prompt, "prompt_token_ids": command.prompt_token_ids},
                    command.sampling_params,
                    command.lora_request,
                    command.priority,
                    command.fairness_key,
                    command.cache_salt,
                )
            except Exception as exc:  # the caller raises it
                message.results.append(CommandResult(request_id=command.request_id, error=exc))
            else:
                self._live.add(command.request_id)
                message.results.append(CommandResult(request_id=command.request_id))
        elif isinstance(command, AbortRequest):
            if command.request_id in self._live:
                self._add_outputs(engine.abort_request(command.request_id), message)
        elif isinstance(command, AdapterCommand):
            try:
                if command.method == "add_lora":
                    assert command.lora_request is not None
                    value: object = engine.add_lora(command.lora_request)
                else:
                    value = engine.remove_lora(command.lora_int_id)
            except Exception as exc:
                message.results.append(CommandResult(command_id=command.command_id, error=exc))
            else:
                message.results.append(CommandResult(command_id=command.command_id, value=value))

    def _abort_all(self, message: StepMessage) -> None:
        for request_id in list(self._live):
            self._add_outputs(self.engine.abort_request(request_id), message)

    def _add_outputs(self, outputs: list[RequestOutput], message: StepMessage) -> None:
        for output in outputs:
            if output.request_id not in self._live:
                continue  # aborted earlier: nothing more to say
            message.deltas.append(self._delta(output))
            if output.finished:
                self._live.discard(output.request_id)

    @staticmethod
    def _delta(output: RequestOutput) -> OutputDelta:
        """`output` (already a delta: the engine's `output_deltas`) as a message record."""
        completions = [
            CompletionDelta(
                c.index, c.token_ids, c.text, c.logprobs, c.finish_reason, c.stop_reason
            )
            for c in output.outputs
        ]
        return OutputDelta(
            output.request_id, completions, output.finished, output.num_cached_tokens, output.error
        )
