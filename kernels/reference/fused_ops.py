"""References for the decoder's small fused ops: RMSNorm (+ residual add), RoPE, SiLU-and-mul.

The numerics are Hugging Face transformers' Llama ones, op for op (each op rounds to the
activation dtype where HF's does), so the CPU model matches HF bit for bit in float32. The
Triton kernels in `kernels/triton/` reproduce the same rounding points in one pass each.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

# PyTorch's CUDA sum / mean of one contiguous float32 row (ATen's Reduce.cuh, as HF's
# `pow(2).mean(-1)` runs it at a decode step): a row longer than 128 is read in vectors of 4,
# its (vectors or) elements dealt round-robin to up to 512 threads, whose sums then halve.
ROW_SUM_VECTOR = 4
ROW_SUM_MAX_LANES = 512


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


def row_sum_lanes(hidden_size: int) -> tuple[bool, int]:
    """(vectorized, lanes) of PyTorch's CUDA reduction of one contiguous row of `hidden_size`."""
    vectorized = hidden_size > 128
    items = hidden_size // ROW_SUM_VECTOR if vectorized else hidden_size
    return vectorized, min(1 << (items.bit_length() - 1), ROW_SUM_MAX_LANES)


def row_sum_cuda_order(
    values: torch.Tensor, layout: tuple[bool, int] | None = None
) -> torch.Tensor:
    """values [num_rows, n] float32 -> [num_rows]: each row summed in the order in which
    PyTorch's CUDA reduction sums one row alone (the spec of the Triton RMSNorm's sum; float32
    adds round alike on any device, so this runs anywhere).

    Thread `lane` keeps 4 accumulators; accumulator i adds, in order of s = 0, 1, ...,
      vectorized (n > 128): element 4 * (lane + s * lanes) + i,
      otherwise:            element lane + (4 * s + i) * lanes;
    the four combine as ((a0 + a1) + a2) + a3. Then lane l adds lane l + half, halving the
    lanes until one is left. `layout` ((vectorized, lanes), default `row_sum_lanes(n)`) is for
    bench/row_sum_order.py, which checks this against PyTorch on a GPU (an H200, torch 2.11:
    every row equal) beside the other layouts.
    """
    num_rows, n = values.shape
    vectorized, lanes = layout or row_sum_lanes(n)
    steps = -(-n // (ROW_SUM_VECTOR * lanes))
    padded = values.new_zeros(num_rows, steps * ROW_SUM_VECTOR * lanes)
    padded[:, :n] = values  # zeros add exactly
    if vectorized:
        acc_in = padded.view(num_rows, steps, lanes, ROW_SUM_VECTOR)
    else:
        acc_in = padded.view(num_rows, steps, ROW_SUM_VECTOR, lanes).transpose(2, 3)
    acc = acc_in[:, 0]  # [num_rows, lanes, 4]
    for s in range(1, steps):
        acc = acc + acc_in[:, s]
    lane_sums = acc[..., 0]  # [num_rows, lanes]
    for i in range(1, ROW_SUM_VECTOR):
        lane_sums = lane_sums + acc[..., i]
    while lane_sums.shape[1] > 1:
        half = lane_sums.shape[1] // 2
        lane_sums = lane_sums[:, :half] + lane_sums[:, half:]
    return lane_sums[:, 0]


def inverse_float32(n: int) -> float:
    """float32(1 / n), rounded once, as PyTorch's mean scales its sum (a multiply, not a divide)."""
    return float(np.float32(1.0) / np.float32(n))


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
