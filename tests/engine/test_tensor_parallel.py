"""tensor_parallel_size=2 on the CPU (gloo, one spawned worker): greedy outputs equal the
single-process engine's and HF transformers' token for token, under chunked prefill and
preemption (faults: test_tensor_parallel_faults.py).

Engines are shared per module (a spawned worker takes ~2 s to start)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from loraplex.engine import LLM, SamplingParams
from loraplex.engine.distributed.tp_runner import TensorParallelRunner
from loraplex.engine.llm_engine import LLMEngine
from loraplex.engine.runner.model_runner import ModelRunner
from tests.checkpoints import CheckpointFactory
from tests.engine.engine_driver import run_to_completion
from tests.engine.hf_reference import hf_greedy
from tests.engine.tensor_parallel_models import (
    MODELS,
    PREEMPTION,
    SMALL,
    TP,
    make_llm,
    make_prompts,
)

pytestmark = pytest.mark.timeout(300)

MAX_TOKENS = 8


def generate(engine: LLMEngine, prompts: list[list[int]]) -> list[list[int]]:
    params = SamplingParams(max_tokens=MAX_TOKENS, min_tokens=MAX_TOKENS, temperature=0.0)
    base = engine.num_steps
    for i, prompt in enumerate(prompts):
        engine.add_request(f"{base}-{i}", {"prompt_token_ids": prompt}, params)
    finished = run_to_completion(engine)
    return [finished[f"{base}-{i}"].outputs[0].token_ids for i in range(len(prompts))]


@pytest.fixture(scope="module", params=list(MODELS))
def model(
    request: pytest.FixtureRequest, checkpoint_factory: CheckpointFactory
) -> Iterator[tuple[str, Path, LLM]]:
    arch, kwargs = MODELS[request.param]
    checkpoint = checkpoint_factory(arch, **kwargs)
    llm = make_llm(checkpoint, TP, preemption_mode=PREEMPTION[request.param], **SMALL)
    yield request.param, checkpoint, llm
    llm.shutdown()


def test_tp2_greedy_equals_one_process_and_hf_under_chunking_and_preemption(
    model: tuple[str, Path, LLM],
) -> None:
    name, checkpoint, llm = model
    assert isinstance(llm.engine.runner, TensorParallelRunner)
    prompts = make_prompts()
    expected = hf_greedy(checkpoint, prompts, MAX_TOKENS)
    single = make_llm(checkpoint, 1, preemption_mode=PREEMPTION[name], **SMALL)
    assert type(single.engine.runner) is ModelRunner
    assert generate(single.engine, prompts) == expected
    assert generate(llm.engine, prompts) == expected
    stats = llm.engine.get_stats()
    if PREEMPTION[name] == "swap":
        assert stats.num_preemptions_swap > 0
    else:
        assert stats.num_preemptions_recompute > 0
    # Chunked: the 40-token prompt took several steps of at most 7 tokens.
    assert stats.num_steps > 40 // SMALL["max_num_batched_tokens"]


def test_tp2_serves_a_second_batch_and_the_offline_api(model: tuple[str, Path, LLM]) -> None:
    """The same engine again (prefix-cache hits on repeated prompts), through LLM.generate."""
    name, checkpoint, llm = model
    prompts = make_prompts()[:3]
    expected = hf_greedy(checkpoint, prompts, MAX_TOKENS)
    params = SamplingParams(max_tokens=MAX_TOKENS, min_tokens=MAX_TOKENS, temperature=0.0)
    requests = [{"prompt_token_ids": p} for p in prompts]
    outputs = llm.generate(requests, params, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in outputs] == expected
    hits = llm.engine.get_stats().prefix_cache_hit_tokens
    outputs = llm.generate(requests, params, use_tqdm=False)  # the same prompts again
    assert [o.outputs[0].token_ids for o in outputs] == expected
    assert llm.engine.get_stats().prefix_cache_hit_tokens > hits


def test_each_rank_holds_only_its_shard(model: tuple[str, Path, LLM]) -> None:
    name, checkpoint, llm = model
    runner = llm.engine.runner
    arch = runner.arch
    attn = runner.model.model.layers[0].self_attn
    assert attn.num_heads == arch.num_attention_heads // TP
    assert runner.num_kv_heads == max(1, arch.num_key_value_heads // TP)
    assert runner.kv_cache.shape[-2] == runner.num_kv_heads
    mlp = runner.model.model.layers[0].mlp
    assert mlp.down_proj.input_size == arch.intermediate_size // TP
    vocab_rows = runner.model.model.embed_tokens.weight.shape[0]
    assert vocab_rows == -(-arch.vocab_size // TP)
