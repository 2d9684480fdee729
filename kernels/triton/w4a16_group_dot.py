"""W4A16 GEMM for group-wise (not act-order) 4-bit weights: integer dot products per group,
scaled once per group and column.

Method: AWQ / GPTQ weight-only quantization (layout and spec: `kernels/reference/w4a16.py`)
with the scale and zero point taken out of the inner product. Within one group g of BLOCK_K
input rows, for every column n:

    sum_k x[m, k] * (q[k, n] - z[g, n]) * s[g, n]
        = s[g, n] * (sum_k x[m, k] * q[k, n]  -  z[g, n] * sum_k x[m, k])

so the K loop feeds tl.dot the 4-bit integers themselves, exact in x's dtype, and does the
zero and scale on the [BLOCK_M, BLOCK_N] float32 tile once per group. Per weight that leaves a
shift, a mask-and-or and a bit cast (no float arithmetic), where `w4a16.py` forms
(q - z) * s in float32 and rounds it for every weight. The integers come out of the nibbles by
the exponent trick: OR-ing q into the mantissa of a power of two 2^e (whose ulp is 1) gives the
float 2^e + q exactly; the dot then runs on 2^e + q and the epilogue subtracts 2^e with the
zero point (2^e = 128 for bfloat16, 1024 for float16; float32 subtracts 2^23 in the loop).

Nibble order: int r of a column packs rows 8r..8r+7, so a tile of BLOCK_K rows holds
BLOCK_K / 8 ints per column and nibble j of them is rows {k0 + 8p + j}. The tile is dotted with
x's columns in the same order: either as 8 dots of BLOCK_K / 8 rows (x read with stride 8,
SPLIT_NIBBLES), or as one dot over the tile reordered nibble-major, [8, BLOCK_K / 8] -> BLOCK_K:

    tile row r = j * (BLOCK_K / 8) + p   <->   input row k0 + 8p + j

Numerics: the products are exact and accumulate in float32, so the result is closer to the
exact product than the reference's (which rounds each dequantized weight to x's dtype first);
tests compare the two within the dtype's tolerance. Split-K writes float32 partial sums that
the launcher adds in a fixed order.

Grid: (cdiv(M, BLOCK_M), cdiv(N, BLOCK_N), SPLIT_K). Needs BLOCK_K to divide the group size
(one group per K step; `group_dot_tiles` adapts it); act-order weights take `w4a16.py`'s
kernel.
"""

from __future__ import annotations

import math
import sys
from typing import NamedTuple

import torch
import triton
import triton.language as tl

from loraplex.kernels.triton.launch_checks import check
from loraplex.kernels.triton.tile_table import MIN_DOT_DIM, TileTable, check_dot_tiles

OP = "w4a16_gemm"
# Split-K 0 ("auto") splits K until the grid has about this many programs: two per SM of an
# H100 / H200 (132 SMs), so that a thin weight (few output tiles) still fills the GPU.
TARGET_PROGRAMS = 264
MAX_AUTO_SPLIT_K = 16

# The float whose mantissa takes q, as (its bits OR-ed with q, the value subtracted after).
_EXPONENT_TRICK = {
    torch.bfloat16: (0x4300, 128.0),  # bf16 128.0: 7 mantissa bits, ulp 1 from 128 to 256
    torch.float16: (0x6400, 1024.0),  # fp16 1024.0: 10 mantissa bits
    torch.float32: (0x4B000000, 8388608.0),  # fp32 2^23: subtracted in the loop (see kernel)
}


class GroupDotTiles(NamedTuple):
    block_m: int
    block_n: int
    block_k: int  # input rows per K step: divides the group size
    num_warps: int
    split_k: int = 0  # programs along K; 0: enough for ~TARGET_PROGRAMS programs in all
    num_stages: int = 3
    split_nibbles: bool = True  # 8 dots of BLOCK_K / 8 rows, or one dot of a reordered tile


@triton.jit
def _w4a16_group_dot_kernel(  # type: ignore[no-untyped-def]
    x_ptr,
    qweight_ptr,
    scales_ptr,
    zeros_ptr,
    out_ptr,
    partial_ptr,
    M,
    N,
    k_per_split,
    stride_xm,
    stride_om,
    K,
    GROUP_SIZE: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    USE_PARTIAL: tl.constexpr,  # split-K > 1: float32 partial sums
    SPLIT_NIBBLES: tl.constexpr,
    MAGIC: tl.constexpr,  # bits of 2^e
    OFFSET: tl.constexpr,  # 2^e: the dot's integers are OFFSET + q
    IS_FP32: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    PACKED: tl.constexpr = BLOCK_K // 8  # ints per column per K step
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_m = offs_m < M
    mask_n = offs_n < N
    dtype = x_ptr.dtype.element_ty
    offs_p = tl.arange(0, PACKED)
    x_rows = x_ptr + offs_m[:, None].to(tl.int64) * stride_xm  # [BLOCK_M, 1]
    k_begin = tl.program_id(2) * k_per_split  # a multiple of BLOCK_K, as is K
    k_end = tl.minimum(k_begin + k_per_split, K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(k_begin, k_end, BLOCK_K):
        packed = tl.load(
            qweight_ptr + (k0 // 8 + offs_p)[:, None].to(tl.int64) * N + offs_n[None, :],
            mask=mask_n[None, :],
            other=0,
        )  # [PACKED, BLOCK_N] int32
        group_row = (k0 // GROUP_SIZE) * N + offs_n
        scale = tl.load(scales_ptr + group_row, mask=mask_n, other=0.0).to(tl.float32)
        zero = tl.load(zeros_ptr + group_row, mask=mask_n, other=0).to(tl.float32)
        if SPLIT_NIBBLES:
            dots = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
            x_sum = tl.zeros((BLOCK_M,), dtype=tl.float32)
            for j in tl.static_range(8):
                x = tl.load(
                    x_rows + (k0 + 8 * offs_p + j)[None, :], mask=mask_m[:, None], other=0.0
                )
                bits = ((packed >> (4 * j)) & 0xF) | MAGIC  # [PACKED, BLOCK_N]
                dots = tl.dot(
                    x, _as_float(bits, dtype, OFFSET, IS_FP32), dots, input_precision=DOT_PRECISION
                )
                x_sum += tl.sum(x.to(tl.float32), axis=1)
        else:
            # Tile row r = j * PACKED + p is input row k0 + 8p + j (see the module docstring).
            offs_r = tl.arange(0, BLOCK_K)
            cols = k0 + 8 * (offs_r % PACKED) + offs_r // PACKED
            x = tl.load(x_rows + cols[None, :], mask=mask_m[:, None], other=0.0)
            shifts = 4 * tl.arange(0, 8)
            bits = ((packed[None, :, :] >> shifts[:, None, None]) & 0xF) | MAGIC
            w = tl.reshape(_as_float(bits, dtype, OFFSET, IS_FP32), (BLOCK_K, BLOCK_N))
            dots = tl.dot(x, w, input_precision=DOT_PRECISION)
            x_sum = tl.sum(x.to(tl.float32), axis=1)
        if IS_FP32:
            acc += (dots - x_sum[:, None] * zero[None, :]) * scale[None, :]
        else:
            acc += (dots - x_sum[:, None] * (zero + OFFSET)[None, :]) * scale[None, :]
    mask_mn = mask_m[:, None] & mask_n[None, :]
    if not USE_PARTIAL:
        out_offs = offs_m[:, None].to(tl.int64) * stride_om + offs_n[None, :]
        tl.store(out_ptr + out_offs, acc.to(dtype), mask=mask_mn)
    else:
        part_offs = (tl.program_id(2) * M + offs_m[:, None]).to(tl.int64) * N + offs_n[None, :]
        tl.store(partial_ptr + part_offs, acc, mask=mask_mn)


@triton.jit
def _as_float(bits, dtype: tl.constexpr, OFFSET: tl.constexpr, IS_FP32: tl.constexpr):  # type: ignore[no-untyped-def]
    """int32 bits of OFFSET + q -> that float in `dtype` (float32: q itself)."""
    if IS_FP32:
        w = bits.to(tl.float32, bitcast=True) - OFFSET
    else:
        w = bits.to(tl.int16).to(dtype, bitcast=True)
    return w


# Tiles by the number of rows of x, from bench/w4a16_sweep.py on an H200 (Llama-3-8B
# projections, group size 128).
GROUP_DOT_TILES: TileTable[GroupDotTiles] = TileTable(
    (
        (16, GroupDotTiles(16, 128, 128, 4)),
        (sys.maxsize, GroupDotTiles(64, 128, 128, 4)),
    )
)


def fits_group_dot(group_size: int, g_idx: torch.Tensor | None) -> bool:
    """Whether these weights can take this kernel: no act-order, and groups of a multiple of
    MIN_DOT_DIM rows (a K step then lies in one group)."""
    return g_idx is None and group_size % MIN_DOT_DIM == 0


def group_dot_tiles(tiles: GroupDotTiles, group_size: int) -> GroupDotTiles:
    """`tiles` with a K step that divides the group size (groups of 32 or 64 rows get K steps
    of that size, whose 4 or 8 ints per column are too few for 8 dots: one reordered dot)."""
    block_k = math.gcd(tiles.block_k, group_size)
    if block_k == tiles.block_k:
        return tiles
    return tiles._replace(block_k=block_k, split_nibbles=False)


def launch_w4a16_group_dot(
    x: torch.Tensor,  # [M, K]
    qweight: torch.Tensor,  # [K/8, N] int32
    scales: torch.Tensor,  # [G, N]
    zeros: torch.Tensor,  # [G, N] uint8
    group_size: int,
    tiles: GroupDotTiles,
) -> torch.Tensor:
    """y = x @ dequantize(W) -> [M, N] in x's dtype, with these tiles (their K step adapted to
    the group size). The caller has checked the arguments (`w4a16.check_w4a16_args`) and that
    `fits_group_dot`."""
    tiles = group_dot_tiles(tiles, group_size)
    check_dot_tiles(BLOCK_M=tiles.block_m, BLOCK_N=tiles.block_n, BLOCK_K=tiles.block_k)
    check(OP, group_size % tiles.block_k == 0, "block_k must divide the group size")
    check(OP, tiles.block_k // 8 >= MIN_DOT_DIM or not tiles.split_nibbles, "8 dots need 128 rows")
    check(OP, tiles.split_k >= 0, f"split_k must be >= 0, got {tiles.split_k}")
    m, k = x.shape
    n = qweight.shape[1]
    out = torch.empty((m, n), dtype=x.dtype, device=x.device)
    if m == 0 or n == 0:
        return out
    magic, offset = _EXPONENT_TRICK[x.dtype]
    num_tiles = triton.cdiv(m, tiles.block_m) * triton.cdiv(n, tiles.block_n)
    split_k = tiles.split_k or min(MAX_AUTO_SPLIT_K, triton.cdiv(TARGET_PROGRAMS, num_tiles))
    split_k = min(split_k, k // tiles.block_k)
    k_per_split = triton.cdiv(k // tiles.block_k, split_k) * tiles.block_k
    split_k = triton.cdiv(k, k_per_split)  # no empty split
    partial = out
    if split_k > 1:
        partial = torch.empty((split_k, m, n), dtype=torch.float32, device=x.device)
    grid = (triton.cdiv(m, tiles.block_m), triton.cdiv(n, tiles.block_n), split_k)
    _w4a16_group_dot_kernel[grid](
        x,
        qweight,
        scales,
        zeros,
        out,
        partial,
        m,
        n,
        k_per_split,
        x.stride(0),
        out.stride(0),
        K=k,
        GROUP_SIZE=group_size,
        BLOCK_M=tiles.block_m,
        BLOCK_N=tiles.block_n,
        BLOCK_K=tiles.block_k,
        USE_PARTIAL=split_k > 1,
        SPLIT_NIBBLES=tiles.split_nibbles,
        MAGIC=magic,
        OFFSET=offset,
        IS_FP32=x.dtype == torch.float32,
        DOT_PRECISION="ieee" if x.dtype == torch.float32 else "tf32",
        num_warps=tiles.num_warps,
        num_stages=tiles.num_stages,
    )
    if split_k > 1:
        out.copy_(partial.sum(dim=0))
    return out
