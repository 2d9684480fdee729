"""Reference FP8 W8A8: per-token activation quantization and the scaled GEMM, the spec of the
CUDA path (`kernels/cuda/fp8_scaled_mm.py`, `torch._scaled_mm`).

    x_scale[m] = max_k |x[m, k]| * (1 / 448)    (448: the largest float8_e4m3fn)
    x_fp8[m, k] = fp8(clamp(x[m, k] / x_scale[m], -448, 448))
    y[m, n] = sum_k (x_fp8[m, k] * x_scale[m]) * (w_fp8[n, k] * w_scale[n])

The reference dequantizes both operands to float32 and multiplies in float32 (the CPU path);
cuBLAS multiplies the fp8 values and applies the scales to the float32 accumulator: the same
sums up to rounding. The scale multiplies by float32(1 / 448) rather than dividing by 448: that
is what PyTorch's CUDA division by a Python number does, and the Triton kernel does the same,
so the reference and the kernel agree bit for bit on every device.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from loraplex.kernels.reference.fused_ops import fused_add_rms_norm, rms_norm, silu_and_mul

FP8_DTYPE = torch.float8_e4m3fn
FP8_MAX = float(torch.finfo(FP8_DTYPE).max)  # 448
INV_FP8_MAX = 1.0 / FP8_MAX
MIN_SCALE = 1e-12 / FP8_MAX  # an all-zero row gets this scale (its values stay 0)


def quantize_fp8_per_token(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [M, K] -> (x_fp8 [M, K] float8_e4m3fn, x_scale [M, 1] float32)."""
    amax = x.abs().amax(dim=-1, keepdim=True).float()  # [M, 1]
    scale = (amax * INV_FP8_MAX).clamp(min=MIN_SCALE)
    x_fp8 = (x.float() / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)
    return x_fp8, scale


def silu_and_mul_quant_fp8(
    x: torch.Tensor,  # [M, 2 * I]
    keep_unquantized: bool = True,
) -> tuple[torch.Tensor | None, torch.Tensor, torch.Tensor]:
    """SwiGLU of a fused [gate | up] row, then its per-token FP8 quantization: (out [M, I] in x's
    dtype, or None without `keep_unquantized`, out_fp8 [M, I] float8_e4m3fn, out_scale [M, 1]
    float32). The unquantized output feeds the LoRA shrink of down_proj, the FP8 pair its base
    GEMM: a step without adapters needs only the pair."""
    out = silu_and_mul(x)
    out_fp8, out_scale = quantize_fp8_per_token(out)
    return out if keep_unquantized else None, out_fp8, out_scale


def rms_norm_quant_fp8(
    x: torch.Tensor,  # [M, hidden]
    weight: torch.Tensor,  # [hidden]
    eps: float,
    keep_unquantized: bool = True,
) -> tuple[torch.Tensor | None, torch.Tensor, torch.Tensor]:
    """RMSNorm, then its per-token FP8 quantization: (out [M, hidden] in x's dtype, or None
    without `keep_unquantized`, out_fp8 float8_e4m3fn, out_scale [M, 1] float32). The
    unquantized output feeds the next projection's LoRA shrink, the FP8 pair its base GEMM."""
    out = rms_norm(x, weight, eps)
    out_fp8, out_scale = quantize_fp8_per_token(out)
    return out if keep_unquantized else None, out_fp8, out_scale


def fused_add_rms_norm_quant_fp8(
    x: torch.Tensor,  # [M, hidden]
    residual: torch.Tensor,  # [M, hidden]
    weight: torch.Tensor,  # [hidden]
    eps: float,
    keep_unquantized: bool = True,
) -> tuple[torch.Tensor | None, torch.Tensor, torch.Tensor, torch.Tensor]:
    """fused_add_rms_norm, then the per-token FP8 quantization of its normed output:
    (out or None without `keep_unquantized`, new_residual, out_fp8, out_scale)."""
    out, new_residual = fused_add_rms_norm(x, residual, weight, eps)
    out_fp8, out_scale = quantize_fp8_per_token(out)
    return out if keep_unquantized else None, new_residual, out_fp8, out_scale


def fp8_scaled_mm(
    x_fp8: torch.Tensor,  # [M, K] float8_e4m3fn
    x_scale: torch.Tensor,  # [M, 1] float32
    w_fp8: torch.Tensor,  # [N, K] float8_e4m3fn
    w_scale: torch.Tensor,  # [N] float32
    out_dtype: torch.dtype,
) -> torch.Tensor:
    """-> y [M, N] in out_dtype."""
    a = x_fp8.float() * x_scale
    b = w_fp8.float() * w_scale[:, None]
    return F.linear(a, b).to(out_dtype)
