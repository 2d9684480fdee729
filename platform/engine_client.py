"""EngineClient: the platform's side of `AsyncEngine`.

Adds what the engine should not know about: tokenization off the event loop, admission
(draining, queue-depth backpressure), tracking of requests in flight, and a graceful drain.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncGenerator, Sequence
from typing import cast

import anyio

from loraplex.engine.async_engine import AsyncEngine
from loraplex.engine.request import LoRARequest, RequestOutput, SamplingParams
from loraplex.engine.stats import EngineStats
from loraplex.engine.tokenizer import Tokenizer
from loraplex.platform.crud import AdapterRef
from loraplex.platform.engine_stream import EngineStream
from loraplex.platform.errors import EngineOverloadedError, ServiceUnavailableError
from loraplex.platform.ratelimit import BackpressureGate

logger = logging.getLogger(__name__)


class EngineClient:
    def __init__(
        self, engine: AsyncEngine, *, max_waiting_requests: int, max_waiting_tokens: int
    ) -> None:
        self.engine = engine
        self.backpressure = BackpressureGate(max_waiting_requests, max_waiting_tokens)
        self._inflight: set[str] = set()
        self._idle = asyncio.Event()
        self._idle.set()
        self._token_strings: dict[int, str] = {}
        self.is_draining = False

    @property
    def model_name(self) -> str:
        return self.engine.model_name

    @property
    def max_model_len(self) -> int:
        return self.engine.max_model_len

    @property
    def tokenizer(self) -> Tokenizer:
        return self.engine.tokenizer

    @property
    def is_ready(self) -> bool:
        return self.engine.is_running and not self.is_draining

    @property
    def num_inflight(self) -> int:
        return len(self._inflight)

    def get_stats(self) -> EngineStats:
        return self.engine.get_stats()

    # ---- tokenization (in a worker thread: a long prompt must not stall other streams) ----

    async def encode_text(self, text: str) -> list[int]:
        return await anyio.to_thread.run_sync(self.tokenizer.encode, text)

    async def encode_chat(self, messages: Sequence[dict[str, str]]) -> list[int]:
        def render_and_encode() -> list[int]:
            prompt = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True)
            # The template already wrote any BOS it wants.
            return self.tokenizer.encode(prompt, add_special_tokens=False)

        return await anyio.to_thread.run_sync(render_and_encode)

    def token_string(self, token_id: int) -> str:
        """One token's text (for logprobs), cached: the vocabulary bounds the cache."""
        text = self._token_strings.get(token_id)
        if text is None:
            text = self.tokenizer.decode([token_id], skip_special_tokens=False)
            self._token_strings[token_id] = text
        return text

    # ---- admission and generation -----------------------------------------------------------

    def check_admission(self) -> None:
        """503 while draining; 429 engine_overloaded while the waiting queue is past its bound."""
        if self.is_draining or not self.engine.is_running:
            raise ServiceUnavailableError(
                "the server is shutting down" if self.is_draining else "the engine is not running"
            )
        retry_after = self.backpressure.check(self.engine.get_stats())
        if retry_after is not None:
            raise EngineOverloadedError(
                "the engine is overloaded; retry later", retry_after_s=retry_after
            )

    def generate(
        self,
        *,
        request_id: str,
        prompt_token_ids: list[int],
        sampling_params: SamplingParams,
        adapter: AdapterRef | None,
        priority: int,
        tenant_key: str,
        stream: bool = True,
    ) -> EngineStream:
        """Start one engine request and return its stream of delta outputs (without `stream`,
        only the first and then the rest joined: for a caller that only collects them). The
        caller must `close()` it however it ends: that aborts the request if it is still running
        and waits for the engine's last output; the stream's totals then are the ones billed."""
        lora_request = None
        if adapter is not None:
            lora_request = LoRARequest(
                lora_name=adapter.model_id,
                lora_int_id=adapter.adapter_id,
                lora_path=adapter.path,
                content_hash=adapter.content_hash,
            )
        # The tenant is both the fairness key and the prefix-cache salt: its cached prompt
        # blocks are never shared with (nor timed by) another tenant (CVE-2025-46570).
        source = self.engine.generate(
            prompt_token_ids,
            sampling_params,
            request_id,
            lora_request=lora_request,
            priority=priority,
            fairness_key=tenant_key,
            cache_salt=tenant_key,
            delta=True,
            stream=stream,
        )
        self._inflight.add(request_id)
        self._idle.clear()
        return EngineStream(
            request_id,
            cast(AsyncGenerator[RequestOutput, None], source),
            abort=lambda: self.engine.abort(request_id),
            on_done=lambda: self._on_stream_done(request_id),
        )

    def _on_stream_done(self, request_id: str) -> None:
        self._inflight.discard(request_id)
        if not self._inflight:
            self._idle.set()

    # ---- lifecycle ----------------------------------------------------------------------

    def start_draining(self) -> None:
        """New requests get 503 from now on (called from the SIGTERM handler too)."""
        self.is_draining = True

    async def start(self) -> None:
        await self.engine.start()

    async def drain(self, grace_s: float) -> None:
        """Stop admitting; let requests in flight finish for up to `grace_s`, then abort them."""
        self.start_draining()
        with anyio.move_on_after(grace_s):
            await self._idle.wait()
        if self._inflight:
            logger.warning("grace period over: aborting %d requests", len(self._inflight))
            for request_id in list(self._inflight):
                await self.engine.abort(request_id)
            with anyio.move_on_after(5):
                await self._idle.wait()

    async def shutdown(self) -> None:
        await self.engine.shutdown()
