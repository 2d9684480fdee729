"""PyTorch's built-in int4 GEMM (`aten._weight_int4pack_mm`, "tinygemm") against the engine's
W4A16 path and a bf16 matmul, at Llama-3-8B projection shapes, group size 128 (a GPU only).

tinygemm dequantizes w = (q - 8) * scale + zero with bf16 scale and zero per group and column.
An AWQ / GPTQ group (q - z) * s maps onto it exactly in real numbers with zero = (8 - z) * s;
what changes is rounding: the scale goes from float16 to bf16 and the zero term is rounded once
more. This script checks the packing (both nibble orders, so the layout is measured, not
assumed) and reports each path's error against the float32 reference, then times every path
per row count M, each call replayed from a CUDA graph.
"""

from __future__ import annotations

import argparse
import functools
import json
from collections.abc import Callable

import torch
import torch.nn.functional as F
from kernel_timing import graph_us
from w4a16_sweep import GROUP_SIZE, PROJECTIONS, packed_weights

from loraplex.engine.model.quant.int4_layout import unpack_int4
from loraplex.kernels.reference.w4a16 import dequantize_w4
from loraplex.kernels.triton.w4a16 import w4a16_gemm

ROW_COUNTS = (1, 16, 32, 64, 128)
INNER_K_TILES = (2, 4, 8)


def tinygemm_weights(
    qweight: torch.Tensor,
    scales: torch.Tensor,
    zeros: torch.Tensor,
    inner_k_tiles: int,
    hi_first: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Loraplex's [K/8, N] layout -> (tinygemm's packed weight, scales_and_zeros [G, N, 2])."""
    q = unpack_int4(qweight, 0).t().to(torch.int32)  # [N, K]
    even, odd = q[:, ::2], q[:, 1::2]
    pairs = (even << 4 | odd) if hi_first else (odd << 4 | even)
    packed = torch.ops.aten._convert_weight_to_int4pack(
        pairs.to(torch.uint8).contiguous(), inner_k_tiles
    )
    s = scales.float()
    zero = (8.0 - zeros.float()) * s
    return packed, torch.stack([s, zero], dim=-1).to(torch.bfloat16).contiguous()


def paths_at(
    m: int,
    k: int,
    weights: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
    dense: torch.Tensor,  # [K, N] float32
    hi_first: bool,
) -> dict[str, Callable[[], torch.Tensor]]:
    """Each path's call on a fresh x [m, K] (bf16 dense, the engine, tinygemm per tile count)."""
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    w_bf16 = dense.t().contiguous().to(torch.bfloat16)  # [N, K]
    q, s, z = weights
    paths: dict[str, Callable[[], torch.Tensor]] = {
        "bf16": lambda: F.linear(x, w_bf16),
        "engine": lambda: w4a16_gemm(x, q, s, z, None, GROUP_SIZE),
    }
    for tiles in INNER_K_TILES:
        packed, sz = tinygemm_weights(q, s, z, tiles, hi_first)
        paths[f"tiny{tiles}"] = functools.partial(
            torch.ops.aten._weight_int4pack_mm, x, packed, GROUP_SIZE, sz
        )
    return paths


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--json")
    ap.add_argument("--row-counts", default=",".join(map(str, ROW_COUNTS)))
    args = ap.parse_args()
    torch.manual_seed(0)
    weights = {name: packed_weights(k, n) for name, (n, k) in PROJECTIONS.items()}
    dense = {name: dequantize_w4(q, s, z, None, GROUP_SIZE) for name, (q, s, z) in weights.items()}
    # The nibble order: whichever matches the float32 reference.
    name = "o"
    x = torch.randn(16, PROJECTIONS[name][1], device="cuda", dtype=torch.bfloat16)
    ref = x.float() @ dense[name]
    errors = {}
    for hi_first in (True, False):
        packed, sz = tinygemm_weights(*weights[name], 8, hi_first)
        y = torch.ops.aten._weight_int4pack_mm(x, packed, GROUP_SIZE, sz)
        errors[hi_first] = float((y.float() - ref).abs().max() / ref.abs().max())
    hi_first = errors[True] < errors[False]
    triton_err = float((w4a16_gemm(x, *weights[name], None, GROUP_SIZE).float() - ref).abs().max())
    print(
        f"relative max error: tinygemm hi-first {errors[True]:.2e}, lo-first {errors[False]:.2e};"
        f" triton {triton_err / float(ref.abs().max()):.2e}"
    )
    results: dict[str, dict[str, float]] = {}
    for m in (int(v) for v in args.row_counts.split(",")):
        sums: dict[str, float] = {}
        for name, (_, k) in PROJECTIONS.items():
            for label, fn in paths_at(m, k, weights[name], dense[name], hi_first).items():
                us = graph_us(fn, repeats=10) / 10
                sums[label] = sums.get(label, 0.0) + us
                print(f"M={m:4d} {name:8s} {label:8s} {us:8.1f} us")
        results[str(m)] = sums
        line = "  ".join(f"{k} {v:.1f}" for k, v in sums.items())
        print(f"== M={m:4d} sum over projections (us): {line}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"hi_first": hi_first, "errors": errors, "sums": results}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
