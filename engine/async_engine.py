"""AsyncEngine: the only door into the engine for the server.

The engine's step loop (engine/engine_core.py) runs in a thread of this process or in a process
of its own (engine/core_transport.py); AsyncEngine sends it commands and turns its per-step
messages back into each request's stream of `RequestOutput`s, on the event loop: cumulative
(each output holds everything so far), or with `delta=True` only what came since the last
one (what the server reads: its per-step work then does not grow with the output's length).

    generate() ──AddRequest/AbortRequest──▶ EngineCore (thread or process)
    per-request output ◀── one call_soon_threadsafe per step ◀── StepMessage (deltas, stats)

Steps a caller did not read in time merge into one output (`output_collector.py`): under
load, readers do less work per token instead of falling further behind.

Leaving a stream early (or the task being cancelled: a client that hung up) aborts the request.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

from loraplex.engine.core_transport import CoreTransport, ProcessTransport, ThreadTransport
from loraplex.engine.engine_args import create_engine_config
from loraplex.engine.engine_core import (
    AbortRequest,
    AdapterCommand,
    AddRequest,
    CommandResult,
    Shutdown,
    StepMessage,
)
from loraplex.engine.errors import EngineDeadError, InvalidParameterError
from loraplex.engine.llm_engine import LLMEngine, PromptType
from loraplex.engine.output_collector import RequestOutputCollector
from loraplex.engine.request import LoRARequest, RequestOutput, SamplingParams
from loraplex.engine.stats import AdapterLoad, EngineStats
from loraplex.engine.tokenizer import Tokenizer

logger = logging.getLogger(__name__)


class AsyncEngine:
    def __init__(self, transport: CoreTransport, tokenizer: Tokenizer, model: str) -> None:
        self.transport = transport
        self.tokenizer = tokenizer
        self.model_name = model.rstrip("/").split("/")[-1]
        self.max_model_len = transport.info.max_model_len
        self.vocab_size = transport.info.vocab_size
        self._requests: dict[str, RequestOutputCollector] = {}
        self._pending: dict[int, asyncio.Future[Any]] = {}
        self._command_ids = itertools.count(1)
        self._stats = EngineStats()
        self._on_adapter_load: Callable[[AdapterLoad], None] | None = None
        self._dead: str | None = None
        self._started = False
        self._stopping = False

    @classmethod
    def from_engine_args(
        cls, model: str, *, engine_process: bool = False, **kwargs: Any
    ) -> AsyncEngine:
        """Build the engine: in this process (a thread runs its steps), or with
        `engine_process` in a process of its own (what the server does). Blocks while the
        model loads."""
        config = create_engine_config(model, **kwargs)
        if engine_process:
            return cls(ProcessTransport(config), Tokenizer.from_model_dir(model), model)
        engine = LLMEngine(config, output_deltas=True)
        return cls(ThreadTransport(engine), engine.tokenizer, model)

    @property
    def engine(self) -> LLMEngine:
        """The LLMEngine itself, when it runs in this process (tests inspect it)."""
        assert isinstance(self.transport, ThreadTransport), "the engine runs in a process"
        return self.transport.engine

    @property
    def is_running(self) -> bool:
        return self._started and self._dead is None and self.transport.is_alive

    # ---- lifecycle ---------------------------------------------------------------------

    async def start(self) -> None:
        if self._started:
            return
        loop = asyncio.get_running_loop()

        def on_message(message: StepMessage) -> None:  # called from the transport's thread
            loop.call_soon_threadsafe(self._dispatch, message)

        self.transport.start(on_message)
        self._started = True

    async def shutdown(self) -> None:
        """Stop the step loop; requests still in flight end with finish_reason 'abort'."""
        if not self._started or not self.transport.is_alive:
            return
        self._stopping = True
        self.transport.send(Shutdown())
        await asyncio.to_thread(self.transport.join)

    # ---- requests ----------------------------------------------------------------------

    async def generate(
        self,
        prompt: PromptType,
        sampling_params: SamplingParams,
        request_id: str,
        lora_request: LoRARequest | None = None,
        priority: int = 0,
        fairness_key: str = "",
        cache_salt: str | None = None,
        delta: bool = False,
        stream: bool = True,
    ) -> AsyncIterator[RequestOutput]:
        """Stream outputs of one request until it finishes: cumulative, or with `delta` only
        the completions that changed since the last output and what they gained
        (`request.join_output` puts deltas back together). Without `stream`, two outputs at
        most: the first and, merged, everything after it (`output_collector.py`).

        Invalid requests raise before anything is yielded. Leaving the loop early (or the
        task being cancelled, e.g. on client disconnect) aborts the request at once. For a
        token-id prompt the add is queued before the first suspension, so an `abort()` issued
        once the first `__anext__` has begun is applied after the add (commands run in order).
        """
        if not self.is_running:
            raise EngineDeadError(self._dead or "the engine is not running")
        if request_id in self._requests:
            raise ValueError(f"request id {request_id!r} is already in use")
        text, token_ids = await self._tokenize(prompt)
        loop = asyncio.get_running_loop()
        request = RequestOutputCollector(text, token_ids, loop.create_future(), delta, stream)
        self._requests[request_id] = request
        finished = False
        try:
            # Inside the try: a caller cancelled while the add is on its way (a client that
            # hung up at once) still aborts the request, which the core adds first.
            self.transport.send(
                AddRequest(
                    request_id, text, token_ids, sampling_params, lora_request, priority,
                    fairness_key, cache_salt,
                )
            )  # fmt: skip
            await request.added
            while not finished:
                if not request.has_output and request.failure is None:
                    request.wake.clear()
                    await request.wake.wait()
                if not request.has_output:
                    assert request.failure is not None
                    raise request.failure
                item = request.read(request_id)
                finished = item.finished
                if item.error is not None:
                    raise item.error
                yield item
        finally:
            self._requests.pop(request_id, None)
            if not finished and self.is_running:
                self.transport.send(AbortRequest(request_id))

    async def abort(self, request_id: str) -> None:
        if self.is_running:
            self.transport.send(AbortRequest(request_id))

    def get_stats(self) -> EngineStats:
        """The latest snapshot the engine sent (never blocks)."""
        return self._stats

    def observe_adapter_loads(self, callback: Callable[[AdapterLoad], None]) -> None:
        """Call `callback` (on the event loop) after every adapter load."""
        self._on_adapter_load = callback

    async def _tokenize(self, prompt: PromptType) -> tuple[str | None, list[int]]:
        if isinstance(prompt, str):
            # Tokenize off the event loop: a long prompt must not stall other clients.
            return prompt, await asyncio.to_thread(self.tokenizer.encode, prompt)
        if isinstance(prompt, dict):
            return prompt.get("prompt"), list(prompt["prompt_token_ids"])
        if not isinstance(prompt, list):
            raise InvalidParameterError("must be text or token ids", param="prompt")
        return None, list(prompt)

    # ---- adapters ----------------------------------------------------------------------

    async def add_lora(self, lora_request: LoRARequest) -> None:
        """Load and validate an adapter now, in the engine (else it loads on first use)."""
        await self._call(AdapterCommand(next(self._command_ids), "add_lora", lora_request))

    async def remove_lora(self, lora_int_id: int) -> bool:
        """Unregister an adapter; its requests in flight finish first."""
        command = AdapterCommand(next(self._command_ids), "remove_lora", lora_int_id=lora_int_id)
        return bool(await self._call(command))

    async def _call(self, command: AdapterCommand) -> Any:
        if not self.is_running:
            raise EngineDeadError(self._dead or "the engine is not running")
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._pending[command.command_id] = future
        self.transport.send(command)
        return await future

    # ---- messages from the core (on the event loop) ------------------------------------

    def _dispatch(self, message: StepMessage) -> None:
        if message.stats is not None:  # first: a caller never sees older stats than outputs
            self._stats = message.stats
        for result in message.results:
            self._settle(result)
        for delta in message.deltas:
            request = self._requests.get(delta.request_id)
            if request is not None:
                request.apply(delta)
        if self._on_adapter_load is not None:
            for load in message.adapter_loads:
                self._on_adapter_load(load)
        if message.died is not None and self._dead is None:
            self._fail_everything(message.died)

    def _settle(self, result: CommandResult) -> None:
        future: asyncio.Future[Any] | None
        if result.request_id is not None:
            request = self._requests.get(result.request_id)
            future = request.added if request is not None else None
        else:
            future = self._pending.pop(result.command_id, None)
        if future is None or future.done():
            return
        if result.error is not None:
            future.set_exception(result.error)
        else:
            future.set_result(result.value)

    def _fail_everything(self, reason: str) -> None:
        """The core is gone: every waiting caller gets EngineDeadError, never a hang."""
        self._dead = reason
        if not self._stopping:
            logger.error("%s", reason)
        for request in self._requests.values():
            if not request.added.done():
                request.added.set_exception(EngineDeadError(reason))
            request.fail(EngineDeadError(reason))
        for future in self._pending.values():
            if not future.done():
                future.set_exception(EngineDeadError(reason))
        self._pending.clear()
