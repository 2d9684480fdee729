"""Random inputs of the multi-LoRA kernels, poisoned where a kernel must not look, and oracles.

Rank padding of every weight, and every weight and the scaling of a slot that targets no slice,
is NaN, so a kernel that uses anything past a (slot, slice)'s rank, or computes for an empty
one, poisons its output. `poisoned_lora_out` gives the expand an input that is NaN wherever the
expand must not read (past each token's rank, rows of tokens without an adapter).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import pytest
import torch

from loraplex.kernels.lora_mapping import build_lora_mapping

SENTINEL = 1234.0  # exactly representable in fp16/bf16: a shrink output that must be zeroed
NAN = float("nan")

# (ranks[slice][slot], tokens per slot, tokens without adapter, max_rank, slice sizes)
CASES = {
    # 3 segments of BLOCK_M + 1 tokens (decode tiles): the segment-tile bound is exactly reached.
    "tight-segment-tiles": ([[8, 8, 8]], [17, 17, 17], 0, 8, (24,)),
    "1-adapter-r4": ([[4]], [5], 0, 4, (72,)),
    "1-token": ([[8, 16]], [0, 1], 0, 16, (72,)),
    "no-adapter-tokens": ([[16, 8]], [0, 0], 6, 16, (72,)),
    "no-tokens": ([[8]], [0], 0, 8, (72,)),
    "2-slices-padded": ([[8, 16], [8, 0]], [3, 9], 2, 64, (72, 24)),
    # qkv-like: a slot without q, a slot with only v, an unused slot, a slot without tokens.
    "3-slices-uneven-ranks": (
        [[16, 0, 0, 4, 8], [16, 4, 0, 4, 8], [16, 4, 0, 0, 8]],
        [1, 3, 4, 37, 0],
        4,
        16,
        (136, 40, 40),
    ),
    "3-slices-r64-r4": ([[64, 4, 64], [64, 4, 64], [64, 4, 0]], [17, 16, 2], 1, 64, (24, 8, 8)),
    # Ranks past the widest rank tile (64) of every tile row: several rank tiles / rank steps.
    "2-slices-r128": ([[100, 40], [128, 0]], [4, 6], 1, 128, (24, 16)),
}
CASE_ARGS = ("ranks", "tokens_per_slot", "num_plain", "max_rank", "slice_sizes")
CASE_PARAMS = [pytest.param(*case, id=name) for name, case in CASES.items()]


@dataclass
class LoRAKernelInputs:
    """The arguments of one shrink + expand pair, and the batch they came from."""

    x: torch.Tensor  # [num_tokens, in_dim]
    lora_a: torch.Tensor  # [max_loras, num_slices, max_rank, in_dim]
    lora_b: torch.Tensor  # [max_loras, sum(slice_sizes), max_rank]
    scalings: torch.Tensor  # [max_loras] float32
    lora_ranks: torch.Tensor  # [num_slices, max_loras] int32
    slice_sizes: tuple[int, ...]
    token_lora_slots: torch.Tensor  # [num_tokens]; -1 = no adapter
    sorted_token_ids: torch.Tensor  # [num_tokens] int32
    slot_start_loc: torch.Tensor  # [max_loras + 1] int32

    @property
    def mapping(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return self.sorted_token_ids, self.slot_start_loc, self.lora_ranks

    @property
    def shape(self) -> tuple[int, int, int]:
        """(num_slices, num_tokens, max_rank): the shrink output's shape."""
        return len(self.slice_sizes), self.x.shape[0], self.lora_a.shape[2]


def make_inputs(
    ranks: list[list[int]],
    tokens_per_slot: list[int],
    num_plain_tokens: int,
    max_rank: int,
    slice_sizes: tuple[int, ...],
    dtype: torch.dtype,
    device: torch.device,
    in_dim: int = 200,
) -> LoRAKernelInputs:
    """Random weights (ranks[slice][slot]) and a shuffled batch with tokens_per_slot[s] tokens on
    slot s plus `num_plain_tokens` without an adapter. Shrink outputs and expand deltas are O(1)."""
    num_slices, max_loras = len(ranks), len(ranks[0])
    assert len(slice_sizes) == num_slices and len(tokens_per_slot) == max_loras
    slots = [s for s, n in enumerate(tokens_per_slot) for _ in range(n)]
    slots += [-1] * num_plain_tokens
    token_lora_slots = torch.tensor(slots, dtype=torch.int64)[torch.randperm(len(slots))]
    token_lora_slots = token_lora_slots.to(device)
    a_shape = (max_loras, num_slices, max_rank, in_dim)
    lora_a = torch.randn(a_shape, device=device) / in_dim**0.5
    lora_b = torch.randn(max_loras, sum(slice_sizes), max_rank, device=device) / max_rank**0.5
    scalings = torch.rand(max_loras, device=device) + 0.5
    start = 0
    for i, size in enumerate(slice_sizes):
        for slot, rank in enumerate(ranks[i]):
            lora_a[slot, i, rank:] = NAN
            lora_b[slot, start : start + size, rank:] = NAN
        start += size
    for slot in range(max_loras):
        if not any(r[slot] for r in ranks):
            scalings[slot] = NAN  # an unused slot's scaling is stale: never read it
    ids, loc = build_lora_mapping(token_lora_slots, max_loras)
    return LoRAKernelInputs(
        x=torch.randn(len(slots), in_dim, device=device).to(dtype),
        lora_a=lora_a.to(dtype),
        lora_b=lora_b.to(dtype),
        scalings=scalings,
        lora_ranks=torch.tensor(ranks, dtype=torch.int32, device=device),
        slice_sizes=slice_sizes,
        token_lora_slots=token_lora_slots,
        sorted_token_ids=ids,
        slot_start_loc=loc,
    )


def token_ranks(inputs: LoRAKernelInputs) -> torch.Tensor:
    """[num_slices, num_tokens]: each token's rank per slice (0 without an adapter)."""
    slots = inputs.token_lora_slots.long()
    ranks = inputs.lora_ranks.long()[:, slots.clamp(min=0)]
    return torch.where(slots >= 0, ranks, torch.zeros_like(ranks))


def poisoned_lora_out(inputs: LoRAKernelInputs) -> torch.Tensor:
    """A float32 shrink output for the expand: random where it reads, NaN elsewhere."""
    shape = inputs.shape
    cols = torch.arange(shape[2], device=inputs.x.device)
    live = cols[None, None, :] < token_ranks(inputs)[:, :, None]
    values = torch.randn(shape, device=inputs.x.device)
    return torch.where(live, values, torch.full_like(values, NAN))


def random_y(inputs: LoRAKernelInputs, dtype: torch.dtype, extra_cols: int = 40) -> torch.Tensor:
    """y with `extra_cols` columns beyond the slices (room for a y_offset)."""
    width = sum(inputs.slice_sizes) + extra_cols
    return torch.randn(inputs.x.shape[0], width, device=inputs.x.device).to(dtype)


def adapted(inputs: LoRAKernelInputs) -> Iterator[tuple[int, int, int, int]]:
    """(slice, token, slot, rank) of every token whose slot has a non-zero rank for the slice."""
    ranks = inputs.lora_ranks.tolist()
    for t, s in enumerate(inputs.token_lora_slots.tolist()):
        for i in range(len(inputs.slice_sizes)):
            if s >= 0 and ranks[i][s]:
                yield i, t, s, ranks[i][s]


def naive_shrink(inputs: LoRAKernelInputs) -> torch.Tensor:
    """The shrink, token by token in float64: [num_slices, num_tokens, max_rank] float32."""
    out = torch.zeros(inputs.shape, device=inputs.x.device)
    for i, t, s, rank in adapted(inputs):
        a = inputs.lora_a[s, i, :rank].double()
        out[i, t, :rank] = (inputs.x[t].double() @ a.T).float()
    return out


def naive_expand(
    inputs: LoRAKernelInputs, lora_out: torch.Tensor, y: torch.Tensor, y_offset: int
) -> torch.Tensor:
    """The expand, token by token in float64, into a copy of y."""
    y = y.clone()
    for i, t, s, rank in adapted(inputs):
        start = sum(inputs.slice_sizes[:i])
        b = inputs.lora_b[s, start : start + inputs.slice_sizes[i], :rank].double()
        delta = lora_out[i, t, :rank].double() @ b.T
        cols = slice(y_offset + start, y_offset + start + inputs.slice_sizes[i])
        y[t, cols] = (y[t, cols].double() + float(inputs.scalings[s]) * delta).to(y.dtype)
    return y
