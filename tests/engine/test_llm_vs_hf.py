"""The engine's greedy outputs equal HF transformers' token for token."""

from __future__ import annotations

import random

import pytest

from loraplex.engine import LLM, SamplingParams
from loraplex.platform.demo.tiny_checkpoint import write_random_checkpoint
from tests.engine.hf_reference import hf_greedy

MAX_TOKENS = 8


@pytest.fixture(scope="module", params=["llama", "mistral", "qwen2"])
def checkpoint(request, tmp_path_factory):
    kwargs = {"tie_word_embeddings": True} if request.param == "qwen2" else {}
    return write_random_checkpoint(tmp_path_factory.mktemp(request.param), request.param, **kwargs)


def make_prompts(seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(5, 500) for _ in range(n)] for n in (3, 17, 40, 9, 1, 26)]


def run_engine(llm: LLM, prompts: list[list[int]]) -> list[list[int]]:
    """Generate step by step, checking the KV bookkeeping after every step."""
    engine = llm.engine
    params = SamplingParams(max_tokens=MAX_TOKENS, min_tokens=MAX_TOKENS, temperature=0.0)
    for i, prompt in enumerate(prompts):
        engine.add_request(str(i), {"prompt_token_ids": prompt}, params)
    results: dict[str, list[int]] = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                results[out.request_id] = out.outputs[0].token_ids
        engine.kv_cache_manager.check_integrity()
    assert engine.kv_cache_manager.num_free_blocks == engine.kv_cache_manager.num_blocks
    return [results[str(i)] for i in range(len(prompts))]


@pytest.mark.parametrize(
    "engine_kwargs",
    [
        pytest.param({}, id="default"),
        pytest.param({"max_num_batched_tokens": 7, "block_size": 4}, id="chunked-prefill"),
        pytest.param(
            {"num_kv_blocks": 14, "block_size": 4, "preemption_mode": "swap"}, id="preemption-swap"
        ),
        pytest.param(
            {"num_kv_blocks": 14, "block_size": 4, "preemption_mode": "recompute"},
            id="preemption-recompute",
        ),
        pytest.param(
            {"num_kv_blocks": 14, "block_size": 4, "swap_space_gb": 1e-6},
            id="preemption-swap-space-short",
        ),
    ],
)
def test_greedy_matches_hf(checkpoint, engine_kwargs):
    prompts = make_prompts()
    expected = hf_greedy(checkpoint, prompts, MAX_TOKENS)
    llm = LLM(str(checkpoint), device="cpu", dtype="float32", **engine_kwargs)
    assert run_engine(llm, prompts) == expected
    stats = llm.engine.get_stats()
    # Every generated token but each request's last was computed by a step, besides prompts.
    assert stats.num_scheduled_tokens >= stats.num_generated_tokens > 0
    assert stats.num_steps > 0 and stats.step_seconds > 0
    # parts of the steps' time
    assert stats.launch_seconds > 0 and stats.result_wait_seconds >= 0
    assert stats.launch_seconds + stats.result_wait_seconds <= stats.step_seconds
    if engine_kwargs.get("preemption_mode") == "swap":
        assert stats.num_preemptions_swap > 0
    if engine_kwargs.get("preemption_mode") == "recompute" or "swap_space_gb" in engine_kwargs:
        assert stats.num_preemptions_recompute > 0


def test_smollm2_batch_matches_hf_under_chunking_and_preemption(smollm2_checkpoint):
    """The real demo model: a batch of different lengths, chunked prefill and preemption."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(smollm2_checkpoint)
    texts = [
        "The capital of France is",
        "Once upon a time, in a small village by the sea,",
        "def fibonacci(n):",
    ]
    prompts = [tokenizer(t).input_ids for t in texts]
    expected = hf_greedy(smollm2_checkpoint, prompts, MAX_TOKENS)
    llm = LLM(
        str(smollm2_checkpoint),
        device="cpu",
        dtype="float32",
        block_size=4,
        num_kv_blocks=8,
        max_num_batched_tokens=6,
    )
    assert run_engine(llm, prompts) == expected
    assert llm.engine.scheduler.num_preemptions > 0
    assert llm.tokenizer.decode(expected[0]).startswith(" Paris")
