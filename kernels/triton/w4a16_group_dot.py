"""W4A16 GEMM for group-wise (not act-order) 4-bit weights with groups of 128 rows or a multiple:
integer dots on the tensor cores with the weights on the MMA's wide side, scaled once per group.

Method: AWQ / GPTQ weight-only quantization (layout and spec: `kernels/reference/w4a16.py`)
with the scale and zero point taken out of the inner product. Within one group g, for every
output column n and row m of x:

    sum_k x[m, k] (q[k, n] - z[g, n]) s[g, n]
        = s[g, n] * sum_k x[m, k] (2^e + q[k, n])   -   (2^e + z[g, n]) s[g, n] * xsum[m, g]

where xsum[m, g] = sum over the group of x[m, k] (computed once per call, [M, G] float32).
The K loop therefore feeds the MMA the floats 2^e + q, made from the nibbles by bit operations
alone: OR-ing q into the mantissa of 2^e, whose ulp is 1, gives 2^e + q exactly (2^e = 128 in
bfloat16, 1024 in float16; float32 subtracts 2^23 back in the loop). Each group's dot is scaled
by s on the float32 accumulator, and the zero-point term is taken off once at the end. Per
weight that leaves a shift, a mask-and-or and a packing move, where `w4a16.py` forms
(q - z) * s in float32 and rounds it for every weight.

Swap-AB: the kernel computes out^T = W^T x^T, so the dequantized weights are the MMA's first
operand, used from registers, and the few rows of x (decode) are its narrow second operand.
One program covers BLOCK_M <= 64 rows of x against BLOCK_N columns: no weight is unpacked
twice for two tiles of rows.

Nibble order: int p of a column packs rows 8p..8p+7, so nibble j of a K step's BLOCK_K / 8
ints is rows {k0 + 8p + j}; each nibble is one dot of BLOCK_K / 8 rows with x's columns in the
same order (x read with stride 8).

Numerics: the products are exact and accumulate in float32, so the result is closer to the
exact product than the reference's (which rounds each dequantized weight to x's dtype first);
tests compare the two within the dtype's tolerance. Split-K writes float32 partial sums that
the launcher adds in a fixed order (deterministic).

Grid: (cdiv(M, BLOCK_M), cdiv(N, BLOCK_N), SPLIT_K).
"""

from __future__ import annotations

import sys
from typing import NamedTuple

import torch
import triton
import triton.language as tl

from loraplex.kernels.triton.launch_checks import check
from loraplex.kernels.triton.tile_table import MIN_DOT_DIM, TileTable, check_dot_tiles

OP = "w4a16_gemm"
NIBBLES = 8  # 4-bit values per int32
# Split-K 0 ("auto") splits K until the grid has about this many programs, two per SM of an
# H100 / H200 (132 SMs), so that a thin weight (few column tiles) still fills the GPU.
TARGET_PROGRAMS = 264
MAX_AUTO_SPLIT_K = 16

# The float whose mantissa takes q: (its bits, which q is OR-ed into; its value).
_EXPONENT_TRICK = {
    torch.bfloat16: (0x4300, 128.0),  # bf16 128.0: 7 mantissa bits, ulp 1 from 128 to 256
    torch.float16: (0x6400, 1024.0),  # fp16 1024.0: 10 mantissa bits
    torch.float32: (0x4B000000, 8388608.0),  # fp32 2^23: subtracted in the loop (see kernel)
}


class GroupDotTiles(NamedTuple):
    block_m: int  # rows of x per program (the MMA's narrow side): 16, 32 or 64
    block_n: int  # output columns per program
    block_k: int  # input rows per K step: a multiple of 128 that divides the group size
    num_warps: int
    split_k: int = 0  # programs along K; 0: enough for ~TARGET_PROGRAMS programs in all
    num_stages: int = 3


@triton.jit
def _w4a16_group_dot_kernel(  # type: ignore[no-untyped-def]
    x_ptr,
    qweight_ptr,
    scales_ptr,
    zeros_ptr,
    x_sums_ptr,  # [M, G] float32
    out_ptr,
    partial_ptr,
    M,
    N,
    K,
    k_per_split,
    stride_xm,
    stride_om,
    GROUP_SIZE: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    USE_PARTIAL: tl.constexpr,  # split-K > 1: float32 partial sums
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
    k_begin = tl.program_id(2) * k_per_split  # a multiple of BLOCK_K, as is K
    k_end = tl.minimum(k_begin + k_per_split, K)
    # x^T [PACKED, BLOCK_M]: nibble j of a K step reads columns k0 + 8p + j
    xt_ptrs = x_ptr + offs_m[None, :].to(tl.int64) * stride_xm + (k_begin + 8 * offs_p)[:, None]
    # W^T as packed ints [BLOCK_N, PACKED]
    w_ptrs = qweight_ptr + (k_begin // 8 + offs_p)[None, :].to(tl.int64) * N + offs_n[:, None]
    acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)  # out^T
    for k0 in range(k_begin, k_end, BLOCK_K):
        packed = tl.load(w_ptrs, mask=mask_n[:, None], other=0)
        group_row = (k0 // GROUP_SIZE) * N + offs_n
        scale = tl.load(scales_ptr + group_row, mask=mask_n, other=0.0).to(tl.float32)
        dots = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
        for j in tl.static_range(8):
            xt = tl.load(xt_ptrs + j, mask=mask_m[None, :], other=0.0)
            bits = ((packed >> (4 * j)) & 0xF) | MAGIC  # [BLOCK_N, PACKED]
            if IS_FP32:
                w = bits.to(tl.float32, bitcast=True) - OFFSET
            else:
                w = bits.to(tl.int16).to(dtype, bitcast=True)
            dots = tl.dot(w, xt, dots, input_precision=DOT_PRECISION)
        acc += dots * scale[:, None]
        w_ptrs += PACKED * N
        xt_ptrs += BLOCK_K
    # The zero-point term of this split's groups: (2^e + z) * s * xsum.
    num_groups = K // GROUP_SIZE
    for g in range(k_begin // GROUP_SIZE, k_end // GROUP_SIZE):
        x_sum = tl.load(x_sums_ptr + offs_m * num_groups + g, mask=mask_m, other=0.0)
        scale = tl.load(scales_ptr + g * N + offs_n, mask=mask_n, other=0.0).to(tl.float32)
        zero = tl.load(zeros_ptr + g * N + offs_n, mask=mask_n, other=0).to(tl.float32)
        if not IS_FP32:
            zero += OFFSET
        acc -= (zero * scale)[:, None] * x_sum[None, :]
    mask = mask_n[:, None] & mask_m[None, :]
    if not USE_PARTIAL:
        out_offs = offs_m[None, :].to(tl.int64) * stride_om + offs_n[:, None]
        tl.store(out_ptr + out_offs, acc.to(dtype), mask=mask)
    else:
        part_offs = (tl.program_id(2) * M + offs_m[None, :]).to(tl.int64) * N + offs_n[:, None]
        tl.store(partial_ptr + part_offs, acc, mask=mask)


# Tiles by the number of rows of x, from bench/w4a16_sweep.py on an H200 (Llama-3-8B
# projections, group size 128).
GROUP_DOT_TILES: TileTable[GroupDotTiles] = TileTable(
    (
        (16, GroupDotTiles(16, 128, 128, 4)),
        (32, GroupDotTiles(32, 128, 128, 4)),
        (sys.maxsize, GroupDotTiles(64, 256, 128, 8)),
    )
)
GROUP_DOT_MAX_M = 64  # more rows: several programs would unpack the same weights


def fits_group_dot(m: int, group_size: int, g_idx: torch.Tensor | None) -> bool:
    """Whether this kernel takes the GEMM: at most GROUP_DOT_MAX_M rows, no act-order, and
    groups of a multiple of 128 rows (8 dots of 16 rows per K step, each in one group)."""
    return m <= GROUP_DOT_MAX_M and g_idx is None and group_size % (NIBBLES * MIN_DOT_DIM) == 0


def launch_w4a16_group_dot(
    x: torch.Tensor,  # [M, K]
    qweight: torch.Tensor,  # [K/8, N] int32
    scales: torch.Tensor,  # [G, N]
    zeros: torch.Tensor,  # [G, N] uint8
    group_size: int,
    tiles: GroupDotTiles,
) -> torch.Tensor:
    """y = x @ dequantize(W) -> [M, N] in x's dtype, with these tiles. The caller has checked
    the arguments (`w4a16.check_w4a16_args`); the weights must fit (`fits_group_dot`)."""
    check_dot_tiles(BLOCK_M=tiles.block_m, BLOCK_N=tiles.block_n, BLOCK_K=tiles.block_k)
    check(OP, tiles.block_k >= NIBBLES * MIN_DOT_DIM, "block_k must be >= 128")
    check(OP, group_size % tiles.block_k == 0, "block_k must divide the group size")
    check(OP, tiles.split_k >= 0, f"split_k must be >= 0, got {tiles.split_k}")
    m, k = x.shape
    n = qweight.shape[1]
    out = torch.empty((m, n), dtype=x.dtype, device=x.device)
    if m == 0 or n == 0:
        return out
    magic, offset = _EXPONENT_TRICK[x.dtype]
    num_steps = k // tiles.block_k
    num_tiles = triton.cdiv(m, tiles.block_m) * triton.cdiv(n, tiles.block_n)
    split_k = tiles.split_k or min(MAX_AUTO_SPLIT_K, triton.cdiv(TARGET_PROGRAMS, num_tiles))
    k_per_split = triton.cdiv(num_steps, min(split_k, num_steps)) * tiles.block_k
    split_k = triton.cdiv(k, k_per_split)  # no empty split
    partial = out
    if split_k > 1:
        partial = torch.empty((split_k, m, n), dtype=torch.float32, device=x.device)
    # [M, G]: each group's sum of x, in float32
    x_sums = torch.sum(x.unflatten(1, (-1, group_size)), dim=-1, dtype=torch.float32)
    grid = (triton.cdiv(m, tiles.block_m), triton.cdiv(n, tiles.block_n), split_k)
    _w4a16_group_dot_kernel[grid](
        x,
        qweight,
        scales,
        zeros,
        x_sums,
        out,
        partial,
        m,
        n,
        k,
        k_per_split,
        x.stride(0),
        out.stride(0),
        GROUP_SIZE=group_size,
        BLOCK_M=tiles.block_m,
        BLOCK_N=tiles.block_n,
        BLOCK_K=tiles.block_k,
        USE_PARTIAL=split_k > 1,
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
