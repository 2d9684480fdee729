"""Split-KV paged attention for decode steps: one query token per sequence (Triton).

Method: PagedAttention (Kwon et al., SOSP 2023) for the cache layout and its v2 partitioning,
as in Flash-Decoding (Dao et al., 2023): a decode step has only num_seqs x num_kv_heads rows of
work, too few programs to keep every SM's loads in flight, so each sequence's keys are cut into
splits that run as separate programs, each producing a partial result, and a second kernel
merges them.

    grid = (num_seqs, num_kv_heads, max_splits)        phase 1: one program per split
    keys [kv_lo, seq_len) in tiles of TILE_N:
        | split 0       | split 1       | split 2 |      tiles_per_split tiles each
    partial_out[s, h, split, :] = softmax-weighted V of that split (normalised)
    partial_lse[s, h, split]    = log2 of that split's softmax denominator (base-2 LSE)

    grid = (num_seqs, num_heads)                       phase 2: merge
    out = sum_i 2^(lse_i - max lse) * partial_out_i / sum_i 2^(lse_i - max lse)

With max_splits = 1 (large batches) phase 1 writes `out` itself and phase 2 does not run.

How many splits a sequence uses depends on its length, on the device (CUDA-graph friendly):
each split holds at least `min_split_tiles` tiles, at most `max_splits` splits; programs past
the last used split return at once, and the merge reads only the used ones. One program's rows
are the num_queries_per_kv query heads sharing a kv head, so each K/V tile is loaded once per
GQA group.

Decode is recognised as `num_tokens == num_seqs` (the reference's own rule); token i belongs to
sequence i at position seq_lens[i] - 1.

Tiles (`DECODE_ATTENTION_TILES`, keyed by num_seqs x num_kv_heads, the programs of one split)
come from bench/attention_bench.py's sweep; `launch_paged_decode_attention` takes the
tiles as an argument (benchmarks and tests pass candidates); `paged_attention` picks them.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Final

import torch
import triton
import triton.language as tl

from loraplex.kernels.triton.attention_tile import load_kv_tile, online_softmax_step
from loraplex.kernels.triton.grid_math import next_power_of_2
from loraplex.kernels.triton.paged_attention_args import check_out, check_paged_attention_args
from loraplex.kernels.triton.tile_table import MIN_DOT_DIM, TileTable, check_dot_tiles

OP = "paged_decode_attention"
LOG2E = 1.4426950408889634


@dataclass(frozen=True)
class DecodeAttentionTiles:
    """Tile shape and split policy of one decode launch."""

    tile_n: int  # keys per step of the KV loop
    max_splits: int  # programs per (sequence, kv head), at most
    min_split_tiles: int  # tiles per split, at least (short sequences use fewer splits)
    num_warps: int
    num_stages: int

    def __post_init__(self) -> None:
        check_dot_tiles(tile_n=self.tile_n)
        if self.max_splits < 1 or self.min_split_tiles < 1:
            raise ValueError("max_splits and min_split_tiles must be >= 1")


# bench/attention_bench.py on an H200 (bench/results/h200-662ba43-split-kv, h200-e4a38b9-split-kv):
# per row the split count at tile 64 that was best at context 4,096 and within 3% of the best at
# 640 (fewer programs, more splits): batch 1 at 4,096 runs in 19.6 us with 16 splits against
# 124.5 with one; from batch 64 up (512 programs) one split, the whole context per program.
DECODE_ATTENTION_TILES: Final = TileTable(
    (
        (32, DecodeAttentionTiles(64, 16, 2, num_warps=4, num_stages=2)),
        (64, DecodeAttentionTiles(64, 8, 2, num_warps=4, num_stages=2)),
        (128, DecodeAttentionTiles(64, 4, 2, num_warps=4, num_stages=2)),
        (256, DecodeAttentionTiles(64, 2, 2, num_warps=4, num_stages=2)),
        (sys.maxsize, DecodeAttentionTiles(64, 1, 2, num_warps=4, num_stages=2)),
    )
)


@triton.jit
def _split_layout(  # type: ignore[no-untyped-def]
    seq_len,
    sliding_window,
    MAX_SPLITS: tl.constexpr,
    MIN_SPLIT_TILES: tl.constexpr,
    TILE_N: tl.constexpr,
    USE_SLIDING_WINDOW: tl.constexpr,
):
    """(first key, tiles per split, splits used) of a sequence; both phases call this."""
    kv_lo = 0
    if USE_SLIDING_WINDOW:
        kv_lo = tl.maximum(seq_len - sliding_window, 0) // TILE_N * TILE_N
    num_tiles = tl.cdiv(seq_len - kv_lo, TILE_N)
    tiles_per_split = tl.maximum(tl.cdiv(num_tiles, MAX_SPLITS), MIN_SPLIT_TILES)
    return kv_lo, tiles_per_split, tl.cdiv(num_tiles, tiles_per_split)


@triton.jit
def _decode_split_kernel(  # type: ignore[no-untyped-def]
    partial_out_ptr,  # [num_seqs, num_heads, MAX_SPLITS, HEAD_DIM_PAD] float32
    partial_lse_ptr,  # [num_seqs, num_heads, MAX_SPLITS] float32
    out_ptr,  # [num_seqs, num_heads, HEAD_DIM]: written here when MAX_SPLITS == 1
    query_ptr,
    key_cache_ptr,
    value_cache_ptr,
    block_tables_ptr,
    seq_lens_ptr,
    qk_scale,  # softmax scale * log2(e): the kernel works in base 2
    sliding_window,
    stride_qt,
    stride_qh,
    stride_kb,
    stride_ks,
    stride_kh,
    stride_vb,
    stride_vs,
    stride_vh,
    stride_bt,
    stride_ot,
    stride_oh,
    num_heads,
    HEAD_DIM: tl.constexpr,
    HEAD_DIM_PAD: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    NUM_QUERIES_PER_KV: tl.constexpr,
    BLOCK_M: tl.constexpr,
    TILE_N: tl.constexpr,
    MAX_SPLITS: tl.constexpr,
    MIN_SPLIT_TILES: tl.constexpr,
    USE_SLIDING_WINDOW: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    seq = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    seq_len = tl.load(seq_lens_ptr + seq)
    kv_lo, tiles_per_split, num_splits = _split_layout(
        seq_len, sliding_window, MAX_SPLITS, MIN_SPLIT_TILES, TILE_N, USE_SLIDING_WINDOW
    )
    if split >= num_splits:
        return
    kv_start = kv_lo + split * tiles_per_split * TILE_N
    kv_end = tl.minimum(seq_len, kv_start + tiles_per_split * TILE_N)

    offs_m = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM_PAD)
    offs_n = tl.arange(0, TILE_N)
    head = kv_head * NUM_QUERIES_PER_KV + offs_m  # [BLOCK_M]
    mask_m = offs_m < NUM_QUERIES_PER_KV
    mask_d = offs_d < HEAD_DIM
    q_ptrs = query_ptr + seq.to(tl.int64) * stride_qt + head[:, None] * stride_qh + offs_d[None, :]
    q = tl.load(q_ptrs, mask=mask_m[:, None] & mask_d[None, :], other=0.0)  # [BLOCK_M, D_PAD]
    q_pos = seq_len - 1

    block_table_ptr = block_tables_ptr + seq.to(tl.int64) * stride_bt
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM_PAD], dtype=tl.float32)
    for tile_start in range(kv_start, kv_end, TILE_N):
        kv_pos = tile_start + offs_n  # [TILE_N]
        mask_n = kv_pos < kv_end
        if USE_SLIDING_WINDOW:
            mask_n = mask_n & (kv_pos > q_pos - sliding_window)
        block_id = tl.load(block_table_ptr + kv_pos // BLOCK_SIZE, mask=mask_n, other=0)
        kv_mask = mask_n[:, None] & mask_d[None, :]
        k = load_kv_tile(
            key_cache_ptr,
            block_id,
            kv_pos,
            kv_head,
            stride_kb,
            stride_ks,
            stride_kh,
            offs_d,
            kv_mask,
            BLOCK_SIZE,
        )
        v = load_kv_tile(
            value_cache_ptr,
            block_id,
            kv_pos,
            kv_head,
            stride_vb,
            stride_vs,
            stride_vh,
            offs_d,
            kv_mask,
            BLOCK_SIZE,
        )
        s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * qk_scale  # [BLOCK_M, TILE_N]
        s = tl.where(mask_n[None, :], s, float("-inf"))
        acc, m_i, l_i = online_softmax_step(s, v, acc, m_i, l_i, DOT_PRECISION)

    # Every used split holds at least one key in the window, so l_i > 0 on real rows.
    l_safe = tl.where(l_i == 0.0, 1.0, l_i)
    if MAX_SPLITS == 1:  # the whole context: this is the output, nothing to merge
        o_ptrs = out_ptr + seq.to(tl.int64) * stride_ot + head[:, None] * stride_oh
        out = (acc / l_safe[:, None]).to(out_ptr.dtype.element_ty)
        tl.store(o_ptrs + offs_d[None, :], out, mask=mask_m[:, None] & mask_d[None, :])
        return
    lse = tl.where(l_i == 0.0, float("-inf"), m_i + tl.math.log2(l_safe))  # [BLOCK_M]
    row = (seq.to(tl.int64) * num_heads + head) * MAX_SPLITS + split  # [BLOCK_M]
    tl.store(partial_lse_ptr + row, lse, mask=mask_m)
    o_ptrs = partial_out_ptr + row[:, None] * HEAD_DIM_PAD + offs_d[None, :]
    tl.store(o_ptrs, acc / l_safe[:, None], mask=mask_m[:, None])


@triton.jit
def _decode_merge_kernel(  # type: ignore[no-untyped-def]
    out_ptr,
    partial_out_ptr,
    partial_lse_ptr,
    seq_lens_ptr,
    sliding_window,
    stride_ot,
    stride_oh,
    num_heads,
    HEAD_DIM: tl.constexpr,
    HEAD_DIM_PAD: tl.constexpr,
    TILE_N: tl.constexpr,
    MAX_SPLITS: tl.constexpr,
    SPLITS_PAD: tl.constexpr,
    MIN_SPLIT_TILES: tl.constexpr,
    USE_SLIDING_WINDOW: tl.constexpr,
):
    seq = tl.program_id(0)
    head = tl.program_id(1)
    seq_len = tl.load(seq_lens_ptr + seq)
    _, _, num_splits = _split_layout(
        seq_len, sliding_window, MAX_SPLITS, MIN_SPLIT_TILES, TILE_N, USE_SLIDING_WINDOW
    )
    offs_s = tl.arange(0, SPLITS_PAD)
    offs_d = tl.arange(0, HEAD_DIM_PAD)
    mask_s = offs_s < num_splits
    row = (seq.to(tl.int64) * num_heads + head) * MAX_SPLITS + offs_s  # [SPLITS_PAD]
    lse = tl.load(partial_lse_ptr + row, mask=mask_s, other=float("-inf"))
    lse_max = tl.max(lse, axis=0)
    lse_max = tl.where(lse_max == float("-inf"), 0.0, lse_max)
    weight = tl.math.exp2(lse - lse_max)  # [SPLITS_PAD], 0 for unused splits
    o = tl.load(
        partial_out_ptr + row[:, None] * HEAD_DIM_PAD + offs_d[None, :],
        mask=mask_s[:, None],
        other=0.0,
    )  # [SPLITS_PAD, HEAD_DIM_PAD]
    total = tl.sum(weight, axis=0)
    out = tl.sum(o * weight[:, None], axis=0) / tl.where(total == 0.0, 1.0, total)
    o_ptrs = out_ptr + seq.to(tl.int64) * stride_ot + head * stride_oh + offs_d
    tl.store(o_ptrs, out.to(out_ptr.dtype.element_ty), mask=offs_d < HEAD_DIM)


def launch_paged_decode_attention(
    query: torch.Tensor,  # [num_seqs, num_heads, head_dim]: one token per sequence
    key_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    value_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    block_tables: torch.Tensor,  # [num_seqs, max_num_blocks] int32
    seq_lens: torch.Tensor,  # [num_seqs] int32, >= 1, including this step's token
    query_start_loc: torch.Tensor,  # [num_seqs + 1] int32 (arange: checked shape only)
    scale: float,
    sliding_window: int | None,
    tiles: DecodeAttentionTiles,
    out: torch.Tensor | None = None,  # [num_seqs, num_heads, head_dim]: written in place
) -> torch.Tensor:  # [num_seqs, num_heads, head_dim]
    """Decode attention with the given tiles and split policy (two launches; one when
    `tiles.max_splits` is 1), into `out` (a new tensor if None)."""
    args = (query, key_cache, value_cache, block_tables, seq_lens, query_start_loc)
    check_paged_attention_args(OP, *args, sliding_window)
    num_seqs, num_heads, head_dim = query.shape
    _, block_size, num_kv_heads, _ = key_cache.shape
    if query.shape[0] != block_tables.shape[0]:
        raise ValueError(f"{OP}: needs one query token per sequence")
    out = check_out(OP, query, out)
    if num_seqs == 0:
        return out
    num_queries_per_kv = num_heads // num_kv_heads
    head_dim_pad = max(MIN_DOT_DIM, next_power_of_2(head_dim))
    merged = tiles.max_splits > 1  # else phase 1 writes `out` and needs no partials
    partial_out = torch.empty(
        (num_seqs, num_heads, tiles.max_splits, head_dim_pad) if merged else (0,),
        dtype=torch.float32,
        device=query.device,
    )
    partial_lse = torch.empty(
        (num_seqs, num_heads, tiles.max_splits) if merged else (0,),
        dtype=torch.float32,
        device=query.device,
    )
    split_args = {
        "TILE_N": tiles.tile_n,
        "MAX_SPLITS": tiles.max_splits,
        "MIN_SPLIT_TILES": tiles.min_split_tiles,
        "USE_SLIDING_WINDOW": sliding_window is not None,
    }
    _decode_split_kernel[(num_seqs, num_kv_heads, tiles.max_splits)](
        partial_out,
        partial_lse,
        out,
        query,
        key_cache,
        value_cache,
        block_tables,
        seq_lens,
        scale * LOG2E,
        sliding_window or 0,
        query.stride(0),
        query.stride(1),
        key_cache.stride(0),
        key_cache.stride(1),
        key_cache.stride(2),
        value_cache.stride(0),
        value_cache.stride(1),
        value_cache.stride(2),
        block_tables.stride(0),
        out.stride(0),
        out.stride(1),
        num_heads,
        HEAD_DIM=head_dim,
        HEAD_DIM_PAD=head_dim_pad,
        BLOCK_SIZE=block_size,
        NUM_QUERIES_PER_KV=num_queries_per_kv,
        BLOCK_M=max(MIN_DOT_DIM, next_power_of_2(num_queries_per_kv)),
        DOT_PRECISION="ieee" if query.dtype == torch.float32 else "tf32",
        num_warps=tiles.num_warps,
        num_stages=tiles.num_stages,
        **split_args,
    )
    if not merged:
        return out
    _decode_merge_kernel[(num_seqs, num_heads)](
        out,
        partial_out,
        partial_lse,
        seq_lens,
        sliding_window or 0,
        out.stride(0),
        out.stride(1),
        num_heads,
        HEAD_DIM=head_dim,
        HEAD_DIM_PAD=head_dim_pad,
        SPLITS_PAD=next_power_of_2(tiles.max_splits),
        num_warps=4,
        **split_args,
    )
    return out
