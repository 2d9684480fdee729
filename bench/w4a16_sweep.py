"""W4A16 GEMM tiles and paths at Llama-3-8B projection shapes, bf16, group size 128 (a GPU only).

For each row count M it times, per projection: the engine's choice (`w4a16_gemm`), the K-loop
kernel with the table's tiles, a sweep of candidate tiles (block sizes, warps, split-K) for the
K-loop kernel, dequantize-then-cuBLAS,
and a bf16 matmul of the same shape. Then, per M, the candidate tiles with the least time summed
over the four projections: what `W4A16_TILES` (keyed by M alone) should hold, and whether
dequantize-then-matmul wins there (`DEQUANT_MIN_M`).

Each time is one replay of a CUDA graph of the call (the engine replays its decode steps as
graphs: no host launch gaps, extra launches such as a split-K reduction still count), after
do_bench's L2 flush. `--splits-only`: the table's tiles at split-K 1..16 instead of the grid.

Correctness is not checked here: tests/kernels/test_w4a16_kernels.py runs on the GPU first.
"""

from __future__ import annotations

import argparse
import functools
import itertools
import json
import math

import torch
from kernel_timing import graph_us
from triton.runtime.errors import OutOfResources

from loraplex.engine.model.quant.int4_layout import pack_int4
from loraplex.kernels.triton.w4a16 import W4A16_TILES, W4A16Tiles, launch_w4a16_gemm, w4a16_gemm
from loraplex.kernels.triton.w4a16_dequantize import w4a16_dequantize

# Llama-3-8B's projections (N, K): fused qkv, o, fused gate_up, down.
PROJECTIONS = {
    "qkv": (6144, 4096),
    "o": (4096, 4096),
    "gate_up": (28672, 4096),
    "down": (4096, 14336),
}
GROUP_SIZE = 128
ROW_COUNTS = (1, 16, 64, 128, 256, 1024, 4096)


def candidate_tiles(m: int, splits_only: bool) -> list[W4A16Tiles]:
    if splits_only:  # the table's tiles at each split-K
        return [W4A16_TILES.lookup(m)._replace(split_k=s) for s in (1, 2, 4, 8, 16)]
    if m <= 64:
        block_m = 16 if m <= 16 else 64
        grid = itertools.product((64, 128), (64, 128, 256), (4, 8, 16), (2, 3, 4))
        return [W4A16Tiles(block_m, n, k, 4, s, st) for n, k, s, st in grid]
    grid = itertools.product((64, 128), (64, 128), (32, 64), (4, 8))
    return [W4A16Tiles(bm, bn, bk, w, 1) for bm, bn, bk, w in grid]


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


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--json", help="write the timings here")
    ap.add_argument("--row-counts", default=",".join(map(str, ROW_COUNTS)))
    ap.add_argument(
        "--splits-only", action="store_true", help="candidates: the table's tiles at each split-K"
    )
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("needs a GPU")
    torch.manual_seed(0)
    weights = {name: packed_weights(k, n) for name, (n, k) in PROJECTIONS.items()}
    results: dict[str, dict[str, object]] = {}
    for m in (int(m) for m in args.row_counts.split(",")):
        table = W4A16_TILES.lookup(m)
        totals: dict[W4A16Tiles, float] = {}
        summary = {"engine": 0.0, "table_tiles": 0.0}
        summary.update({"dequant_matmul": 0.0, "bf16_matmul": 0.0})
        for name, (n, k) in PROJECTIONS.items():
            qw, sc, zr = weights[name]
            x = torch.randn(m, k, dtype=torch.bfloat16, device="cuda")
            dense_w = torch.randn(k, n, dtype=torch.bfloat16, device="cuda")
            kloop = functools.partial(launch_w4a16_gemm, x, qw, sc, zr, None, GROUP_SIZE)
            row = {
                "engine": graph_us(lambda: w4a16_gemm(x, qw, sc, zr, None, GROUP_SIZE)),  # noqa: B023
                "table_tiles": graph_us(functools.partial(kloop, table)),
                "dequant_matmul": graph_us(functools.partial(dequant_matmul, x, qw, sc, zr)),
                "bf16_matmul": graph_us(functools.partial(torch.matmul, x, dense_w)),
            }
            for tiles in candidate_tiles(m, args.splits_only):
                try:
                    t = graph_us(functools.partial(kloop, tiles))
                except OutOfResources:  # e.g. shared memory of deep pipelines of large tiles
                    t = math.inf
                totals[tiles] = totals.get(tiles, 0.0) + t
                row.setdefault("best_candidate_us", t)
                if t <= row["best_candidate_us"]:
                    row["best_candidate_us"], row["best_candidate"] = t, list(tiles)
            for key in summary:
                summary[key] += float(row[key])  # type: ignore[arg-type]
            gb_s = (k * n / 2) / (float(row["best_candidate_us"]) * 1e-6) / 1e9  # type: ignore[arg-type]
            print(
                f"{name:8s} M={m:5d}: "
                + ", ".join(
                    f"{key} {float(v):.1f}"
                    for key, v in row.items()
                    if key.endswith("us") or key in summary
                )
                + f" us; best tiles {row['best_candidate']} ({gb_s:.0f} GB/s of packed weights)",
                flush=True,
            )
            results[f"{name} m={m}"] = row
        best_tiles, best_total = min(totals.items(), key=lambda item: item[1])
        print(
            f"== M={m}: sums over the 4 projections (us): "
            + ", ".join(f"{key} {v:.1f}" for key, v in summary.items())
            + f"; best tiles {tuple(best_tiles)} {best_total:.1f} (table {tuple(table)})",
            flush=True,
        )
        results[f"sum m={m}"] = {**summary, "best_tiles": list(best_tiles), "best_us": best_total}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
