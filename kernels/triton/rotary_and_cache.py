"""RoPE on q and k and the KV-cache write of k and v, in one Triton launch.

Method: RoPE (Su et al., 2021) in the "rotate_half" layout, as `rotary.py` applies it, and
vLLM's `reshape_and_cache` (Kwon et al., 2023, PagedAttention), as `reshape_and_cache.py` does
it. Attention reads K and V from the paged cache only, so the rotated k is never needed
anywhere else: this kernel writes it straight into its cache slot. The separate pair wrote k to
a temporary and launched a second kernel to copy it, with v, into the cache.

One program per token:

    cos/sin row of the token  ->  rotated q heads   -> q_out[token]           (always)
                                  rotated k heads   -> key_cache[slot]        (slot >= 0)
                                  v heads (copied)  -> value_cache[slot]      (slot >= 0)

Numerics are those of the pair, bit for bit: the same rotation (`rotary.rotate_heads`, launched
without FP fusion so that each product is rounded before its add, as HF's separate ops round)
and a plain copy of v.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from loraplex.kernels.triton.grid_math import next_power_of_2
from loraplex.kernels.triton.reshape_and_cache import check_cache_write_args, copy_heads
from loraplex.kernels.triton.rotary import check_rotary_args, load_cos_sin, rotate_heads

OP = "rotary_and_cache"

NUM_WARPS = 4


@triton.jit
def _rotary_and_cache_kernel(  # type: ignore[no-untyped-def]
    q_ptr,
    k_ptr,
    v_ptr,
    cos_ptr,
    sin_ptr,
    q_out_ptr,
    key_cache_ptr,
    value_cache_ptr,
    slot_mapping_ptr,
    stride_qt,
    stride_qh,
    stride_kt,
    stride_kh,
    stride_vt,
    stride_vh,
    stride_cos,
    stride_sin,
    stride_kcb,
    stride_kcs,
    stride_kch,
    stride_vcb,
    stride_vcs,
    stride_vch,
    NUM_HEADS: tl.constexpr,
    NUM_KV_HEADS: tl.constexpr,
    HALF_DIM: tl.constexpr,
    HEADS_PAD: tl.constexpr,
    KV_HEADS_PAD: tl.constexpr,
    HALF_PAD: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
):
    token = tl.program_id(0).to(tl.int64)
    c1, c2, s1, s2 = load_cos_sin(
        cos_ptr, sin_ptr, token, stride_cos, stride_sin, HALF_DIM, HALF_PAD
    )
    rotate_heads(
        q_ptr + token * stride_qt,
        q_out_ptr + token * (NUM_HEADS * 2 * HALF_DIM),
        stride_qh,
        2 * HALF_DIM,
        c1,
        c2,
        s1,
        s2,
        NUM_HEADS,
        HALF_DIM,
        HEADS_PAD,
        HALF_PAD,
    )
    slot = tl.load(slot_mapping_ptr + token).to(tl.int64)
    if slot < 0:  # a padding token: no cache slot
        return
    block_id = slot // BLOCK_SIZE
    offset = slot % BLOCK_SIZE
    rotate_heads(
        k_ptr + token * stride_kt,
        key_cache_ptr + block_id * stride_kcb + offset * stride_kcs,
        stride_kh,
        stride_kch,
        c1,
        c2,
        s1,
        s2,
        NUM_KV_HEADS,
        HALF_DIM,
        KV_HEADS_PAD,
        HALF_PAD,
    )
    copy_heads(
        v_ptr + token * stride_vt,
        value_cache_ptr + block_id * stride_vcb + offset * stride_vcs,
        stride_vh,
        stride_vch,
        NUM_KV_HEADS,
        2 * HALF_DIM,
        KV_HEADS_PAD,
        2 * HALF_PAD,
    )


def rotary_and_cache(
    q: torch.Tensor,  # [num_tokens, num_heads, head_dim]
    k: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
    v: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
    cos: torch.Tensor,  # [num_tokens, head_dim]
    sin: torch.Tensor,  # [num_tokens, head_dim]
    key_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    value_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    slot_mapping: torch.Tensor,  # [num_tokens] int64; -1 = skip
) -> torch.Tensor:
    """Rotated q as a new contiguous tensor; rotated k and v written into the caches at their
    slots (in place). q, k and v may be strided views (of the fused qkv output)."""
    check_rotary_args(OP, q, k, cos, sin)
    check_cache_write_args(OP, k, v, key_cache, value_cache, slot_mapping)
    num_tokens, num_heads, head_dim = q.shape
    num_kv_heads = k.shape[1]
    q_out = torch.empty((num_tokens, num_heads, head_dim), dtype=q.dtype, device=q.device)
    if num_tokens == 0:
        return q_out
    half = head_dim // 2
    _rotary_and_cache_kernel[(num_tokens,)](
        q,
        k,
        v,
        cos,
        sin,
        q_out,
        key_cache,
        value_cache,
        slot_mapping,
        q.stride(0),
        q.stride(1),
        k.stride(0),
        k.stride(1),
        v.stride(0),
        v.stride(1),
        cos.stride(0),
        sin.stride(0),
        key_cache.stride(0),
        key_cache.stride(1),
        key_cache.stride(2),
        value_cache.stride(0),
        value_cache.stride(1),
        value_cache.stride(2),
        NUM_HEADS=num_heads,
        NUM_KV_HEADS=num_kv_heads,
        HALF_DIM=half,
        HEADS_PAD=next_power_of_2(num_heads),
        KV_HEADS_PAD=next_power_of_2(num_kv_heads),
        HALF_PAD=next_power_of_2(half),
        BLOCK_SIZE=key_cache.shape[1],
        num_warps=NUM_WARPS,
        # No FMA contraction: x * cos is rounded to the dtype before the add, as in HF.
        enable_fp_fusion=False,
    )
    return q_out
