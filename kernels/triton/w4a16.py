"""W4A16 GEMM in Triton: y = x @ W with W's 4-bit values dequantized in the K loop.

Method: the AWQ / GPTQ weight-only scheme (Lin et al., 2023, "AWQ"; Frantar et al., 2022,
"GPTQ"): asymmetric 4-bit integers with a float16 scale and a zero point per group of input
rows, dequantized in registers so the weight is read from memory at a quarter of its 16-bit
size. Layout and spec: `kernels/reference/w4a16.py`.

Grid: (cdiv(M, BLOCK_M), cdiv(N, BLOCK_N)). Each program loops over K in BLOCK_K steps: loads
the x tile, the packed rows k // 8 of its columns (each int32 serves 8 rows), shifts out row
k's nibble, gathers the scale and zero of group g(k) (k // group_size, or g_idx[k] with
act-order), forms (q - z) * s in float32, rounds it to x's dtype (the reference's rounding
point) and accumulates the dot product in float32.
"""

from __future__ import annotations

import sys

import torch
import triton
import triton.language as tl

from loraplex.kernels.triton.launch_checks import check, check_one_device
from loraplex.kernels.triton.tile_table import TileTable, check_dot_tiles

OP = "w4a16_gemm"

# (BLOCK_M, BLOCK_N, BLOCK_K, num_warps) by the number of rows of x. Not tuned on a GPU yet.
W4A16_TILES: TileTable[tuple[int, int, int, int]] = TileTable(
    ((16, (16, 64, 64, 4)), (64, (64, 64, 64, 4)), (sys.maxsize, (128, 128, 32, 8)))
)


@triton.jit
def _w4a16_kernel(  # type: ignore[no-untyped-def]
    x_ptr,
    qweight_ptr,
    scales_ptr,
    zeros_ptr,
    g_idx_ptr,
    out_ptr,
    M,
    N,
    K,
    stride_xm,
    stride_om,
    GROUP_SIZE: tl.constexpr,
    HAS_G_IDX: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    UNPACK_ONCE: tl.constexpr,
):
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_m = offs_m < M
    mask_n = offs_n < N
    dtype = out_ptr.dtype.element_ty
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        mask_k = offs_k < K
        x = tl.load(
            x_ptr + offs_m[:, None].to(tl.int64) * stride_xm + offs_k[None, :],
            mask=mask_m[:, None] & mask_k[None, :],
            other=0.0,
        )  # [BLOCK_M, BLOCK_K]
        mask_kn = mask_k[:, None] & mask_n[None, :]
        if UNPACK_ONCE:
            rows_p = k0 // 8 + tl.arange(0, BLOCK_K // 8)
            packed = tl.load(
                qweight_ptr + rows_p[:, None].to(tl.int64) * N + offs_n[None, :],
                mask=(rows_p < K // 8)[:, None] & mask_n[None, :],
                other=0,
            )  # [BLOCK_K / 8, BLOCK_N] int32, each read once
            shifts = tl.arange(0, 8) * 4  # nibble j of packed row p holds row 8 * p + j
            q = (packed[:, None, :] >> shifts[None, :, None]) & 0xF
            q = tl.reshape(q, (BLOCK_K, BLOCK_N))
        else:
            packed = tl.load(
                qweight_ptr + (offs_k // 8)[:, None].to(tl.int64) * N + offs_n[None, :],
                mask=mask_kn,
                other=0,
            )  # [BLOCK_K, BLOCK_N] int32
            q = (packed >> ((offs_k % 8) * 4)[:, None]) & 0xF
        if UNPACK_ONCE and not HAS_G_IDX and GROUP_SIZE % BLOCK_K == 0:
            # The whole tile lies in one group: one row of scales and zeros.
            group_row = (k0 // GROUP_SIZE) * N + offs_n
            scale = tl.load(scales_ptr + group_row, mask=mask_n, other=0.0).to(tl.float32)[None, :]
            zero = tl.load(zeros_ptr + group_row, mask=mask_n, other=0).to(tl.float32)[None, :]
        else:
            if HAS_G_IDX:
                groups = tl.load(g_idx_ptr + offs_k, mask=mask_k, other=0)
            else:
                groups = offs_k // GROUP_SIZE
            group_offs = groups[:, None].to(tl.int64) * N + offs_n[None, :]
            scale = tl.load(scales_ptr + group_offs, mask=mask_kn, other=0.0).to(tl.float32)
            zero = tl.load(zeros_ptr + group_offs, mask=mask_kn, other=0).to(tl.float32)
        w = ((q.to(tl.float32) - zero) * scale).to(dtype)  # [BLOCK_K, BLOCK_N]
        acc = tl.dot(x, w, acc, input_precision=DOT_PRECISION)
    tl.store(
        out_ptr + offs_m[:, None].to(tl.int64) * stride_om + offs_n[None, :],
        acc.to(dtype),
        mask=mask_m[:, None] & mask_n[None, :],
    )


def w4a16_gemm(
    x: torch.Tensor,  # [M, K]
    qweight: torch.Tensor,  # [K/8, N] int32
    scales: torch.Tensor,  # [G, N]
    zeros: torch.Tensor,  # [G, N] uint8
    g_idx: torch.Tensor | None,  # [K] int32
    group_size: int,
) -> torch.Tensor:
    """y = x @ dequantize(W) -> [M, N] in x's dtype (a new tensor)."""
    m = x.shape[0]
    return launch_w4a16_gemm(x, qweight, scales, zeros, g_idx, group_size, W4A16_TILES.lookup(m))


def launch_w4a16_gemm(
    x: torch.Tensor,
    qweight: torch.Tensor,
    scales: torch.Tensor,
    zeros: torch.Tensor,
    g_idx: torch.Tensor | None,
    group_size: int,
    tiles: tuple[int, int, int, int],
    unpack_once: bool = False,
) -> torch.Tensor:
    """`w4a16_gemm` with explicit tiles (BLOCK_M, BLOCK_N, BLOCK_K, num_warps). `unpack_once`:
    the candidate inner loop (each packed int32 read once and unpacked in registers, one row of
    scales and zeros per tile inside one group); tested against the reference, not yet run on a
    GPU, so `w4a16_gemm` does not use it (`bench/w4a16_candidate.py` times it)."""
    block_m, block_n, block_k, num_warps = tiles
    check_dot_tiles(BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k)
    check(OP, x.dim() == 2 and qweight.dim() == 2, "x and qweight must be 2-D")
    m, k = x.shape
    n = qweight.shape[1]
    num_groups = scales.shape[0]
    check(OP, qweight.dtype == torch.int32 and qweight.shape[0] * 8 == k, "qweight [K/8, N] int32")
    check(OP, tuple(scales.shape) == (num_groups, n), f"scales must be [G, {n}]")
    check(OP, tuple(zeros.shape) == (num_groups, n) and zeros.dtype == torch.uint8, "zeros [G, N]")
    check(OP, x.dtype in (torch.float16, torch.bfloat16, torch.float32), f"x dtype {x.dtype}")
    check(OP, x.stride(-1) == 1, "x needs a contiguous last dim")
    for name, t in (("qweight", qweight), ("scales", scales), ("zeros", zeros)):
        check(OP, t.is_contiguous(), f"{name} must be contiguous")
    if g_idx is None:
        check(OP, group_size > 0 and num_groups * group_size == k, "group_size * G must be K")
    else:
        check(OP, tuple(g_idx.shape) == (k,) and g_idx.dtype == torch.int32, "g_idx [K] int32")
    check_one_device(OP, x, qweight, scales, zeros, *(() if g_idx is None else (g_idx,)))
    out = torch.empty((m, n), dtype=x.dtype, device=x.device)
    if m == 0 or n == 0:
        return out
    grid = (triton.cdiv(m, block_m), triton.cdiv(n, block_n))
    _w4a16_kernel[grid](
        x,
        qweight,
        scales,
        zeros,
        qweight if g_idx is None else g_idx,  # unused without act-order
        out,
        m,
        n,
        k,
        x.stride(0),
        out.stride(0),
        GROUP_SIZE=max(group_size, 1),
        HAS_G_IDX=g_idx is not None,
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        BLOCK_K=block_k,
        DOT_PRECISION="ieee" if x.dtype == torch.float32 else "tf32",
        UNPACK_ONCE=unpack_once,
        num_warps=num_warps,
    )
    return out
