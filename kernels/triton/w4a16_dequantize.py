"""4-bit weights (AWQ / GPTQ layout) dequantized into a dense [K, N] matrix in Triton.

Used by `w4a16_gemm` for launches with many rows (prefill): there the GEMM is compute-bound, and
dequantizing the weight once, then multiplying with cuBLAS, beats dequantizing it in the K loop
of every row tile (vLLM's AWQ layer does the same above 256 tokens). Layout and spec:
`kernels/reference/w4a16.py` (`dequantize_w4`, rounded to the output dtype).

Grid: (cdiv(K/8, BLOCK_P), cdiv(N, BLOCK_N)). Each program loads BLOCK_P packed rows once,
shifts out their 8 nibbles in registers (packed row p holds rows 8p..8p+7), gathers each row's
scale and zero, and stores (q - z) * s, formed in float32 and rounded once.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from loraplex.kernels.launch_checks import check, check_one_device
from loraplex.kernels.triton.grid_math import cdiv

OP = "w4a16_dequantize"
BLOCK_P, BLOCK_N, NUM_WARPS = 8, 128, 4  # 64 rows x 128 columns per program


@triton.jit
def _w4a16_dequantize_kernel(  # type: ignore[no-untyped-def]
    qweight_ptr,
    scales_ptr,
    zeros_ptr,
    g_idx_ptr,
    w_ptr,
    N,
    num_packed_rows,
    GROUP_SIZE: tl.constexpr,
    HAS_G_IDX: tl.constexpr,
    BLOCK_P: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    rows_p = tl.program_id(0) * BLOCK_P + tl.arange(0, BLOCK_P)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_n = offs_n < N
    packed = tl.load(
        qweight_ptr + rows_p[:, None].to(tl.int64) * N + offs_n[None, :],
        mask=(rows_p < num_packed_rows)[:, None] & mask_n[None, :],
        other=0,
    )  # [BLOCK_P, BLOCK_N] int32
    shifts = tl.arange(0, 8) * 4
    q = (packed[:, None, :] >> shifts[None, :, None]) & 0xF
    q = tl.reshape(q, (BLOCK_P * 8, BLOCK_N))  # row 8p + j <- nibble j of packed row p
    offs_k = tl.program_id(0) * BLOCK_P * 8 + tl.arange(0, BLOCK_P * 8)
    mask_k = offs_k < num_packed_rows * 8
    if HAS_G_IDX:
        groups = tl.load(g_idx_ptr + offs_k, mask=mask_k, other=0)
    else:
        groups = offs_k // GROUP_SIZE
    mask_kn = mask_k[:, None] & mask_n[None, :]
    group_offs = groups[:, None].to(tl.int64) * N + offs_n[None, :]
    scale = tl.load(scales_ptr + group_offs, mask=mask_kn, other=0.0).to(tl.float32)
    zero = tl.load(zeros_ptr + group_offs, mask=mask_kn, other=0).to(tl.float32)
    w = (q.to(tl.float32) - zero) * scale
    tl.store(
        w_ptr + offs_k[:, None].to(tl.int64) * N + offs_n[None, :],
        w.to(w_ptr.dtype.element_ty),
        mask=mask_kn,
    )


def w4a16_dequantize(
    qweight: torch.Tensor,  # [K/8, N] int32
    scales: torch.Tensor,  # [G, N]
    zeros: torch.Tensor,  # [G, N] uint8
    g_idx: torch.Tensor | None,  # [K] int32
    group_size: int,
    dtype: torch.dtype,
) -> torch.Tensor:
    """-> W [K, N] in `dtype` (a new tensor); the caller has validated the layout."""
    check(OP, dtype in (torch.float16, torch.bfloat16, torch.float32), "dtype %s", dtype)
    check_one_device(OP, qweight, scales, zeros, *(() if g_idx is None else (g_idx,)))
    num_packed_rows, n = qweight.shape
    w = torch.empty((num_packed_rows * 8, n), dtype=dtype, device=qweight.device)
    if w.numel() == 0:
        return w
    grid = (cdiv(num_packed_rows, BLOCK_P), cdiv(n, BLOCK_N))
    _w4a16_dequantize_kernel[grid](
        qweight,
        scales,
        zeros,
        qweight if g_idx is None else g_idx,  # unused without act-order
        w,
        n,
        num_packed_rows,
        GROUP_SIZE=max(group_size, 1),
        HAS_G_IDX=g_idx is not None,
        BLOCK_P=BLOCK_P,
        BLOCK_N=BLOCK_N,
        num_warps=NUM_WARPS,
    )
    return w
