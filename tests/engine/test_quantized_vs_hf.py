"""Quantized bases (AWQ, GPTQ with and without act-order, FP8 online and from checkpoints)
with mixed LoRA adapters equal HF transformers + PEFT running the dequantized weights, token
for token (for FP8, HF's linear layers also quantize their input activations per token)."""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from loraplex.engine import LLM, LoRARequest, SamplingParams
from loraplex.platform.demo.tiny_checkpoint import write_random_checkpoint
from tests.engine.hf_reference import hf_greedy
from tests.engine.lora_adapters import write_peft_adapter
from tests.engine.quant_checkpoints import (
    quantize_linear_inputs,
    write_fp8_checkpoint,
    write_fp8_online_twin,
    write_int4_checkpoint,
)

MAX_TOKENS = 6
ADAPTERS = {"qv4": (4, ["q_proj", "v_proj"]), "all8": (8, ["q_proj", "k_proj", "v_proj",
            "o_proj", "gate_proj", "up_proj", "down_proj"])}  # fmt: skip
PLAN: list[str | None] = [None, "qv4", "all8", None, "all8", "qv4"]
# Llama with GQA (4 query heads, 2 KV heads); "wide" has hidden 128 for group size 128.
BASES = {"small": {}, "wide": {"hidden_size": 128, "intermediate_size": 256}}


@pytest.fixture(scope="module")
def bases(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, dict[str, Path]]]:
    root = tmp_path_factory.mktemp("quant")
    out = {}
    for name, kwargs in BASES.items():
        base = write_random_checkpoint(root / name, "llama", **kwargs)
        adapters = {
            a: write_peft_adapter(base, root / f"{name}-{a}", rank, modules, seed=i)
            for i, (a, (rank, modules)) in enumerate(ADAPTERS.items())
        }
        out[name] = (base, adapters)
    return out


Case = Callable[[Path, Path], tuple[Path, dict[str, Any], Path, bool]]


def int4(method: str, group_size: int, act_order: bool = False) -> Case:
    def build(base: Path, out: Path) -> tuple[Path, dict[str, Any], Path, bool]:
        quant, dequant = write_int4_checkpoint(base, out, method, group_size, act_order)
        return quant, {}, dequant, False  # detected from quantization_config

    return build


def fp8_checkpoint(layout: str) -> Case:
    def build(base: Path, out: Path) -> tuple[Path, dict[str, Any], Path, bool]:
        quant, dequant = write_fp8_checkpoint(base, out, layout)
        return quant, {"quantization": "fp8"}, dequant, True

    return build


def fp8_online(base: Path, out: Path) -> tuple[Path, dict[str, Any], Path, bool]:
    return base, {"quantization": "fp8"}, write_fp8_online_twin(base, out), True


CASES: dict[str, tuple[str, Case]] = {
    "awq-g32": ("small", int4("awq", 32)),
    "awq-g128": ("wide", int4("awq", 128)),
    "gptq-g64": ("small", int4("gptq", 64)),
    "gptq-g32-act-order": ("small", int4("gptq", 32, act_order=True)),
    "gptq-g128-act-order": ("wide", int4("gptq", 128, act_order=True)),
    "fp8-online": ("small", fp8_online),
    "fp8-checkpoint": ("small", fp8_checkpoint("fp8")),
    "fp8-compressed-tensors": ("small", fp8_checkpoint("compressed-tensors")),
}


@pytest.mark.parametrize("case", list(CASES))
def test_quantized_base_with_mixed_adapters_matches_hf(
    bases: dict[str, tuple[Path, dict[str, Path]]], tmp_path: Path, case: str
) -> None:
    base_name, build = CASES[case]
    base, adapter_dirs = bases[base_name]
    engine_dir, engine_kwargs, oracle_dir, fp8 = build(base, tmp_path / case)
    rng = random.Random(3)
    prompts = [[rng.randrange(5, 500) for _ in range(rng.randrange(2, 30))] for _ in PLAN]
    prepare = quantize_linear_inputs if fp8 else None
    expected = hf_greedy(oracle_dir, prompts, MAX_TOKENS, PLAN, adapter_dirs, prepare)

    llm = LLM(str(engine_dir), device="cpu", dtype="float32", max_lora_rank=8, **engine_kwargs)
    layer = llm.engine.runner.model.model.layers[0]
    if fp8:
        assert layer.self_attn.qkv_proj.weight.dtype == torch.float8_e4m3fn
    else:
        assert layer.self_attn.qkv_proj.qweight.dtype == torch.int32
        # down_proj has more than one group in every case (one group needs no g_idx).
        assert hasattr(layer.mlp.down_proj, "g_idx") == case.endswith("act-order")
    ids = {name: i + 1 for i, name in enumerate(ADAPTERS)}
    requests = [None if n is None else LoRARequest(n, ids[n], str(adapter_dirs[n])) for n in PLAN]
    # HF's min_new_tokens bans the EOS tokens at every step; min_tokens does the same here.
    params = SamplingParams(max_tokens=MAX_TOKENS, min_tokens=MAX_TOKENS, temperature=0.0)
    outs = llm.generate(
        [{"prompt_token_ids": p} for p in prompts], params, lora_request=requests, use_tqdm=False
    )
    got = [o.outputs[0].token_ids for o in outs]
    for name, e, g in zip(PLAN, expected, got, strict=True):
        assert g == e, f"adapter {name}: {g} != {e}"
    # The longest prompt again, with its adapter: served from the prefix cache, same tokens.
    i = max(range(len(PLAN)), key=lambda j: len(prompts[j]))
    assert len(prompts[i]) >= 16  # at least one full block
    hits = llm.engine.get_stats().prefix_cache_hit_tokens
    again = llm.generate([{"prompt_token_ids": prompts[i]}], params, requests[i], use_tqdm=False)
    assert again[0].outputs[0].token_ids == expected[i]
    assert llm.engine.get_stats().prefix_cache_hit_tokens > hits
    # The adapters change outputs on the quantized base too.
    plain = hf_greedy(oracle_dir, prompts, MAX_TOKENS, prepare=prepare)
    assert sum(p != e for p, e in zip(plain, expected, strict=True)) >= 2
