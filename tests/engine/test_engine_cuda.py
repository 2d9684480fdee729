"""The engine on CUDA (Triton kernels, CUDA graphs) against HF transformers (+ PEFT), greedy.

Tiny random Llama and Qwen2 checkpoints in float32, a batch mixing three adapters (ranks 4, 16,
64 on different modules) with base-model requests. Adapters live in the KV cache's blocks and
are evicted only when blocks are short: with the memory for all of them and a per-step cap of
2 adapters nothing is evicted; with a KV cache smaller than the three adapters together
(evictions and reloads are certain) under the default schedule, chunked prefill, and forced
preemption by swap and by recompute. Token-for-token equality with HF on the same GPU.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest
import torch

from loraplex.engine import LLM, LoRARequest, SamplingParams
from loraplex.engine.lora.lora_batch import LoRABatch
from loraplex.engine.runner.cuda_graph import CUDAGraphRunner
from loraplex.engine.runner.input_batch import ModelInputs
from tests.checkpoints import CheckpointFactory
from tests.engine.hf_reference import hf_greedy_on
from tests.engine.lora_adapters import write_peft_adapter

pytestmark = pytest.mark.gpu

MAX_TOKENS = 8
ADAPTERS = {  # name: (rank, target modules)
    "a4": (4, ["q_proj", "v_proj"]),
    "a16": (16, ["o_proj", "down_proj"]),
    "a64": (64, ["q_proj", "k_proj", "gate_proj", "up_proj"]),
}
# The adapters take 4 + 4 + 30 blocks of 2048 elements (2 x block_size 16 x 2 KV heads x 32):
# 36 blocks cannot hold all three, and still hold the largest beside any one request.
TIGHT = {"num_kv_blocks": 36, "block_size": 16}
PREEMPTING = {**TIGHT, "max_num_batched_tokens": 64}
CASES: dict[str, dict[str, Any]] = {
    "roomy-max-loras-2": {"max_loras": 2},
    "tight": TIGHT,
    "tight-chunked-prefill": {**TIGHT, "max_num_batched_tokens": 7},
    "tight-preempt-swap": {**PREEMPTING, "preemption_mode": "swap"},
    "tight-preempt-recompute": {**PREEMPTING, "preemption_mode": "recompute"},
}

Workload = tuple[Path, dict[str, Path], list[str | None], list[list[int]], list[list[int]]]


@pytest.fixture(scope="module", params=["llama", "qwen2"])
def workload(
    request: pytest.FixtureRequest,
    checkpoint_factory: CheckpointFactory,
    tmp_path_factory: pytest.TempPathFactory,
) -> Workload:
    """(checkpoint, adapter dirs, adapter per request, prompts, HF's greedy outputs)."""
    arch = request.param
    base = checkpoint_factory(arch, hidden_size=128, num_heads=4, num_kv_heads=2, head_dim=32)
    root = tmp_path_factory.mktemp(f"cuda-adapters-{arch}")
    adapter_dirs = {
        name: write_peft_adapter(base, root / name, rank, modules, seed=rank)
        for name, (rank, modules) in ADAPTERS.items()
    }
    names: list[str | None] = [*adapter_dirs, None, *adapter_dirs, None]
    rng = random.Random(0)
    prompts = [[rng.randrange(5, 500) for _ in range(rng.randrange(3, 60))] for _ in names]
    expected = hf_greedy_on(
        "cuda", base, prompts, MAX_TOKENS, adapters=names, adapter_dirs=adapter_dirs
    )
    return base, adapter_dirs, names, prompts, expected


@pytest.mark.parametrize("case", list(CASES))
def test_engine_on_cuda_matches_hf(
    workload: Workload, case: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    base, adapter_dirs, names, prompts, expected = workload
    graph_steps = {"with_lora": 0}
    replay = CUDAGraphRunner.run

    def counting_run(runner: CUDAGraphRunner, inputs: ModelInputs, lora: LoRABatch | None) -> Any:
        if lora is not None:
            graph_steps["with_lora"] += 1
        return replay(runner, inputs, lora)

    monkeypatch.setattr(CUDAGraphRunner, "run", counting_run)  # observes, changes nothing
    # 16 sequences at most (the batch has 8): 5 CUDA-graph sizes to capture instead of 15.
    kwargs = {"max_num_seqs": 16, **CASES[case]}
    llm = LLM(str(base), device="cuda", dtype="float32", **kwargs)
    ids = {name: i + 1 for i, name in enumerate(adapter_dirs)}
    loras = [None if n is None else LoRARequest(n, ids[n], str(adapter_dirs[n])) for n in names]
    params = SamplingParams(max_tokens=MAX_TOKENS, min_tokens=MAX_TOKENS, temperature=0.0)
    outs = llm.generate(
        [{"prompt_token_ids": p} for p in prompts], params, lora_request=loras, use_tqdm=False
    )
    got = [o.outputs[0].token_ids for o in outs]
    for name, g, e in zip(names, got, expected, strict=True):
        assert g == e, f"adapter {name}: {g} != {e}"
    stats = llm.engine.get_stats()
    assert stats.lora.num_gpu_loads >= len(adapter_dirs)
    if case.startswith("tight"):
        assert stats.lora.num_gpu_evictions > 0, "36 KV blocks cannot hold the 3 adapters"
    else:
        assert stats.lora.num_gpu_evictions == 0, "evicted with blocks to spare"
    assert graph_steps["with_lora"] > 0, "decode steps with adapters replayed a CUDA graph"
    if "preempt" in case:
        assert getattr(stats, f"num_preemptions_{case.rsplit('-', 1)[-1]}") > 0
    # Every request's blocks are back; what is still held belongs to idle resident adapters.
    engine = llm.engine
    kv, lora_manager = engine.kv_cache_manager, engine.lora_manager
    assert lora_manager is not None
    kv.check_integrity()
    lora_manager.check_integrity()
    assert not kv.req_to_blocks and not lora_manager.pool._pins
    assert kv.num_free_blocks + lora_manager.pool.num_blocks_held == kv.num_blocks
    assert stats.kv_blocks_adapters == lora_manager.pool.num_blocks_held
    del llm
    torch.cuda.empty_cache()


def test_decode_batches_shrinking_between_graph_sizes_keep_every_adapter(
    workload: Workload,
) -> None:
    """Requests that stop one step apart: decode steps of 7, 6, ..., 1 sequences replay the
    graphs of 8, 8, 8, 4, 4, 2 and 1 rows, with padding rows. An earlier step's token ids left
    in those rows made the fused gate_up activation rewrite a real token without its adapter's
    delta (CUDAGraphRunner.copy_lora_mapping). Each output is HF's greedy prefix."""
    base, adapter_dirs, names, prompts, expected = workload
    llm = LLM(str(base), device="cuda", dtype="float32", max_num_seqs=16)
    ids = {name: i + 1 for i, name in enumerate(adapter_dirs)}
    loras = [None if n is None else LoRARequest(n, ids[n], str(adapter_dirs[n])) for n in names]
    lengths = [MAX_TOKENS - i for i in range(len(prompts))]
    params = [SamplingParams(max_tokens=n, min_tokens=n, temperature=0.0) for n in lengths]
    outs = llm.generate(
        [{"prompt_token_ids": p} for p in prompts], params, lora_request=loras, use_tqdm=False
    )
    for name, n, out, e in zip(names, lengths, outs, expected, strict=True):
        assert out.outputs[0].token_ids == e[:n], f"adapter {name}"
    del llm
    torch.cuda.empty_cache()


@pytest.mark.parametrize("with_lora", [False, True])
def test_a_step_is_prepared_and_launched_while_the_gpu_runs(
    workload: Workload, with_lora: bool
) -> None:
    """Async scheduling: step() schedules and launches the next step and reads the previous
    one's tokens without waiting for the GPU to drain (no synchronising copy on the way), and
    the outputs are the synchronous engine's."""
    base, adapter_dirs, _, prompts, _ = workload
    name = next(iter(adapter_dirs))
    lora = LoRARequest(name, 1, str(adapter_dirs[name])) if with_lora else None
    params = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
    outputs = {}
    for async_scheduling in (True, False):
        llm = LLM(str(base), device="cuda", dtype="float32", max_num_seqs=16,
                  async_scheduling=async_scheduling)  # fmt: skip
        engine = llm.engine
        if with_lora:
            engine.add_lora(lora)  # type: ignore[arg-type]
        for i, prompt in enumerate(prompts[:4]):
            engine.add_request(str(i), {"prompt_token_ids": prompt}, params, lora_request=lora)
        done: dict[str, list[int]] = {}
        for step in range(40):
            if not engine.has_unfinished_requests():
                break
            if async_scheduling and step == 3:  # decoding, one step in flight
                torch.cuda._sleep(1_000_000_000)  # ~0.5 s of GPU time behind it
                busy = torch.cuda.Event()
                busy.record()
                engine.step()
                assert not busy.query(), "step() waited for the GPU"
                continue
            for out in engine.step():
                if out.finished:
                    done[out.request_id] = out.outputs[0].token_ids
        outputs[async_scheduling] = done
        del llm
        torch.cuda.empty_cache()
    assert len(outputs[True]) == 4 and outputs[True] == outputs[False]


def test_decode_steps_across_slot_tables_keep_every_adapter(
    checkpoint_factory: CheckpointFactory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """12 requests, each with its own adapter, that stop one step apart: decode steps of 12
    to 9 adapters replay the batch-16 graph of the 16-slot table, those of 8 to 5 the batch-8
    graph of the 8-slot one (a step's mapping tables hold its adapters rounded up to a power of
    two, engine/lora/step_mapping.py), and each output is HF's greedy prefix."""
    base = checkpoint_factory("llama")
    modules = (["q_proj", "v_proj"], ["o_proj", "down_proj"], ["gate_proj", "up_proj", "k_proj"])
    names = [f"a{i}" for i in range(12)]
    adapter_dirs = {
        name: write_peft_adapter(base, tmp_path / name, 4 + i, modules[i % 3], seed=i)
        for i, name in enumerate(names)
    }
    rng = random.Random(1)
    prompts = [[rng.randrange(5, 500) for _ in range(rng.randrange(3, 30))] for _ in names]
    lengths = [4 + i for i in range(len(names))]
    expected = hf_greedy_on(
        "cuda", base, prompts, max(lengths), adapters=list(names), adapter_dirs=adapter_dirs
    )
    replayed: set[tuple[int, int]] = set()  # (padded size, slot table) of each LoRA replay
    replay = CUDAGraphRunner.run

    def recording_run(runner: CUDAGraphRunner, inputs: ModelInputs, lora: LoRABatch | None) -> Any:
        if lora is not None:
            n = inputs.input_ids.shape[0]
            replayed.add((runner.padded_size(n), lora.slot_adapters.shape[0]))
        return replay(runner, inputs, lora)

    monkeypatch.setattr(CUDAGraphRunner, "run", recording_run)  # observes, changes nothing
    llm = LLM(str(base), device="cuda", dtype="float32", max_num_seqs=16)
    loras = [LoRARequest(n, i + 1, str(adapter_dirs[n])) for i, n in enumerate(names)]
    params = [SamplingParams(max_tokens=n, min_tokens=n, temperature=0.0) for n in lengths]
    outs = llm.generate(
        [{"prompt_token_ids": p} for p in prompts], params, lora_request=loras, use_tqdm=False
    )
    for name, n, out, e in zip(names, lengths, outs, expected, strict=True):
        assert out.outputs[0].token_ids == e[:n], f"adapter {name}"
    assert {(16, 16), (8, 8)} <= replayed, replayed
    del llm
    torch.cuda.empty_cache()
