"""LLM: the offline API (vLLM's shape): generate for a list of prompts, return when all done."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Sequence
from typing import Any

from tqdm.auto import tqdm

from loraplex.engine.core_transport import freeze_startup_heap
from loraplex.engine.llm_engine import LLMEngine, PromptType
from loraplex.engine.request import LoRARequest, RequestOutput, SamplingParams
from loraplex.engine.tokenizer import Tokenizer


class LLM:
    def __init__(self, model: str, **kwargs: Any) -> None:
        """Build the engine, then freeze the process's heap as the server's engine process does
        (`freeze_startup_heap`): otherwise each full garbage collection walks the ~600,000
        objects alive after start-up (about one per 10 s of generating), a pause of 100-250 ms
        in which the GPU runs out of queued work. The heap is unfrozen when this LLM is
        collected, so that an engine given up (with the reference cycles it holds) is still
        freed; with several LLMs alive, the first one collected unfreezes it for all."""
        self.engine = LLMEngine.from_engine_args(model, **kwargs)
        self._next_id = 0
        freeze_startup_heap()
        weakref.finalize(self, gc.unfreeze)

    @property
    def tokenizer(self) -> Tokenizer:
        return self.engine.tokenizer

    def generate(
        self,
        prompts: PromptType | Sequence[PromptType],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        lora_request: LoRARequest | Sequence[LoRARequest | None] | None = None,
        priority: int | Sequence[int] | None = None,
        use_tqdm: bool = True,
    ) -> list[RequestOutput]:
        """Generate for every prompt; outputs come back in the order of `prompts`."""
        prompt_list = _as_list(prompts)
        params = _broadcast(
            sampling_params or SamplingParams(), len(prompt_list), "sampling_params"
        )
        loras = _broadcast(lora_request, len(prompt_list), "lora_request")
        priorities = _broadcast(
            priority if priority is not None else 0, len(prompt_list), "priority"
        )
        ids = []
        for prompt, p, lora, prio in zip(prompt_list, params, loras, priorities, strict=True):
            request_id = str(self._next_id)
            self._next_id += 1
            self.engine.add_request(request_id, prompt, p, lora_request=lora, priority=prio)
            ids.append(request_id)
        return self._run(ids, use_tqdm)

    def _run(self, request_ids: list[str], use_tqdm: bool) -> list[RequestOutput]:
        finished: dict[str, RequestOutput] = {}
        bar = tqdm(total=len(request_ids), desc="Generating", disable=not use_tqdm)
        try:
            while self.engine.has_unfinished_requests():
                for output in self.engine.step():
                    if output.finished:
                        finished[output.request_id] = output
                        bar.update(1)
        except BaseException:
            for request_id in request_ids:
                if request_id not in finished:
                    self.engine.abort_request(request_id)
            raise
        finally:
            bar.close()
        if self.engine.dead is not None:  # its requests ended with an error: say why
            raise self.engine.dead
        return [finished[request_id] for request_id in request_ids]

    def shutdown(self) -> None:
        """Stop the engine's worker processes, if any (tensor parallelism); also done when
        the LLM is garbage-collected or the interpreter exits."""
        self.engine.shutdown()

    def add_lora(self, lora_request: LoRARequest) -> bool:
        return self.engine.add_lora(lora_request)

    def remove_lora(self, lora_int_id: int) -> bool:
        return self.engine.remove_lora(lora_int_id)

    def list_loras(self) -> list[int]:
        return self.engine.list_loras()


def _as_list(prompts: PromptType | Sequence[PromptType]) -> list[PromptType]:
    if isinstance(prompts, (str, dict)):
        return [prompts]
    if prompts and all(isinstance(t, int) for t in prompts):
        return [list(prompts)]  # type: ignore[arg-type]  # one prompt of token ids
    return list(prompts)  # type: ignore[arg-type]


def _broadcast(value: Any, n: int, name: str) -> list[Any]:
    if isinstance(value, (list, tuple)):
        if len(value) != n:
            raise ValueError(f"{name}: got {len(value)} values for {n} prompts")
        return list(value)
    return [value] * n
