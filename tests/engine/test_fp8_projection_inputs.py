"""Which inputs an FP8 base's projections get: the FP8 copy alone in a step without adapters,
the unquantized row too where a LoRA shrink may read it (a step with adapters, or the memory
profile of an engine with adapters enabled, `ForwardContext.keep_unquantized`)."""

from __future__ import annotations

from pathlib import Path

import torch

from loraplex.engine import LLM
from loraplex.engine.model.forward_context import AttentionMetadata, ForwardContext
from loraplex.platform.demo.tiny_checkpoint import write_random_checkpoint


def test_keep_unquantized_writes_the_projection_inputs_and_changes_no_output(
    tmp_path: Path,
) -> None:
    base = write_random_checkpoint(tmp_path / "base", "llama")
    llm = LLM(str(base), device="cpu", dtype="float32", quantization="fp8")
    runner = llm.engine.runner
    layer = runner.model.model.layers[0]
    inputs: list[torch.Tensor | None] = []
    # The norm's output (qkv_proj) and the activation's (down_proj); gate_up_proj takes the
    # second norm's through forward_unexpanded, which module hooks do not see.
    for proj in (layer.self_attn.qkv_proj, layer.mlp.down_proj):
        proj.register_forward_pre_hook(lambda _, args: inputs.append(args[0]))
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
