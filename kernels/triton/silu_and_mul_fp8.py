"""SiLU-and-mul whose output is also quantized to FP8 per token, in one Triton pass: the input of
an FP8 down_proj.

Spec: `kernels/reference/fp8.py` `silu_and_mul_quant_fp8` (= `silu_and_mul`, then
`quantize_fp8_per_token`). Unfused, the quantization reads the [T, I] activation back and writes
it again; here one program holds a token's whole row, so the row's max |x| is known before it is
written, and the bf16 row (for the LoRA shrink) and its FP8 copy and scale go out together. A
step without adapters has no shrink to feed: `keep_unquantized=False` skips the bf16 row, two
of the three bytes written per element. The math is the two kernels' own (`silu_mul`,
`quantize_row`): the result equals theirs bit for bit.

Grid: (num_tokens,).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from loraplex.kernels.launch_checks import check
from loraplex.kernels.reference.fp8 import FP8_DTYPE, FP8_MAX, INV_FP8_MAX, MIN_SCALE
from loraplex.kernels.triton.fp8_quant import MAX_K, store_quantized_row
from loraplex.kernels.triton.grid_math import next_power_of_2
from loraplex.kernels.triton.silu_and_mul import silu_mul

OP = "silu_and_mul_quant_fp8"


@triton.jit
def _silu_and_mul_fp8_kernel(  # type: ignore[no-untyped-def]
    x_ptr,
    out_ptr,
    out_fp8_ptr,
    scale_ptr,
    stride_x,
    stride_out,
    stride_out_fp8,
    INTERMEDIATE: tl.constexpr,
    BLOCK: tl.constexpr,
    FP8_MAX: tl.constexpr,
    INV_FP8_MAX: tl.constexpr,
    MIN_SCALE: tl.constexpr,
    STORE_OUT: tl.constexpr,
):
    token = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    mask = offs < INTERMEDIATE
    row = x_ptr + token * stride_x
    gate = tl.load(row + offs, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(row + INTERMEDIATE + offs, mask=mask, other=0.0).to(tl.float32)
    out = silu_mul(gate, up, out_ptr.dtype.element_ty)  # 0 where masked: silu(0) * 0
    if STORE_OUT:
        tl.store(out_ptr + token * stride_out + offs, out, mask=mask)
    out_fp8_ptrs = out_fp8_ptr + token * stride_out_fp8 + offs
    store_quantized_row(
        out.to(tl.float32), out_fp8_ptrs, scale_ptr + token, mask, FP8_MAX, INV_FP8_MAX, MIN_SCALE
    )


def silu_and_mul_quant_fp8(
    x: torch.Tensor,  # [num_tokens, 2 * intermediate]
    keep_unquantized: bool = True,
) -> tuple[torch.Tensor | None, torch.Tensor, torch.Tensor]:
    """(silu(gate) * up [T, I] in x's dtype, or None without `keep_unquantized`, its
    float8_e4m3fn copy [T, I], scale [T, 1] float32)."""
    check(OP, x.dim() == 2, "x must be [num_tokens, 2 * intermediate], got %s", tuple(x.shape))
    num_tokens, width = x.shape
    check(OP, width % 2 == 0, "last dim must be even, got %s", width)
    check(OP, 0 < width // 2 <= MAX_K, "intermediate %s outside 1..%s", width // 2, MAX_K)
    check(OP, x.stride(-1) == 1, "x needs a contiguous last dim")
    intermediate = width // 2
    out = None
    if keep_unquantized:
        out = torch.empty((num_tokens, intermediate), dtype=x.dtype, device=x.device)
    out_fp8 = torch.empty((num_tokens, intermediate), dtype=FP8_DTYPE, device=x.device)
    scale = torch.empty((num_tokens, 1), dtype=torch.float32, device=x.device)
    if num_tokens == 0:
        return out, out_fp8, scale
    block = next_power_of_2(intermediate)
    out_arg = x if out is None else out  # a placeholder of the dtype, never written
    _silu_and_mul_fp8_kernel[(num_tokens,)](
        x,
        out_arg,
        out_fp8,
        scale,
        x.stride(0),
        out_arg.stride(0),
        out_fp8.stride(0),
        INTERMEDIATE=intermediate,
        BLOCK=block,
        FP8_MAX=FP8_MAX,
        INV_FP8_MAX=INV_FP8_MAX,
        MIN_SCALE=MIN_SCALE,
        STORE_OUT=out is not None,
        num_warps=min(16, max(4, block // 1024)),
    )
    return out, out_fp8, scale
