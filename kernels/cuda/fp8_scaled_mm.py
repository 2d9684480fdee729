"""FP8 W8A8 GEMM on CUDA through `torch._scaled_mm` (cuBLASLt), row-wise scales: one per
token of x, one per output channel of w. Needs compute capability >= 8.9 (Ada, Hopper); the
engine checks it at load (`engine/model/quant/fp8.py`). Spec: `kernels/reference/fp8.py`.
"""

from __future__ import annotations

import torch

from loraplex.kernels.launch_checks import check

OP = "fp8_scaled_mm"
FP8_ALIGNMENT = 16  # cuBLASLt's FP8 GEMM needs K and N multiples of 16


def fp8_scaled_mm(
    x_fp8: torch.Tensor,  # [M, K] float8_e4m3fn
    x_scale: torch.Tensor,  # [M, 1] float32
    w_fp8: torch.Tensor,  # [N, K] float8_e4m3fn
    w_scale: torch.Tensor,  # [N] float32
    out_dtype: torch.dtype,
) -> torch.Tensor:
    """-> y [M, N] in out_dtype. cuBLAS writes bfloat16 (the only output type of row-wise
    scaling); other dtypes are cast from it."""
    (m, k), (n, k_w) = x_fp8.shape, w_fp8.shape
    check(OP, k == k_w, "x has K=%s, w has K=%s", k, k_w)
    check(OP, k % FP8_ALIGNMENT == 0 and n % FP8_ALIGNMENT == 0, "K=%s, N=%s not x16", k, n)
    check(OP, x_fp8.is_contiguous() and w_fp8.is_contiguous(), "x and w must be contiguous")
    check(OP, tuple(x_scale.shape) == (m, 1) and x_scale.dtype == torch.float32, "x_scale [M, 1]")
    check(OP, tuple(w_scale.shape) == (n,) and w_scale.dtype == torch.float32, "w_scale [N]")
    y = torch._scaled_mm(
        x_fp8,
        w_fp8.t(),  # [K, N] column-major, as cuBLASLt wants the second operand
        scale_a=x_scale,
        scale_b=w_scale.view(1, n),
        out_dtype=torch.bfloat16,
        # The K reduction stays in the FP8 tensor cores' accumulator instead of being promoted
        # to fp32 registers every few K tiles (as vLLM's CUTLASS FP8 GEMMs do); the GPU tests
        # hold it to the reference path's tolerances.
        use_fast_accum=True,
    )
    return y if out_dtype == torch.bfloat16 else y.to(out_dtype)
