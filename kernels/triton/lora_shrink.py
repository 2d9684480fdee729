"""Multi-slice, split-K multi-LoRA shrink (x @ A.T per adapter segment) in Triton: Punica SGMV
over S-LoRA's paged weights.

Method: Punica's segmented gather matrix multiplication (Chen et al., 2023, "Punica: Multi-Tenant
LoRA Serving"), with the slices of a fused projection (q/k/v, gate/up) in one launch as vLLM's
`lora_shrink` does, reading each adapter's A from its pages in the KV cache's memory (S-LoRA,
Sheng et al., 2023; the layout is `kernels/reference/lora.py`'s). A program owns one (segment
tile, in_dim chunk, rank tile, slice): it gathers its token rows of `x` through
`sorted_token_ids` (no copy of x), multiplies them by its adapter's A over its chunk of in_dim
and adds the partial product into `out` (split-K):

    grid = (num_slices, cdiv(in_dim, K_CHUNK) * cdiv(max_rank, BLOCK_N), num_segment_tiles)
    program_id(1) = k_chunk * num_rank_tiles + rank_tile

The slice varies fastest: the programs of one x tile for q, k and v (gate and up) run side by
side, so the second and third read x from L2 instead of HBM (a prefill step's x is larger than
L2; with the slice slowest, each slice's pass read all of x again).

Segment tiles (`lora_segments.py`) cover the segments of slots whose adapter has a rank for the
program's slice, within a bound that depends on shapes only (CUDA-graph friendly). Programs past
the last tile, or whose rank tile starts at or past their adapter's rank, return at once.
BLOCK_N is max_rank rounded up to a power of two, capped per tile row (`max_block_n`); rows of A
past the adapter's rank are masked (never read).

Paged rows (`lora_pages.py`): a row of A (in_dim elements) lies whole in one page when it fits
one, so each rank row of the tile finds its page once and the k loop walks contiguous memory, as
with a dense A; rows longer than a page (SPLIT_ROWS) find their page per element.

Split-K: at decode a slot owns a few tokens, so without it only a few programs per slice would be
busy, each walking all of in_dim (4096..14336) serially. With chunks of K_CHUNK, every (slot,
slice) gets cdiv(in_dim, K_CHUNK) programs, whose partial products are added atomically. The
launcher zeroes `out` first (a memset) unless told that `out` is already zero (`zero_out=False`:
one buffer zeroed once for many launches); the kernel then always adds.

Tiles (`SHRINK_TILES`, keyed by the number of tokens of the launch):
- decode (<= 64 tokens): segments of a few tokens, so BLOCK_M = 16 (tl.dot's minimum), and
  short chunks of in_dim so that a handful of adapters already give several programs per SM.
  Rank tiles of 16: a rank-16 adapter costs one program per chunk whatever max_lora_rank is,
  and registers and shared memory stay those of a 16-column tile.
- mid (<= 512): longer chunks; BLOCK_M = 16 still, since with many adapters a segment has a
  few tokens (H200, 128 adapters at 256 tokens: 2.0 ms per step against 2.5 with 32 rows).
- prefill: BLOCK_M = 64 and long chunks (thousands of tokens fill the GPU already; split-K only
  bounds the serial loop). BLOCK_K = 64 keeps 3 pipeline stages of fp32 tiles at rank 64 under
  100 KB of shared memory.
`launch_lora_shrink` takes the tiles as an argument (benchmarks and tests pass candidates).

Numerics: products accumulate in float32; `out` is float32 (the expand reads an unrounded
intermediate). Split-K makes the order of the fp32 additions, hence the last bits of `out`,
vary between runs (as in vLLM). With `zero_out`, rows of `out` of tokens outside every segment,
and columns past an adapter's rank, are 0; without it they are left as they were.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Final

import torch
import triton
import triton.language as tl

from loraplex.kernels.launch_checks import check, check_one_device
from loraplex.kernels.triton.grid_math import cdiv
from loraplex.kernels.triton.lora_pages import matrix_ptrs, page_rows
from loraplex.kernels.triton.lora_segments import (
    check_lora_mapping,
    past_last_tile,
    rank_block,
    segment_grid,
    segment_tile,
    segment_token_ids,
)
from loraplex.kernels.triton.tile_table import TileTable, check_dot_tiles

OP = "lora_shrink"
MAX_GRID_Z = 65535


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
        (512, ShrinkTiles(16, block_k=128, k_chunk=512, max_block_n=64, num_warps=4, num_stages=3)),
        (
            sys.maxsize,
            ShrinkTiles(64, block_k=64, k_chunk=1024, max_block_n=64, num_warps=4, num_stages=3),
        ),
    )
)


@triton.jit
def _lora_shrink_kernel(  # type: ignore[no-untyped-def]
    x_ptr,
    pages_ptr,
    page_table_ptr,
    first_page_ptr,
    lora_ranks_ptr,
    slot_adapters_ptr,
    num_active_slots_ptr,
    sorted_token_ids_ptr,
    slot_start_loc_ptr,
    out_ptr,
    in_dim,
    page_size,
    num_rank_tiles,
    stride_xm,
    stride_pp,
    stride_pt,
    stride_fs,
    stride_rs,
    stride_os,
    stride_om,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    K_CHUNK: tl.constexpr,
    SLOTS: tl.constexpr,
    SPLIT_ROWS: tl.constexpr,  # in_dim > page_size: a row of A spans pages
    USE_ATOMIC: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    pid_k = tl.program_id(1) // num_rank_tiles
    n_start = (tl.program_id(1) % num_rank_tiles) * BLOCK_N
    slice_id = tl.program_id(0)
    tile_id = tl.program_id(2)
    past, num_active = past_last_tile(tile_id, slot_start_loc_ptr, num_active_slots_ptr, BLOCK_M)
    if past:
        return
    adapter, m_start, seg_end, rank = segment_tile(
        tile_id,
        slot_start_loc_ptr,
        slot_adapters_ptr,
        lora_ranks_ptr + slice_id * stride_rs,
        num_active,
        BLOCK_M,
        SLOTS,
    )
    if (m_start >= seg_end) | (n_start >= rank):
        return  # also covers rank == 0

    token_ids, mask_m = segment_token_ids(sorted_token_ids_ptr, m_start, seg_end, BLOCK_M)
    offs_n = n_start + tl.arange(0, BLOCK_N)  # rows of A (the rank)
    mask_n = offs_n < rank
    first = tl.load(first_page_ptr + slice_id * stride_fs + adapter)
    adapter_pages = page_table_ptr + adapter.to(tl.int64) * stride_pt
    offs_k = tl.arange(0, BLOCK_K)
    k_start = pid_k * K_CHUNK
    x_ptrs = x_ptr + token_ids[:, None] * stride_xm + (k_start + offs_k)[None, :]
    if SPLIT_ROWS:
        row_base = tl.zeros((BLOCK_N,), dtype=tl.int64)  # unused: pages found per element
    else:
        row_base = page_rows(adapter_pages, first, offs_n, mask_n, in_dim, page_size, stride_pp)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for step in range(K_CHUNK // BLOCK_K):
        k = k_start + step * BLOCK_K + offs_k  # [BLOCK_K] columns of A
        mask_k = k < in_dim
        x = tl.load(x_ptrs, mask=mask_m[:, None] & mask_k[None, :], other=0.0)
        mask_a = mask_k[:, None] & mask_n[None, :]
        if SPLIT_ROWS:  # A read transposed: [BLOCK_K, BLOCK_N]
            a_ptrs = matrix_ptrs(
                pages_ptr, adapter_pages, first, offs_n[None, :], k[:, None], mask_a, in_dim,
                page_size, stride_pp,
            )  # fmt: skip
        else:
            a_ptrs = pages_ptr + row_base[None, :] + k[:, None]
        a = tl.load(a_ptrs, mask=mask_a, other=0.0)
        acc = tl.dot(x, a, acc, input_precision=DOT_PRECISION)
        x_ptrs += BLOCK_K
    out_ptrs = out_ptr + slice_id * stride_os + token_ids[:, None] * stride_om + offs_n[None, :]
    mask = mask_m[:, None] & mask_n[None, :]
    if USE_ATOMIC:
        tl.atomic_add(out_ptrs, acc, mask=mask, sem="relaxed")
    else:
        tl.store(out_ptrs, acc, mask=mask)


def _check_args(
    x: torch.Tensor,
    pages: torch.Tensor,
    page_table: torch.Tensor,
    first_page: torch.Tensor,
    lora_ranks: torch.Tensor,
    slot_adapters: torch.Tensor,
    num_active_slots: torch.Tensor,
    sorted_token_ids: torch.Tensor,
    slot_start_loc: torch.Tensor,
    out: torch.Tensor,
) -> None:
    check(OP, x.dim() == 2 and pages.dim() == 2 and out.dim() == 3, "bad tensor ranks")
    num_tokens = x.shape[0]
    num_slices = out.shape[0]
    check(OP, x.dtype == pages.dtype, "x dtype %s != pages dtype %s", x.dtype, pages.dtype)
    check(OP, x.dtype in (torch.float16, torch.bfloat16, torch.float32), "bad dtype %s", x.dtype)
    check(OP, out.shape[1] == num_tokens, "out must be [num_slices, num_tokens, max_rank]")
    check(OP, out.dtype == torch.float32, "out dtype must be float32 (split-K adds atomically)")
    mapping = (
        page_table,
        first_page,
        lora_ranks,
        slot_adapters,
        num_active_slots,
        sorted_token_ids,
        slot_start_loc,
    )
    check_lora_mapping(OP, num_tokens, num_slices, mapping)
    check(OP, x.stride(1) == 1 and out.stride(2) == 1, "x and out need contiguous rows")
    check(OP, pages.stride(1) == 1, "pages need contiguous rows")
    check_one_device(OP, x, pages, out, sorted_token_ids)


def lora_shrink(
    x: torch.Tensor,  # [num_tokens, in_dim]
    pages: torch.Tensor,  # [num_pages, page_size]
    page_table: torch.Tensor,  # [num_adapters, max_pages] int32
    first_page: torch.Tensor,  # [num_slices, num_adapters] int32: first page of A_i
    lora_ranks: torch.Tensor,  # [num_slices, num_adapters] int32
    slot_adapters: torch.Tensor,  # [num_slots] int32
    num_active_slots: torch.Tensor,  # [1] int32: slots from it on are empty
    sorted_token_ids: torch.Tensor,  # [num_tokens] int32
    slot_start_loc: torch.Tensor,  # [num_slots + 1] int32
    out: torch.Tensor,  # [num_slices, num_tokens, max_rank] float32
    zero_out: bool = True,
) -> None:
    """Zero `out` (unless `zero_out` is False), then out[i, t, :r] += x[t] @ A_i[:r].T for every
    slice i and token t of an adapter's segment. One launch for all slices, with SHRINK_TILES'
    row for the number of tokens."""
    tiles = SHRINK_TILES.lookup(x.shape[0])
    tables = (
        page_table,
        first_page,
        lora_ranks,
        slot_adapters,
        num_active_slots,
        sorted_token_ids,
        slot_start_loc,
    )
    launch_lora_shrink(x, pages, *tables, out, zero_out, tiles)


def launch_lora_shrink(
    x: torch.Tensor,
    pages: torch.Tensor,
    page_table: torch.Tensor,
    first_page: torch.Tensor,
    lora_ranks: torch.Tensor,
    slot_adapters: torch.Tensor,
    num_active_slots: torch.Tensor,
    sorted_token_ids: torch.Tensor,
    slot_start_loc: torch.Tensor,
    out: torch.Tensor,
    zero_out: bool,
    tiles: ShrinkTiles,
) -> None:
    """`lora_shrink` with the given tiles instead of the table's."""
    tables = (
        page_table,
        first_page,
        lora_ranks,
        slot_adapters,
        num_active_slots,
        sorted_token_ids,
        slot_start_loc,
    )
    _check_args(x, pages, *tables, out)
    num_tokens, in_dim = x.shape
    num_slices, _, max_rank = out.shape
    num_tiles, slots = segment_grid(num_tokens, slot_adapters.shape[0], tiles.block_m)
    # The segment tiles take the grid's third dimension (CUDA caps it at 65,535): millions of
    # tokens in one launch, far past any step's max_num_batched_tokens.
    check(OP, num_tiles <= MAX_GRID_Z, "%s tokens need more than %s tiles", num_tokens, MAX_GRID_Z)
    if zero_out:
        out.zero_()
    if num_tokens == 0 or max_rank == 0 or num_slices == 0 or in_dim == 0:
        return

    # Never chunk finer than in_dim needs: small in_dim gets one chunk (and plain stores).
    k_chunk = min(tiles.k_chunk, cdiv(in_dim, tiles.block_k) * tiles.block_k)
    split_k = cdiv(in_dim, k_chunk)
    block_n = rank_block(max_rank, tiles.max_block_n)
    num_rank_tiles = cdiv(max_rank, block_n)
    grid = (num_slices, split_k * num_rank_tiles, num_tiles)
    page_size = pages.shape[1]
    _lora_shrink_kernel[grid](
        x,
        pages,
        page_table,
        first_page,
        lora_ranks,
        slot_adapters,
        num_active_slots,
        sorted_token_ids,
        slot_start_loc,
        out,
        in_dim,
        page_size,
        num_rank_tiles,
        x.stride(0),
        pages.stride(0),
        page_table.stride(0),
        first_page.stride(0),
        lora_ranks.stride(0),
        out.stride(0),
        out.stride(1),
        BLOCK_M=tiles.block_m,
        BLOCK_N=block_n,
        BLOCK_K=tiles.block_k,
        K_CHUNK=k_chunk,
        SLOTS=slots,
        SPLIT_ROWS=in_dim > page_size,
        USE_ATOMIC=split_k > 1 or not zero_out,
        DOT_PRECISION="ieee" if x.dtype == torch.float32 else "tf32",
        num_warps=tiles.num_warps,
        num_stages=tiles.num_stages,
    )
