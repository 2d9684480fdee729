"""Drive an LLMEngine step by step in tests, checking KV bookkeeping after every step."""

from __future__ import annotations

from collections.abc import Callable

from loraplex.engine import LLM
from loraplex.engine.llm_engine import LLMEngine
from loraplex.engine.request import RequestOutput


def check_engine(engine: LLMEngine) -> None:
    engine.kv_cache_manager.check_integrity()
    if engine.lora_manager is not None:
        engine.lora_manager.check_integrity()


def run_to_completion(
    engine: LLMEngine, on_step: Callable[[int], None] | None = None
) -> dict[str, RequestOutput]:
    finished: dict[str, RequestOutput] = {}
    step = 0
    while engine.has_unfinished_requests():
        if on_step is not None:
            on_step(step)
        for out in engine.step():
            if out.finished:
                finished[out.request_id] = out
        check_engine(engine)
        step += 1
    kv = engine.kv_cache_manager
    assert not kv.req_to_blocks, "every request's blocks are back at the end"
    held = engine.lora_manager.pool.num_blocks_held if engine.lora_manager else 0
    assert kv.num_free_blocks + held == kv.num_blocks, "the rest hold idle resident adapters"
    assert kv.swap_space.num_free_blocks == kv.swap_space.num_cpu_blocks, "and every CPU block"
    return finished


def make_llm(checkpoint, **kwargs) -> LLM:
    return LLM(str(checkpoint), device="cpu", dtype="float32", **kwargs)
