"""SiLU-and-mul with the gate_up projection's multi-LoRA expand fused in, in Triton.

Method: Punica's SGMV expand (`lora_expand.py`) folded into vLLM's `silu_and_mul`
(`silu_and_mul.py`). The unfused pair reads the gate_up GEMM's output y [T, 2I], adds each
token's adapter delta, writes y back, and then the activation reads y once more: y crosses
memory three times. Here a program loads its tile of gate and up, adds the deltas in registers
and writes only silu(gate') * up' [T, I]; at a 4,096-token prefill step of Llama-3-8B that saves
470 MB of traffic per layer. The result is exactly the unfused pair's: gate' and up' are rounded
to the dtype as `lora_expand` rounds y, and the activation rounds as `silu_and_mul` does.

Every token must be visited, adapted or not, so the programs' row tiles come in two kinds:

    grid = (segment tiles + rest tiles, cdiv(I, BLOCK_N))
    segment tiles: `slot_tile`'s, BLOCK_M tokens of one slot, over every active slot whatever
                   its ranks (an adapter without gate_proj or up_proj still needs the silu);
    rest tiles:    BLOCK_M tokens each of those without an adapter, which `build_lora_mapping`
                   puts last: sorted_token_ids[slot_start_loc[num_active]:].

Both counts are shape-only bounds (CUDA-graph friendly); programs past the step's own tiles
return at once.

Tiles (`SILU_LORA_TILES`, `lora_expand`'s `ExpandTiles` keyed by the number of tokens): 16-row
tiles at every size, each program walking a run of column tiles. The rows are
bench/silu_lora_tiles.py's H200 sweep (bench/results/h200-48af144-silu-lora): within 4% of the
best candidate at each size from 64 to 4,096 tokens (32-row tiles were the best at 2,048 and
4,096, by 3-4%); 64-row tiles and 8 warps were slower at every size.
"""

from __future__ import annotations

import sys
from typing import Final

import torch
import triton
import triton.language as tl

from loraplex.kernels.launch_checks import check, check_one_device
from loraplex.kernels.triton.grid_math import cdiv
from loraplex.kernels.triton.lora_expand import ExpandTiles
from loraplex.kernels.triton.lora_pages import lora_delta, lora_rank_rows
from loraplex.kernels.triton.lora_segments import (
    check_lora_mapping,
    rank_block,
    segment_grid,
    segment_tile_bound,
    segment_token_ids,
    slot_tile,
)
from loraplex.kernels.triton.tile_table import TileTable

OP = "silu_and_mul_lora"

SILU_LORA_TILES: Final = TileTable(
    (
        (64, ExpandTiles(16, 128, max_block_k=16, num_warps=4, num_stages=2, target_programs=1024)),
        (
            sys.maxsize,
            ExpandTiles(16, 128, max_block_k=64, num_warps=4, num_stages=2, target_programs=4096),
        ),
    )
)


@triton.jit
def _silu_and_mul_column_tile(  # type: ignore[no-untyped-def]
    n_start,
    x_rows,  # [BLOCK_M, 1] pointers to the token rows of x
    out_rows,  # [BLOCK_M, 1] pointers to the token rows of out
    lo_gate,  # [BLOCK_M, 1] pointers to the token rows of lora_out[0] (gate), [1] (up)
    lo_up,
    mask_m,
    rank_gate,
    rank_up,
    scale_gate,
    scale_up,
    pages_ptr,
    adapter_pages,
    first_gate,
    first_up,
    intermediate,
    page_size,
    stride_pp,
    lo_tile_gate,  # lora_rank_rows' results for gate, then for up
    row_base_gate,
    mask_k_gate,
    lo_tile_up,
    row_base_up,
    mask_k_up,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    SPLIT_ROWS: tl.constexpr,
    ONE_STEP: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    """out[rows, cols] = silu(gate + delta_gate) * (up + delta_up), each sum rounded first."""
    offs_n = n_start + tl.arange(0, BLOCK_N)
    mask_n = offs_n < intermediate
    mask = mask_m[:, None] & mask_n[None, :]
    gate = tl.load(x_rows + offs_n[None, :], mask=mask, other=0.0)
    up = tl.load(x_rows + intermediate + offs_n[None, :], mask=mask, other=0.0)
    dtype = gate.dtype
    d_gate = lora_delta(
        offs_n, mask_n, lo_gate, mask_m, rank_gate, pages_ptr, adapter_pages, first_gate,
        intermediate, page_size, stride_pp, lo_tile_gate, row_base_gate, mask_k_gate,
        BLOCK_M, BLOCK_N, BLOCK_K, SPLIT_ROWS, ONE_STEP, DOT_PRECISION,
    )  # fmt: skip
    d_up = lora_delta(
        offs_n, mask_n, lo_up, mask_m, rank_up, pages_ptr, adapter_pages, first_up,
        intermediate, page_size, stride_pp, lo_tile_up, row_base_up, mask_k_up,
        BLOCK_M, BLOCK_N, BLOCK_K, SPLIT_ROWS, ONE_STEP, DOT_PRECISION,
    )  # fmt: skip
    gate = (gate.to(tl.float32) + d_gate * scale_gate).to(dtype).to(tl.float32)
    up = (up.to(tl.float32) + d_up * scale_up).to(dtype).to(tl.float32)
    act = (gate / (1.0 + tl.exp(-gate))).to(dtype).to(tl.float32)
    tl.store(out_rows + offs_n[None, :], (act * up).to(dtype), mask=mask)


# Counts that change with every step (bounds and comparisons only): one compiled variant for all
# of them, not one per class of values (1, a multiple of 16, any other).
@triton.jit(do_not_specialize=["num_tokens", "num_segment_grid"])
def _silu_and_mul_lora_kernel(  # type: ignore[no-untyped-def]
    x_ptr,
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
    out_ptr,
    num_tokens,
    intermediate,
    page_size,
    num_segment_grid,  # grid rows of segment tiles; the rest tiles follow
    stride_x,
    stride_ls,
    stride_lm,
    stride_pp,
    stride_pt,
    stride_fs,
    stride_rs,
    stride_out,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    SLOTS: tl.constexpr,
    SPLIT_ROWS: tl.constexpr,  # a row of B^T (intermediate elements) spans pages
    COLUMN_RUNS: tl.constexpr,
    TARGET_PROGRAMS: tl.constexpr,
    ONE_STEP: tl.constexpr,  # every rank fits BLOCK_K and a row of B^T fits a page
    DOT_PRECISION: tl.constexpr,
):
    tile = tl.program_id(0)
    num_active, num_segment_tiles = segment_tile_bound(
        slot_start_loc_ptr, num_active_slots_ptr, BLOCK_M
    )
    num_adapted = tl.load(slot_start_loc_ptr + num_active)
    num_rest_tiles = tl.cdiv(num_tokens - num_adapted, BLOCK_M)
    is_rest = tile >= num_segment_grid
    rest = tile - num_segment_grid
    past_segments = (tile < num_segment_grid) & (tile >= num_segment_tiles)
    if past_segments | (is_rest & (rest >= num_rest_tiles)):
        return
    num_n_tiles = tl.num_programs(1)
    if COLUMN_RUNS:
        run = tl.cdiv((num_segment_tiles + num_rest_tiles) * num_n_tiles, TARGET_PROGRAMS)
        run = tl.minimum(tl.maximum(run, 1), num_n_tiles)  # column tiles per program
    else:
        run = 1
    n_first = tl.program_id(1) * run * BLOCK_N
    if n_first >= intermediate:
        return

    adapter, m_start, seg_end = slot_tile(
        tile, slot_start_loc_ptr, slot_adapters_ptr, num_active, BLOCK_M, SLOTS
    )
    # A rest tile: no adapter (rank 0 skips every read of the adapter's tables and pages).
    m_start = tl.where(is_rest, num_adapted + rest * BLOCK_M, m_start)
    seg_end = tl.where(is_rest, num_tokens, seg_end)
    adapter = tl.where(is_rest, 0, adapter)
    rank_gate = tl.where(is_rest, 0, tl.load(lora_ranks_ptr + adapter))
    rank_up = tl.where(is_rest, 0, tl.load(lora_ranks_ptr + stride_rs + adapter))
    scaling = tl.load(scalings_ptr + adapter)  # NaN for an adapter of no rank: never used
    scale_gate = tl.where(rank_gate > 0, scaling, 0.0)
    scale_up = tl.where(rank_up > 0, scaling, 0.0)
    first_gate = tl.load(first_page_ptr + adapter)
    first_up = tl.load(first_page_ptr + stride_fs + adapter)
    adapter_pages = page_table_ptr + adapter.to(tl.int64) * stride_pt

    token_ids, mask_m = segment_token_ids(sorted_token_ids_ptr, m_start, seg_end, BLOCK_M)
    x_rows = x_ptr + token_ids[:, None] * stride_x
    out_rows = out_ptr + token_ids[:, None] * stride_out
    lo_gate = lora_out_ptr + token_ids[:, None] * stride_lm
    lo_up = lo_gate + stride_ls
    lo_tile_gate, row_base_gate, mask_k_gate = lora_rank_rows(
        lo_gate, mask_m, rank_gate, adapter_pages, first_gate, intermediate, page_size,
        stride_pp, BLOCK_K, ONE_STEP,
    )  # fmt: skip
    lo_tile_up, row_base_up, mask_k_up = lora_rank_rows(
        lo_up, mask_m, rank_up, adapter_pages, first_up, intermediate, page_size,
        stride_pp, BLOCK_K, ONE_STEP,
    )  # fmt: skip
    n_end = tl.minimum(n_first + run * BLOCK_N, intermediate)
    for n_start in range(n_first, n_end, BLOCK_N):
        _silu_and_mul_column_tile(
            n_start, x_rows, out_rows, lo_gate, lo_up, mask_m, rank_gate, rank_up, scale_gate,
            scale_up, pages_ptr, adapter_pages, first_gate, first_up, intermediate, page_size,
            stride_pp, lo_tile_gate, row_base_gate, mask_k_gate, lo_tile_up, row_base_up,
            mask_k_up, BLOCK_M, BLOCK_N, BLOCK_K, SPLIT_ROWS, ONE_STEP, DOT_PRECISION,
        )  # fmt: skip


def silu_and_mul_lora(
    x: torch.Tensor,  # [num_tokens, 2 * intermediate]: the gate_up GEMM's output, [gate | up]
    lora_out: torch.Tensor,  # [2, num_tokens, max_rank] float32: gate's and up's shrink
    pages: torch.Tensor,  # [num_pages, page_size]
    page_table: torch.Tensor,  # [num_adapters, max_pages] int32
    first_page: torch.Tensor,  # [2, num_adapters] int32: first page of B_gate^T, B_up^T
    lora_ranks: torch.Tensor,  # [2, num_adapters] int32
    scalings: torch.Tensor,  # [num_adapters] float32
    slot_adapters: torch.Tensor,  # [num_slots] int32
    num_active_slots: torch.Tensor,  # [1] int32
    sorted_token_ids: torch.Tensor,  # [num_tokens] int32
    slot_start_loc: torch.Tensor,  # [num_slots + 1] int32
) -> torch.Tensor:
    """`silu_and_mul` of x after `lora_expand` of its two slices into it -> [num_tokens, I] in
    x's dtype (a new tensor; x is left as it was). SILU_LORA_TILES' row for the number of tokens."""
    tables = (page_table, first_page, lora_ranks, scalings, slot_adapters, num_active_slots)
    mapping = (sorted_token_ids, slot_start_loc)
    tiles = SILU_LORA_TILES.lookup(x.shape[0])
    return launch_silu_and_mul_lora(x, lora_out, pages, *tables, *mapping, tiles)


def _check_args(
    x: torch.Tensor,
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
) -> None:
    check(OP, x.dim() == 2 and lora_out.dim() == 3 and pages.dim() == 2, "bad tensor ranks")
    num_tokens, width = x.shape
    check(OP, width % 2 == 0, "x's last dim must be even, got %s", width)
    check(OP, lora_out.shape[:2] == (2, num_tokens), "lora_out must be [2, num_tokens, max_rank]")
    check(OP, lora_out.dtype == torch.float32, "lora_out must be float32")
    float_dtypes = (torch.float16, torch.bfloat16, torch.float32)
    check(OP, x.dtype in float_dtypes and pages.dtype in float_dtypes, "bad floating dtype")
    check(
        OP,
        scalings.shape == (page_table.shape[0],) and scalings.dtype == torch.float32,
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
    check_lora_mapping(OP, num_tokens, 2, mapping)
    check(OP, x.stride(1) == 1 and lora_out.stride(2) == 1, "x and lora_out need contiguous rows")
    check(OP, pages.stride(1) == 1, "pages need contiguous rows")
    check_one_device(OP, x, lora_out, pages, scalings, sorted_token_ids)


def launch_silu_and_mul_lora(
    x: torch.Tensor,
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
    tiles: ExpandTiles,
) -> torch.Tensor:
    """`silu_and_mul_lora` with the given tiles instead of the table's."""
    tables = (page_table, first_page, lora_ranks, scalings, slot_adapters, num_active_slots)
    mapping = (sorted_token_ids, slot_start_loc)
    _check_args(x, lora_out, pages, *tables, *mapping)
    num_tokens, width = x.shape
    intermediate = width // 2
    out = torch.empty((num_tokens, intermediate), dtype=x.dtype, device=x.device)
    if num_tokens == 0 or intermediate == 0:
        return out
    page_size = pages.shape[1]
    block_k = rank_block(max(lora_out.shape[2], 1), tiles.max_block_k)
    num_segment_grid, slots = segment_grid(num_tokens, slot_adapters.shape[0], tiles.block_m)
    num_rest_grid = cdiv(num_tokens, tiles.block_m)
    grid = (num_segment_grid + num_rest_grid, cdiv(intermediate, tiles.block_n))
    _silu_and_mul_lora_kernel[grid](
        x,
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
        out,
        num_tokens,
        intermediate,
        page_size,
        num_segment_grid,
        x.stride(0),
        lora_out.stride(0),
        lora_out.stride(1),
        pages.stride(0),
        page_table.stride(0),
        first_page.stride(0),
        lora_ranks.stride(0),
        out.stride(0),
        BLOCK_M=tiles.block_m,
        BLOCK_N=tiles.block_n,
        BLOCK_K=block_k,
        SLOTS=slots,
        SPLIT_ROWS=intermediate > page_size,
        COLUMN_RUNS=tiles.target_programs is not None,
        TARGET_PROGRAMS=tiles.target_programs or 1,
        ONE_STEP=lora_out.shape[2] <= block_k and intermediate <= page_size,
        DOT_PRECISION="ieee" if pages.dtype == torch.float32 else "tf32",
        num_warps=tiles.num_warps,
        num_stages=tiles.num_stages,
    )
    return out
