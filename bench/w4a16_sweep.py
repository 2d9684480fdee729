"""W4A16 GEMM paths and tiles at Llama-3-8B projection shapes, bf16, group size 128 (a GPU only).

For each row count M it times, per projection, each call replayed from a CUDA graph (no Python
launch cost in the figure; do_bench flushes L2 before each replay):
- `engine`: what `w4a16_gemm` runs for that M;
- `dequant_kloop`: the act-order kernel (`w4a16.py`, dequantize in the K loop) at its table's
  tiles, for scale;
- a sweep of candidate tiles for the group-dot kernel (`w4a16_group_dot.py`);
- `dequant_matmul`: dequantize W, then cuBLAS; `bf16_matmul`: a bf16 weight of the same shape.
Then, per M, the candidate tiles with the least time summed over the four projections: what
`GROUP_DOT_TILES` (keyed by M alone) should hold, and where dequantize-then-matmul starts to
win (`DEQUANT_MIN_M`).

Correctness is not checked here: tests/kernels/test_w4a16_kernels.py runs on the GPU first.
"""

from __future__ import annotations

import argparse
import functools
import itertools
import json
import math
import time

import torch
from kernel_timing import graph_us
from triton.runtime.errors import OutOfResources

from loraplex.engine.model.quant.int4_layout import pack_int4
from loraplex.kernels.triton.w4a16 import W4A16_TILES, launch_w4a16_gemm, w4a16_gemm
from loraplex.kernels.triton.w4a16_dequantize import w4a16_dequantize
from loraplex.kernels.triton.w4a16_group_dot import GroupDotTiles, launch_w4a16_group_dot

# Llama-3-8B's projections (N, K): fused qkv, o, fused gate_up, down.
PROJECTIONS = {
    "qkv": (6144, 4096),
    "o": (4096, 4096),
    "gate_up": (28672, 4096),
    "down": (4096, 14336),
}
GROUP_SIZE = 128
ROW_COUNTS = (16, 64, 128, 256)


def candidate_tiles(m: int) -> list[GroupDotTiles]:
    if m <= 16:
        grid = itertools.product((16,), (64, 128, 256), (4,), (0, 4, 8), (True, False))
    elif m <= 64:
        grid = itertools.product((32, 64), (64, 128, 256), (4, 8), (0, 1, 4), (True, False))
    else:
        grid = itertools.product((64, 128), (128, 256), (4, 8), (0, 1), (True, False))
    return [GroupDotTiles(bm, bn, 128, w, split_k=s, split_nibbles=sn) for bm, bn, w, s, sn in grid]


def packed_weights(k: int, n: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Random qweight [K/8, N], scales [G, N] fp16, zeros [G, N] uint8 on the GPU."""
    q = torch.randint(0, 16, (k, n), dtype=torch.uint8)
    groups = k // GROUP_SIZE
    scales = torch.rand(groups, n) * 0.02 + 0.001
    zeros = torch.randint(0, 16, (groups, n), dtype=torch.uint8)
    return pack_int4(q, 0).cuda(), scales.half().cuda(), zeros.cuda()


def dequant_matmul(x: torch.Tensor, qweight, scales, zeros) -> torch.Tensor:  # type: ignore[no-untyped-def]
    w = w4a16_dequantize(qweight, scales, zeros, None, GROUP_SIZE, x.dtype)
    return torch.matmul(x, w)


def time_or_inf(fn) -> float:  # type: ignore[no-untyped-def]
    try:
        return graph_us(fn)
    except OutOfResources:  # e.g. shared memory of deep pipelines of large tiles
        return math.inf


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--json", help="write the timings here")
    ap.add_argument("--row-counts", default=",".join(map(str, ROW_COUNTS)))
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("needs a GPU")
    torch.manual_seed(0)
    weights = {name: packed_weights(k, n) for name, (n, k) in PROJECTIONS.items()}
    results: dict[str, dict[str, object]] = {}
    started = time.monotonic()
    for m in (int(m) for m in args.row_counts.split(",")):
        totals: dict[GroupDotTiles, float] = {}
        summary = dict.fromkeys(("engine", "dequant_kloop", "dequant_matmul", "bf16_matmul"), 0.0)
        for name, (n, k) in PROJECTIONS.items():
            qw, sc, zr = weights[name]
            x = torch.randn(m, k, dtype=torch.bfloat16, device="cuda")
            dense_w = torch.randn(k, n, dtype=torch.bfloat16, device="cuda")
            kloop = functools.partial(
                launch_w4a16_gemm, x, qw, sc, zr, None, GROUP_SIZE, W4A16_TILES.lookup(m)
            )
            row: dict[str, object] = {
                "engine": time_or_inf(lambda: w4a16_gemm(x, qw, sc, zr, None, GROUP_SIZE)),  # noqa: B023
                "dequant_kloop": time_or_inf(kloop),
                "dequant_matmul": time_or_inf(functools.partial(dequant_matmul, x, qw, sc, zr)),
                "bf16_matmul": time_or_inf(functools.partial(torch.matmul, x, dense_w)),
            }
            best = math.inf
            for tiles in candidate_tiles(m):
                group_dot = functools.partial(
                    launch_w4a16_group_dot, x, qw, sc, zr, GROUP_SIZE, tiles
                )
                t = time_or_inf(group_dot)
                totals[tiles] = totals.get(tiles, 0.0) + t
                if t < best:
                    best, row["best_tiles"] = t, list(tiles)
            row["best_group_dot"] = best
            for key in summary:
                summary[key] += float(row[key])  # type: ignore[arg-type]
            gb_s = (k * n / 2) / (best * 1e-6) / 1e9
            print(
                f"{name:8s} M={m:5d}: "
                + ", ".join(f"{key} {float(row[key]):.1f}" for key in (*summary, "best_group_dot"))  # type: ignore[arg-type]
                + f" us; best tiles {row['best_tiles']} ({gb_s:.0f} GB/s of packed weights)",
                flush=True,
            )
            results[f"{name} m={m}"] = row
        best_tiles, best_total = min(totals.items(), key=lambda item: item[1])
        print(
            f"== M={m}: sums over the 4 projections (us): "
            + ", ".join(f"{key} {v:.1f}" for key, v in summary.items())
            + f"; best tiles {tuple(best_tiles)} {best_total:.1f} "
            f"({time.monotonic() - started:.0f} s so far)",
            flush=True,
        )
        ranked = sorted(totals.items(), key=lambda item: item[1])[:5]
        print("   top 5: " + "; ".join(f"{tuple(t)} {v:.1f}" for t, v in ranked), flush=True)
        results[f"sum m={m}"] = {**summary, "best_tiles": list(best_tiles), "best_us": best_total}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
