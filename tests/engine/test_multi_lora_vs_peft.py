"""Mixed-adapter batches equal PEFT's mixed-batch generation token for token."""

from __future__ import annotations

import random

import pytest

from loraplex.engine import LLM, LoRARequest, SamplingParams
from loraplex.platform.demo.tiny_checkpoint import write_random_checkpoint
from tests.engine.hf_reference import hf_greedy
from tests.engine.lora_adapters import write_peft_adapter

MAX_TOKENS = 6
ADAPTERS = {  # name: (rank, target modules)
    "a4": (4, ["q_proj", "v_proj"]),
    "b8": (8, ["q_proj", "k_proj", "v_proj", "o_proj"]),
    "c16": (16, ["gate_proj", "up_proj", "down_proj"]),
    "d32": (32, ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]),
    "e64": (64, ["o_proj", "down_proj"]),
}


@pytest.fixture(scope="module", params=["llama", "qwen2"])
def setup(request, tmp_path_factory):
    root = tmp_path_factory.mktemp(f"lora-{request.param}")
    base = write_random_checkpoint(root / "base", request.param)
    adapter_dirs = {
        name: write_peft_adapter(
            base, root / name, rank, modules, seed=i, use_rslora=(name == "c16")
        )
        for i, (name, (rank, modules)) in enumerate(ADAPTERS.items())
    }
    return base, adapter_dirs


# Engine settings: memory for every adapter at once; a KV pool too small for all adapters
# together (evictions, uploads waiting for room, KV reclaiming adapters' blocks); a cap of 3
# distinct adapters per step with a CPU cache of 2 (reloads from disk).
SETTINGS = {
    "roomy": {},
    "tight-memory": {"num_kv_blocks": 48},
    "capped": {"max_loras": 3, "max_cpu_loras": 2},
}


@pytest.mark.parametrize("settings", list(SETTINGS))
def test_mixed_adapter_batches_match_peft(setup, settings):
    base, adapter_dirs = setup
    rng = random.Random(1)
    names = list(ADAPTERS)
    # Every adapter twice, plus base-model requests, interleaved.
    plan: list[str | None] = [*names, None, *reversed(names), None]
    prompts = [[rng.randrange(5, 500) for _ in range(rng.randrange(2, 30))] for _ in plan]
    expected = hf_greedy(base, prompts, MAX_TOKENS, adapters=plan, adapter_dirs=adapter_dirs)

    llm = LLM(
        str(base),
        device="cpu",
        dtype="float32",
        max_lora_rank=64,
        max_num_batched_tokens=64,
        **SETTINGS[settings],
    )
    ids = {name: i + 1 for i, name in enumerate(names)}
    requests = [None if n is None else LoRARequest(n, ids[n], str(adapter_dirs[n])) for n in plan]
    params = SamplingParams(max_tokens=MAX_TOKENS, min_tokens=MAX_TOKENS, temperature=0.0)
    outs = llm.generate(
        [{"prompt_token_ids": p} for p in prompts], params, lora_request=requests, use_tqdm=False
    )
    got = [o.outputs[0].token_ids for o in outs]
    for name, e, g in zip(plan, expected, got, strict=True):
        assert g == e, f"adapter {name}: {g} != {e}"
    # The adapters changed something: not every adapted output equals the base output.
    base_only = hf_greedy(base, prompts, MAX_TOKENS)
    assert sum(b != e for b, e in zip(base_only, expected, strict=True)) >= 4
    stats = llm.engine.get_stats().lora
    if settings == "tight-memory":
        assert stats.num_gpu_evictions > 0
    if settings == "capped":
        assert stats.num_cpu_evictions > 0
    # Every request's blocks are back; what is still held belongs to resident adapters, idle.
    engine = llm.engine
    kv = engine.kv_cache_manager
    kv.check_integrity()
    engine.lora_manager.check_integrity()
    assert not kv.req_to_blocks and not engine.lora_manager.pool._pins
    assert kv.num_free_blocks + engine.lora_manager.pool.num_blocks_held == kv.num_blocks
