"""AsyncEngine: the only door into the engine for the server.

The LLMEngine runs in one background thread (model steps block; the event loop must not).
Callers talk to it through a command inbox; outputs come back through one asyncio.Queue per
request, handed over with `call_soon_threadsafe`.

    event loop ──add/abort──▶ inbox ──▶ engine thread: apply commands, step(), publish outputs
               ◀──RequestOutput── per-request queue ◀──┘
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

from loraplex.engine.errors import EngineDeadError
from loraplex.engine.llm_engine import LLMEngine, PromptType
from loraplex.engine.request import LoRARequest, RequestOutput, SamplingParams
from loraplex.engine.stats import AdapterLoad, EngineStats
from loraplex.engine.tokenizer import Tokenizer

logger = logging.getLogger(__name__)

_IDLE_WAIT_S = 0.05


@dataclass
class _Stream:
    loop: asyncio.AbstractEventLoop
    queue: asyncio.Queue[RequestOutput | BaseException]

    def put(self, item: RequestOutput | BaseException) -> None:
        self.loop.call_soon_threadsafe(self.queue.put_nowait, item)


class AsyncEngine:
    def __init__(self, engine: LLMEngine) -> None:
        self.engine = engine
        self._inbox: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
        self._wakeup = threading.Event()
        self._streams: dict[str, _Stream] = {}
        self._thread: threading.Thread | None = None
        self._stopping = False
        self._stats: EngineStats = engine.get_stats()

    @classmethod
    def from_engine_args(cls, model: str, **kwargs: Any) -> AsyncEngine:
        return cls(LLMEngine.from_engine_args(model, **kwargs))

    @property
    def tokenizer(self) -> Tokenizer:
        return self.engine.tokenizer

    @property
    def model_name(self) -> str:
        return self.engine.config.model.model.rstrip("/").split("/")[-1]

    @property
    def max_model_len(self) -> int:
        return self.engine.max_model_len

    @property
    def is_running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    # ---- lifecycle ---------------------------------------------------------------------

    async def start(self) -> None:
        if self.is_running:
            return
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="loraplex-engine", daemon=True)
        self._thread.start()

    async def shutdown(self) -> None:
        """Stop the step loop; requests still in flight end with finish_reason 'abort'."""
        if self._thread is None:
            return
        self._submit(self._abort_all)
        self._stopping = True
        self._wakeup.set()
        await asyncio.to_thread(self._thread.join)
        self._thread = None

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
    ) -> AsyncIterator[RequestOutput]:
        """Stream cumulative outputs of one request until it finishes.

        Invalid requests raise before anything is yielded. Leaving the loop early (or the
        task being cancelled, e.g. on client disconnect) aborts the request at once. For a
        token-id prompt the add is queued before the first suspension, so an `abort()` issued
        once the first `__anext__` has begun is applied after the add (commands run in order).
        """
        if not self.is_running:
            raise EngineDeadError("the engine is not running")
        if isinstance(prompt, str):
            # Tokenize off the event loop: a long prompt must not stall other clients.
            text, token_ids = await asyncio.to_thread(self.engine.tokenize_prompt, prompt)
            prompt = {"prompt": text, "prompt_token_ids": token_ids}
        loop = asyncio.get_running_loop()
        stream = _Stream(loop, asyncio.Queue())
        added: asyncio.Future[None] = loop.create_future()
        accepted = False  # set in the engine thread once the engine holds the request

        def add() -> None:
            nonlocal accepted
            try:
                self.engine.add_request(
                    request_id,
                    prompt,
                    sampling_params,
                    lora_request,
                    priority,
                    fairness_key,
                    cache_salt,
                )
            except Exception as exc:  # handed to the caller, who raises it
                loop.call_soon_threadsafe(_settle, added, None, exc)
                return
            accepted = True
            self._streams[request_id] = stream
            loop.call_soon_threadsafe(_settle, added, None, None)

        def abort_if_accepted() -> None:
            if accepted:  # never abort another request that happens to hold this id
                self._abort(request_id)

        finished = False
        try:
            # Inside the try: a caller cancelled while the add is queued (a client that hung
            # up at once) still aborts the request, which the engine thread adds first.
            self._submit(add)
            await added
            while not finished:
                item = await stream.queue.get()
                if isinstance(item, BaseException):
                    raise item
                finished = item.finished
                if item.error is not None:
                    raise item.error
                yield item
        finally:
            if not finished:
                self._submit(abort_if_accepted)

    async def abort(self, request_id: str) -> None:
        self._submit(lambda: self._abort(request_id))

    def get_stats(self) -> EngineStats:
        """The latest snapshot published by the engine thread (never blocks)."""
        return self._stats

    def observe_adapter_loads(self, callback: Callable[[AdapterLoad], None]) -> None:
        """Call `callback` after every adapter load (from the engine thread: keep it cheap and
        thread-safe, e.g. a Prometheus observation)."""
        if self.engine.lora_manager is not None:
            self.engine.lora_manager.on_adapter_load = callback

    # ---- adapters ----------------------------------------------------------------------

    async def add_lora(self, lora_request: LoRARequest) -> None:
        """Load an adapter now, in the engine thread (else it loads on first use)."""
        await self._call(lambda: self.engine.add_lora(lora_request))

    async def remove_lora(self, lora_int_id: int) -> bool:
        """Unregister an adapter; its requests in flight finish first."""
        return bool(await self._call(lambda: self.engine.remove_lora(lora_int_id)))

    async def _call(self, fn: Callable[[], Any]) -> Any:
        """Run `fn` in the engine thread between steps and return its result."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()

        def command() -> None:
            try:
                result = fn()
            except Exception as exc:
                loop.call_soon_threadsafe(_settle, future, None, exc)
            else:
                loop.call_soon_threadsafe(_settle, future, result, None)

        self._submit(command)
        return await future

    # ---- the engine thread -------------------------------------------------------------

    def _submit(self, command: Callable[[], None]) -> None:
        self._inbox.put(command)
        self._wakeup.set()

    def _run(self) -> None:
        try:
            while not self._stopping or not self._inbox.empty():
                self._apply_commands()
                if self.engine.has_unfinished_requests():
                    self._step()
                else:
                    self._wakeup.wait(_IDLE_WAIT_S)
                    self._wakeup.clear()
        except BaseException as exc:  # a bug in the engine: fail every stream, never hang
            logger.exception("engine thread died")
            for stream in self._streams.values():
                stream.put(EngineDeadError(f"engine thread died: {exc!r}"))
            self._streams.clear()
            raise

    def _apply_commands(self) -> None:
        while True:
            try:
                command = self._inbox.get_nowait()
            except queue.Empty:
                return
            command()

    def _step(self) -> None:
        outputs = self.engine.step()
        self._stats = self.engine.get_stats()  # before outputs: a caller never sees old stats
        for output in outputs:
            self._publish(output)

    def _publish(self, output: RequestOutput) -> None:
        stream = self._streams.get(output.request_id)
        if stream is None:
            return
        stream.put(output)
        if output.finished:
            del self._streams[output.request_id]

    def _abort(self, request_id: str) -> None:
        outputs = self.engine.abort_request(request_id)
        self._stats = self.engine.get_stats()
        for output in outputs:
            self._publish(output)
        self._streams.pop(request_id, None)

    def _abort_all(self) -> None:
        for request_id in list(self._streams):
            self._abort(request_id)


def _settle(future: asyncio.Future[Any], result: Any, error: BaseException | None) -> None:
    if future.done():
        return
    if error is None:
        future.set_result(result)
    else:
        future.set_exception(error)
