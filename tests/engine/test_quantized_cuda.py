"""Quantized bases on CUDA (the Triton W4A16 GEMM, torch._scaled_mm, CUDA graphs): 4-bit
greedy equal to HF + PEFT on the dequantized weights on the same GPU (float32, as
test_engine_cuda.py); FP8 layers against the CPU reference path, and CUDA-graph decode equal
to eager decode. Not run on CPU hosts (`pytest -m gpu`)."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch

from loraplex.engine import LLM, LoRARequest, SamplingParams
from loraplex.engine.model import load_model
from loraplex.engine.model.linear import MergedLinear
from tests.checkpoints import CheckpointFactory
from tests.engine.hf_reference import hf_greedy_on
from tests.engine.lora_adapters import write_peft_adapter
from tests.engine.quant_checkpoints import write_int4_checkpoint

pytestmark = pytest.mark.gpu

MAX_TOKENS = 8
PLAN: list[str | None] = [None, "qv4", "mlp16", None, "mlp16", "qv4"]
ADAPTERS = {"qv4": (4, ["q_proj", "v_proj"]), "mlp16": (16, ["gate_proj", "up_proj", "down_proj"])}


def wide_base(checkpoint_factory: CheckpointFactory) -> Path:
    return checkpoint_factory("llama", hidden_size=128, intermediate_size=256, head_dim=32)


def prompts() -> list[list[int]]:
    rng = random.Random(5)
    return [[rng.randrange(5, 500) for _ in range(rng.randrange(2, 40))] for _ in PLAN]


@pytest.mark.parametrize(("method", "act_order"), [("awq", False), ("gptq", True)])
def test_4_bit_on_cuda_matches_hf_on_the_dequantized_weights(
    checkpoint_factory: CheckpointFactory, tmp_path: Path, method: str, act_order: bool
) -> None:
    base = wide_base(checkpoint_factory)
    quant, dequant = write_int4_checkpoint(base, tmp_path / method, method, 64, act_order)
    adapter_dirs = {
        name: write_peft_adapter(dequant, tmp_path / name, rank, modules, seed=i)
        for i, (name, (rank, modules)) in enumerate(ADAPTERS.items())
    }
    ps = prompts()
    expected = hf_greedy_on("cuda", dequant, ps, MAX_TOKENS, PLAN, adapter_dirs)
    llm = LLM(str(quant), device="cuda", dtype="float32", max_lora_rank=16)
    ids = {name: i + 1 for i, name in enumerate(ADAPTERS)}
    loras = [None if n is None else LoRARequest(n, ids[n], str(adapter_dirs[n])) for n in PLAN]
    params = SamplingParams(max_tokens=MAX_TOKENS, min_tokens=MAX_TOKENS, temperature=0.0)
    outs = llm.generate([{"prompt_token_ids": p} for p in ps], params, loras, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in outs] == expected


def test_fp8_layers_on_cuda_match_the_reference_path(
    checkpoint_factory: CheckpointFactory,
) -> None:
    if torch.cuda.get_device_capability() < (8, 9):
        pytest.skip("no FP8 tensor cores")
    base = wide_base(checkpoint_factory)
    gpu, _ = load_model(base, "bfloat16", "cuda", quantization="fp8")
    cpu, _ = load_model(base, "bfloat16", "cpu", quantization="fp8")
    gpu_layers = dict(gpu.named_modules())
    for name, layer in cpu.named_modules():
        if not isinstance(layer, MergedLinear):
            continue
        gpu_layer = gpu_layers[name]
        assert isinstance(gpu_layer, MergedLinear)
        assert torch.equal(
            gpu_layer.weight.cpu().float(), layer.weight.float()
        )  # same quantization
        x = torch.randn(37, layer.input_size, dtype=torch.bfloat16)
        expected = layer.method.apply(x).float()
        got = gpu_layer.method.apply(x.cuda()).float().cpu()
        torch.testing.assert_close(got, expected, atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("quantization", ["fp8", "awq"])
def test_cuda_graph_decode_equals_eager(
    checkpoint_factory: CheckpointFactory, tmp_path: Path, quantization: str
) -> None:
    if quantization == "fp8" and torch.cuda.get_device_capability() < (8, 9):
        pytest.skip("no FP8 tensor cores")
    base = wide_base(checkpoint_factory)
    model = base
    if quantization == "awq":
        model, _ = write_int4_checkpoint(base, tmp_path / "awq", "awq", 64)
    params = SamplingParams(max_tokens=MAX_TOKENS, min_tokens=MAX_TOKENS, temperature=0.0)
    results = []
    for eager in (False, True):
        llm = LLM(str(model), device="cuda", dtype="bfloat16", quantization=quantization,
                  enforce_eager=eager)  # fmt: skip
        outs = llm.generate([{"prompt_token_ids": p} for p in prompts()], params, use_tqdm=False)
        results.append([o.outputs[0].token_ids for o in outs])
        del llm
    assert results[0] == results[1]


ALL_MODULES = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def test_fp8_with_adapters_finishes_a_full_batch(
    checkpoint_factory: CheckpointFactory, tmp_path: Path
) -> None:
    """W1's schedule on a small model: 512 requests of 512 tokens, 4,096 tokens per step, up
    to 256 at once, each with one of 8 adapters on every module, CUDA graphs on. On an H100 the
    Llama-3-8B shape died in this schedule with an illegal memory access at a step of 128
    requests (FP8 base with adapters only; bench/results/h100-1af5045-agreement-fp8-lora-crash).
    Every request must finish with its tokens. (Tokens are not compared with eager mode: the
    split-K shrink's float32 atomics may flip a near-tie.)"""
    if torch.cuda.get_device_capability() < (8, 9):
        pytest.skip("no FP8 tensor cores")
    base = wide_base(checkpoint_factory)
    adapters = [
        LoRARequest(f"a{i}", i + 1, str(write_peft_adapter(base, tmp_path / f"a{i}", 16,
                                                             ALL_MODULES, seed=i)))
        for i in range(8)
    ]  # fmt: skip
    rng = random.Random(7)
    ps = [[rng.randrange(5, 500) for _ in range(512)] for _ in range(512)]
    llm = LLM(str(base), device="cuda", dtype="bfloat16", quantization="fp8", max_lora_rank=16,
              max_num_seqs=256, max_num_batched_tokens=4096, enable_prefix_caching=False)  # fmt: skip
    params = SamplingParams(max_tokens=32, temperature=0.0, ignore_eos=True)
    loras = [adapters[i % 8] for i in range(len(ps))]
    outs = llm.generate([{"prompt_token_ids": p} for p in ps], params, loras, use_tqdm=False)
    assert [len(o.outputs[0].token_ids) for o in outs] == [32] * len(ps)
