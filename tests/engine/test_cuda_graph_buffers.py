"""CUDAGraphRunner's static input buffers, filled on the CPU (no graph is captured or replayed
here: these are the copies `run` makes before a replay)."""

from __future__ import annotations

import random

import torch

from loraplex.engine.model import load_model
from loraplex.engine.runner.cuda_graph import CUDAGraphRunner
from loraplex.kernels import build_lora_mapping
from tests.checkpoints import CheckpointFactory


def test_padding_rows_of_the_lora_mapping_are_the_graphs_own_tokens(
    checkpoint_factory: CheckpointFactory,
) -> None:
    """A decode step of n tokens replays the graph of the next captured size; the fused SiLU
    visits sorted_token_ids up to that size. After a step of 200 tokens, a step of 100 (graph
    128) must find in positions [100, 128) ids of rows that graph has, not the 200-token
    step's ids (up to 199)."""
    model, _ = load_model(checkpoint_factory("llama"), "float32", "cpu")
    runner = CUDAGraphRunner(model, [], 256, 4, None, torch.device("cpu"))
    rng = random.Random(0)
    for n in (200, 100, 37, 256, 3):
        size = runner.padded_size(n)
        slots = torch.tensor([rng.randrange(-1, 1) for _ in range(n)], dtype=torch.int32)
        sorted_ids, starts = build_lora_mapping(slots, 1)
        adapters = torch.zeros(1, dtype=torch.int32)
        runner.copy_lora_mapping(
            sorted_ids, starts, adapters, torch.ones(1, dtype=torch.int32), size
        )
        assert torch.equal(runner.sorted_token_ids[:n], sorted_ids)
        assert sorted(runner.sorted_token_ids[:size].tolist()) == list(range(size)), (n, size)
        assert torch.equal(runner.slot_start_loc, starts)
