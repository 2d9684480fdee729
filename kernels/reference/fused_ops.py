"""References for the decoder's small fused ops: RMSNorm (+ residual add), RoPE, SiLU-and-mul.

The numerics are Hugging Face transformers' Llama ones, op for op (each op rounds to the
activation dtype where HF's does), so the CPU model matches HF bit for bit in float32. The
Triton kernels in `kernels/triton/` reproduce the same rounding points in one pass each.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def rms_norm(
    x: torch.Tensor,  # [num_tokens, hidden_size]
    weight: torch.Tensor,  # [hidden_size]
    eps: float,
) -> torch.Tensor:
    """weight * (x * rsqrt(mean(x^2) + eps)), normalized in float32 and cast back before the
    weight multiply (HF's LlamaRMSNorm). Returns [num_tokens, hidden_size] in x's dtype."""
    input_dtype = x.dtype
    h = x.to(torch.float32)
    variance = h.pow(2).mean(-1, keepdim=True)  # [num_tokens, 1]
    h = h * torch.rsqrt(variance + eps)
    return weight * h.to(input_dtype)


def fused_add_rms_norm(
    x: torch.Tensor,  # [num_tokens, hidden_size]
    residual: torch.Tensor,  # [num_tokens, hidden_size]
    weight: torch.Tensor,  # [hidden_size]
    eps: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """vLLM's fused_add_rms_norm, out of place: new_residual = x + residual (rounded to the
    dtype, as the unfused residual add rounds), out = rms_norm(new_residual).
    Returns (out, new_residual); the inputs are not modified."""
    new_residual = x + residual
    return rms_norm(new_residual, weight, eps), new_residual


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def _apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    cos, sin = cos[:, None, :], sin[:, None, :]  # [T, 1, head_dim]
    return (x * cos) + (_rotate_half(x) * sin)


def apply_rotary_pos_emb(
    q: torch.Tensor,  # [num_tokens, num_heads, head_dim]
    k: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
    cos: torch.Tensor,  # [num_tokens, head_dim]
    sin: torch.Tensor,  # [num_tokens, head_dim]
) -> tuple[torch.Tensor, torch.Tensor]:
    """RoPE in the "rotate_half" (NeoX / HF Llama) layout: x * cos + rotate_half(x) * sin, per
    head, with cos/sin already scaled by the attention factor (see engine/model/rotary.py).
    Out of place: returns new contiguous (q, k); q and k may be strided views (of the fused
    qkv output) and are not modified."""
    return _apply_rotary(q, cos, sin), _apply_rotary(k, cos, sin)


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:  # x [num_tokens, 2 * intermediate_size]
    """SwiGLU on a fused [gate | up] projection: silu(gate) * up -> [num_tokens, intermediate]."""
    gate, up = x.chunk(2, dim=-1)
    return F.silu(gate) * up
