"""prepare_inputs: the flat tensors of a step, against the same built token by token in Python
(the definitions in its docstring), over steps that mix decodes, whole prompts, chunks of
prompts, tokens still in flight and requests with output already, on scattered blocks."""

from __future__ import annotations

import random

import pytest
import torch

from loraplex.engine.device_copy import PACK_ALIGN_BYTES, host_ints, packed_to_device
from loraplex.engine.request import Request, SamplingParams
from loraplex.engine.runner.input_batch import prepare_inputs
from loraplex.engine.scheduler.output import ScheduledRequest

BLOCK_SIZE = 4


def scheduled_item(rng: random.Random, index: int, free_blocks: list[int]) -> ScheduledRequest:
    """One request of a random kind, its blocks taken from `free_blocks` (shuffled ids)."""
    num_prompt = rng.randint(1, 23)
    num_output = rng.choice([0, 0, rng.randint(1, 9)])
    request = Request(f"r{index}", [rng.randrange(1000) for _ in range(num_prompt)],
                      SamplingParams(max_tokens=64))  # fmt: skip
    request.output_token_ids = [rng.randrange(1000) for _ in range(num_output)]
    known = num_prompt + num_output
    in_flight = num_output > 0 and rng.random() < 0.5  # the last token is being sampled
    total = known + int(in_flight)
    if num_output or in_flight:  # a decode: the request's last position
        start, end = total - 1, total
    else:  # a prompt, whole or a chunk of it
        start = rng.randint(0, num_prompt - 1)
        end = rng.randint(start + 1, num_prompt)
    num_blocks = -(-end // BLOCK_SIZE)
    block_ids = [free_blocks.pop() for _ in range(num_blocks)]
    return ScheduledRequest(request, end - start, block_ids, start, end == total)


def expected_inputs(scheduled: list[ScheduledRequest]) -> dict[str, list]:
    """Token by token, as the docstring of prepare_inputs defines each tensor."""
    out: dict[str, list] = {"input_ids": [], "positions": [], "slot_mapping": [],
                            "logits_indices": [], "placeholder_rows": []}  # fmt: skip
    for item in scheduled:
        request = item.request
        tokens = request.prompt_token_ids + request.output_token_ids
        for p in range(item.start_position, item.start_position + item.num_new_tokens):
            if p >= len(tokens):
                out["placeholder_rows"].append(len(out["input_ids"]))
            out["input_ids"].append(tokens[p] if p < len(tokens) else 0)
            out["positions"].append(p)
            block = item.block_ids[p // BLOCK_SIZE]
            out["slot_mapping"].append(block * BLOCK_SIZE + p % BLOCK_SIZE)
        if item.needs_sample:
            out["logits_indices"].append(len(out["input_ids"]) - 1)
    return out


@pytest.mark.parametrize("seed", range(12))
def test_prepare_inputs_matches_the_token_by_token_definition(seed: int) -> None:
    rng = random.Random(seed)
    free_blocks = list(range(400))
    rng.shuffle(free_blocks)
    scheduled = [scheduled_item(rng, i, free_blocks) for i in range(rng.randint(1, 12))]
    inputs = prepare_inputs(scheduled, BLOCK_SIZE, torch.device("cpu"))
    expected = expected_inputs(scheduled)
    assert inputs.input_ids.tolist() == expected["input_ids"]
    assert inputs.positions.tolist() == expected["positions"]
    assert inputs.attn.slot_mapping.tolist() == expected["slot_mapping"]
    assert inputs.logits_indices.tolist() == expected["logits_indices"]
    assert inputs.placeholder_rows == expected["placeholder_rows"]
    ends = [s.start_position + s.num_new_tokens for s in scheduled]
    assert inputs.attn.seq_lens.tolist() == ends
    lens = [s.num_new_tokens for s in scheduled]
    assert inputs.attn.query_start_loc.tolist() == [sum(lens[:i]) for i in range(len(lens) + 1)]
    width = max(len(s.block_ids) for s in scheduled)
    rows = [s.block_ids + [0] * (width - len(s.block_ids)) for s in scheduled]
    assert inputs.attn.block_tables.tolist() == rows
    assert (inputs.attn.max_query_len, inputs.attn.max_seq_len) == (max(lens), max(ends))
    for t, dtype in ((inputs.input_ids, torch.int64), (inputs.attn.slot_mapping, torch.int64),
                     (inputs.attn.block_tables, torch.int32), (inputs.attn.seq_lens, torch.int32)):  # fmt: skip
        assert t.dtype == dtype and t.is_contiguous()


def test_packed_tensors_start_aligned_and_keep_their_values() -> None:
    int64s = [
        host_ints([1, 2, 3], torch.int64),
        torch.arange(6).view(2, 3),
        host_ints([], torch.int64),
    ]
    int32s = [host_ints([7], torch.int32), torch.arange(5, dtype=torch.int32)]
    got64, got32 = packed_to_device(int64s, int32s, torch.device("cpu"))
    for got, want in zip(got64 + got32, int64s + int32s, strict=True):
        assert got.dtype == want.dtype and got.shape == want.shape and torch.equal(got, want)
        assert got.data_ptr() % PACK_ALIGN_BYTES == 0 or got.numel() == 0
    got64[0].fill_(-1)  # a write to one view leaves the others alone
    assert torch.equal(got64[1], torch.arange(6).view(2, 3))
