"""build_lora_mapping: tokens grouped by slot, stable within a slot, no-adapter tokens last."""

from __future__ import annotations

import pytest
import torch

from loraplex.kernels.lora_mapping import build_lora_mapping


def _i32(values: list[int]) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int32)


def test_docstring_example() -> None:
    ids, loc = build_lora_mapping(torch.tensor([1, -1, 0, 1, 0]), max_loras=2)
    assert ids.dtype == torch.int32 and loc.dtype == torch.int32
    assert torch.equal(ids, _i32([2, 4, 0, 3, 1]))
    assert torch.equal(loc, _i32([0, 2, 4]))


def test_no_adapter_tokens() -> None:
    ids, loc = build_lora_mapping(torch.full((4,), -1), max_loras=3)
    assert torch.equal(ids, _i32([0, 1, 2, 3]))
    assert torch.equal(loc, _i32([0, 0, 0, 0]))


def test_empty_batch() -> None:
    ids, loc = build_lora_mapping(torch.zeros(0, dtype=torch.int64), max_loras=2)
    assert ids.shape == (0,)
    assert torch.equal(loc, _i32([0, 0, 0]))


def test_empty_slots_between_used_ones() -> None:
    ids, loc = build_lora_mapping(torch.tensor([3, 0, 3, -1, 0]), max_loras=5)
    assert torch.equal(ids, _i32([1, 4, 0, 2, 3]))
    assert torch.equal(loc, _i32([0, 2, 2, 2, 4, 4]))


@pytest.mark.parametrize("num_tokens", [1, 7, 100])
def test_random_mapping_is_a_stable_grouping(num_tokens: int) -> None:
    max_loras = 4
    slots = torch.randint(-1, max_loras, (num_tokens,))
    ids, loc = build_lora_mapping(slots, max_loras)
    assert sorted(ids.tolist()) == list(range(num_tokens))  # a permutation
    for slot in range(max_loras):
        segment = ids[loc[slot] : loc[slot + 1]].tolist()
        assert segment == torch.nonzero(slots == slot).flatten().tolist()
    tail = ids[loc[max_loras] :].tolist()
    assert tail == torch.nonzero(slots == -1).flatten().tolist()
