"""The W4A16 GEMM's unpack-once inner loop (`launch_w4a16_gemm(..., unpack_once=True)`) timed
against the engine's, at Llama-3-8B projection shapes, bf16, group size 128 (a GPU only).

The engine's loop loads each packed int32 once per K row it holds (8 times per tile) and gathers
a scale and a zero per element; the candidate loads the tile's BLOCK_K / 8 packed rows once,
unpacks them in registers, and loads one row of scales and zeros when the tile lies in one group.
Correctness: tests/kernels/test_w4a16_kernels.py checks both against the reference (run it on
the GPU first: bf16 is checked there only). `w4a16_gemm` switches once this shows a gain.
"""

from __future__ import annotations

import argparse
import functools
import json

import torch
from kernel_timing import bench_us

from loraplex.engine.model.quant.int4_layout import pack_int4
from loraplex.kernels.triton.w4a16 import W4A16_TILES, launch_w4a16_gemm

# Llama-3-8B's projections (N, K): fused qkv, o, fused gate_up, down.
PROJECTIONS = {
    "qkv": (6144, 4096),
    "o": (4096, 4096),
    "gate_up": (28672, 4096),
    "down": (4096, 14336),
}
GROUP_SIZE = 128


def packed_weights(k: int, n: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Random qweight [K/8, N], scales [G, N] fp16, zeros [G, N] uint8 on the GPU."""
    q = torch.randint(0, 16, (k, n), dtype=torch.uint8)
    groups = k // GROUP_SIZE
    scales = torch.rand(groups, n) * 0.02 + 0.001
    zeros = torch.randint(0, 16, (groups, n), dtype=torch.uint8)
    return pack_int4(q, 0).cuda(), scales.half().cuda(), zeros.cuda()


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--json", help="write the timings here")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("needs a GPU")
    torch.manual_seed(0)
    results = {}
    for name, (n, k) in PROJECTIONS.items():
        weights = (*packed_weights(k, n), None, GROUP_SIZE)
        dense_w = torch.randn(k, n, dtype=torch.bfloat16, device="cuda")
        for m in (1, 16, 64, 256, 4096):
            x = torch.randn(m, k, dtype=torch.bfloat16, device="cuda")
            run = functools.partial(launch_w4a16_gemm, x, *weights, W4A16_TILES.lookup(m))
            engine = bench_us(run)
            candidate = bench_us(functools.partial(run, unpack_once=True))
            dense = bench_us(functools.partial(torch.matmul, x, dense_w))
            results[f"{name} m={m}"] = {
                "engine_us": engine,
                "candidate_us": candidate,
                "bf16_matmul_us": dense,
            }
            weight_gb_s = (k * n / 2) / (candidate * 1e-6) / 1e9
            print(
                f"{name:8s} M={m:5d}: engine {engine:8.1f} us, candidate {candidate:8.1f} us "
                f"({engine / candidate:.2f}x; packed weights at {weight_gb_s:.0f} GB/s), "
                f"bf16 matmul {dense:8.1f} us",
                flush=True,
            )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
