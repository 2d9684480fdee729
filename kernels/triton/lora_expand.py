"""Multi-slice multi-LoRA expand (y += scaling * lora_out @ B.T per segment) in Triton: Punica SGMV
over S-LoRA's paged weights.

Method: Punica's segmented gather matrix multiplication (Chen et al., 2023, "Punica: Multi-Tenant
LoRA Serving"), the second half of a LoRA delta after `lora_shrink`, with every slice of a fused
projection in one launch (as vLLM's `lora_expand`), reading each adapter's B_i^T (rank rows of
out_dim_i elements) from its pages in the KV cache's memory (S-LoRA, Sheng et al., 2023; the
layout is `kernels/reference/lora.py`'s). Slice i writes columns y_offset + [o_i, o_i + n_i) of y,
o_i = n_0 + ... + n_{i-1}.

A program owns one (segment tile, run of output-column tiles of a slice, slice); it gathers its
token rows of `lora_out[slice]` through `sorted_token_ids` and, for each column tile of its run,
multiplies them by its adapter's B^T over the adapter's rank for that slice only, scales, and adds
into those columns of y.

    grid = (num_segment_tiles, cdiv(max_i n_i, BLOCK_N), num_slices)
    column tiles per program (a run) = clamp(cdiv(segment tile bound * grid[1],
                                                   TARGET_PROGRAMS), 1, grid[1])

Segment tiles are the shrink's (`lora_segments.py`: a shape-only bound, so CUDA-graph friendly).
The run length is decided in the kernel from the step's own bound on its segment tiles: a step of
a few adapters spreads one column tile per program over the GPU, while a step of 100+ adapters
(segments of a few tokens each) would otherwise run thousands of programs that each read one
small tile of B^T behind a chain of dependent loads; there each program walks a run of column
tiles instead (the H200 sweep: 128 adapters at 256 tokens 3.3 ms against 3.8). With `target_programs=None` the kernel
is compiled without the run loop (one column tile per program). Programs past the last segment
tile, or whose run starts past their (narrower) slice, return at once. The K loop walks the
adapter's own rank in BLOCK_K steps. A rank row of B^T lies whole in
one page when it fits one (`lora_pages.py`), so a [BLOCK_K, BLOCK_N] tile is BLOCK_K contiguous
runs of columns; when some slice of the launch is wider than a page (SPLIT_ROWS), every slice
finds its pages per element through the general formula (rows packed or spanning pages alike). Slice
boundaries are passed as scalars: up to MAX_SLICES slices (qkv).

Tiles (`EXPAND_TILES`, keyed by the number of tokens of the launch): out_dim is wide
(1024..14336 per slice) and the reduction (the rank) short, so BLOCK_N = 128 columns per column
tile, BLOCK_K = the max rank rounded up to a power of two, capped at 16 for decode and 64
otherwise. BLOCK_M = 16 (tl.dot's minimum) up to 2,048 tokens: a step of many adapters has
segments of a few tokens each, and a taller tile would read B^T for rows it does not have.
Column runs (target_programs) from 65 to 2,048 tokens; a decode step of up to 64 tokens runs one
column tile per program (runs there cost 7-27% on the H200). Those rows are
bench/lora_many_tiles.py's H200 sweep (bench/results/h200-*-many-tiles). Past 2,048 tokens
(prefill), 32-row tiles, one column tile per program: bench/lora_step_tiles.py's sweep of
W1's 4,096-token step, where the expand moves y at 80% of a copy's speed (64-row tiles with
runs: 59%).
`launch_lora_expand` takes the tiles as an argument (benchmarks and tests pass candidates).

Numerics: the `lora_out` tile is cast to the weights' dtype for the tensor-core dot (as vLLM's
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

from loraplex.kernels.launch_checks import check, check_one_device
from loraplex.kernels.triton.grid_math import cdiv
from loraplex.kernels.triton.lora_pages import lora_delta, lora_rank_rows
from loraplex.kernels.triton.lora_segments import (
    check_lora_mapping,
    rank_block,
    segment_grid,
    segment_tile,
    segment_tile_bound,
    segment_token_ids,
)
from loraplex.kernels.triton.tile_table import TileTable, check_dot_tiles

OP = "lora_expand"
MAX_SLICES = 3


@dataclass(frozen=True)
class ExpandTiles:
    """Tile shape of one launch."""

    block_m: int  # token rows per program
    block_n: int  # output columns per column tile
    max_block_k: int  # rank step: max_rank rounded up to a power of 2, capped
    num_warps: int
    num_stages: int
    # Working programs per slice to aim for: past it, each program walks several column tiles.
    # None: one column tile per program whatever the step.
    target_programs: int | None = None

    def __post_init__(self) -> None:
        check_dot_tiles(block_m=self.block_m, block_n=self.block_n, max_block_k=self.max_block_k)
        if self.target_programs is not None and self.target_programs <= 0:
            raise ValueError(f"target_programs {self.target_programs} must be positive")


EXPAND_TILES: Final = TileTable(
    (
        (64, ExpandTiles(block_m=16, block_n=128, max_block_k=16, num_warps=4, num_stages=2)),
        (
            2048,
            ExpandTiles(16, 128, max_block_k=64, num_warps=4, num_stages=2, target_programs=1024),
        ),
        (sys.maxsize, ExpandTiles(32, 128, max_block_k=64, num_warps=4, num_stages=2)),
    )
)


def slice_ends(slice_sizes: tuple[int, ...]) -> list[int]:
    """End column of each slice (past y_offset), padded to MAX_SLICES (no program has the
    extra ids)."""
    ends = [sum(slice_sizes[: i + 1]) for i in range(len(slice_sizes))]
    return ends + [sum(slice_sizes)] * (MAX_SLICES - len(slice_sizes))


@triton.jit
def slice_rows(slice_id, slice_end_0, slice_end_1, slice_end_2):  # type: ignore[no-untyped-def]
    """Columns [start, end) of y past y_offset that belong to slice_id."""
    start = tl.where(slice_id == 0, 0, tl.where(slice_id == 1, slice_end_0, slice_end_1))
    end = tl.where(slice_id == 0, slice_end_0, tl.where(slice_id == 1, slice_end_1, slice_end_2))
    return start, end


@triton.jit
def expand_column_tile(  # type: ignore[no-untyped-def]
    n_start,
    n_end,  # columns of the slice this program may write end here
    lo_rows,  # [BLOCK_M, 1] pointers to the token rows of lora_out[slice]
    y_rows,  # [BLOCK_M, 1] pointers to the token rows of y, at the slice's first column
    mask_m,
    rank,
    scaling,
    pages_ptr,
    adapter_pages,
    first,
    width,
    page_size,
    stride_pp,
    lo_tile,  # lora_rank_rows' results
    row_base,
    mask_k,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    SPLIT_ROWS: tl.constexpr,
    ONE_STEP: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    """y[rows, n_start:n_start + BLOCK_N] += scaling * lora_out[rows, :rank] @ B^T[:rank, cols]."""
    offs_n = n_start + tl.arange(0, BLOCK_N)  # columns within the slice
    mask_n = offs_n < n_end
    y_ptrs = y_rows + offs_n[None, :]
    mask = mask_m[:, None] & mask_n[None, :]
    y = tl.load(y_ptrs, mask=mask, other=0.0)
    acc = lora_delta(
        offs_n, mask_n, lo_rows, mask_m, rank, pages_ptr, adapter_pages, first, width,
        page_size, stride_pp, lo_tile, row_base, mask_k,
        BLOCK_M, BLOCK_N, BLOCK_K, SPLIT_ROWS, ONE_STEP, DOT_PRECISION,
    )  # fmt: skip
    tl.store(y_ptrs, (y.to(tl.float32) + acc * scaling).to(y.dtype), mask=mask)


@triton.jit
def _lora_expand_kernel(  # type: ignore[no-untyped-def]
    lora_out_ptr,
    pages_ptr,
    page_table_ptr,
    first_page_ptr,
    lora_ranks_ptr,
    scalings_ptr,
    slot_adapters_ptr,
    num_active_slots_ptr,
    sorted_token_ids_ptr,
    slot_start_loc_ptr,
    y_ptr,
    page_size,
    slice_end_0,
    slice_end_1,
    slice_end_2,
    y_offset,
    stride_ls,
    stride_lm,
    stride_pp,
    stride_pt,
    stride_fs,
    stride_rs,
    stride_ym,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    SLOTS: tl.constexpr,
    SPLIT_ROWS: tl.constexpr,  # some slice is wider than a page: the general addressing
    COLUMN_RUNS: tl.constexpr,  # programs may walk several column tiles
    TARGET_PROGRAMS: tl.constexpr,
    ONE_STEP: tl.constexpr,  # every rank fits BLOCK_K and no slice spans pages
    DOT_PRECISION: tl.constexpr,
):
    slice_id = tl.program_id(2)
    num_active, num_segment_tiles = segment_tile_bound(
        slot_start_loc_ptr, num_active_slots_ptr, BLOCK_M
    )
    if tl.program_id(0) >= num_segment_tiles:
        return
    num_n_tiles = tl.num_programs(1)
    if COLUMN_RUNS:
        run = tl.cdiv(num_segment_tiles * num_n_tiles, TARGET_PROGRAMS)
        run = tl.minimum(tl.maximum(run, 1), num_n_tiles)  # column tiles per program
    else:
        run = 1
    n_first = tl.program_id(1) * run * BLOCK_N
    if n_first >= num_n_tiles * BLOCK_N:
        return
    adapter, m_start, seg_end, rank = segment_tile(
        tl.program_id(0),
        slot_start_loc_ptr,
        slot_adapters_ptr,
        lora_ranks_ptr + slice_id * stride_rs,
        num_active,
        BLOCK_M,
        SLOTS,
    )
    slice_start, slice_end = slice_rows(slice_id, slice_end_0, slice_end_1, slice_end_2)
    width = slice_end - slice_start  # columns of this slice: the length of a B^T row
    if (m_start >= seg_end) | (rank == 0) | (n_first >= width):
        return

    first = tl.load(first_page_ptr + slice_id * stride_fs + adapter)
    adapter_pages = page_table_ptr + adapter.to(tl.int64) * stride_pt
    scaling = tl.load(scalings_ptr + adapter)
    token_ids, mask_m = segment_token_ids(sorted_token_ids_ptr, m_start, seg_end, BLOCK_M)
    y_rows = y_ptr + token_ids[:, None] * stride_ym + (y_offset + slice_start)
    lo_rows = lora_out_ptr + slice_id * stride_ls + token_ids[:, None] * stride_lm
    lo_tile, row_base, mask_k = lora_rank_rows(
        lo_rows, mask_m, rank, adapter_pages, first, width, page_size, stride_pp,
        BLOCK_K, ONE_STEP,
    )  # fmt: skip
    if COLUMN_RUNS:
        n_end = tl.minimum(n_first + run * BLOCK_N, width)
        for n_start in range(n_first, n_end, BLOCK_N):
            expand_column_tile(
                n_start, n_end, lo_rows, y_rows, mask_m, rank, scaling, pages_ptr,
                adapter_pages, first, width, page_size, stride_pp, lo_tile, row_base, mask_k,
                BLOCK_M, BLOCK_N, BLOCK_K, SPLIT_ROWS, ONE_STEP, DOT_PRECISION,
            )  # fmt: skip
    else:
        expand_column_tile(
            n_first, width, lo_rows, y_rows, mask_m, rank, scaling, pages_ptr,
            adapter_pages, first, width, page_size, stride_pp, lo_tile, row_base, mask_k,
            BLOCK_M, BLOCK_N, BLOCK_K, SPLIT_ROWS, ONE_STEP, DOT_PRECISION,
        )  # fmt: skip


def _check_args(
    lora_out: torch.Tensor,
    pages: torch.Tensor,
    page_table: torch.Tensor,
    first_page: torch.Tensor,
    lora_ranks: torch.Tensor,
    scalings: torch.Tensor,
    slot_adapters: torch.Tensor,
    num_active_slots: torch.Tensor,
    sorted_token_ids: torch.Tensor,
    slot_start_loc: torch.Tensor,
    y: torch.Tensor,
    y_offset: int,
    slice_sizes: tuple[int, ...],
) -> None:
    check(OP, lora_out.dim() == 3 and pages.dim() == 2 and y.dim() == 2, "bad tensor ranks")
    num_slices, num_tokens, _ = lora_out.shape
    check(OP, len(slice_sizes) == num_slices, "one slice size per lora_out slice")
    check(OP, num_slices <= MAX_SLICES, "at most %s slices per launch", MAX_SLICES)
    check(OP, y.shape[0] == num_tokens, "y and lora_out must have the same number of tokens")
    total_out = sum(slice_sizes)
    check(OP, y_offset >= 0 and y_offset + total_out <= y.shape[1], "y_offset out of range")
    float_dtypes = (torch.float16, torch.bfloat16, torch.float32)
    check(OP, pages.dtype in float_dtypes and y.dtype in float_dtypes, "bad floating dtype")
    check(OP, lora_out.dtype in (torch.float32, pages.dtype), "lora_out: fp32 or the pages'")
    num_adapters = page_table.shape[0]
    check(
        OP,
        scalings.shape == (num_adapters,) and scalings.dtype == torch.float32,
        "scalings must be float32 [num_adapters]",
    )
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
    check(OP, lora_out.stride(2) == 1 and y.stride(1) == 1, "lora_out and y need contiguous rows")
    check(OP, pages.stride(1) == 1, "pages need contiguous rows")
    check_one_device(OP, lora_out, pages, y, scalings, sorted_token_ids)


def lora_expand(
    lora_out: torch.Tensor,  # [num_slices, num_tokens, max_rank], float32 or the pages' dtype
    pages: torch.Tensor,  # [num_pages, page_size]
    page_table: torch.Tensor,  # [num_adapters, max_pages] int32
    first_page: torch.Tensor,  # [num_slices, num_adapters] int32: first page of B_i^T
    lora_ranks: torch.Tensor,  # [num_slices, num_adapters] int32
    scalings: torch.Tensor,  # [num_adapters] float32
    slot_adapters: torch.Tensor,  # [num_slots] int32
    num_active_slots: torch.Tensor,  # [1] int32: slots from it on are empty
    sorted_token_ids: torch.Tensor,  # [num_tokens] int32
    slot_start_loc: torch.Tensor,  # [num_slots + 1] int32
    y: torch.Tensor,  # [num_tokens, y_dim]
    y_offset: int,
    slice_sizes: tuple[int, ...],  # out_dim of each slice, in y's column order
) -> None:
    """y[t, y_offset + o_i + j] += scalings[a] * lora_out[i, t, :r] @ B_i^T[:r, j] for every
    slice i (o_i = sum(slice_sizes[:i]), j < slice_sizes[i]) and token t of an adapter's
    segment. One launch for all slices, with EXPAND_TILES' row for the number of tokens."""
    tiles = EXPAND_TILES.lookup(y.shape[0])
    tables = (page_table, first_page, lora_ranks, scalings, slot_adapters, num_active_slots)
    mapping = (sorted_token_ids, slot_start_loc)
    launch_lora_expand(lora_out, pages, *tables, *mapping, y, y_offset, slice_sizes, tiles)


def launch_lora_expand(
    lora_out: torch.Tensor,
    pages: torch.Tensor,
    page_table: torch.Tensor,
    first_page: torch.Tensor,
    lora_ranks: torch.Tensor,
    scalings: torch.Tensor,
    slot_adapters: torch.Tensor,
    num_active_slots: torch.Tensor,
    sorted_token_ids: torch.Tensor,
    slot_start_loc: torch.Tensor,
    y: torch.Tensor,
    y_offset: int,
    slice_sizes: tuple[int, ...],
    tiles: ExpandTiles,
) -> None:
    """`lora_expand` with the given tiles instead of the table's."""
    tables = (page_table, first_page, lora_ranks, scalings, slot_adapters, num_active_slots)
    mapping = (sorted_token_ids, slot_start_loc)
    _check_args(lora_out, pages, *tables, *mapping, y, y_offset, slice_sizes)
    num_slices, num_tokens, max_rank = lora_out.shape
    if num_tokens == 0 or sum(slice_sizes) == 0 or max_rank == 0:
        return

    page_size = pages.shape[1]
    block_k = rank_block(max_rank, tiles.max_block_k)
    num_slots = slot_adapters.shape[0]
    num_tiles, slots = segment_grid(num_tokens, num_slots, tiles.block_m)
    grid = (num_tiles, cdiv(max(slice_sizes), tiles.block_n), num_slices)
    _lora_expand_kernel[grid](
        lora_out,
        pages,
        page_table,
        first_page,
        lora_ranks,
        scalings,
        slot_adapters,
        num_active_slots,
        sorted_token_ids,
        slot_start_loc,
        y,
        page_size,
        *slice_ends(slice_sizes),
        y_offset,
        lora_out.stride(0),
        lora_out.stride(1),
        pages.stride(0),
        page_table.stride(0),
        first_page.stride(0),
        lora_ranks.stride(0),
        y.stride(0),
        BLOCK_M=tiles.block_m,
        BLOCK_N=tiles.block_n,
        BLOCK_K=block_k,
        SLOTS=slots,
        SPLIT_ROWS=max(slice_sizes) > page_size,
        COLUMN_RUNS=tiles.target_programs is not None,
        TARGET_PROGRAMS=tiles.target_programs or 1,
        ONE_STEP=max_rank <= block_k and max(slice_sizes) <= page_size,
        DOT_PRECISION="ieee" if pages.dtype == torch.float32 else "tf32",
        num_warps=tiles.num_warps,
        num_stages=tiles.num_stages,
    )
