"""A step's token -> adapter mapping for the SGMV kernels, built on the host in one copy.

The step's adapters take batch slots in order of first appearance; each token gets its
request's slot (-1 without an adapter), and `build_lora_mapping` groups the tokens by slot:

    requests   r0 (a, 2 tokens)  r1 (none, 1)  r2 (b, 1)  r3 (a, 1)
    slots      a -> 0, b -> 1    token_slots [0, 0, -1, 1, 0]

A handful of tiny CPU ops and one host-to-device copy of the packed tensors, instead of as
many GPU launches (and a sort) ahead of every step. Each table starts 16-byte aligned.

The slot tables hold `slot_table_size` slots: the step's adapters rounded up to a power of two,
not `max_batch_loras`. The kernels size their grids and their per-program slot search by the
tables (`kernels/triton/lora_segments.py`), so a step of 8 adapters launches 8 slot rows and
searches 8 lanes rather than 256; powers of two keep the compiled variants few.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from loraplex.engine.device_copy import aligned_to_device
from loraplex.kernels import build_lora_mapping

MIN_SLOT_TABLE = 8  # the smallest table: steps of 1-8 adapters share one kernel variant


def slot_table_size(num_adapters: int, max_batch_loras: int) -> int:
    """Slots in the mapping tables of a step with `num_adapters` adapters: a power of two from
    MIN_SLOT_TABLE, never more than max_batch_loras (nor fewer than the step's adapters)."""
    assert 0 < num_adapters <= max_batch_loras
    return min(max_batch_loras, max(MIN_SLOT_TABLE, 1 << (num_adapters - 1).bit_length()))


@dataclass(frozen=True)
class StepMapping:
    """The kernels' mapping tensors, on the step's device (LoRABatch's fields, in order)."""

    sorted_token_ids: torch.Tensor  # [num_tokens] int32
    slot_start_loc: torch.Tensor  # [num_slots + 1] int32 (num_slots: slot_table_size)
    slot_adapters: torch.Tensor  # [num_slots] int32: batch slot -> resident id
    num_active_slots: torch.Tensor  # [1] int32

    def tensors(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        return self.sorted_token_ids, self.slot_start_loc, self.slot_adapters, self.num_active_slots


def map_step(
    adapters_per_request: Sequence[str | None],  # each request's adapter (content hash) or None
    tokens_per_request: Sequence[int],
    resident_id: Callable[[str], int],
    max_batch_loras: int,
    device: torch.device,
) -> tuple[list[str], StepMapping | None]:
    """(the step's adapters in slot order, their mapping; None when no request has one)."""
    adapters = list(dict.fromkeys(h for h in adapters_per_request if h is not None))
    if not adapters:
        return [], None
    assert len(adapters) <= max_batch_loras, "the scheduler caps adapters per step"
    slot_of = {h: slot for slot, h in enumerate(adapters)}
    # Per request in Python, per token in torch: a prefill step has thousands of tokens.
    request_slots = torch.tensor(
        [-1 if h is None else slot_of[h] for h in adapters_per_request], dtype=torch.int32
    )
    token_slots = request_slots.repeat_interleave(
        torch.tensor(tokens_per_request), output_size=sum(tokens_per_request)
    )
    num_slots = slot_table_size(len(adapters), max_batch_loras)
    slot_adapters = torch.zeros(num_slots, dtype=torch.int32)
    slot_adapters[: len(adapters)] = torch.tensor(
        [resident_id(h) for h in adapters], dtype=torch.int32
    )
    num_active_slots = torch.tensor([len(adapters)], dtype=torch.int32)
    sorted_token_ids, slot_start_loc = build_lora_mapping(token_slots, num_slots)
    # Each table 16-byte aligned on the device, as the decode graphs' own buffers are: Triton
    # compiles a kernel variant per pointer alignment, so views at other offsets would need
    # (and compile, mid-serving) variants of their own.
    tables = [slot_start_loc, slot_adapters, num_active_slots, sorted_token_ids]
    slot_start_loc, slot_adapters, num_active_slots, sorted_token_ids = aligned_to_device(
        tables, device
    )
    return adapters, StepMapping(sorted_token_ids, slot_start_loc, slot_adapters, num_active_slots)
