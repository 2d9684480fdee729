"""W4A16 GEMM at 64 rows (a Llama-3-8B layer's four projections, group size 128): the shipped
kernel against three variants of its K loop, each over a grid of tiles, with bf16 cuBLAS and the
packed weight's read time beside them.

Variants: `bcast` loads each packed int32 once per row of K (8 addresses alike, served by L1)
and shifts by k % 8, instead of loading [BLOCK_K / 8, BLOCK_N] and reshaping the nibbles;
`trans` computes out^T = W^T x^T, so the dequantized weight is the dot's first operand; split-K
partials are added with float32 atomics. Every candidate is checked against the reference.
Run from the repo root on a GPU: python3 <this file>"""

import functools
import itertools
import sys
import time

sys.path.insert(0, "bench")
import torch
import triton
import triton.language as tl
from kernel_timing import graph_us

from loraplex.engine.model.quant.int4_layout import pack_int4
from loraplex.kernels.reference.w4a16 import w4a16_gemm as ref_gemm
from loraplex.kernels.triton.w4a16 import launch_w4a16_gemm, w4a16_tiles


@triton.jit
def _v_kernel(
    x_ptr,
    qw_ptr,
    s_ptr,
    z_ptr,
    out_ptr,
    M,
    N,
    K,
    k_per_split,
    stride_xm,
    GROUP_SIZE: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    SPLIT_K: tl.constexpr,
    TRANS: tl.constexpr,
    BCAST: tl.constexpr,
    MAGIC: tl.constexpr,
):
    offs_m = tl.arange(0, BLOCK_M)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_m = offs_m < M
    mask_n = offs_n < N
    k_begin = tl.program_id(2) * k_per_split
    k_end = tl.minimum(k_begin + k_per_split, K)
    if TRANS:
        acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    else:
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(k_begin, k_end, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        if BCAST:
            packed = tl.load(
                qw_ptr + (offs_k // 8)[:, None].to(tl.int64) * N + offs_n[None, :],
                mask=mask_n[None, :],
                other=0,
            )
            q = (packed >> ((offs_k % 8) * 4)[:, None]) & 0xF
            q = (q | MAGIC).to(tl.float32, bitcast=True) - 8388608.0
        else:
            rows_p = k0 // 8 + tl.arange(0, BLOCK_K // 8)
            packed = tl.load(
                qw_ptr + rows_p[:, None].to(tl.int64) * N + offs_n[None, :],
                mask=mask_n[None, :],
                other=0,
            )
            shifts = tl.arange(0, 8) * 4
            q = (packed[:, None, :] >> shifts[None, :, None]) & 0xF
            q = (q | MAGIC).to(tl.float32, bitcast=True) - 8388608.0
            q = tl.reshape(q, (BLOCK_K, BLOCK_N))
        grow = (k0 // GROUP_SIZE) * N + offs_n
        scale = tl.load(s_ptr + grow, mask=mask_n, other=0.0).to(tl.float32)[None, :]
        zero = tl.load(z_ptr + grow, mask=mask_n, other=0).to(tl.float32)[None, :]
        w = ((q - zero) * scale).to(tl.bfloat16)  # [BK, BN]
        if TRANS:
            x = tl.load(
                x_ptr + offs_m[None, :] * stride_xm + offs_k[:, None],
                mask=mask_m[None, :],
                other=0.0,
            )  # [BK, BM]
            acc = tl.dot(tl.trans(w), x, acc)
        else:
            x = tl.load(
                x_ptr + offs_m[:, None] * stride_xm + offs_k[None, :],
                mask=mask_m[:, None],
                other=0.0,
            )
            acc = tl.dot(x, w, acc)
    if TRANS:
        optrs = out_ptr + offs_m[None, :] * N + offs_n[:, None]
        omask = mask_m[None, :] & mask_n[:, None]
    else:
        optrs = out_ptr + offs_m[:, None] * N + offs_n[None, :]
        omask = mask_m[:, None] & mask_n[None, :]
    if SPLIT_K == 1:
        tl.store(optrs, acc, mask=omask)
    else:
        tl.atomic_add(optrs, acc, mask=omask, sem="relaxed")


def run_v(x, qw, s, z, gs, bn, bk, split, warps, stages, trans, bcast, out32):
    m, k = x.shape
    n = qw.shape[1]
    kps = triton.cdiv(triton.cdiv(k, split), bk) * bk
    if split > 1:
        out32.zero_()
    _v_kernel[(1, triton.cdiv(n, bn), split)](
        x,
        qw,
        s,
        z,
        out32,
        m,
        n,
        k,
        kps,
        x.stride(0),
        GROUP_SIZE=gs,
        BLOCK_M=64,
        BLOCK_N=bn,
        BLOCK_K=bk,
        SPLIT_K=split,
        TRANS=trans,
        BCAST=bcast,
        MAGIC=0x4B000000,
        num_warps=warps,
        num_stages=stages,
    )
    return out32.to(torch.bfloat16)


torch.manual_seed(0)
dev = "cuda"
M = 64
GS = 128
SHAPES = {"qkv": (4096, 6144), "o": (4096, 4096), "gate_up": (4096, 28672), "down": (14336, 4096)}
data = {}
for name, (k, n) in SHAPES.items():
    x = torch.randn(M, k, device=dev, dtype=torch.bfloat16)
    qw = pack_int4(torch.randint(0, 16, (k, n), device=dev, dtype=torch.uint8), 0)
    s = (torch.rand(k // GS, n, device=dev) * 0.01 + 0.001).half()
    z = torch.randint(0, 16, (k // GS, n), device=dev, dtype=torch.uint8)
    w16 = torch.randn(n, k, device=dev, dtype=torch.bfloat16)
    ref = ref_gemm(x, qw, s, z, None, GS).float()
    data[name] = (x, qw, s, z, w16, ref, torch.empty(M, n, device=dev, dtype=torch.float32))
bf16 = sum(graph_us(lambda d=d: torch.nn.functional.linear(d[0], d[4])) for d in data.values())
cur = sum(
    graph_us(
        lambda d=d: launch_w4a16_gemm(
            d[0], d[1], d[2], d[3], None, GS, w4a16_tiles(M, d[1].shape[1])
        )
    )
    for d in data.values()
)
for name, d in data.items():
    y = launch_w4a16_gemm(d[0], d[1], d[2], d[3], None, GS, w4a16_tiles(M, d[1].shape[1])).float()
    print(
        name, "current max err", (y - d[5]).abs().max().item(), "ref max", d[5].abs().max().item()
    )
packed_mb = sum(d[1].numel() * 4 for d in data.values()) / 1e6
buf = torch.empty(int(packed_mb * 1e6) // 2, device=dev, dtype=torch.bfloat16)
buf2 = torch.empty_like(buf)
copy = graph_us(lambda: buf2.copy_(buf))  # reads + writes the packed bytes: 2x the read floor
print(
    f"M={M}: bf16 cuBLAS {bf16:.1f} us/layer; current W4A16 {cur:.1f}; packed {packed_mb:.1f} MB,"
    f" read floor ~{copy / 2:.1f} us",
    flush=True,
)
res = []
for trans, bcast in ((False, False), (False, True), (True, True), (True, False)):
    for bn, bk, split, warps, stages in itertools.product(
        (128, 256), (64, 128), (1, 2, 4), (4, 8), (3,)
    ):
        t0 = time.time()
        try:
            tot = 0.0
            bad = False
            for name, (x, qw, s, z, _, ref, o32) in data.items():
                sp = split if name != "gate_up" else max(1, split // 2)
                y = run_v(x, qw, s, z, GS, bn, bk, sp, warps, stages, trans, bcast, o32).float()
                bad |= not torch.allclose(y, ref, rtol=2e-2, atol=2e-2 * ref.abs().max().item())
                tot += graph_us(
                    functools.partial(
                        run_v, x, qw, s, z, GS, bn, bk, sp, warps, stages, trans, bcast, o32
                    )
                )
        except Exception as e:
            print(
                f"  fail trans={trans} bcast={bcast} {bn} {bk} {split} {warps} {stages}: {type(e).__name__} {str(e)[:80]}",
                flush=True,
            )
            continue
        res.append((tot, trans, bcast, bn, bk, split, warps, stages, bad))
        print(
            f"  {tot:7.1f} us trans={trans:d} bcast={bcast:d} bn={bn} bk={bk} split={split} w={warps} st={stages}{' BAD' if bad else ''} ({time.time() - t0:.1f}s)",
            flush=True,
        )
res.sort()
print("best:")
for r in res[:10]:
    print("  ", r)
