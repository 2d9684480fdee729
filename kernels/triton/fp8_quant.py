"""Per-token FP8 quantization of activations in one Triton kernel (the FP8 W8A8 path's input).

Spec: `kernels/reference/fp8.py` `quantize_fp8_per_token`. The reference is eight PyTorch ops
(abs, amax, casts, divide, clamps) per linear layer: at a decode step of a Llama-3-8B shape that
is a thousand small kernels, more time than FP8 saves on the GEMMs. Here one program reads a
token's row once, takes its max |x|, and writes the float8_e4m3fn row and its float32 scale.
The scale is max |x| times float32(1 / 448) and the division by it rounds to nearest
(`div_rn`), as the reference's PyTorch ops do on CUDA: the result equals the reference's bit for
bit (the GPU test checks it).

Grid: (num_tokens,); each program holds one whole row (K up to MAX_K) in registers.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from loraplex.kernels.launch_checks import check
from loraplex.kernels.reference.fp8 import FP8_DTYPE, FP8_MAX, INV_FP8_MAX, MIN_SCALE
from loraplex.kernels.triton.grid_math import next_power_of_2

OP = "quantize_fp8_per_token"
MAX_K = 32768  # the widest row one program holds (Llama-3-70B's intermediate size is 28,672)


@triton.jit
def quantize_row(x, FP8_MAX: tl.constexpr, INV_FP8_MAX: tl.constexpr, MIN_SCALE: tl.constexpr):  # type: ignore[no-untyped-def]
    """A float32 row (padding 0) -> (its float8 values, still float32, and its scale)."""
    amax = tl.max(tl.abs(x), axis=0)
    scale = tl.maximum(amax * INV_FP8_MAX, MIN_SCALE)
    return tl.minimum(tl.maximum(tl.math.div_rn(x, scale), -FP8_MAX), FP8_MAX), scale


@triton.jit
def store_quantized_row(  # type: ignore[no-untyped-def]
    x,
    out_ptrs,
    scale_ptr,
    mask,
    FP8_MAX: tl.constexpr,
    INV_FP8_MAX: tl.constexpr,
    MIN_SCALE: tl.constexpr,
):
    """Quantize a float32 row (padding 0) and store its float8 values at out_ptrs, its scale at
    scale_ptr: the tail of every kernel that writes an FP8 projection input."""
    q, scale = quantize_row(x, FP8_MAX, INV_FP8_MAX, MIN_SCALE)
    tl.store(out_ptrs, q.to(out_ptrs.dtype.element_ty), mask=mask)
    tl.store(scale_ptr, scale)


@triton.jit
def _quantize_fp8_per_token_kernel(  # type: ignore[no-untyped-def]
    x_ptr,
    out_ptr,
    scale_ptr,
    stride_x,
    stride_out,
    K: tl.constexpr,
    BLOCK_K: tl.constexpr,
    FP8_MAX: tl.constexpr,
    INV_FP8_MAX: tl.constexpr,
    MIN_SCALE: tl.constexpr,
):
    token = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK_K)
    mask = offs < K
    x = tl.load(x_ptr + token * stride_x + offs, mask=mask, other=0.0).to(tl.float32)
    out_ptrs = out_ptr + token * stride_out + offs
    store_quantized_row(x, out_ptrs, scale_ptr + token, mask, FP8_MAX, INV_FP8_MAX, MIN_SCALE)


def quantize_fp8_per_token(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [M, K] -> (x_fp8 [M, K] float8_e4m3fn, x_scale [M, 1] float32)."""
    check(OP, x.dim() == 2, "x must be [num_tokens, K], got %s", tuple(x.shape))
    m, k = x.shape
    check(OP, 0 < k <= MAX_K, "K=%s outside 1..%s", k, MAX_K)
    check(OP, x.stride(-1) == 1, "x needs a contiguous last dim")
    out = torch.empty((m, k), dtype=FP8_DTYPE, device=x.device)
    scale = torch.empty((m, 1), dtype=torch.float32, device=x.device)
    if m == 0:
        return out, scale
    block_k = next_power_of_2(k)
    _quantize_fp8_per_token_kernel[(m,)](
        x,
        out,
        scale,
        x.stride(0),
        out.stride(0),
        K=k,
        BLOCK_K=block_k,
        FP8_MAX=FP8_MAX,
        INV_FP8_MAX=INV_FP8_MAX,
        MIN_SCALE=MIN_SCALE,
        num_warps=min(16, max(4, block_k // 1024)),
    )
    return out, scale
