"""RoPE on q and k and the paged KV-cache write of k and v, in one Triton launch.

Method: RoPE (Su et al., 2021, "RoFormer: Enhanced Transformer with Rotary Position
Embedding") in the "rotate_half" (GPT-NeoX / HF Llama) layout, and vLLM's `reshape_and_cache`
(Kwon et al., 2023, "Efficient Memory Management for Large Language Model Serving with
PagedAttention"). With a head x = [x1 | x2] and cos = [c1 | c2], sin = [s1 | s2]:

    rotated = [x1 * c1 - x2 * s1  |  x2 * c2 + x1 * s2]

and token t's slot `slot_mapping[t]` = block_id * block_size + offset. One program per token
loads its cos/sin row once, then:

    rotated q heads   -> q_out[t]                            (always)
    rotated k heads   -> key_cache[block_id, offset]         (slot >= 0)
    v heads (copied)  -> value_cache[block_id, offset]       (slot >= 0; -1 is padding)

Attention reads keys and values from the cache only, so the rotated k is written there and
nowhere else. q, k and v are read in place as strided views of the fused qkv output; q_out is
new and contiguous, as attention wants it.

Numerics: each product is rounded to the dtype before its add, as HF's separate ops round
(`kernels/reference`): the launch turns Triton's FP fusion off, which would otherwise contract
each product and its add into one FMA (one rounding instead of two). v is copied exactly.

A kernel rather than PyTorch ops: skipping -1 slots in PyTorch needs a boolean mask and hence a
host sync (not CUDA-graph capturable), and the reference's cat / neg / mul / add would each be a
launch of its own.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from loraplex.kernels.launch_checks import check, check_contiguous_last_dim, check_one_device
from loraplex.kernels.triton.grid_math import next_power_of_2

OP = "rotary_and_cache"

NUM_WARPS = 4


@triton.jit
def _rotate_heads(  # type: ignore[no-untyped-def]
    src_ptr,
    dst_ptr,
    stride_h,
    dst_stride_h,
    c1,
    c2,
    s1,
    s2,
    NUM_HEADS: tl.constexpr,
    HALF_DIM: tl.constexpr,
    HEADS_PAD: tl.constexpr,
    HALF_PAD: tl.constexpr,
):
    """One token's heads, rotated: src_ptr/dst_ptr point at its row ([NUM_HEADS, 2 * HALF]
    with head strides stride_h / dst_stride_h); c1, c2, s1, s2 are its cos/sin halves [1, HALF]
    in float32. Launch with FP fusion off (see the module docstring)."""
    dtype = dst_ptr.dtype.element_ty
    offs_h = tl.arange(0, HEADS_PAD)
    offs_d = tl.arange(0, HALF_PAD)
    mask = (offs_h < NUM_HEADS)[:, None] & (offs_d < HALF_DIM)[None, :]
    src = src_ptr + offs_h[:, None] * stride_h + offs_d[None, :]
    x1 = tl.load(src, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(src + HALF_DIM, mask=mask, other=0.0).to(tl.float32)
    out1 = (x1 * c1).to(dtype).to(tl.float32) + (-x2 * s1).to(dtype).to(tl.float32)
    out2 = (x2 * c2).to(dtype).to(tl.float32) + (x1 * s2).to(dtype).to(tl.float32)
    dst = dst_ptr + offs_h[:, None] * dst_stride_h + offs_d[None, :]
    tl.store(dst, out1.to(dtype), mask=mask)
    tl.store(dst + HALF_DIM, out2.to(dtype), mask=mask)


@triton.jit
def _copy_heads(  # type: ignore[no-untyped-def]
    src_ptr,
    dst_ptr,
    stride_h,
    dst_stride_h,
    NUM_HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    HEADS_PAD: tl.constexpr,
    HEAD_DIM_PAD: tl.constexpr,
):
    """One token's [NUM_HEADS, HEAD_DIM] row from src_ptr to dst_ptr (head strides given)."""
    offs_h = tl.arange(0, HEADS_PAD)
    offs_d = tl.arange(0, HEAD_DIM_PAD)
    mask = (offs_h < NUM_HEADS)[:, None] & (offs_d < HEAD_DIM)[None, :]
    row = tl.load(src_ptr + offs_h[:, None] * stride_h + offs_d[None, :], mask=mask)
    tl.store(dst_ptr + offs_h[:, None] * dst_stride_h + offs_d[None, :], row, mask=mask)


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
    offs_d = tl.arange(0, HALF_PAD)
    mask_d = offs_d < HALF_DIM
    cos_row = cos_ptr + token * stride_cos + offs_d
    sin_row = sin_ptr + token * stride_sin + offs_d
    c1 = tl.load(cos_row, mask=mask_d, other=0.0).to(tl.float32)[None, :]
    c2 = tl.load(cos_row + HALF_DIM, mask=mask_d, other=0.0).to(tl.float32)[None, :]
    s1 = tl.load(sin_row, mask=mask_d, other=0.0).to(tl.float32)[None, :]
    s2 = tl.load(sin_row + HALF_DIM, mask=mask_d, other=0.0).to(tl.float32)[None, :]
    _rotate_heads(
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
    _rotate_heads(
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
    _copy_heads(
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
    _check_args(q, k, v, cos, sin, key_cache, value_cache, slot_mapping)
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


def _check_args(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Raise ValueError unless the arguments are one launch in the documented layout."""
    check(OP, q.dim() == 3 and k.dim() == 3, "q and k must be [num_tokens, heads, head_dim]")
    num_tokens, _, head_dim = q.shape
    num_kv_heads = k.shape[1]
    check(OP, k.shape == (num_tokens, num_kv_heads, head_dim), "k must match q's tokens/head_dim")
    check(OP, v.shape == k.shape, "v must be shaped as k")
    check(OP, head_dim % 2 == 0, "head_dim must be even, got %s", head_dim)
    check(
        OP,
        cos.shape == (num_tokens, head_dim) and sin.shape == cos.shape,
        "cos and sin must be [num_tokens, head_dim]",
    )
    check(
        OP,
        key_cache.dim() == 4 and key_cache.shape == value_cache.shape,
        "key_cache and value_cache must be equal [num_blocks, block_size, H, D]",
    )
    check(OP, key_cache.shape[2:] == (num_kv_heads, head_dim), "cache heads/head_dim != k's")
    check(
        OP,
        q.dtype == k.dtype == v.dtype == cos.dtype == sin.dtype == key_cache.dtype
        == value_cache.dtype,
        "q, k, v, cos, sin and the caches must share one dtype",
    )  # fmt: skip
    check(
        OP,
        slot_mapping.shape == (num_tokens,) and slot_mapping.dtype == torch.int64,
        "slot_mapping must be int64 [num_tokens]",
    )
    check(OP, slot_mapping.is_contiguous(), "slot_mapping must be contiguous")
    check_contiguous_last_dim(
        OP, q=q, k=k, v=v, cos=cos, sin=sin, key_cache=key_cache, value_cache=value_cache
    )
    check_one_device(OP, q, k, v, cos, sin, key_cache, value_cache, slot_mapping)
