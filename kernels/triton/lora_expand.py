"""Multi-slice multi-LoRA expand (y += scaling * lora_out @ B.T per segment) in Triton: Punica SGMV.

Method: Punica's segmented gather matrix multiplication (Chen et al., 2023, "Punica: Multi-Tenant
LoRA Serving"), the second half of a LoRA delta after `lora_shrink`, with every slice of a fused
projection in one launch (as vLLM's `lora_expand`). The slices' B matrices are stacked along
out_dim in the order of y's columns, so slice i owns rows [o_i, o_i + n_i) of `lora_b` and
columns y_offset + [o_i, o_i + n_i) of y:

    lora_b[slot]  [ q (n_0 rows) | k (n_1) | v (n_2) ]  x  max_rank
    y columns     [ y_offset + o_0 ... | + o_1 ...  | + o_2 ...  ]       o_i = n_0 + ... + n_{i-1}

A program owns one (token tile of a slot's segment, output-column tile of a slice, slice, slot);
it gathers its token rows of `lora_out[slice]` through `sorted_token_ids`, multiplies them by
the slot's B over the slot's rank for that slice only, scales, and adds into its columns of y.

    grid = (cdiv(num_tokens, BLOCK_M), cdiv(max_i n_i, BLOCK_N), num_slices * max_loras)

The grid depends on shapes only (CUDA-graph friendly); programs whose token tile starts past
their slot's segment, whose slot has rank 0 for their slice, or whose column tile starts past
their (narrower) slice return at once. The K loop stops at the rank, so rank padding costs at
most one BLOCK_K tile. Slice boundaries are passed as scalars: up to MAX_SLICES slices (qkv).

Tiles (`EXPAND_TILES`, by number of tokens of the launch): out_dim is wide (1024..14336 per
slice) and the reduction (the rank, <= 64) short, so BLOCK_N = 128 columns per program with
BLOCK_K = the rank rounded up (one step for ranks <= 64). BLOCK_M follows the segment size:
16 (tl.dot's minimum) at decode, 32 up to 512 tokens, 64 for prefill.

Numerics: the `lora_out` tile is cast to `lora_b`'s dtype for the tensor-core dot (as vLLM's
expand does), products accumulate in float32, and `y` is read, added to in float32 and rounded
once. Each token appears in at most one segment and slices own disjoint columns, so the
read-modify-write needs no atomics.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

import torch
import triton
import triton.language as tl


@dataclass(frozen=True)
class ExpandTiles:
    """Tile shape of one launch; BLOCK_K is the max rank rounded up (MIN..MAX_BLOCK_K)."""

    block_m: int  # token rows per program
    block_n: int  # output columns per program
    num_warps: int
    num_stages: int


# (largest number of tokens, tiles): the first row that fits the launch is used. The benchmark
# (bench/kernels_check.py) swaps the decode row to compare candidates.
EXPAND_TILES: tuple[tuple[int, ExpandTiles], ...] = (
    (64, ExpandTiles(block_m=16, block_n=128, num_warps=4, num_stages=2)),
    (512, ExpandTiles(block_m=32, block_n=128, num_warps=4, num_stages=2)),
    (sys.maxsize, ExpandTiles(block_m=64, block_n=128, num_warps=4, num_stages=2)),
)
MIN_BLOCK_K = 16  # tl.dot's smallest K
MAX_BLOCK_K = 64  # ranks above loop in steps of 64
MAX_SLICES = 3


def expand_tiles(num_tokens: int) -> ExpandTiles:
    return next(tiles for bound, tiles in EXPAND_TILES if num_tokens <= bound)


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
    DOT_PRECISION: tl.constexpr,
):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    slice_id = tl.program_id(2) // max_loras
    slot = tl.program_id(2) % max_loras
    rank = tl.load(lora_ranks_ptr + slice_id * stride_rs + slot)
    seg_end = tl.load(slot_start_loc_ptr + slot + 1)
    m_start = tl.load(slot_start_loc_ptr + slot) + pid_m * BLOCK_M
    # Rows [slice_start, slice_end) of lora_b belong to this program's slice.
    slice_start = tl.where(slice_id == 0, 0, tl.where(slice_id == 1, slice_end_0, slice_end_1))
    slice_end = tl.where(
        slice_id == 0, slice_end_0, tl.where(slice_id == 1, slice_end_1, slice_end_2)
    )
    n_start = slice_start + pid_n * BLOCK_N
    if (m_start >= seg_end) | (rank == 0) | (n_start >= slice_end):
        return

    offs_m = m_start + tl.arange(0, BLOCK_M)
    mask_m = offs_m < seg_end
    token_ids = tl.load(sorted_token_ids_ptr + offs_m, mask=mask_m, other=0).to(tl.int64)
    offs_n = n_start + tl.arange(0, BLOCK_N)
    mask_n = offs_n < slice_end
    offs_k = tl.arange(0, BLOCK_K)

    lo_ptrs = (
        lora_out_ptr + slice_id * stride_ls + token_ids[:, None] * stride_lm + offs_k[None, :]
    )  # [BLOCK_M, BLOCK_K]
    b_ptrs = (
        lora_b_ptr + slot.to(tl.int64) * stride_bl + offs_n[None, :] * stride_bn + offs_k[:, None]
    )  # [BLOCK_K, BLOCK_N]: B[slot, n, k] read transposed
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k_start in range(0, rank, BLOCK_K):
        mask_k = offs_k < rank - k_start
        lo = tl.load(lo_ptrs, mask=mask_m[:, None] & mask_k[None, :], other=0.0)
        b = tl.load(b_ptrs, mask=mask_k[:, None] & mask_n[None, :], other=0.0)
        acc = tl.dot(lo.to(b.dtype), b, acc, input_precision=DOT_PRECISION)
        lo_ptrs += BLOCK_K
        b_ptrs += BLOCK_K

    acc *= tl.load(scalings_ptr + slot)
    y_ptrs = y_ptr + token_ids[:, None] * stride_ym + (y_offset + offs_n)[None, :]
    mask = mask_m[:, None] & mask_n[None, :]
    y = tl.load(y_ptrs, mask=mask, other=0.0)
    tl.store(y_ptrs, (y.to(tl.float32) + acc).to(y.dtype), mask=mask)


def _check(cond: bool, msg: str) -> None:
    if not cond:
        raise ValueError(f"lora_expand: {msg}")


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
    where r = lora_ranks[i, s]. One launch for all slices."""
    _check(lora_out.dim() == 3 and lora_b.dim() == 3 and y.dim() == 2, "bad tensor ranks")
    num_slices, num_tokens, max_rank = lora_out.shape
    max_loras, total_out, b_rank = lora_b.shape
    _check(len(slice_sizes) == num_slices, "one slice size per lora_out slice")
    _check(num_slices <= MAX_SLICES, f"at most {MAX_SLICES} slices per launch")
    _check(sum(slice_sizes) == total_out, f"slice sizes {slice_sizes} != lora_b rows {total_out}")
    _check(b_rank == max_rank, f"lora_b max_rank {b_rank} != lora_out max_rank {max_rank}")
    _check(y.shape[0] == num_tokens, "y and lora_out must have the same number of tokens")
    _check(y_offset >= 0 and y_offset + total_out <= y.shape[1], "y_offset slice out of range")
    float_dtypes = (torch.float16, torch.bfloat16, torch.float32)
    _check(lora_b.dtype in float_dtypes and y.dtype in float_dtypes, "bad floating dtype")
    _check(lora_out.dtype in (torch.float32, lora_b.dtype), "lora_out must be fp32 or lora_b's")
    _check(
        scalings.shape == (max_loras,) and scalings.dtype == torch.float32,
        "scalings must be float32 [max_loras]",
    )
    _check(sorted_token_ids.shape == (num_tokens,), "sorted_token_ids must be [num_tokens]")
    _check(slot_start_loc.shape == (max_loras + 1,), "slot_start_loc must be [max_loras + 1]")
    _check(lora_ranks.shape == (num_slices, max_loras), "lora_ranks must be [slices, max_loras]")
    for name, t in (("sorted_token_ids", sorted_token_ids), ("slot_start_loc", slot_start_loc)):
        _check(t.dtype == torch.int32 and t.is_contiguous(), f"{name} must be contiguous int32")
    _check(lora_ranks.dtype == torch.int32 and lora_ranks.stride(1) == 1, "lora_ranks: int32 rows")
    _check(lora_out.stride(2) == 1 and y.stride(1) == 1, "lora_out and y need contiguous rows")
    _check(lora_b.stride(2) == 1, "lora_b needs a contiguous last dim")
    devices = {
        t.device
        for t in (lora_out, lora_b, y, sorted_token_ids, slot_start_loc, lora_ranks, scalings)
    }
    _check(len(devices) == 1, f"all tensors must be on one device, got {devices}")
    if num_tokens == 0 or total_out == 0 or max_rank == 0:
        return

    ends = [sum(slice_sizes[: i + 1]) for i in range(num_slices)]
    ends += [total_out] * (MAX_SLICES - num_slices)  # unused: no program has those slice ids
    tiles = expand_tiles(num_tokens)
    grid = (
        triton.cdiv(num_tokens, tiles.block_m),
        triton.cdiv(max(slice_sizes), tiles.block_n),
        num_slices * max_loras,
    )
    _lora_expand_kernel[grid](
        lora_out,
        lora_b,
        y,
        sorted_token_ids,
        slot_start_loc,
        lora_ranks,
        scalings,
        max_loras,
        *ends,
        y_offset,
        lora_out.stride(0),
        lora_out.stride(1),
        lora_b.stride(0),
        lora_b.stride(1),
        y.stride(0),
        lora_ranks.stride(0),
        BLOCK_M=tiles.block_m,
        BLOCK_N=tiles.block_n,
        BLOCK_K=min(MAX_BLOCK_K, max(MIN_BLOCK_K, triton.next_power_of_2(max_rank))),
        DOT_PRECISION="ieee" if lora_b.dtype == torch.float32 else "tf32",
        num_warps=tiles.num_warps,
        num_stages=tiles.num_stages,
    )
