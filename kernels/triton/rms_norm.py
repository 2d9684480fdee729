"""RMSNorm, alone or fused with the residual add before it, in Triton (one pass per row).

Method: RMSNorm (Zhang & Sennrich, 2019, "Root Mean Square Layer Normalization") with vLLM's
`fused_add_rms_norm` fusion: a decoder layer's `hidden + sublayer_out` and the next norm read
and write each row once instead of the ~8 elementwise/reduction kernels of the HF-style math.

One program per row holds the whole row in registers (hidden sizes up to 16K): it loads x (and
the residual), forms the sum, reduces mean(x^2) in float32 and writes out. The rounding points
are the reference's (kernels/reference/fused_ops.py): the residual sum is rounded to the dtype
before it is normalized, the normalized row is rounded to the dtype before the weight multiply.
Out of place: the inputs are not modified.

`rms_norm_quant_fp8` / `fused_add_rms_norm_quant_fp8` also quantize the normed row to FP8 per
token on its way out (the input of an FP8 q/k/v or gate/up projection): the row is in registers,
so its max |x| is known before it is written, and the per-token quantization kernel's separate
read and write of it is saved. Without `keep_unquantized` (no adapter's shrink reads the normed
row) only the FP8 row and its scale are written. The math is `fp8_quant.quantize_row`'s: bit
for bit the two ops.

The sum of squares adds in the order PyTorch's CUDA reduction adds one row alone
(`row_sum_cuda_order`, the order of HF's `pow(2).mean(-1)` at a decode step), and the mean is
that sum times float32(1 / hidden_size), as PyTorch scales it. Another order moves the variance
by an ulp now and then, which flips a bf16 rounding of the normalized row and, through greedy
near-ties, the continuation. The order does not depend on the number of rows: a row's result is
the same in any batch. Squares and sums are rounded separately (no FMA contraction).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from loraplex.kernels.launch_checks import check, check_contiguous_last_dim, check_one_device
from loraplex.kernels.reference.fp8 import FP8_DTYPE, FP8_MAX, INV_FP8_MAX, MIN_SCALE
from loraplex.kernels.reference.fused_ops import (
    ROW_SUM_VECTOR,
    inverse_float32,
    row_sum_lanes,
)
from loraplex.kernels.triton.fp8_quant import store_quantized_row
from loraplex.kernels.triton.grid_math import cdiv, next_power_of_2

OP = "rms_norm"

MAX_HIDDEN_SIZE = 16384  # one row per program must fit in registers


def _num_warps(block: int) -> int:
    if block <= 1024:
        return 4
    if block <= 4096:
        return 8
    return 16


@triton.jit
def _row_sum_of_squares(  # type: ignore[no-untyped-def]
    x_row_ptr,
    residual_row_ptr,
    HIDDEN_SIZE: tl.constexpr,
    HAS_RESIDUAL: tl.constexpr,
    VECTORIZED: tl.constexpr,
    LANES: tl.constexpr,
    STEPS: tl.constexpr,
    VECTOR: tl.constexpr,
    HALVINGS: tl.constexpr,
):
    """sum(x^2) of one row (x + residual, rounded, with a residual) in `row_sum_cuda_order`."""
    dtype = x_row_ptr.dtype.element_ty
    lane = tl.arange(0, LANES)
    lane_sums = tl.zeros((LANES,), dtype=tl.float32)  # 0 + a0 is a0: ((a0 + a1) + a2) + a3
    for i in tl.static_range(VECTOR):
        acc = tl.zeros((LANES,), dtype=tl.float32)
        for s in tl.static_range(STEPS):
            if VECTORIZED:
                offs = VECTOR * (lane + s * LANES) + i
            else:
                offs = lane + (VECTOR * s + i) * LANES
            mask = offs < HIDDEN_SIZE
            v = tl.load(x_row_ptr + offs, mask=mask, other=0.0).to(tl.float32)
            if HAS_RESIDUAL:
                r = tl.load(residual_row_ptr + offs, mask=mask, other=0.0).to(tl.float32)
                v = (v + r).to(dtype).to(tl.float32)
            acc += v * v
        lane_sums += acc
    # Lane l adds lane l + half until one is left. Each tl.sum is over an axis of 2: one add.
    for k in tl.static_range(HALVINGS):
        lane_sums = tl.sum(tl.reshape(lane_sums, (2, LANES >> (k + 1))), axis=0)
    return tl.sum(lane_sums, axis=0)


@triton.jit
def _rms_norm_kernel(  # type: ignore[no-untyped-def]
    x_ptr,
    residual_ptr,
    weight_ptr,
    out_ptr,
    new_residual_ptr,
    out_fp8_ptr,
    scale_ptr,
    stride_x,
    stride_residual,
    stride_out,
    stride_new_residual,
    stride_out_fp8,
    eps,
    inv_hidden_size,
    HIDDEN_SIZE: tl.constexpr,
    BLOCK: tl.constexpr,
    HAS_RESIDUAL: tl.constexpr,
    QUANT_FP8: tl.constexpr,
    STORE_OUT: tl.constexpr,  # False only with QUANT_FP8: the FP8 copy alone is wanted
    FP8_MAX: tl.constexpr,
    INV_FP8_MAX: tl.constexpr,
    MIN_SCALE: tl.constexpr,
    VECTORIZED: tl.constexpr,
    LANES: tl.constexpr,
    STEPS: tl.constexpr,
    VECTOR: tl.constexpr,
    HALVINGS: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    mask = offs < HIDDEN_SIZE
    dtype = out_ptr.dtype.element_ty

    x = tl.load(x_ptr + row * stride_x + offs, mask=mask, other=0.0).to(tl.float32)
    if HAS_RESIDUAL:
        residual = tl.load(residual_ptr + row * stride_residual + offs, mask=mask, other=0.0)
        summed = (x + residual.to(tl.float32)).to(dtype)
        tl.store(new_residual_ptr + row * stride_new_residual + offs, summed, mask=mask)
        x = summed.to(tl.float32)

    sum_sq = _row_sum_of_squares(
        x_ptr + row * stride_x,
        residual_ptr + row * stride_residual,
        HIDDEN_SIZE,
        HAS_RESIDUAL,
        VECTORIZED,
        LANES,
        STEPS,
        VECTOR,
        HALVINGS,
    )
    variance = sum_sq * inv_hidden_size
    normed = (x * tl.rsqrt(variance + eps)).to(dtype).to(tl.float32)
    weight = tl.load(weight_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    out = (weight * normed).to(dtype)  # 0 where masked
    if STORE_OUT:
        tl.store(out_ptr + row * stride_out + offs, out, mask=mask)
    if QUANT_FP8:
        out_fp8_ptrs = out_fp8_ptr + row * stride_out_fp8 + offs
        store_quantized_row(
            out.to(tl.float32), out_fp8_ptrs, scale_ptr + row, mask, FP8_MAX, INV_FP8_MAX, MIN_SCALE
        )


class _NormOutputs(NamedTuple):
    out: torch.Tensor | None  # [T, hidden] in x's dtype; None: only the FP8 copy is kept
    new_residual: torch.Tensor | None  # x + residual, with a residual
    out_fp8: torch.Tensor | None  # [T, hidden] float8_e4m3fn, when quantized
    out_scale: torch.Tensor | None  # [T, 1] float32, when quantized


def _launch(
    x: torch.Tensor,
    residual: torch.Tensor | None,
    weight: torch.Tensor,
    eps: float,
    quantize_fp8: bool = False,
    keep_unquantized: bool = True,
) -> _NormOutputs:
    check(OP, x.dim() == 2, "x must be [num_tokens, hidden_size], got %s", tuple(x.shape))
    num_tokens, hidden_size = x.shape
    check(OP, weight.shape == (hidden_size,), "weight must be [hidden_size]")
    check(OP, hidden_size <= MAX_HIDDEN_SIZE, "hidden_size %s > %s", hidden_size, MAX_HIDDEN_SIZE)
    check(OP, weight.dtype == x.dtype, "x and weight must share one dtype")
    check(OP, x.stride(-1) == 1 and weight.is_contiguous(), "x needs a contiguous last dim")
    if residual is not None:
        check(
            OP,
            residual.shape == x.shape and residual.dtype == x.dtype,
            "residual must match x's shape and dtype",
        )
        check_contiguous_last_dim(OP, residual=residual)
    check_one_device(OP, *(t for t in (x, weight, residual) if t is not None))

    assert keep_unquantized or quantize_fp8, "a norm must write some output"
    shape = (num_tokens, hidden_size)
    out = torch.empty(shape, dtype=x.dtype, device=x.device) if keep_unquantized else None
    new_residual = None if residual is None else torch.empty(shape, dtype=x.dtype, device=x.device)
    out_fp8 = out_scale = None
    if quantize_fp8:
        out_fp8 = torch.empty(shape, dtype=FP8_DTYPE, device=x.device)
        out_scale = torch.empty((num_tokens, 1), dtype=torch.float32, device=x.device)
    outputs = _NormOutputs(out, new_residual, out_fp8, out_scale)
    if num_tokens == 0:
        return outputs
    block = next_power_of_2(hidden_size)
    vectorized, lanes = row_sum_lanes(hidden_size)
    # Pointers a launch never uses get placeholders of the right dtype (x for the bf16 ones),
    # never read nor written: the residual's without one, out's when it is not kept, the FP8
    # outputs' when unquantized.
    res_in = x if residual is None else residual
    out_arg = x if out is None else out
    res_out = x if new_residual is None else new_residual
    fp8_out = x if out_fp8 is None else out_fp8
    scale_out = x if out_scale is None else out_scale
    _rms_norm_kernel[(num_tokens,)](
        x,
        res_in,
        weight,
        out_arg,
        res_out,
        fp8_out,
        scale_out,
        x.stride(0),
        res_in.stride(0),
        out_arg.stride(0),
        res_out.stride(0),
        fp8_out.stride(0),
        eps,
        inverse_float32(hidden_size),
        HIDDEN_SIZE=hidden_size,
        BLOCK=block,
        HAS_RESIDUAL=residual is not None,
        QUANT_FP8=quantize_fp8,
        STORE_OUT=out is not None,
        FP8_MAX=FP8_MAX,
        INV_FP8_MAX=INV_FP8_MAX,
        MIN_SCALE=MIN_SCALE,
        VECTORIZED=vectorized,
        LANES=lanes,
        STEPS=cdiv(hidden_size, ROW_SUM_VECTOR * lanes),
        VECTOR=ROW_SUM_VECTOR,
        HALVINGS=lanes.bit_length() - 1,
        num_warps=_num_warps(block),
        enable_fp_fusion=False,  # x * x and the adds round apart, as PyTorch's ops do
    )
    return outputs


def rms_norm(
    x: torch.Tensor,  # [num_tokens, hidden_size]
    weight: torch.Tensor,  # [hidden_size]
    eps: float,
) -> torch.Tensor:
    """weight * normalize(x) -> [num_tokens, hidden_size] in x's dtype (a new tensor)."""
    out = _launch(x, None, weight, eps).out
    assert out is not None
    return out


def fused_add_rms_norm(
    x: torch.Tensor,  # [num_tokens, hidden_size]
    residual: torch.Tensor,  # [num_tokens, hidden_size]
    weight: torch.Tensor,  # [hidden_size]
    eps: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(rms_norm(x + residual), x + residual) in one pass; new tensors, inputs untouched."""
    out, new_residual, _, _ = _launch(x, residual, weight, eps)
    assert out is not None and new_residual is not None
    return out, new_residual


def rms_norm_quant_fp8(
    x: torch.Tensor,  # [num_tokens, hidden_size]
    weight: torch.Tensor,  # [hidden_size]
    eps: float,
    keep_unquantized: bool = True,
) -> tuple[torch.Tensor | None, torch.Tensor, torch.Tensor]:
    """(rms_norm(x), or None without `keep_unquantized`, its float8_e4m3fn copy, its per-token
    scale [T, 1] float32) in one pass."""
    out, _, out_fp8, out_scale = _launch(x, None, weight, eps, True, keep_unquantized)
    assert out_fp8 is not None and out_scale is not None
    return out, out_fp8, out_scale


def fused_add_rms_norm_quant_fp8(
    x: torch.Tensor,  # [num_tokens, hidden_size]
    residual: torch.Tensor,  # [num_tokens, hidden_size]
    weight: torch.Tensor,  # [hidden_size]
    eps: float,
    keep_unquantized: bool = True,
) -> tuple[torch.Tensor | None, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(out, or None without `keep_unquantized`, x + residual, out's float8_e4m3fn copy, its
    per-token scale) in one pass."""
    out, new_residual, out_fp8, out_scale = _launch(
        x, residual, weight, eps, True, keep_unquantized
    )
    assert new_residual is not None and out_fp8 is not None and out_scale is not None
    return out, new_residual, out_fp8, out_scale
