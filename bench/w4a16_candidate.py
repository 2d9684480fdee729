"""A candidate W4A16 GEMM kernel beside the engine's (kernels/triton/w4a16.py): correctness
against the reference, then time against the engine's kernel at Llama-3-8B projection shapes.

    python bench/w4a16_candidate.py                # on a GPU: check, then time
    TRITON_INTERPRET=1 python bench/w4a16_candidate.py --check-only   # CPU, float32 only

The engine's kernel loads each packed int32 once per K row it holds (8 times per tile) and
gathers a scale and a zero per element. The candidate loads the tile's BLOCK_K / 8 packed rows
once, unpacks them in registers ([BLOCK_K / 8, 8, BLOCK_N] -> [BLOCK_K, BLOCK_N]) and, when the
tile lies inside one quantization group, loads one row of scales and zeros. Same launch
arguments, same rounding point ((q - z) * s in float32, rounded to x's dtype), so it can replace
the engine's kernel once a GPU run shows it is correct and faster. Until then it lives here, not
in the engine.
"""

from __future__ import annotations

import argparse
import functools
import json
import os

import torch
import triton
import triton.language as tl

from loraplex.engine.model.quant.int4_layout import pack_int4
from loraplex.kernels import reference
from loraplex.kernels.triton.w4a16 import W4A16_TILES, launch_w4a16_gemm

# Llama-3-8B's projections (N, K): fused qkv, o, fused gate_up, down.
PROJECTIONS = {
    "qkv": (6144, 4096),
    "o": (4096, 4096),
    "gate_up": (28672, 4096),
    "down": (4096, 14336),
}
TOLERANCES = {torch.float32: 1e-4, torch.float16: 2e-2, torch.bfloat16: 6e-2}


@triton.jit
def _w4a16_unpack_once_kernel(  # type: ignore[no-untyped-def]
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
):
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_m = offs_m < M
    mask_n = offs_n < N
    dtype = out_ptr.dtype.element_ty
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    offs_p = tl.arange(0, BLOCK_K // 8)  # the tile's packed rows
    shifts = tl.arange(0, 8) * 4  # nibble j of a packed int32 holds row 8 * p + j
    for k0 in range(0, K, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        mask_k = offs_k < K
        x = tl.load(
            x_ptr + offs_m[:, None].to(tl.int64) * stride_xm + offs_k[None, :],
            mask=mask_m[:, None] & mask_k[None, :],
            other=0.0,
        )  # [BLOCK_M, BLOCK_K]
        rows_p = k0 // 8 + offs_p
        packed = tl.load(
            qweight_ptr + rows_p[:, None].to(tl.int64) * N + offs_n[None, :],
            mask=(rows_p < K // 8)[:, None] & mask_n[None, :],
            other=0,
        )  # [BLOCK_K / 8, BLOCK_N] int32, each read once
        q = (packed[:, None, :] >> shifts[None, :, None]) & 0xF  # [BLOCK_K / 8, 8, BLOCK_N]
        q = tl.reshape(q, (BLOCK_K, BLOCK_N)).to(tl.float32)  # row-major: row 8 * p + j
        if HAS_G_IDX:
            groups = tl.load(g_idx_ptr + offs_k, mask=mask_k, other=0)
            mask_kn = mask_k[:, None] & mask_n[None, :]
            group_offs = groups[:, None].to(tl.int64) * N + offs_n[None, :]
            scale = tl.load(scales_ptr + group_offs, mask=mask_kn, other=0.0).to(tl.float32)
            zero = tl.load(zeros_ptr + group_offs, mask=mask_kn, other=0).to(tl.float32)
        elif GROUP_SIZE % BLOCK_K == 0:
            # The whole tile is in one group: one row of scales and zeros.
            group_offs = (k0 // GROUP_SIZE) * N + offs_n
            scale = tl.load(scales_ptr + group_offs, mask=mask_n, other=0.0).to(tl.float32)[None, :]
            zero = tl.load(zeros_ptr + group_offs, mask=mask_n, other=0).to(tl.float32)[None, :]
        else:
            mask_kn = mask_k[:, None] & mask_n[None, :]
            group_offs = (offs_k // GROUP_SIZE)[:, None].to(tl.int64) * N + offs_n[None, :]
            scale = tl.load(scales_ptr + group_offs, mask=mask_kn, other=0.0).to(tl.float32)
            zero = tl.load(zeros_ptr + group_offs, mask=mask_kn, other=0).to(tl.float32)
        w = ((q - zero) * scale).to(dtype)  # [BLOCK_K, BLOCK_N]
        acc = tl.dot(x, w, acc, input_precision=DOT_PRECISION)
    tl.store(
        out_ptr + offs_m[:, None].to(tl.int64) * stride_om + offs_n[None, :],
        acc.to(dtype),
        mask=mask_m[:, None] & mask_n[None, :],
    )


def candidate_gemm(
    x: torch.Tensor,
    qweight: torch.Tensor,
    scales: torch.Tensor,
    zeros: torch.Tensor,
    g_idx: torch.Tensor | None,
    group_size: int,
    tiles: tuple[int, int, int, int] | None = None,
) -> torch.Tensor:
    """The candidate with the engine kernel's tile table (or `tiles`)."""
    m, k = x.shape
    n = qweight.shape[1]
    block_m, block_n, block_k, num_warps = tiles or W4A16_TILES.lookup(m)
    out = torch.empty((m, n), dtype=x.dtype, device=x.device)
    grid = (triton.cdiv(m, block_m), triton.cdiv(n, block_n))
    _w4a16_unpack_once_kernel[grid](
        x, qweight, scales, zeros, qweight if g_idx is None else g_idx, out, m, n, k,
        x.stride(0), out.stride(0), GROUP_SIZE=max(group_size, 1), HAS_G_IDX=g_idx is not None,
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k,
        DOT_PRECISION="ieee" if x.dtype == torch.float32 else "tf32", num_warps=num_warps,
    )  # fmt: skip
    return out


def inputs(m: int, k: int, n: int, group_size: int, act_order: bool, dtype, device):
    q = torch.randint(0, 16, (k, n), dtype=torch.uint8)
    qweight = pack_int4(q, 0).to(device)
    num_groups = k // group_size
    scales = (torch.rand(num_groups, n) * 0.02 + 0.001).half().to(device)
    zeros = torch.randint(0, 16, (num_groups, n), dtype=torch.uint8).to(device)
    g_idx = None
    if act_order:
        g_idx = torch.empty(k, dtype=torch.int32)
        g_idx[torch.randperm(k)] = (torch.arange(k) // group_size).to(torch.int32)
        g_idx = g_idx.to(device)
    return torch.randn(m, k).to(dtype).to(device), qweight, scales, zeros, g_idx


def check(device: str) -> int:
    """Candidate vs reference over group sizes, act-order, ragged shapes; number of failures."""
    dtypes = [torch.float32, torch.float16] + ([torch.bfloat16] if device == "cuda" else [])
    cases = [(3, 64, 32, 32, False), (17, 128, 40, 64, False), (5, 128, 24, 128, False),
             (9, 96, 16, 32, True), (1, 128, 48, 64, True), (4, 64, 24, 16, False)]  # fmt: skip
    failures = 0
    for dtype in dtypes:
        for m, k, n, group_size, act_order in cases:
            args = inputs(m, k, n, group_size, act_order, dtype, device)
            want = reference.w4a16_gemm(*args, group_size)
            for tiles in [(16, 16, 32, 4), (16, 16, 16, 4)]:
                got = candidate_gemm(*args, group_size, tiles)
                tol = TOLERANCES[dtype]
                ok = torch.allclose(got.float(), want.float(), atol=tol, rtol=tol)
                failures += not ok
                if not ok:
                    print(
                        f"MISMATCH {dtype} m={m} k={k} n={n} g={group_size} act={act_order} {tiles}"
                    )
    print(f"candidate vs reference: {failures} failures", flush=True)
    return failures


def time_kernels() -> dict:
    """Microseconds per call at decode and prefill row counts, bf16, group size 128."""
    from kernel_timing import bench_us

    results = {}
    for name, (n, k) in PROJECTIONS.items():
        dense_w = torch.randn(k, n, dtype=torch.bfloat16, device="cuda")
        for m in (1, 16, 64, 256, 4096):
            args = (*inputs(m, k, n, 128, False, torch.bfloat16, "cuda")[:4], None, 128)
            engine_tiles = W4A16_TILES.lookup(m)
            engine = bench_us(functools.partial(launch_w4a16_gemm, *args, engine_tiles))
            cand = bench_us(functools.partial(candidate_gemm, *args))
            dense = bench_us(functools.partial(torch.matmul, args[0], dense_w))
            weight_gb_s = (k * n / 2) / (cand * 1e-6) / 1e9
            results[f"{name} m={m}"] = {
                "engine_us": engine,
                "candidate_us": cand,
                "bf16_matmul_us": dense,
            }
            print(
                f"{name:8s} M={m:5d}: engine {engine:8.1f} us, candidate {cand:8.1f} us "
                f"({engine / cand:.2f}x; packed weights at {weight_gb_s:.0f} GB/s), "
                f"bf16 matmul {dense:8.1f} us",
                flush=True,
            )
    return results


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--check-only", action="store_true")
    ap.add_argument("--json", help="write the timings here")
    args = ap.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
        raise SystemExit("no GPU: run with TRITON_INTERPRET=1 --check-only")
    torch.manual_seed(0)
    failures = check(device)
    if failures or args.check_only or device == "cpu":
        return 1 if failures else 0
    results = time_kernels()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
