"""Paged attention on a CUDA GPU at the Llama-3-8B shape (bf16, 32 q / 8 kv heads, head_dim 128,
block 16), against the card's own ceilings measured in the same run.

    python3 bench/attention_bench.py [--json PATH] [--batches 32,64] [--contexts 640]
                                     [--decode-only]

1. Ceilings: copy bandwidth (a 4 GiB device-to-device copy, bytes read + written per second)
   and the bf16 matmul rate (8192^3, TFLOP/s).
2. Decode: batch 32..256 x context 640 and 4096, KV bytes read per second as a fraction of the
   copy bandwidth, for the mixed kernel run on decode (`launch_paged_attention`, what decode
   used before split-KV) and for split-KV candidates (`launch_paged_decode_attention`); the
   table's own row first. Each timing is one CUDA-graph replay of one call (the engine replays
   decode steps as graphs), median over do_bench's runs with L2 flushed.
3. Prefill and chunked prefill: TFLOP/s (QK^T and PV, causal) for the table's tiles and
   candidates, as a fraction of the matmul rate.

Timing only: tests/kernels checks every tile shape against the reference.
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
import time
from pathlib import Path
from typing import Any

import torch
import triton
from kernel_timing import bench_us, graph_us
from kernels_bench import HEAD_DIM, NUM_KV_HEADS, paged_inputs
from triton.testing import do_bench

from loraplex.kernels.triton.paged_attention import (
    ATTENTION_TILES,
    AttentionTiles,
    launch_paged_attention,
)
from loraplex.kernels.triton.paged_decode_attention import (
    DECODE_ATTENTION_TILES,
    DecodeAttentionTiles,
    launch_paged_decode_attention,
)

DTYPE = torch.bfloat16
SCALE = HEAD_DIM**-0.5
KV_BYTES_PER_TOKEN = 2 * NUM_KV_HEADS * HEAD_DIM * DTYPE.itemsize
DECODE_BATCHES = (32, 64, 128, 256)
DECODE_CONTEXTS = (640, 4096)
SPLIT_CANDIDATES = [
    DecodeAttentionTiles(tile_n, splits, min_tiles, num_warps=warps, num_stages=stages)
    for tile_n in (32, 64)
    for splits in (1, 2, 4, 8, 16)
    for min_tiles in (2, 8)
    for warps, stages in ((4, 2), (4, 3), (8, 2))
    if not (splits == 1 and min_tiles == 8)
]
PREFILL_CANDIDATES = [
    AttentionTiles(block_m, tile_n, num_warps=warps, num_stages=stages)
    for block_m in (64, 128)
    for tile_n in (32, 64, 128)
    for warps in (4, 8)
    for stages in (2, 3)
]
# (name, seq_lens, q_lens): whole prompts, and a chunk of 2048 after 2048 cached tokens.
PREFILL_BATCHES = (
    ("4 x 512", [512] * 4, [512] * 4),
    ("4 x 2048", [2048] * 4, [2048] * 4),
    ("chunk 2048 @ 4096", [4096] * 2, [2048] * 2),
)


def ceilings() -> dict[str, float]:
    src = torch.empty(2**31, dtype=torch.int16, device="cuda")  # 4 GiB
    dst = torch.empty_like(src)
    us = float(do_bench(lambda: dst.copy_(src), warmup=5, rep=100)) * 1e3
    copy_gbps = 2 * src.numel() * src.element_size() / us / 1e3
    a = torch.randn(8192, 8192, device="cuda", dtype=DTYPE)
    b = torch.randn(8192, 8192, device="cuda", dtype=DTYPE)
    mm_us = float(do_bench(lambda: a @ b, warmup=5, rep=100)) * 1e3
    tflops = 2 * 8192**3 / mm_us / 1e6
    print(f"ceilings: copy {copy_gbps:.0f} GB/s (read + write), bf16 matmul {tflops:.0f} TFLOP/s")
    return {"copy_gbps": copy_gbps, "matmul_tflops": tflops}


def time_decode(copy_gbps: float, batches: list[int], contexts: list[int]) -> list[dict[str, Any]]:
    rows = []
    for ctx in contexts:
        for batch in batches:
            args = paged_inputs([ctx] * batch, [1] * batch)
            table = DECODE_ATTENTION_TILES.lookup(batch * NUM_KV_HEADS)
            candidates: list[tuple[str, Any]] = [
                ("mixed kernel", (launch_paged_attention, ATTENTION_TILES.lookup(1))),
                ("table", (launch_paged_decode_attention, table)),
            ] + [("split", (launch_paged_decode_attention, t)) for t in SPLIT_CANDIDATES]
            timed = []
            for kind, (launch, tiles) in candidates:
                us = graph_us(functools.partial(launch, *args, SCALE, None, tiles))
                gbps = batch * ctx * KV_BYTES_PER_TOKEN / us / 1e3
                timed.append((us, kind, tiles, gbps / copy_gbps))
                rows.append(
                    {
                        "ctx": ctx,
                        "batch": batch,
                        "kind": kind,
                        "tiles": repr(tiles),
                        "us": us,
                        "kv_gbps": gbps,
                        "of_copy": gbps / copy_gbps,
                    }
                )
            mixed_us, table_us = timed[0][0], timed[1][0]
            best = min(timed[2:], key=lambda t: t[0])
            print(
                f"  decode b{batch:<3} ctx {ctx:<4}: mixed kernel {mixed_us:7.1f} us, table "
                f"{table_us:7.1f} us ({timed[1][3]:.0%} of copy), best {best[0]:7.1f} us "
                f"({best[3]:.0%}) {best[2]}"
            )
            del args
            torch.cuda.empty_cache()
    return rows


def time_prefill(matmul_tflops: float) -> list[dict[str, Any]]:
    rows = []
    for name, seq_lens, q_lens in PREFILL_BATCHES:
        args = paged_inputs(seq_lens, q_lens)
        # causal: query i of a chunk sees context + i + 1 keys; 4 flops per (query, key, dim) pair
        pairs = sum(q * (s - q) + q * (q + 1) / 2 for s, q in zip(seq_lens, q_lens, strict=True))
        flops = 4 * pairs * args[0].shape[1] * HEAD_DIM
        table = ATTENTION_TILES.lookup(triton.cdiv(sum(q_lens), len(q_lens)))
        timed = []
        for kind, tiles in [("table", table)] + [("cand", t) for t in PREFILL_CANDIDATES]:
            us = bench_us(functools.partial(launch_paged_attention, *args, SCALE, None, tiles))
            tflops = flops / us / 1e6
            timed.append((us, tiles))
            rows.append(
                {
                    "batch": name,
                    "kind": kind,
                    "tiles": repr(tiles),
                    "us": us,
                    "tflops": tflops,
                    "of_matmul": tflops / matmul_tflops,
                }
            )
        best = min(timed[1:], key=lambda t: t[0])
        print(
            f"  prefill {name:<18}: table {timed[0][0]:7.1f} us ({flops / timed[0][0] / 1e6:5.0f}"
            f" TFLOP/s), best {best[0]:7.1f} us ({flops / best[0] / 1e6:5.0f} TFLOP/s, "
            f"{flops / best[0] / 1e6 / matmul_tflops:.0%} of matmul) {best[1]}"
        )
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--json", type=Path)
    ap.add_argument("--batches", default=",".join(map(str, DECODE_BATCHES)))
    ap.add_argument("--contexts", default=",".join(map(str, DECODE_CONTEXTS)))
    ap.add_argument("--decode-only", action="store_true", help="skip the prefill part")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("attention_bench needs a CUDA GPU", file=sys.stderr)
        return 2
    torch.manual_seed(0)
    started = time.perf_counter()
    env = {
        "gpu": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "triton": triton.__version__,
    }
    print(" ".join(f"{k}={v}" for k, v in env.items()))
    results: dict[str, Any] = {"env": env, "ceilings": ceilings()}
    torch.cuda.empty_cache()  # the copy's 8 GiB
    print("decode (KV bytes read / s, as a fraction of copy bandwidth)")
    batches = [int(b) for b in args.batches.split(",")]
    contexts = [int(c) for c in args.contexts.split(",")]
    results["decode"] = time_decode(results["ceilings"]["copy_gbps"], batches, contexts)
    if not args.decode_only:
        print("prefill (causal attention TFLOP/s, as a fraction of the matmul rate)")
        results["prefill"] = time_prefill(results["ceilings"]["matmul_tflops"])
    results["wall_s"] = time.perf_counter() - started
    print(f"done in {results['wall_s']:.1f} s")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
