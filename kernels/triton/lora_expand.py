"""Multi-slice multi-LoRA expand (y += scaling * lora_out @ B.T per segment) in Triton: Punica SGMV.

Method: Punica's segmented gather matrix multiplication (Chen et al., 2023, "Punica: Multi-Tenant
LoRA Serving"), the second half of a LoRA delta after `lora_shrink`, with every slice of a fused
projection in one launch (as vLLM's `lora_expand`). The slices' B matrices are stacked along
out_dim in the order of y's columns, so slice i owns rows [o_i, o_i + n_i) of `lora_b` and
columns y_offset + [o_i, o_i + n_i) of y:

    lora_b[slot]  [ q (n_0 rows) | k (n_1) | v (n_2) ]  x  max_rank
    y columns     [ y_offset + o_0 ... | + o_1 ...  | + o_2 ...  ]       o_i = n_0 + ... + n_{i-1}

A program owns one (segment tile, output-column tile of a slice, slice); it gathers its token
rows of `lora_out[slice]` through `sorted_token_ids`, multiplies them by the slot's B over the
slot's rank for that slice only, scales, and adds into its columns of y.

    grid = (num_segment_tiles, cdiv(max_i n_i, BLOCK_N), num_slices)

Segment tiles are the shrink's (`lora_segments.py`: the BLOCK_M-token tiles of the segments of
slots with a rank for the slice; a shape-only bound, so CUDA-graph friendly).
Programs past the last tile, or whose column tile starts past their (narrower) slice, return at
once. The first B tile is loaded before the token-dependent loads (token ids, then the y and
lora_out rows), so its latency overlaps the gather. When max_rank fits one BLOCK_K step that is
all; otherwise the K loop walks the slot's own rank in BLOCK_K steps (padding past it costs
nothing), loading each B tile one step ahead. Slice boundaries are passed as scalars: up to
MAX_SLICES slices (qkv).

Tiles (`EXPAND_TILES`, keyed by the number of tokens of the launch): out_dim is wide
(1024..14336 per slice) and the reduction (the rank) short, so BLOCK_N = 128 columns per program,
BLOCK_K = the max rank rounded up to a power of two, capped at 16 for decode (registers and
shared memory of a 16-row B tile even when storage is padded to a larger max_lora_rank) and 64
otherwise. BLOCK_M follows the segment size: 16 (tl.dot's minimum) at decode, 32 up to 512
tokens, 64 for prefill. `launch_lora_expand` takes the tiles as an argument (benchmarks and
tests pass candidates).

Numerics: the `lora_out` tile is cast to `lora_b`'s dtype for the tensor-core dot (as vLLM's
expand does), products accumulate in float32, and `y` is read, added to in float32 and rounded
once. Each token appears in at most one segment and slices own disjoint columns, so the
read-modify-write needs no atomics.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Final

import torch
import triton
import triton.language as tl

from loraplex.kernels.triton.launch_checks import check, check_one_device
from loraplex.kernels.triton.lora_segments import (
    check_lora_mapping,
    rank_block,
    segment_grid,
    segment_tile,
    segment_token_ids,
)
from loraplex.kernels.triton.tile_table import TileTable, check_dot_tiles

OP = "lora_expand"
MAX_SLICES = 3


@dataclass(frozen=True)
class ExpandTiles:
    """Tile shape of one launch."""

    block_m: int  # token rows per program
    block_n: int  # output columns per program
    max_block_k: int  # rank step: max_rank rounded up to a power of 2, capped
    num_warps: int
    num_stages: int

    def __post_init__(self) -> None:
        check_dot_tiles(block_m=self.block_m, block_n=self.block_n, max_block_k=self.max_block_k)


EXPAND_TILES: Final = TileTable(
    (
        (64, ExpandTiles(block_m=16, block_n=128, max_block_k=16, num_warps=4, num_stages=2)),
        (512, ExpandTiles(block_m=32, block_n=128, max_block_k=64, num_warps=4, num_stages=2)),
        (
            sys.maxsize,
            ExpandTiles(block_m=64, block_n=128, max_block_k=64, num_warps=4, num_stages=2),
        ),
    )
)


def slice_ends(slice_sizes: tuple[int, ...]) -> list[int]:
    """End row of each slice in lora_b, padded to MAX_SLICES (no program has the extra ids)."""
    ends = [sum(slice_sizes[: i + 1]) for i in range(len(slice_sizes))]
    return ends + [sum(slice_sizes)] * (MAX_SLICES - len(slice_sizes))


@triton.jit
def slice_rows(slice_id, slice_end_0, slice_end_1, slice_end_2):  # type: ignore[no-untyped-def]
    """Rows [start, end) of lora_b (columns of y past y_offset) that belong to slice_id."""
    start = tl.where(slice_id == 0, 0, tl.where(slice_id == 1, slice_end_0, slice_end_1))
    end = tl.where(slice_id == 0, slice_end_0, tl.where(slice_id == 1, slice_end_1, slice_end_2))
    return start, end


@triton.jit
def load_b_tile(b_ptrs, offs_k, mask_n, k_start, rank, max_rank):  # type: ignore[no-untyped-def]
    """B[n, k_start + offs_k] as a [BLOCK_K, BLOCK_N] tile, 0 at and past the slot's rank (and
    no traffic once k_start >= rank). Bounded by the storage width max_rank rather than by the
    rank, so loads along k vectorize; the padding read is replaced, never used (it may be stale
    or NaN)."""
    mask_k = offs_k < tl.where(k_start < rank, max_rank - k_start, 0)
    b = tl.load(b_ptrs, mask=mask_k[:, None] & mask_n[None, :], other=0.0)
    return tl.where((offs_k < rank - k_start)[:, None], b, 0.0)


@triton.jit
def _lora_expand_kernel(  # type: ignore[no-untyped-def]
    lora_out_ptr,
    lora_b_ptr,
    y_ptr,
    sorted_token_ids_ptr,
    slot_start_loc_ptr,
    lora_ranks_ptr,
    scalings_ptr,
    max_loras,
    max_rank,
    slice_end_0,
    slice_end_1,
    slice_end_2,
    y_offset,
    stride_ls,
    stride_lm,
    stride_bl,
    stride_bn,
    stride_ym,
    stride_rs,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    SINGLE_K: tl.constexpr,  # max_rank <= BLOCK_K: one step
    SLOTS: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    pid_n = tl.program_id(1)
    slice_id = tl.program_id(2)
    slot, m_start, seg_end, rank = segment_tile(
        tl.program_id(0),
        slot_start_loc_ptr,
        lora_ranks_ptr + slice_id * stride_rs,
        max_loras,
        BLOCK_M,
        SLOTS,
    )
    slice_start, slice_end = slice_rows(slice_id, slice_end_0, slice_end_1, slice_end_2)
    n_start = slice_start + pid_n * BLOCK_N
    if (m_start >= seg_end) | (rank == 0) | (n_start >= slice_end):
        return

    offs_n = n_start + tl.arange(0, BLOCK_N)
    mask_n = offs_n < slice_end
    offs_k = tl.arange(0, BLOCK_K)
    b_ptrs = (
        lora_b_ptr + slot.to(tl.int64) * stride_bl + offs_n[None, :] * stride_bn + offs_k[:, None]
    )  # [BLOCK_K, BLOCK_N]: B[slot, n, k] read transposed
    # The first B tile does not depend on the token ids: issue it before the gather.
    b = load_b_tile(b_ptrs, offs_k, mask_n, 0, rank, max_rank)
    scaling = tl.load(scalings_ptr + slot)
    token_ids, mask_m = segment_token_ids(sorted_token_ids_ptr, m_start, seg_end, BLOCK_M)
    y_ptrs = y_ptr + token_ids[:, None] * stride_ym + (y_offset + offs_n)[None, :]
    mask = mask_m[:, None] & mask_n[None, :]
    y = tl.load(y_ptrs, mask=mask, other=0.0)
    lo_ptrs = (
        lora_out_ptr + slice_id * stride_ls + token_ids[:, None] * stride_lm + offs_k[None, :]
    )  # [BLOCK_M, BLOCK_K]
    if SINGLE_K:  # no loop, one B tile live
        lo = tl.load(lo_ptrs, mask=mask_m[:, None] & (offs_k < rank)[None, :], other=0.0)
        acc = tl.dot(lo.to(b.dtype), b, input_precision=DOT_PRECISION, out_dtype=tl.float32)
    else:
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k_start in range(0, rank, BLOCK_K):
            lo_mask = mask_m[:, None] & (offs_k < rank - k_start)[None, :]
            lo = tl.load(lo_ptrs, mask=lo_mask, other=0.0)
            acc = tl.dot(lo.to(b.dtype), b, acc, input_precision=DOT_PRECISION)
            lo_ptrs += BLOCK_K
            b_ptrs += BLOCK_K
            b = load_b_tile(b_ptrs, offs_k, mask_n, k_start + BLOCK_K, rank, max_rank)
    tl.store(y_ptrs, (y.to(tl.float32) + acc * scaling).to(y.dtype), mask=mask)


def _check_args(
    lora_out: torch.Tensor,
    lora_b: torch.Tensor,
    sorted_token_ids: torch.Tensor,
    slot_start_loc: torch.Tensor,
    lora_ranks: torch.Tensor,
    scalings: torch.Tensor,
    y: torch.Tensor,
    y_offset: int,
    slice_sizes: tuple[int, ...],
) -> None:
    check(OP, lora_out.dim() == 3 and lora_b.dim() == 3 and y.dim() == 2, "bad tensor ranks")
    num_slices, num_tokens, max_rank = lora_out.shape
    max_loras, total_out, b_rank = lora_b.shape
    check(OP, len(slice_sizes) == num_slices, "one slice size per lora_out slice")
    check(OP, num_slices <= MAX_SLICES, f"at most {MAX_SLICES} slices per launch")
    check(OP, sum(slice_sizes) == total_out, f"slice sizes {slice_sizes} != lora_b rows")
    check(OP, b_rank == max_rank, f"lora_b max_rank {b_rank} != lora_out max_rank {max_rank}")
    check(OP, y.shape[0] == num_tokens, "y and lora_out must have the same number of tokens")
    check(OP, y_offset >= 0 and y_offset + total_out <= y.shape[1], "y_offset out of range")
    float_dtypes = (torch.float16, torch.bfloat16, torch.float32)
    check(OP, lora_b.dtype in float_dtypes and y.dtype in float_dtypes, "bad floating dtype")
    check(OP, lora_out.dtype in (torch.float32, lora_b.dtype), "lora_out: fp32 or lora_b's")
    check(
        OP,
        scalings.shape == (max_loras,) and scalings.dtype == torch.float32,
        "scalings must be float32 [max_loras]",
    )
    mapping = (sorted_token_ids, slot_start_loc, lora_ranks)
    check_lora_mapping(OP, num_tokens, max_loras, num_slices, *mapping)
    check(OP, lora_out.stride(2) == 1 and y.stride(1) == 1, "lora_out and y need contiguous rows")
    check(OP, lora_b.stride(2) == 1, "lora_b needs a contiguous last dim")
    check_one_device(OP, lora_out, lora_b, y, *mapping, scalings)


def lora_expand(
    lora_out: torch.Tensor,  # [num_slices, num_tokens, max_rank], float32 or lora_b.dtype
    lora_b: torch.Tensor,  # [max_loras, sum(slice_sizes), max_rank]: slices stacked along rows
    sorted_token_ids: torch.Tensor,  # [num_tokens] int32
    slot_start_loc: torch.Tensor,  # [max_loras + 1] int32
    lora_ranks: torch.Tensor,  # [num_slices, max_loras] int32
    scalings: torch.Tensor,  # [max_loras] float32
    y: torch.Tensor,  # [num_tokens, y_dim]
    y_offset: int,
    slice_sizes: tuple[int, ...],  # out_dim of each slice, in y's column order
) -> None:
    """y[t, y_offset + o_i + j] += scalings[s] * lora_out[i, t, :r] @ lora_b[s, o_i + j, :r]
    for every slice i (o_i = sum(slice_sizes[:i]), j < slice_sizes[i]) and token t of slot s,
    where r = lora_ranks[i, s]. One launch for all slices, with EXPAND_TILES' row for the
    number of tokens."""
    tiles = EXPAND_TILES.lookup(y.shape[0])
    mapping = (sorted_token_ids, slot_start_loc, lora_ranks)
    launch_lora_expand(lora_out, lora_b, *mapping, scalings, y, y_offset, slice_sizes, tiles)


def launch_lora_expand(
    lora_out: torch.Tensor,
    lora_b: torch.Tensor,
    sorted_token_ids: torch.Tensor,
    slot_start_loc: torch.Tensor,
    lora_ranks: torch.Tensor,
    scalings: torch.Tensor,
    y: torch.Tensor,
    y_offset: int,
    slice_sizes: tuple[int, ...],
    tiles: ExpandTiles,
) -> None:
    """`lora_expand` with the given tiles instead of the table's."""
    mapping = (sorted_token_ids, slot_start_loc, lora_ranks)
    _check_args(lora_out, lora_b, *mapping, scalings, y, y_offset, slice_sizes)
    num_slices, num_tokens, max_rank = lora_out.shape
    max_loras, total_out, _ = lora_b.shape
    if num_tokens == 0 or total_out == 0 or max_rank == 0:
        return

    block_k = rank_block(max_rank, tiles.max_block_k)
    num_tiles, slots = segment_grid(num_tokens, max_loras, tiles.block_m)
    grid = (num_tiles, triton.cdiv(max(slice_sizes), tiles.block_n), num_slices)
    _lora_expand_kernel[grid](
        lora_out,
        lora_b,
        y,
        sorted_token_ids,
        slot_start_loc,
        lora_ranks,
        scalings,
        max_loras,
        max_rank,
        *slice_ends(slice_sizes),
        y_offset,
        lora_out.stride(0),
        lora_out.stride(1),
        lora_b.stride(0),
        lora_b.stride(1),
        y.stride(0),
        lora_ranks.stride(0),
        BLOCK_M=tiles.block_m,
        BLOCK_N=tiles.block_n,
        BLOCK_K=block_k,
        SINGLE_K=max_rank <= block_k,
        SLOTS=slots,
        DOT_PRECISION="ieee" if lora_b.dtype == torch.float32 else "tf32",
        num_warps=tiles.num_warps,
        num_stages=tiles.num_stages,
    )
