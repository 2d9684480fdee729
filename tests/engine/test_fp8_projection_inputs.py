"""Which inputs an FP8 base's projections get: the FP8 copy alone in a step without adapters,
the unquantized row too where a LoRA shrink may read it (a step with adapters, or the memory
profile of an engine with adapters enabled, `ForwardContext.keep_unquantized`)."""

from __future__ import annotations

import random
from pathlib import Path

import torch

from loraplex.engine import LLM, SamplingParams
from loraplex.engine.model.forward_context import AttentionMetadata, ForwardContext
from loraplex.platform.demo.tiny_checkpoint import write_random_checkpoint
from tests.engine.hf_reference import hf_greedy
from tests.engine.quant_checkpoints import quantize_linear_inputs, write_fp8_online_twin


def record_projection_inputs(llm: LLM) -> list[torch.Tensor | None]:
    """The x that layer 0's qkv_proj and down_proj get at each forward, appended as they come.
    (gate_up_proj takes the second norm's output through forward_unexpanded, which module
    hooks do not see.)"""
    inputs: list[torch.Tensor | None] = []
    layer = llm.engine.runner.model.model.layers[0]
    for proj in (layer.self_attn.qkv_proj, layer.mlp.down_proj):
        proj.register_forward_pre_hook(lambda _, args: inputs.append(args[0]))
    return inputs


def test_keep_unquantized_writes_the_projection_inputs_and_changes_no_output(
    tmp_path: Path,
) -> None:
    base = write_random_checkpoint(tmp_path / "base", "llama")
    llm = LLM(str(base), device="cpu", dtype="float32", quantization="fp8")
    runner = llm.engine.runner
    inputs = record_projection_inputs(llm)
    n = 8  # one sequence of n prompt tokens; slot -1: the cache is not written
    attn = AttentionMetadata(
        slot_mapping=torch.full((n,), -1, dtype=torch.int64),
        block_tables=torch.zeros((1, 1), dtype=torch.int32),
        seq_lens=torch.tensor([n], dtype=torch.int32),
        query_start_loc=torch.tensor([0, n], dtype=torch.int32),
        max_query_len=n,
        max_seq_len=n,
    )
    input_ids = torch.arange(5, 5 + n)
    outputs = []
    for keep in (False, True):
        inputs.clear()
        ctx = ForwardContext(attn, runner.kv_caches, keep_unquantized=keep)
        assert ctx.needs_unquantized_inputs == keep
        with torch.inference_mode():
            outputs.append(runner.model(input_ids, torch.arange(n), ctx))
        assert len(inputs) == 2
        assert all((x is not None) == keep for x in inputs)
        assert all(x is None or x.shape[0] == n for x in inputs)
    assert torch.equal(outputs[0], outputs[1])


def test_fp8_base_without_adapters_skips_the_unquantized_inputs_and_matches_hf(
    tmp_path: Path,
) -> None:
    """A step without adapters has no LoRA shrink to read the norms' and the activation's
    unquantized output: the FP8 projections get their FP8 input alone (x None), and the tokens
    are still HF's on the same quantization."""
    base = write_random_checkpoint(tmp_path / "base", "llama")
    oracle_dir = write_fp8_online_twin(base, tmp_path / "twin")
    rng = random.Random(5)
    prompts = [[rng.randrange(5, 500) for _ in range(rng.randrange(2, 30))] for _ in range(4)]
    max_tokens = 6
    expected = hf_greedy(oracle_dir, prompts, max_tokens, prepare=quantize_linear_inputs)

    llm = LLM(str(base), device="cpu", dtype="float32", quantization="fp8")
    inputs = record_projection_inputs(llm)
    params = SamplingParams(max_tokens=max_tokens, min_tokens=max_tokens, temperature=0.0)
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in outs] == expected
    assert inputs and all(x is None for x in inputs)
