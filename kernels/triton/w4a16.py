"""W4A16 GEMM in Triton: y = x @ W with W's 4-bit values dequantized in the K loop.

Method: the AWQ / GPTQ weight-only scheme (Lin et al., 2023, "AWQ"; Frantar et al., 2022,
"GPTQ"): asymmetric 4-bit integers with a float16 scale and a zero point per group of input
rows, dequantized in registers so the weight is read from memory at a quarter of its 16-bit
size. Layout and spec: `kernels/reference/w4a16.py`.

Grid: (cdiv(M, BLOCK_M), cdiv(N, BLOCK_N), SPLIT_K). Each program loops over its share of K
(split-K: a few rows of x against a thin weight, as in decode, gives too few output tiles to
fill the GPU) in BLOCK_K steps: loads the x tile and the tile's BLOCK_K / 8 packed rows (each
int32 holds 8 rows of K) once, shifts the nibbles out in registers, takes the scale and zero of
group g(k) (one row of each when the tile lies in one group; k // group_size, or g_idx[k] with
act-order), forms (q - z) * s in float32, rounds it to x's dtype (the reference's rounding
point) and accumulates the dot product in float32. With SPLIT_K > 1 each split writes float32
partial sums and the launcher adds them (a fixed order: deterministic).

With many rows (M >= DEQUANT_MIN_M, prefill) the GEMM is compute-bound: `w4a16_gemm` then
dequantizes W once (`w4a16_dequantize.py`) and multiplies with cuBLAS.
"""

from __future__ import annotations

import sys
from typing import NamedTuple

import torch
import triton
import triton.language as tl

from loraplex.kernels.launch_checks import check, check_one_device
from loraplex.kernels.triton.grid_math import cdiv
from loraplex.kernels.triton.tile_table import TileTable, check_dot_tiles
from loraplex.kernels.triton.w4a16_dequantize import w4a16_dequantize

OP = "w4a16_gemm"


class W4A16Tiles(NamedTuple):
    block_m: int
    block_n: int
    block_k: int
    num_warps: int
    split_k: int = 1  # programs along K; > 1 adds float32 partial sums
    num_stages: int = 3  # Triton's software pipelining depth of the K loop
    # w4a16_gemm splits K less where the output tiles alone give this many programs (None:
    # always split_k). Each split writes and reads back an [M, N] float32 partial.
    split_k_programs: int | None = None


# Tiles by the number of rows of x, from bench/w4a16_sweep.py on an H200 (Llama-3-8B
# projections; sums over the four): the K loop for up to 64 rows, then dequantize + cuBLAS.
# From 17 rows split-K follows the weight's width (`w4a16_tiles`): a wide weight has programs
# enough without it, and its partials are then the larger cost.
W4A16_TILES: TileTable[W4A16Tiles] = TileTable(
    (
        (16, W4A16Tiles(16, 128, 64, 4, 8)),
        (sys.maxsize, W4A16Tiles(64, 128, 64, 4, 8, split_k_programs=512)),
    )
)
DEQUANT_MIN_M = 65  # from this many rows: dequantize W once, then cuBLAS


# M (rows of x) changes with every step: one compiled variant for all, not one per class of values.
@triton.jit(do_not_specialize=["M"])
def _w4a16_kernel(  # type: ignore[no-untyped-def]
    x_ptr,
    qweight_ptr,
    scales_ptr,
    zeros_ptr,
    g_idx_ptr,
    out_ptr,
    partial_ptr,
    M,
    N,
    K,
    k_per_split,
    stride_xm,
    stride_om,
    GROUP_SIZE: tl.constexpr,
    HAS_G_IDX: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    SPLIT_K: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    MAGIC_2_23: tl.constexpr,
):
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_m = offs_m < M
    mask_n = offs_n < N
    dtype = out_ptr.dtype.element_ty
    k_begin = tl.program_id(2) * k_per_split  # a multiple of BLOCK_K
    k_end = tl.minimum(k_begin + k_per_split, K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(k_begin, k_end, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        mask_k = offs_k < k_end
        x = tl.load(
            x_ptr + offs_m[:, None].to(tl.int64) * stride_xm + offs_k[None, :],
            mask=mask_m[:, None] & mask_k[None, :],
            other=0.0,
        )  # [BLOCK_M, BLOCK_K]
        mask_kn = mask_k[:, None] & mask_n[None, :]
        rows_p = k0 // 8 + tl.arange(0, BLOCK_K // 8)
        packed = tl.load(
            qweight_ptr + rows_p[:, None].to(tl.int64) * N + offs_n[None, :],
            mask=(rows_p < k_end // 8)[:, None] & mask_n[None, :],
            other=0,
        )  # [BLOCK_K / 8, BLOCK_N] int32, each read once
        shifts = tl.arange(0, 8) * 4  # nibble j of packed row p holds row 8 * p + j
        q = (packed[:, None, :] >> shifts[None, :, None]) & 0xF
        # q as float32 without an int-to-float conversion (a slow instruction): the bits of
        # 2^23 + q, minus 2^23, exactly.
        q = (q | MAGIC_2_23).to(tl.float32, bitcast=True) - 8388608.0
        q = tl.reshape(q, (BLOCK_K, BLOCK_N))
        if not HAS_G_IDX and GROUP_SIZE % BLOCK_K == 0:
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
        w = ((q - zero) * scale).to(dtype)  # [BLOCK_K, BLOCK_N]
        acc = tl.dot(x, w, acc, input_precision=DOT_PRECISION)
    mask_mn = mask_m[:, None] & mask_n[None, :]
    if SPLIT_K == 1:
        out_offs = offs_m[:, None].to(tl.int64) * stride_om + offs_n[None, :]
        tl.store(out_ptr + out_offs, acc.to(dtype), mask=mask_mn)
    else:
        part_offs = (tl.program_id(2) * M + offs_m[:, None]).to(tl.int64) * N + offs_n[None, :]
        tl.store(partial_ptr + part_offs, acc, mask=mask_mn)


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
    if m >= DEQUANT_MIN_M:
        check_w4a16_args(x, qweight, scales, zeros, g_idx, group_size)
        w = w4a16_dequantize(qweight, scales, zeros, g_idx, group_size, x.dtype)  # [K, N]
        return torch.matmul(x, w)
    tiles = w4a16_tiles(m, qweight.shape[1])
    return launch_w4a16_gemm(x, qweight, scales, zeros, g_idx, group_size, tiles)


def w4a16_tiles(m: int, n: int) -> W4A16Tiles:
    """The K loop's tiles for x of m rows and n output columns: the table's row, with split-K
    cut to what fills `split_k_programs` programs where the row sets it."""
    tiles = W4A16_TILES.lookup(m)
    if tiles.split_k_programs is None:
        return tiles
    num_tiles = max(1, cdiv(m, tiles.block_m) * cdiv(n, tiles.block_n))  # n may be 0
    return tiles._replace(split_k=min(tiles.split_k, cdiv(tiles.split_k_programs, num_tiles)))


def check_w4a16_args(
    x: torch.Tensor,
    qweight: torch.Tensor,
    scales: torch.Tensor,
    zeros: torch.Tensor,
    g_idx: torch.Tensor | None,
    group_size: int,
) -> None:
    """Raise ValueError unless the arguments are a W4A16 GEMM in the documented layout."""
    check(OP, x.dim() == 2 and qweight.dim() == 2, "x and qweight must be 2-D")
    k = x.shape[1]
    n = qweight.shape[1]
    num_groups = scales.shape[0]
    check(OP, qweight.dtype == torch.int32 and qweight.shape[0] * 8 == k, "qweight [K/8, N] int32")
    check(OP, tuple(scales.shape) == (num_groups, n), "scales must be [G, %s]", n)
    check(OP, tuple(zeros.shape) == (num_groups, n) and zeros.dtype == torch.uint8, "zeros [G, N]")
    check(OP, x.dtype in (torch.float16, torch.bfloat16, torch.float32), "x dtype %s", x.dtype)
    check(OP, x.stride(-1) == 1, "x needs a contiguous last dim")
    for name, t in (("qweight", qweight), ("scales", scales), ("zeros", zeros)):
        check(OP, t.is_contiguous(), "%s must be contiguous", name)
    if g_idx is None:
        check(OP, group_size > 0 and num_groups * group_size == k, "group_size * G must be K")
    else:
        check(OP, tuple(g_idx.shape) == (k,) and g_idx.dtype == torch.int32, "g_idx [K] int32")
    check_one_device(OP, x, qweight, scales, zeros, *(() if g_idx is None else (g_idx,)))


def launch_w4a16_gemm(
    x: torch.Tensor,
    qweight: torch.Tensor,
    scales: torch.Tensor,
    zeros: torch.Tensor,
    g_idx: torch.Tensor | None,
    group_size: int,
    tiles: W4A16Tiles,
) -> torch.Tensor:
    """The K-loop kernel with explicit tiles (a benchmark or a test passes candidates)."""
    check_dot_tiles(BLOCK_M=tiles.block_m, BLOCK_N=tiles.block_n, BLOCK_K=tiles.block_k)
    check_w4a16_args(x, qweight, scales, zeros, g_idx, group_size)
    m, k = x.shape
    n = qweight.shape[1]
    out = torch.empty((m, n), dtype=x.dtype, device=x.device)
    if m == 0 or n == 0:
        return out
    split_k = tiles.split_k
    check(OP, split_k >= 1, "split_k must be >= 1, got %s", split_k)
    # Each split's K range is whole BLOCK_K steps, so a tile never straddles two splits.
    k_per_split = cdiv(cdiv(k, split_k), tiles.block_k) * tiles.block_k
    partial = out
    if split_k > 1:
        partial = torch.empty((split_k, m, n), dtype=torch.float32, device=x.device)
    grid = (cdiv(m, tiles.block_m), cdiv(n, tiles.block_n), split_k)
    _w4a16_kernel[grid](
        x,
        qweight,
        scales,
        zeros,
        qweight if g_idx is None else g_idx,  # unused without act-order
        out,
        partial,
        m,
        n,
        k,
        k_per_split,
        x.stride(0),
        out.stride(0),
        GROUP_SIZE=max(group_size, 1),
        HAS_G_IDX=g_idx is not None,
        BLOCK_M=tiles.block_m,
        BLOCK_N=tiles.block_n,
        BLOCK_K=tiles.block_k,
        SPLIT_K=split_k,
        DOT_PRECISION="ieee" if x.dtype == torch.float32 else "tf32",
        MAGIC_2_23=0x4B000000,  # float32 2^23: q in the low mantissa bits
        num_warps=tiles.num_warps,
        num_stages=tiles.num_stages,
    )
    if split_k > 1:
        out.copy_(partial.sum(dim=0))
    return out
