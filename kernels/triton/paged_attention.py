"""Paged attention over a block-table KV cache, prefill chunks and decode in one launch (Triton).

Method: PagedAttention (Kwon et al., SOSP 2023) for the cache layout, FlashAttention-2 (Dao,
2023) online softmax over KV tiles, and the "unified" packing of vLLM's Triton attention backend:
one program per (query tile of one sequence, kv head), whose rows are BLOCK_Q query tokens times
the num_queries_per_kv query heads sharing that kv head, so each K/V tile is loaded once per
GQA group:

    row r of the tile  ->  query token  q_block * BLOCK_Q + r // num_queries_per_kv
                           query head   kv_head * num_queries_per_kv + r % num_queries_per_kv

Query tiles are numbered across sequences without a host-side table: sequence s owns tiles
`(query_start_loc[s] - query_start_loc[0]) // BLOCK_Q + s` onwards (at least cdiv(q_len,
BLOCK_Q) of them; query rows count from query_start_loc[0], so the table of a mixed step's
prefill chunks is a view of the step's whole table, with no kernel to shift it), so

    grid = (num_tokens // BLOCK_Q + num_seqs, num_kv_heads)

depends on shapes only (CUDA-graph friendly); a program finds its sequence by binary search over
query_start_loc and returns at once if its tile lies past the sequence's query tokens.

Query token i of a sequence sits at position p = seq_len - q_len + i and attends to cached
positions j with j <= p (and j > p - sliding_window). Positions map to cache slots through the
block table, per key, so the KV tile size TILE_N is independent of the cache's block_size:

    j  ->  key_cache[block_table[j // block_size], j % block_size, kv_head, :]

Scores, the running max/sum and the output accumulate in float32; P is cast to V's dtype for the
second dot, as in FlashAttention.

Tiles (`ATTENTION_TILES`, keyed by query tokens per sequence, cdiv(num_tokens, num_seqs)): short
row tiles for one query token per sequence (decode through this kernel: `launch_paged_attention`
called directly, or a step with sequences of no query tokens), tall ones for prefill chunks
(bench/attention_bench.py on an H200: 128 x 32 tiles with 8 warps ran 4 x 2,048-token prompts at
268 TFLOP/s against 239 for 64 x 64 with 4). BLOCK_M is at least the GQA group
(num_queries_per_kv), rounded up to a power of two. `launch_paged_attention` takes the tiles as
an argument (benchmarks and tests pass candidates).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Final

import torch
import triton
import triton.language as tl

from loraplex.kernels.triton.attention_tile import load_kv_tile, online_softmax_step
from loraplex.kernels.triton.grid_math import cdiv, next_power_of_2
from loraplex.kernels.triton.paged_attention_args import check_out, check_paged_attention_args
from loraplex.kernels.triton.paged_decode_attention import (
    DECODE_ATTENTION_TILES,
    launch_paged_decode_attention,
)
from loraplex.kernels.triton.tile_table import MIN_DOT_DIM, TileTable, check_dot_tiles

OP = "paged_attention"
LOG2E = 1.4426950408889634


@dataclass(frozen=True)
class AttentionTiles:
    """Tile shape of one launch."""

    block_m: int  # rows per program (query tokens x query heads of one kv head), at least
    tile_n: int  # keys per step of the KV loop
    num_warps: int
    num_stages: int

    def __post_init__(self) -> None:
        check_dot_tiles(block_m=self.block_m, tile_n=self.tile_n)


ATTENTION_TILES: Final = TileTable(
    (
        (1, AttentionTiles(block_m=16, tile_n=32, num_warps=4, num_stages=2)),  # decode
        (sys.maxsize, AttentionTiles(block_m=128, tile_n=32, num_warps=8, num_stages=2)),
    )
)


@triton.jit
def _find_seq_idx(  # type: ignore[no-untyped-def]
    query_start_loc_ptr,
    q_base,  # query_start_loc[0]
    q_block,
    num_seqs,
    BLOCK_Q: tl.constexpr,
):
    """Largest s with (query_start_loc[s] - q_base) // BLOCK_Q + s <= q_block (binary
    search)."""
    lo = 0
    hi = num_seqs
    while lo < hi:
        mid = (lo + hi) // 2
        first_block = (tl.load(query_start_loc_ptr + mid) - q_base) // BLOCK_Q + mid
        if first_block <= q_block:
            lo = mid + 1
        else:
            hi = mid
    return lo - 1


# A step's sequence count, and where a mixed step's views of its tables start (after its decodes),
# change from step to step. Triton would compile a variant for each class of values (1, a
# multiple of 16, any other) and of pointer alignment, in the middle of serving. They bound
# loops or are read as scalars and gathered indices, never as aligned vectors, so one variant
# serves them all.
@triton.jit(
    do_not_specialize=["num_seqs"],
    do_not_specialize_on_alignment=["block_tables_ptr", "seq_lens_ptr", "query_start_loc_ptr"],
)
def _paged_attention_kernel(  # type: ignore[no-untyped-def]
    out_ptr,
    query_ptr,
    key_cache_ptr,
    value_cache_ptr,
    block_tables_ptr,
    seq_lens_ptr,
    query_start_loc_ptr,
    qk_scale,  # softmax scale * log2(e): the kernel works in base 2
    sliding_window,
    num_seqs,
    stride_qt,
    stride_qh,
    stride_ot,
    stride_oh,
    stride_kb,
    stride_ks,
    stride_kh,
    stride_vb,
    stride_vs,
    stride_vh,
    stride_bt,
    HEAD_DIM: tl.constexpr,
    HEAD_DIM_PAD: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    NUM_QUERIES_PER_KV: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_Q: tl.constexpr,
    TILE_N: tl.constexpr,
    USE_SLIDING_WINDOW: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    q_block = tl.program_id(0)
    kv_head = tl.program_id(1)
    q_base = tl.load(query_start_loc_ptr)
    seq = _find_seq_idx(query_start_loc_ptr, q_base, q_block, num_seqs, BLOCK_Q)
    q_start = tl.load(query_start_loc_ptr + seq) - q_base  # the sequence's first query row
    q_len = tl.load(query_start_loc_ptr + seq + 1) - q_base - q_start
    q_block_local = q_block - (q_start // BLOCK_Q + seq)
    if q_block_local * BLOCK_Q >= q_len:
        return

    offs_m = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM_PAD)
    offs_n = tl.arange(0, TILE_N)
    q_idx = q_block_local * BLOCK_Q + offs_m // NUM_QUERIES_PER_KV  # [BLOCK_M] within sequence
    head = kv_head * NUM_QUERIES_PER_KV + offs_m % NUM_QUERIES_PER_KV  # [BLOCK_M]
    mask_m = (offs_m < BLOCK_Q * NUM_QUERIES_PER_KV) & (q_idx < q_len)
    mask_d = offs_d < HEAD_DIM
    token = (q_start + q_idx).to(tl.int64)

    q_ptrs = query_ptr + token[:, None] * stride_qt + head[:, None] * stride_qh + offs_d[None, :]
    q = tl.load(q_ptrs, mask=mask_m[:, None] & mask_d[None, :], other=0.0)  # [BLOCK_M, D_PAD]

    seq_len = tl.load(seq_lens_ptr + seq)
    context_len = seq_len - q_len
    q_pos = context_len + q_idx  # [BLOCK_M] absolute positions
    # Keys this tile can see: [kv_start, kv_end), kv_end = last query's position + 1.
    kv_end = tl.minimum(seq_len, context_len + (q_block_local + 1) * BLOCK_Q)
    kv_start = 0
    if USE_SLIDING_WINDOW:
        first_pos = context_len + q_block_local * BLOCK_Q
        kv_start = tl.maximum(first_pos - sliding_window + 1, 0) // TILE_N * TILE_N

    block_table_ptr = block_tables_ptr + seq.to(tl.int64) * stride_bt
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM_PAD], dtype=tl.float32)
    for tile_start in range(kv_start, kv_end, TILE_N):
        kv_pos = tile_start + offs_n  # [TILE_N]
        mask_n = kv_pos < kv_end
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
        s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * qk_scale  # [BLOCK_M, TILE_N]
        allowed = mask_n[None, :] & (kv_pos[None, :] <= q_pos[:, None])
        if USE_SLIDING_WINDOW:
            allowed = allowed & (kv_pos[None, :] > q_pos[:, None] - sliding_window)
        s = tl.where(allowed, s, float("-inf"))
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
        acc, m_i, l_i = online_softmax_step(s, v, acc, m_i, l_i, DOT_PRECISION)

    l_i = tl.where(l_i == 0.0, 1.0, l_i)  # only padding rows; they are not stored
    out = acc / l_i[:, None]
    o_ptrs = out_ptr + token[:, None] * stride_ot + head[:, None] * stride_oh + offs_d[None, :]
    tl.store(o_ptrs, out.to(out_ptr.dtype.element_ty), mask=mask_m[:, None] & mask_d[None, :])


def paged_attention(
    query: torch.Tensor,  # [num_tokens, num_heads, head_dim]
    key_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    value_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    block_tables: torch.Tensor,  # [num_seqs, max_num_blocks] int32
    seq_lens: torch.Tensor,  # [num_seqs] int32, context length including this step's tokens
    query_start_loc: torch.Tensor,  # [num_seqs + 1] int32
    scale: float,
    sliding_window: int | None = None,
    num_decode_seqs: int = 0,
) -> torch.Tensor:  # [num_tokens, num_heads, head_dim]
    """Causal attention of each sequence's query tokens over its cached K/V.

    A decode step (one query token per sequence) runs split-KV (paged_decode_attention.py);
    anything else runs this module's kernel with ATTENTION_TILES' row for the number of query
    tokens per sequence. `num_decode_seqs`: the leading sequences known (on the host) to have
    one query token each; in a step that mixes them with prefill chunks they run split-KV too,
    into the same output. Through this module's kernel each would take a whole query tile for
    one token and read its context with mostly empty rows. Rows of tokens past
    query_start_loc[-1] (padding) are left uninitialised, as in the reference.
    """
    args = (query, key_cache, value_cache, block_tables, seq_lens, query_start_loc)
    num_seqs = block_tables.shape[0]
    if query.shape[0] == num_seqs and num_seqs > 0:
        decode_tiles = DECODE_ATTENTION_TILES.lookup(num_seqs * key_cache.shape[-2])
        return launch_paged_decode_attention(*args, scale, sliding_window, decode_tiles)
    if not 0 < num_decode_seqs < num_seqs:
        tiles = ATTENTION_TILES.lookup(cdiv(query.shape[0], max(1, num_seqs)))
        return launch_paged_attention(*args, scale, sliding_window, tiles)
    d = num_decode_seqs  # decode tokens are rows 0..d-1; the chunks' start at row d
    out = torch.empty_like(query)
    decode_tiles = DECODE_ATTENTION_TILES.lookup(d * key_cache.shape[-2])
    decode_args = (query[:d], key_cache, value_cache, block_tables[:d], seq_lens[:d])
    launch_paged_decode_attention(
        *decode_args, query_start_loc[: d + 1], scale, sliding_window, decode_tiles, out[:d]
    )
    tiles = ATTENTION_TILES.lookup(cdiv(query.shape[0] - d, num_seqs - d))
    chunk_args = (query[d:], key_cache, value_cache, block_tables[d:], seq_lens[d:])
    launch_paged_attention(*chunk_args, query_start_loc[d:], scale, sliding_window, tiles, out[d:])
    return out


def launch_paged_attention(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    scale: float,
    sliding_window: int | None,
    tiles: AttentionTiles,
    out: torch.Tensor | None = None,  # [num_tokens, num_heads, head_dim]: written in place
) -> torch.Tensor:
    """`paged_attention` with the given tiles instead of the table's (one launch, no decode
    split), into `out` (a new tensor if None). Query rows count from query_start_loc[0]."""
    args = (query, key_cache, value_cache, block_tables, seq_lens, query_start_loc)
    check_paged_attention_args(OP, *args, sliding_window)
    num_tokens, num_heads, head_dim = query.shape
    _, block_size, num_kv_heads, _ = key_cache.shape
    num_seqs = block_tables.shape[0]
    out = check_out(OP, query, out)
    if num_tokens == 0 or num_seqs == 0:
        return out
    num_queries_per_kv = num_heads // num_kv_heads
    block_m = max(tiles.block_m, next_power_of_2(num_queries_per_kv))
    block_q = block_m // num_queries_per_kv
    grid = (num_tokens // block_q + num_seqs, num_kv_heads)
    _paged_attention_kernel[grid](
        out,
        query,
        key_cache,
        value_cache,
        block_tables,
        seq_lens,
        query_start_loc,
        scale * LOG2E,
        sliding_window or 0,
        num_seqs,
        query.stride(0),
        query.stride(1),
        out.stride(0),
        out.stride(1),
        key_cache.stride(0),
        key_cache.stride(1),
        key_cache.stride(2),
        value_cache.stride(0),
        value_cache.stride(1),
        value_cache.stride(2),
        block_tables.stride(0),
        HEAD_DIM=head_dim,
        HEAD_DIM_PAD=max(MIN_DOT_DIM, next_power_of_2(head_dim)),
        BLOCK_SIZE=block_size,
        NUM_QUERIES_PER_KV=num_queries_per_kv,
        BLOCK_M=block_m,
        BLOCK_Q=block_q,
        TILE_N=tiles.tile_n,
        USE_SLIDING_WINDOW=sliding_window is not None,
        DOT_PRECISION="ieee" if query.dtype == torch.float32 else "tf32",
        num_warps=tiles.num_warps,
        num_stages=tiles.num_stages,
    )
    return out
