"""Rotary position embedding (RoPE) applied to q and k in one Triton launch.

Method: RoPE (Su et al., 2021, "RoFormer: Enhanced Transformer with Rotary Position
Embedding") in the "rotate_half" (GPT-NeoX / HF Llama) layout: the two halves of a head are
the real and imaginary parts, so with x = [x1 | x2] and cos = [c1 | c2], sin = [s1 | s2]:

    out = [x1 * c1 - x2 * s1  |  x2 * c2 + x1 * s2]

One program per token loads that token's cos/sin row once and rotates all its query heads,
then all its key heads ([heads, head_dim / 2] tiles). Replaces the reference's cat / neg / mul
/ add kernels per tensor. Each product is rounded to the dtype before the add, as the
reference's separate ops round: the launch turns Triton's FP fusion off, which would otherwise
contract each product and its add into one bf16 FMA (one rounding instead of two).

Out of place, into new contiguous [T, H, D] tensors: q and k arrive as strided views of the
fused qkv output, and attention and the KV-cache write want them contiguous, so writing fresh
tensors costs nothing extra and leaves qkv untouched.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from loraplex.kernels.launch_checks import check, check_contiguous_last_dim, check_one_device
from loraplex.kernels.triton.grid_math import next_power_of_2

OP = "apply_rotary_pos_emb"

NUM_WARPS = 4


@triton.jit
def rotate_heads(  # type: ignore[no-untyped-def]
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
def load_cos_sin(  # type: ignore[no-untyped-def]
    cos_ptr,
    sin_ptr,
    token,
    stride_cos,
    stride_sin,
    HALF_DIM: tl.constexpr,
    HALF_PAD: tl.constexpr,
):
    """The token's cos/sin halves (c1, c2, s1, s2), each [1, HALF_PAD] float32, for rotate_heads."""
    offs_d = tl.arange(0, HALF_PAD)
    mask_d = offs_d < HALF_DIM
    cos_row = cos_ptr + token * stride_cos + offs_d
    sin_row = sin_ptr + token * stride_sin + offs_d
    c1 = tl.load(cos_row, mask=mask_d, other=0.0).to(tl.float32)[None, :]
    c2 = tl.load(cos_row + HALF_DIM, mask=mask_d, other=0.0).to(tl.float32)[None, :]
    s1 = tl.load(sin_row, mask=mask_d, other=0.0).to(tl.float32)[None, :]
    s2 = tl.load(sin_row + HALF_DIM, mask=mask_d, other=0.0).to(tl.float32)[None, :]
    return c1, c2, s1, s2


@triton.jit
def _rotary_kernel(  # type: ignore[no-untyped-def]
    q_ptr,
    k_ptr,
    cos_ptr,
    sin_ptr,
    q_out_ptr,
    k_out_ptr,
    stride_qt,
    stride_qh,
    stride_kt,
    stride_kh,
    stride_cos,
    stride_sin,
    NUM_HEADS: tl.constexpr,
    NUM_KV_HEADS: tl.constexpr,
    HALF_DIM: tl.constexpr,
    HEADS_PAD: tl.constexpr,
    KV_HEADS_PAD: tl.constexpr,
    HALF_PAD: tl.constexpr,
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
    rotate_heads(
        k_ptr + token * stride_kt,
        k_out_ptr + token * (NUM_KV_HEADS * 2 * HALF_DIM),
        stride_kh,
        2 * HALF_DIM,
        c1,
        c2,
        s1,
        s2,
        NUM_KV_HEADS,
        HALF_DIM,
        KV_HEADS_PAD,
        HALF_PAD,
    )


def apply_rotary_pos_emb(
    q: torch.Tensor,  # [num_tokens, num_heads, head_dim]
    k: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
    cos: torch.Tensor,  # [num_tokens, head_dim]
    sin: torch.Tensor,  # [num_tokens, head_dim]
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotated (q, k) as new contiguous tensors; q and k may be strided views."""
    check_rotary_args(OP, q, k, cos, sin)
    num_tokens, num_heads, head_dim = q.shape
    num_kv_heads = k.shape[1]

    q_out = torch.empty((num_tokens, num_heads, head_dim), dtype=q.dtype, device=q.device)
    k_out = torch.empty((num_tokens, num_kv_heads, head_dim), dtype=k.dtype, device=k.device)
    if num_tokens == 0:
        return q_out, k_out
    half = head_dim // 2
    _rotary_kernel[(num_tokens,)](
        q,
        k,
        cos,
        sin,
        q_out,
        k_out,
        q.stride(0),
        q.stride(1),
        k.stride(0),
        k.stride(1),
        cos.stride(0),
        sin.stride(0),
        NUM_HEADS=num_heads,
        NUM_KV_HEADS=num_kv_heads,
        HALF_DIM=half,
        HEADS_PAD=next_power_of_2(num_heads),
        KV_HEADS_PAD=next_power_of_2(num_kv_heads),
        HALF_PAD=next_power_of_2(half),
        num_warps=NUM_WARPS,
        # No FMA contraction: x * cos is rounded to the dtype before the add, as in HF.
        enable_fp_fusion=False,
    )
    return q_out, k_out


def check_rotary_args(
    op: str, q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
) -> None:
    """Raise ValueError unless q [T, H, D], k [T, H_kv, D], cos and sin [T, D] fit one launch."""
    check(op, q.dim() == 3 and k.dim() == 3, "q and k must be [num_tokens, heads, head_dim]")
    num_tokens, _, head_dim = q.shape
    check(op, k.shape == (num_tokens, k.shape[1], head_dim), "k must match q's tokens/head_dim")
    check(op, head_dim % 2 == 0, "head_dim must be even, got %s", head_dim)
    check(
        op,
        cos.shape == (num_tokens, head_dim) and sin.shape == cos.shape,
        "cos and sin must be [num_tokens, head_dim]",
    )
    check(op, q.dtype == k.dtype == cos.dtype == sin.dtype, "q, k, cos, sin must share one dtype")
    check_contiguous_last_dim(op, q=q, k=k, cos=cos, sin=sin)
    check_one_device(op, q, k, cos, sin)
