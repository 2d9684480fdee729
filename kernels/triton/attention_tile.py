"""The KV-tile steps both paged-attention kernels share (FlashAttention-2's inner loop): load a
tile of one kv head's keys or values through the block table, and fold a tile's scores into the
running softmax. Triton inlines these into each kernel."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def load_kv_tile(  # type: ignore[no-untyped-def]
    cache_ptr,
    block_id,  # [TILE_N] the cache block of each position
    kv_pos,  # [TILE_N] positions in the sequence
    kv_head,
    stride_b,
    stride_s,
    stride_h,
    offs_d,  # [D_PAD]
    kv_mask,  # [TILE_N, D_PAD]
    BLOCK_SIZE: tl.constexpr,
):
    """cache[block_id, kv_pos % BLOCK_SIZE, kv_head, :] -> [TILE_N, D_PAD], 0 where masked."""
    slot = block_id.to(tl.int64) * stride_b + (kv_pos % BLOCK_SIZE) * stride_s
    return tl.load(
        cache_ptr + slot[:, None] + kv_head * stride_h + offs_d[None, :], mask=kv_mask, other=0.0
    )


@triton.jit
def online_softmax_step(  # type: ignore[no-untyped-def]
    s,  # [BLOCK_M, TILE_N] float32 scores in base 2, -inf where a key is not allowed
    v,  # [TILE_N, D_PAD]
    acc,  # [BLOCK_M, D_PAD] float32
    m_i,  # [BLOCK_M] running max
    l_i,  # [BLOCK_M] running sum
    DOT_PRECISION: tl.constexpr,
):
    """-> (acc, m_i, l_i) with this tile folded in. A row with no allowed key so far keeps
    m = -inf, so 0 is subtracted instead, keeping exp2 away from (-inf) - (-inf). P is cast to
    V's dtype for the second dot, as in FlashAttention."""
    m_new = tl.maximum(m_i, tl.max(s, axis=1))
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    p = tl.math.exp2(s - m_safe[:, None])
    alpha = tl.math.exp2(m_i - m_safe)
    l_i = l_i * alpha + tl.sum(p, axis=1)
    acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None], input_precision=DOT_PRECISION)
    return acc, m_new, l_i
