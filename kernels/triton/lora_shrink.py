"""Multi-slice, split-K multi-LoRA shrink (x @ A.T per adapter segment) in Triton: Punica SGMV.

Method: Punica's segmented gather matrix multiplication (Chen et al., 2023, "Punica: Multi-Tenant
LoRA Serving"), with the slices of a fused projection (q/k/v, gate/up) in one launch as vLLM's
`lora_shrink` does. A program owns one (segment tile, in_dim chunk, rank tile, slice): it gathers
its token rows of `x` through `sorted_token_ids` (no copy of x), multiplies them by its slot's
slice of `lora_a` over its chunk of in_dim and adds the partial product into `out` (split-K):

    grid = (num_segment_tiles, cdiv(in_dim, K_CHUNK) * cdiv(max_rank, BLOCK_N), num_slices)
    program_id(1) = k_chunk * num_rank_tiles + rank_tile

Segment tiles (`lora_segments.py`) cover the segments of slots with a rank for the program's
slice, within a bound that depends on shapes only (CUDA-graph friendly). Programs past the last
tile, or whose rank tile starts at or past their slot's rank, return at once. BLOCK_N is
max_rank rounded up to a power of two, capped per tile row (`max_block_n`); columns past a slot's
rank are masked (never read).

Split-K: at decode a slot owns a few tokens, so without it only `max_loras` programs per slice
would be busy, each walking all of in_dim (4096..14336) serially. With chunks of K_CHUNK, every
(slot, slice) gets cdiv(in_dim, K_CHUNK) programs, whose partial products are added atomically.
The launcher zeroes `out` first (a memset) unless told that `out` is already zero
(`zero_out=False`: one buffer zeroed once for many launches); the kernel then always adds.

Tiles (`SHRINK_TILES`, keyed by the number of tokens of the launch):
- decode (<= 64 tokens): segments of a few tokens, so BLOCK_M = 16 (tl.dot's minimum), and
  short chunks of in_dim so that a handful of adapters already give several programs per SM.
  Rank tiles of 16: with storage padded to a larger max_lora_rank, a rank-16 adapter costs one
  program per chunk, and registers and shared memory stay those of a 16-column tile.
- mid (<= 512): segments of tens of tokens: BLOCK_M = 32, longer chunks.
- prefill: BLOCK_M = 64 and long chunks (thousands of tokens fill the GPU already; split-K only
  bounds the serial loop). BLOCK_K = 64 keeps 3 pipeline stages of fp32 tiles at rank 64 under
  100 KB of shared memory.
`launch_lora_shrink` takes the tiles as an argument (benchmarks and tests pass candidates).

Numerics: products accumulate in float32; `out` is float32 (the expand reads an unrounded
intermediate). Split-K makes the order of the fp32 additions, hence the last bits of `out`,
vary between runs (as in vLLM). With `zero_out`, rows of `out` of tokens outside every segment,
and columns past a slot's rank, are 0; without it they are left as they were.
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

OP = "lora_shrink"


@dataclass(frozen=True)
class ShrinkTiles:
    """Tile shape of one launch."""

    block_m: int  # token rows per program
    block_k: int  # in_dim step of the inner loop
    k_chunk: int  # in_dim per program (split-K); a multiple of block_k
    max_block_n: int  # rank columns per program: max_rank rounded up to a power of 2, capped
    num_warps: int
    num_stages: int

    def __post_init__(self) -> None:
        check_dot_tiles(block_m=self.block_m, block_k=self.block_k, max_block_n=self.max_block_n)
        if self.k_chunk <= 0 or self.k_chunk % self.block_k:
            raise ValueError(f"k_chunk {self.k_chunk} must be a multiple of block_k")


SHRINK_TILES: Final = TileTable(
    (
        (64, ShrinkTiles(16, block_k=128, k_chunk=256, max_block_n=16, num_warps=4, num_stages=2)),
        (512, ShrinkTiles(32, block_k=128, k_chunk=512, max_block_n=64, num_warps=4, num_stages=3)),
        (
            sys.maxsize,
            ShrinkTiles(64, block_k=64, k_chunk=1024, max_block_n=64, num_warps=4, num_stages=3),
        ),
    )
)


@triton.jit
def shrink_tile(  # type: ignore[no-untyped-def]
    x_ptr,
    a_ptr,  # lora_a[slot, slice]: [max_rank, in_dim]
    token_ids,  # [BLOCK_M] int64
    mask_m,
    offs_n,  # [BLOCK_N] rank columns
    mask_n,
    k_start,
    num_k_steps,
    in_dim,
    stride_xm,
    stride_an,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    """fp32 [BLOCK_M, BLOCK_N]: x[token_ids, k] @ A[offs_n, k].T over k in
    [k_start, k_start + num_k_steps * BLOCK_K) (masked past in_dim)."""
    offs_k = tl.arange(0, BLOCK_K)
    x_ptrs = x_ptr + token_ids[:, None] * stride_xm + (k_start + offs_k)[None, :]
    a_ptrs = a_ptr + offs_n[None, :] * stride_an + (k_start + offs_k)[:, None]  # A read transposed
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for step in range(num_k_steps):
        mask_k = offs_k < in_dim - k_start - step * BLOCK_K
        x = tl.load(x_ptrs, mask=mask_m[:, None] & mask_k[None, :], other=0.0)
        a = tl.load(a_ptrs, mask=mask_k[:, None] & mask_n[None, :], other=0.0)
        acc = tl.dot(x, a, acc, input_precision=DOT_PRECISION)
        x_ptrs += BLOCK_K
        a_ptrs += BLOCK_K
    return acc


@triton.jit
def _lora_shrink_kernel(  # type: ignore[no-untyped-def]
    x_ptr,
    lora_a_ptr,
    out_ptr,
    sorted_token_ids_ptr,
    slot_start_loc_ptr,
    lora_ranks_ptr,
    in_dim,
    max_loras,
    num_rank_tiles,
    stride_xm,
    stride_al,
    stride_as,
    stride_an,
    stride_os,
    stride_om,
    stride_rs,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    K_CHUNK: tl.constexpr,
    SLOTS: tl.constexpr,
    USE_ATOMIC: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    pid_k = tl.program_id(1) // num_rank_tiles
    n_start = (tl.program_id(1) % num_rank_tiles) * BLOCK_N
    slice_id = tl.program_id(2)
    slot, m_start, seg_end, rank = segment_tile(
        tl.program_id(0),
        slot_start_loc_ptr,
        lora_ranks_ptr + slice_id * stride_rs,
        max_loras,
        BLOCK_M,
        SLOTS,
    )
    if (m_start >= seg_end) | (n_start >= rank):
        return  # also covers rank == 0

    token_ids, mask_m = segment_token_ids(sorted_token_ids_ptr, m_start, seg_end, BLOCK_M)
    offs_n = n_start + tl.arange(0, BLOCK_N)
    mask_n = offs_n < rank
    a_ptr = lora_a_ptr + slot.to(tl.int64) * stride_al + slice_id.to(tl.int64) * stride_as
    acc = shrink_tile(
        x_ptr,
        a_ptr,
        token_ids,
        mask_m,
        offs_n,
        mask_n,
        pid_k * K_CHUNK,
        K_CHUNK // BLOCK_K,
        in_dim,
        stride_xm,
        stride_an,
        BLOCK_M,
        BLOCK_N,
        BLOCK_K,
        DOT_PRECISION,
    )
    out_ptrs = out_ptr + slice_id * stride_os + token_ids[:, None] * stride_om + offs_n[None, :]
    mask = mask_m[:, None] & mask_n[None, :]
    if USE_ATOMIC:
        tl.atomic_add(out_ptrs, acc, mask=mask, sem="relaxed")
    else:
        tl.store(out_ptrs, acc, mask=mask)


def _check_args(
    x: torch.Tensor,
    lora_a: torch.Tensor,
    sorted_token_ids: torch.Tensor,
    slot_start_loc: torch.Tensor,
    lora_ranks: torch.Tensor,
    out: torch.Tensor,
) -> None:
    check(OP, x.dim() == 2 and lora_a.dim() == 4, "x must be 2-D and lora_a 4-D")
    num_tokens, in_dim = x.shape
    max_loras, num_slices, max_rank, a_in_dim = lora_a.shape
    check(OP, a_in_dim == in_dim, f"lora_a in_dim {a_in_dim} != x in_dim {in_dim}")
    check(OP, x.dtype == lora_a.dtype, f"x dtype {x.dtype} != lora_a dtype {lora_a.dtype}")
    check(OP, x.dtype in (torch.float16, torch.bfloat16, torch.float32), f"bad dtype {x.dtype}")
    out_shape = (num_slices, num_tokens, max_rank)
    check(OP, out.shape == out_shape, f"out must be {out_shape}")
    check(OP, out.dtype == torch.float32, "out dtype must be float32 (split-K adds atomically)")
    mapping = (sorted_token_ids, slot_start_loc, lora_ranks)
    check_lora_mapping(OP, num_tokens, max_loras, num_slices, *mapping)
    check(OP, x.stride(1) == 1 and out.stride(2) == 1, "x and out need contiguous rows")
    check(OP, lora_a.stride(3) == 1, "lora_a needs a contiguous last dim")
    check_one_device(OP, x, lora_a, out, *mapping)


def lora_shrink(
    x: torch.Tensor,  # [num_tokens, in_dim]
    lora_a: torch.Tensor,  # [max_loras, num_slices, max_rank, in_dim]
    sorted_token_ids: torch.Tensor,  # [num_tokens] int32
    slot_start_loc: torch.Tensor,  # [max_loras + 1] int32
    lora_ranks: torch.Tensor,  # [num_slices, max_loras] int32
    out: torch.Tensor,  # [num_slices, num_tokens, max_rank] float32
    zero_out: bool = True,
) -> None:
    """Zero `out` (unless `zero_out` is False), then out[i, t, :r] += x[t] @ lora_a[s, i, :r].T
    for every slice i and token t of slot s, where r = lora_ranks[i, s]. One launch for all
    slices, with SHRINK_TILES' row for the number of tokens."""
    tiles = SHRINK_TILES.lookup(x.shape[0])
    mapping = (sorted_token_ids, slot_start_loc, lora_ranks)
    launch_lora_shrink(x, lora_a, *mapping, out, zero_out, tiles)


def launch_lora_shrink(
    x: torch.Tensor,
    lora_a: torch.Tensor,
    sorted_token_ids: torch.Tensor,
    slot_start_loc: torch.Tensor,
    lora_ranks: torch.Tensor,
    out: torch.Tensor,
    zero_out: bool,
    tiles: ShrinkTiles,
) -> None:
    """`lora_shrink` with the given tiles instead of the table's."""
    _check_args(x, lora_a, sorted_token_ids, slot_start_loc, lora_ranks, out)
    num_tokens, in_dim = x.shape
    max_loras, num_slices, max_rank, _ = lora_a.shape
    if zero_out:
        out.zero_()
    if num_tokens == 0 or max_rank == 0 or num_slices == 0 or in_dim == 0:
        return

    # Never chunk finer than in_dim needs: small in_dim gets one chunk (and plain stores).
    k_chunk = min(tiles.k_chunk, triton.cdiv(in_dim, tiles.block_k) * tiles.block_k)
    split_k = triton.cdiv(in_dim, k_chunk)
    block_n = rank_block(max_rank, tiles.max_block_n)
    num_rank_tiles = triton.cdiv(max_rank, block_n)
    num_tiles, slots = segment_grid(num_tokens, max_loras, tiles.block_m)
    grid = (num_tiles, split_k * num_rank_tiles, num_slices)
    _lora_shrink_kernel[grid](
        x,
        lora_a,
        out,
        sorted_token_ids,
        slot_start_loc,
        lora_ranks,
        in_dim,
        max_loras,
        num_rank_tiles,
        x.stride(0),
        lora_a.stride(0),
        lora_a.stride(1),
        lora_a.stride(2),
        out.stride(0),
        out.stride(1),
        lora_ranks.stride(0),
        BLOCK_M=tiles.block_m,
        BLOCK_N=block_n,
        BLOCK_K=tiles.block_k,
        K_CHUNK=k_chunk,
        SLOTS=slots,
        USE_ATOMIC=split_k > 1 or not zero_out,
        DOT_PRECISION="ieee" if x.dtype == torch.float32 else "tf32",
        num_warps=tiles.num_warps,
        num_stages=tiles.num_stages,
    )
