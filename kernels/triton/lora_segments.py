"""Segment tiles: the token grid shared by the SGMV shrink and expand (Punica).

Tokens are grouped by batch slot (`kernels/lora_mapping.py`): slot s owns the segment
`sorted_token_ids[slot_start_loc[s]:slot_start_loc[s + 1]]`, and its adapter is
`slot_adapters[s]` (a row of the adapter tables). For one slice, the segment tiles are the
BLOCK_M-token tiles of every segment whose adapter has a non-zero rank for that slice, numbered
in slot order. Program `tile` finds its (slot, first token) from `slot_start_loc` and the
slice's ranks of the slots' adapters, loaded as vectors:

    slot_start_loc [0, 5, 5, 22]   ranks [8, 16, 4]   BLOCK_M 16
    tiles per slot  1, 0, 2        tile 0 -> slot 0, tokens [0, 5); 1 -> slot 2, [5, 21);
                                   2 -> slot 2, [21, 22); 3.. -> none (returns at once)

The number of tiles launched depends on shapes only, never on the mapping's values (CUDA-graph
friendly): num_tokens // BLOCK_M + min(num_slots, num_tokens) bounds the tiles of any mapping,
since each segment adds at most one partial tile. num_slots is the length of the step's slot
tables, which the engine sizes to the step's adapters (`engine/lora/step_mapping.py`: 8 slots
for up to 8 adapters), so the grid and the SLOTS-wide slot search follow the step rather than
max_batch_loras. Slots from `num_active_slots` on are empty, so the step's real bound is (its
adapted tokens) // BLOCK_M + num_active_slots: programs past it leave after two scalar loads
(`past_last_tile`), before the vector work of `segment_tile`; no slot past the active ones is
ever read.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from loraplex.kernels.launch_checks import check, check_one_device
from loraplex.kernels.triton.grid_math import next_power_of_2
from loraplex.kernels.triton.tile_table import MIN_DOT_DIM


def segment_grid(num_tokens: int, num_slots: int, block_m: int) -> tuple[int, int]:
    """(number of segment tiles to launch, SLOTS: the vector width of `segment_tile`, which
    covers the slots that can hold tokens: at most one per token, so min(num_slots, num_tokens)
    rounded up to a power of two; a decode step of 64 tokens looks at 64 slots, not 256)."""
    bound = min(num_slots, num_tokens)
    return num_tokens // block_m + bound, max(2, next_power_of_2(bound))


def rank_block(max_rank: int, max_block: int) -> int:
    """A rank tile: max_rank rounded up to a power of two, within [MIN_DOT_DIM, max_block]."""
    return min(max_block, max(MIN_DOT_DIM, next_power_of_2(max_rank)))


@triton.jit
def segment_tile_bound(  # type: ignore[no-untyped-def]
    slot_start_loc_ptr, num_active_slots_ptr, BLOCK_M: tl.constexpr
):
    """(the number of active slots, a bound on this step's segment tiles: every tile from it
    on is past the last)."""
    num_active = tl.load(num_active_slots_ptr)
    num_adapted = tl.load(slot_start_loc_ptr + num_active)  # tokens of the active slots
    return num_active, num_adapted // BLOCK_M + num_active


@triton.jit
def past_last_tile(  # type: ignore[no-untyped-def]
    tile, slot_start_loc_ptr, num_active_slots_ptr, BLOCK_M: tl.constexpr
):
    """(True if no segment can own `tile`, the number of active slots)."""
    num_active, bound = segment_tile_bound(slot_start_loc_ptr, num_active_slots_ptr, BLOCK_M)
    return tile >= bound, num_active


@triton.jit
def _find_tile(  # type: ignore[no-untyped-def]
    tile, offs, starts, ends, num_tiles, BLOCK_M: tl.constexpr
):
    """(slot mask, m_start, seg_end) of `tile`, given each slot's number of tiles."""
    tiles_end = tl.cumsum(num_tiles, 0)  # inclusive: slot s owns tiles [end - n, end)
    slot = tl.sum((tiles_end <= tile).to(tl.int32), 0)
    here = offs == slot  # all False past the last tile: m_start = seg_end = 0
    first = starts + (tile - tiles_end + num_tiles) * BLOCK_M
    m_start = tl.sum(tl.where(here, first, 0), 0)
    seg_end = tl.sum(tl.where(here, ends, 0), 0)
    return here, m_start, seg_end


@triton.jit
def segment_tile(  # type: ignore[no-untyped-def]
    tile,
    slot_start_loc_ptr,
    slot_adapters_ptr,
    ranks_ptr,  # one slice's ranks, per adapter: [num_adapters]
    num_active,
    BLOCK_M: tl.constexpr,
    SLOTS: tl.constexpr,  # the number of slots rounded up to a power of two
):
    """(adapter, m_start, seg_end, rank) of a segment tile: tokens sorted_token_ids[m_start:
    min(m_start + BLOCK_M, seg_end)] of one slot, whose adapter has rank `rank` for the slice.
    No work when m_start >= seg_end (and adapter is then meaningless)."""
    offs = tl.arange(0, SLOTS)
    valid = offs < num_active
    starts = tl.load(slot_start_loc_ptr + offs, mask=valid, other=0)
    ends = tl.load(slot_start_loc_ptr + offs + 1, mask=valid, other=0)
    adapters = tl.load(slot_adapters_ptr + offs, mask=valid, other=0)
    ranks = tl.load(ranks_ptr + adapters, mask=valid, other=0)
    num_tiles = tl.where(ranks > 0, (ends - starts + BLOCK_M - 1) // BLOCK_M, 0)
    here, m_start, seg_end = _find_tile(tile, offs, starts, ends, num_tiles, BLOCK_M)
    rank = tl.sum(tl.where(here, ranks, 0), 0)
    adapter = tl.sum(tl.where(here, adapters, 0), 0)
    return adapter, m_start, seg_end, rank


@triton.jit
def slot_tile(  # type: ignore[no-untyped-def]
    tile,
    slot_start_loc_ptr,
    slot_adapters_ptr,
    num_active,
    BLOCK_M: tl.constexpr,
    SLOTS: tl.constexpr,
):
    """(adapter, m_start, seg_end) of a tile over every active slot's segment, whatever its
    adapter's ranks (`segment_tile` counts only the slots with a rank for one slice): for a
    kernel that must visit every adapted token."""
    offs = tl.arange(0, SLOTS)
    valid = offs < num_active
    starts = tl.load(slot_start_loc_ptr + offs, mask=valid, other=0)
    ends = tl.load(slot_start_loc_ptr + offs + 1, mask=valid, other=0)
    adapters = tl.load(slot_adapters_ptr + offs, mask=valid, other=0)
    num_tiles = (ends - starts + BLOCK_M - 1) // BLOCK_M
    here, m_start, seg_end = _find_tile(tile, offs, starts, ends, num_tiles, BLOCK_M)
    adapter = tl.sum(tl.where(here, adapters, 0), 0)
    return adapter, m_start, seg_end


@triton.jit
def segment_token_ids(  # type: ignore[no-untyped-def]
    sorted_token_ids_ptr, m_start, seg_end, BLOCK_M: tl.constexpr
):
    """(token ids [BLOCK_M] int64, mask) of a segment tile's rows; masked rows read token 0."""
    offs_m = m_start + tl.arange(0, BLOCK_M)
    mask_m = offs_m < seg_end
    token_ids = tl.load(sorted_token_ids_ptr + offs_m, mask=mask_m, other=0).to(tl.int64)
    return token_ids, mask_m


# Mappings that passed `check_lora_mapping`, by the identity of their tensors: a step hands the
# same mapping, and the adapter pool the same cached table views, to every LoRA launch of its
# forward (hundreds), so each combination is checked once. The entries hold their tensors, so
# no id is reused while its entry lives; the checked properties (shapes, dtypes, strides,
# device) are fixed for a tensor object, since nothing resizes these tensors in place.
_PASSED_MAX = 64
_passed: dict[tuple[int, ...], tuple[torch.Tensor, ...]] = {}


def check_lora_mapping(
    op: str,
    num_tokens: int,
    num_slices: int,
    tensors: tuple[torch.Tensor, ...],
) -> None:
    """Raise ValueError (prefixed with `op`) unless the adapter tables and the batch mapping,
    `tensors` = (page_table, first_page, lora_ranks, slot_adapters, num_active_slots,
    sorted_token_ids, slot_start_loc), fit the launch's shapes and lie on one device."""
    key = (num_tokens, num_slices, *map(id, tensors))
    if key in _passed:
        return
    page_table, first_page, lora_ranks = tensors[:3]  # the adapter tables
    slot_adapters, num_active_slots, sorted_token_ids, slot_start_loc = tensors[3:]  # the step's
    check(op, page_table.dim() == 2, "page_table must be [num_adapters, max_pages]")
    num_adapters = page_table.shape[0]
    shape = (num_slices, num_adapters)
    check(op, first_page.shape == shape, "first_page must be [%s, %s]", *shape)
    check(op, lora_ranks.shape == shape, "lora_ranks must be [%s, %s]", *shape)
    num_slots = slot_adapters.shape[0]
    check(op, sorted_token_ids.shape == (num_tokens,), "sorted_token_ids must be [num_tokens]")
    check(op, slot_start_loc.shape == (num_slots + 1,), "slot_start_loc must be [num_slots + 1]")
    check(op, num_active_slots.shape == (1,), "num_active_slots must be [1]")
    for name, t in (
        ("sorted_token_ids", sorted_token_ids),
        ("slot_start_loc", slot_start_loc),
        ("slot_adapters", slot_adapters),
        ("num_active_slots", num_active_slots),
    ):
        check(op, t.dtype == torch.int32 and t.is_contiguous(), "%s must be contiguous int32", name)
    for name, t in (
        ("page_table", page_table),
        ("first_page", first_page),
        ("lora_ranks", lora_ranks),
    ):
        check(op, t.dtype == torch.int32 and t.stride(1) == 1, "%s must be int32 rows", name)
    check_one_device(op, *tensors)
    if len(_passed) >= _PASSED_MAX:
        _passed.clear()
    _passed[key] = tensors
