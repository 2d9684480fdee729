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


def test_mixed_adapter_batches_match_peft(setup):
    base, adapter_dirs = setup
    rng = random.Random(1)
    names = list(ADAPTERS)
    # Every adapter twice, plus base-model requests, interleaved.
    plan: list[str | None] = [*names, None, *reversed(names), None]
    prompts = [[rng.randrange(5, 500) for _ in range(rng.randrange(2, 30))] for _ in plan]
    expected = hf_greedy(base, prompts, MAX_TOKENS, adapters=plan, adapter_dirs=adapter_dirs)

    # 3 GPU slots for 5 adapters: forces evictions and reloads; 4 CPU slots: CPU evictions.
    llm = LLM(
        str(base),
        device="cpu",
        dtype="float32",
        max_loras=3,
        max_cpu_loras=4,
        max_lora_rank=64,
        max_num_batched_tokens=64,
    )
    ids = {name: i + 1 for i, name in enumerate(names)}
    requests = [None if n is None else LoRARequest(n, ids[n], str(adapter_dirs[n])) for n in plan]
    params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True)
    outs = llm.generate(
        [{"prompt_token_ids": p} for p in prompts], params, lora_request=requests, use_tqdm=False
    )
    got = [o.outputs[0].token_ids for o in outs]
    for name, e, g in zip(plan, expected, got, strict=True):
        assert g == e, f"adapter {name}: {g} != {e}"
    # The adapters changed something: not every adapted output equals the base output.
    base_only = hf_greedy(base, prompts, MAX_TOKENS)
    assert sum(b != e for b, e in zip(base_only, expected, strict=True)) >= 4
    assert llm.engine.get_stats().lora.num_gpu_evictions > 0
    kv = llm.engine.kv_cache_manager
    assert kv.num_free_blocks == kv.num_blocks
