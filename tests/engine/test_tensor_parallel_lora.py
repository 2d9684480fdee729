"""LoRA under tensor_parallel_size=2 (CPU, gloo): mixed-adapter batches equal PEFT's and the
single-process engine's greedy outputs token for token, under chunked prefill and preemption
and with adapters evicted and uploaded again. One engine per model, shared by the asserts."""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from loraplex.engine import LLM, LoRARequest, SamplingParams
from loraplex.engine.distributed.tp_runner import TensorParallelRunner
from tests.checkpoints import CheckpointFactory
from tests.engine.hf_reference import hf_greedy
from tests.engine.lora_adapters import write_peft_adapter
from tests.engine.tensor_parallel_models import MODELS, TP

pytestmark = pytest.mark.timeout(300)

MAX_TOKENS = 6
ADAPTERS = {  # name: (rank, target modules): column- and row-parallel slices, mixed ranks
    "a4": (4, ["q_proj", "v_proj"]),
    "b8": (8, ["q_proj", "k_proj", "v_proj", "o_proj"]),
    "c16": (16, ["gate_proj", "up_proj", "down_proj"]),
    "d8": (8, ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]),
}
# Chunked prefill, a KV pool small enough for preemption and adapter evictions.
# (32 blocks: every request still fits beside its adapter's shard.)
SETTINGS = {"max_num_batched_tokens": 16, "block_size": 8, "num_kv_blocks": 32}


@pytest.fixture(scope="module", params=list(MODELS))
def setup(
    request: pytest.FixtureRequest,
    checkpoint_factory: CheckpointFactory,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[Path, dict[str, Path], LLM]]:
    arch, kwargs = MODELS[request.param]
    base = checkpoint_factory(arch, **kwargs)
    root = tmp_path_factory.mktemp(f"tp-lora-{request.param}")
    adapter_dirs = {
        name: write_peft_adapter(base, root / name, rank, modules, seed=i + 10)
        for i, (name, (rank, modules)) in enumerate(ADAPTERS.items())
    }
    llm = LLM(
        str(base),
        device="cpu",
        dtype="float32",
        tensor_parallel_size=TP,
        max_lora_rank=16,
        max_cpu_loras=2,
        **SETTINGS,
    )
    yield base, adapter_dirs, llm
    llm.shutdown()


def run(
    llm: LLM, prompts: list[list[int]], plan: list[str | None], dirs: dict[str, Path]
) -> list[list[int]]:
    ids = {name: i + 1 for i, name in enumerate(ADAPTERS)}
    requests = [None if n is None else LoRARequest(n, ids[n], str(dirs[n])) for n in plan]
    params = SamplingParams(max_tokens=MAX_TOKENS, min_tokens=MAX_TOKENS, temperature=0.0)
    outs = llm.generate(
        [{"prompt_token_ids": p} for p in prompts], params, lora_request=requests, use_tqdm=False
    )
    return [o.outputs[0].token_ids for o in outs]


def test_tp2_mixed_adapters_match_peft_and_one_process(
    setup: tuple[Path, dict[str, Path], LLM],
) -> None:
    base, adapter_dirs, llm = setup
    assert isinstance(llm.engine.runner, TensorParallelRunner)
    rng = random.Random(1)
    names = list(ADAPTERS)
    plan: list[str | None] = [*names, None, *reversed(names), None]
    prompts = [[rng.randrange(5, 400) for _ in range(rng.randrange(2, 30))] for _ in plan]
    expected = hf_greedy(base, prompts, MAX_TOKENS, adapters=plan, adapter_dirs=adapter_dirs)
    got = run(llm, prompts, plan, adapter_dirs)
    for name, e, g in zip(plan, expected, got, strict=True):
        assert g == e, f"adapter {name}: {g} != {e}"
    base_only = hf_greedy(base, prompts, MAX_TOKENS)
    assert sum(b != e for b, e in zip(base_only, expected, strict=True)) >= 4
    single = LLM(str(base), device="cpu", dtype="float32", max_lora_rank=16)
    assert run(single, prompts, plan, adapter_dirs) == expected
    engine = llm.engine
    assert engine.scheduler.num_preemptions > 0
    stats = engine.get_stats().lora
    assert stats.num_gpu_evictions > 0 and stats.num_cpu_evictions > 0  # uploaded again
    assert engine.lora_manager is not None
    engine.lora_manager.check_integrity()
    engine.kv_cache_manager.check_integrity()


def test_each_rank_packs_its_own_shard_of_an_adapter(
    setup: tuple[Path, dict[str, Path], LLM],
) -> None:
    """Rank 0's pages hold its rows of B for q_proj and its columns of A for o_proj; the
    workers' shards differ from rank 0's."""
    base, adapter_dirs, llm = setup
    manager = llm.engine.lora_manager
    assert manager is not None
    cpu = manager.loader.load(LoRARequest("d8", 99, str(adapter_dirs["d8"])))
    assert len(cpu.packed_shards) == TP - 1
    assert cpu.packed_shards[0].shape == cpu.packed.shape
    assert not torch.equal(cpu.packed_shards[0], cpu.packed)
