"""A step's LoRA mapping (engine/lora/step_mapping.py): slot tables sized to the step's adapters,
and the decode graphs' slot tables (engine/runner/cuda_graph.py) covering every step."""

from __future__ import annotations

import pytest
import torch

from loraplex.engine.lora.step_mapping import map_step, slot_table_size
from loraplex.engine.runner.cuda_graph import graph_slot_tables


@pytest.mark.parametrize(
    ("num_adapters", "max_batch_loras", "expected"),
    [(1, 256, 8), (8, 256, 8), (9, 256, 16), (33, 256, 64), (129, 256, 256), (256, 256, 256),
     (3, 4, 4), (70, 100, 100), (1, 1, 1)],
)  # fmt: skip
def test_slot_table_size(num_adapters: int, max_batch_loras: int, expected: int) -> None:
    assert slot_table_size(num_adapters, max_batch_loras) == expected


def test_map_step_sizes_the_tables_to_the_steps_adapters() -> None:
    """20 adapters: 32 slots (not max_batch_loras); slot s owns its adapter's tokens in batch
    order, the slots past the 20th are empty, tokens without an adapter come last."""
    hashes = [f"h{i % 20}" if i % 7 else None for i in range(60)]
    resident = {f"h{i}": 100 + i for i in range(20)}
    adapters, mapping = map_step(hashes, [2] * 60, resident.__getitem__, 256, torch.device("cpu"))
    assert mapping is not None
    assert adapters == list(dict.fromkeys(h for h in hashes if h is not None))
    assert mapping.slot_adapters.shape == (32,) and mapping.slot_start_loc.shape == (33,)
    assert mapping.num_active_slots.tolist() == [20]
    assert mapping.slot_adapters[:20].tolist() == [resident[h] for h in adapters]
    starts = mapping.slot_start_loc.tolist()
    token_hashes = [h for h in hashes for _ in range(2)]
    for slot, h in enumerate(adapters):
        tokens = mapping.sorted_token_ids[starts[slot] : starts[slot + 1]].tolist()
        assert tokens == [t for t, th in enumerate(token_hashes) if th == h]
    assert starts[20:] == [starts[20]] * 13  # empty slots
    rest = mapping.sorted_token_ids[starts[20] :].tolist()
    assert rest == [t for t, th in enumerate(token_hashes) if th is None]


@pytest.mark.parametrize(
    ("num_adapters", "max_batch_loras", "num_tokens"),
    [(1, 256, 1), (3, 5, 7), (20, 256, 1000), (6, 6, 13)],
)
def test_map_step_tables_start_16_byte_aligned(
    num_adapters: int, max_batch_loras: int, num_tokens: int
) -> None:
    """As the decode graphs' buffers do: Triton compiles a variant per pointer alignment."""
    hashes = [f"h{i % num_adapters}" for i in range(num_tokens)]
    _, mapping = map_step(
        hashes, [1] * num_tokens, lambda h: 1, max_batch_loras, torch.device("cpu")
    )
    assert mapping is not None
    assert [t.data_ptr() % 16 for t in mapping.tensors()] == [0, 0, 0, 0]
    assert mapping.num_active_slots.tolist() == [num_adapters]


def test_map_step_without_adapters_maps_nothing() -> None:
    assert map_step([None, None], [3, 1], lambda h: 0, 8, torch.device("cpu")) == ([], None)


@pytest.mark.parametrize(
    ("size", "max_batch_loras", "expected"),
    [(1, 256, [8]), (8, 256, [8]), (16, 256, [8, 16]), (24, 256, [8, 16, 32]),
     (256, 256, [8, 16, 32, 64, 128, 256]), (96, 100, [8, 16, 32, 64, 100]), (4, 2, [2]),
     (16, 1, [1])],
)  # fmt: skip
def test_decode_graphs_of_a_size_cover_every_slot_table_its_steps_can_have(
    size: int, max_batch_loras: int, expected: list[int]
) -> None:
    """A step of n <= size sequences has at most n adapters, so its table is one of these."""
    assert graph_slot_tables(size, max_batch_loras) == expected
