"""Sweep of the LoRA kernels' tiles on one step of W1 (prefill, by default) or of its decode.

W1 (512 x 512/128, bench/offline_throughput.py) with 8 adapters runs its prompts in steps of
4,096 tokens: 8 requests of 512 tokens, each request's adapter its own (`--run 512`, the
default); its decode steps hold up to 256 sequences of one token each, the adapters in turn
(`--tokens 256 --run 1`). Per candidate tile, the shrink of every slice group and the expand of
the groups the engine expands (q/k/v into y, o and down into the residual stream; gate_up's
deltas go into the activation's kernel, timed by bench/silu_lora_tiles.py) of one Llama-3-8B
layer, each launch alone replayed from a CUDA graph (a launch from Python takes longer than these
kernels run; do_bench flushes L2), 8 adapters of rank 16 in an AdapterPool's pages
(bench/lora_step.py). The candidates are a grid around the table's row for the step's size
(prefill: tall tiles, long k chunks; decode: 16-64 rows, short chunks, column runs or not).
Every candidate's output is compared with the table row's first (`bad` marks a mismatch).
Prints us per layer per candidate, the table's row first; `--json` writes them.

The tables' rows below 2,048 tokens also serve steps of many adapters: check a change there
with bench/lora_many_tiles.py too.

    python3 bench/lora_step_tiles.py [--tokens 4096 --run 512] [--table-only] [--json out.json]
"""

from __future__ import annotations

import argparse
import functools
import itertools
import json
import sys
from collections.abc import Callable

import torch
from kernel_timing import bench_us, graph_us
from lora_step import (
    ADAPTER_RANK,
    GROUPS,
    NUM_ADAPTERS,
    SHAPES,
    Projection,
    batch_slot_adapters,
    create_adapter_pool,
    group_sizes,
    group_slices,
    num_slots,
)

from loraplex.kernels.lora_mapping import build_lora_mapping
from loraplex.kernels.triton.lora_expand import EXPAND_TILES, ExpandTiles, launch_lora_expand
from loraplex.kernels.triton.lora_shrink import SHRINK_TILES, ShrinkTiles, launch_lora_shrink

PREFILL_TOKENS = 2048  # from here on, a step takes the tables' prefill rows
EXPANDED = (GROUPS[0], GROUPS[1], GROUPS[3])  # q/k/v, o, down: the engine's expand launches


def shrink_candidates(num_tokens: int) -> list[ShrinkTiles]:
    if num_tokens > PREFILL_TOKENS:
        grid = itertools.product((64, 128), (64, 128), (1024, 2048, 4096), (4, 8), (3,))
    else:
        grid = itertools.product((16, 32, 64), (64, 128), (256, 512, 1024), (4,), (2, 3))
    return [
        ShrinkTiles(m, block_k=k, k_chunk=c, max_block_n=64, num_warps=w, num_stages=s)
        for m, k, c, w, s in grid
    ]


def expand_candidates(num_tokens: int) -> list[ExpandTiles]:
    if num_tokens > PREFILL_TOKENS:
        grid = itertools.product((32, 64, 128), (128, 256), (4, 8), (2, 3), (None, 1024))
    else:
        grid = itertools.product((16, 32, 64), (64, 128, 256), (4, 8), (2,), (None, 1024, 4096))
    return [
        ExpandTiles(m, n, max_block_k=64, num_warps=w, num_stages=s, target_programs=t)
        for m, n, w, s, t in grid
    ]


def sweep(
    kind: str,
    candidates: list,  # ShrinkTiles | ExpandTiles, the table's row first
    calls: dict[str, Callable[..., torch.Tensor]],  # group -> fn(tiles, fresh) -> its output
) -> dict[str, float]:
    """us per layer of each candidate (the sum over `calls`), its groups' us alongside. A call
    with fresh=True computes from a fresh output (the check); timed calls reuse theirs."""
    expected = {group: call(candidates[0], True) for group, call in calls.items()}
    results = {}
    for tiles in candidates:
        try:
            bad = any(
                not torch.allclose(call(tiles, True), expected[g], rtol=2e-2, atol=2e-2)
                for g, call in calls.items()
            )
            per_group = {
                g: graph_us(functools.partial(call, tiles, False)) for g, call in calls.items()
            }
        except Exception as exc:  # a tile the GPU cannot run (shared memory): report, go on
            print(f"  {kind:<6} failed: {tiles} ({type(exc).__name__})", flush=True)
            continue
        total = sum(per_group.values())
        groups = " ".join(f"{g} {us:6.1f}" for g, us in per_group.items())
        flag = " bad" if bad else ""
        print(f"  {kind:<6} {total:8.1f} us  [{groups}]  {tiles}{flag}", flush=True)
        results[f"{kind} {tiles}"] = total
    return results


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--run", type=int, default=512, help="consecutive tokens of one adapter")
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--table-only", action="store_true", help="time the tables' rows alone")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("lora_step_tiles needs a CUDA GPU", file=sys.stderr)
        return 2
    torch.manual_seed(0)
    device, dtype = torch.device("cuda"), torch.bfloat16
    pool = create_adapter_pool(dtype, device)
    slot_adapters, num_active_slots = batch_slot_adapters(pool, NUM_ADAPTERS)
    num_tokens = args.tokens
    token_slots = (torch.arange(num_tokens, device=device) // args.run) % NUM_ADAPTERS
    ids, loc = build_lora_mapping(token_slots.to(torch.int32), num_slots(NUM_ADAPTERS))
    mapping = (slot_adapters, num_active_slots, ids, loc)

    def shrink(names: Projection, x: torch.Tensor, out: torch.Tensor, tiles, fresh: bool):
        rows = group_slices(names)
        tables = (pool.pages[0], pool.page_table, pool.first_a[rows], pool.ranks[rows])
        out = torch.empty_like(out) if fresh else out
        launch_lora_shrink(x, *tables, *mapping, out, True, tiles)  # zeroes out first
        return out

    def expand(names: Projection, lora_out, y0: torch.Tensor, y_timed, tiles, fresh: bool):
        rows = group_slices(names)
        tables = (pool.pages[0], pool.page_table, pool.first_b[rows], pool.ranks[rows])
        y = y0.clone() if fresh else y_timed  # timed calls keep adding into y_timed
        sizes = group_sizes(names)
        launch_lora_expand(lora_out, *tables, pool.scalings, *mapping, y, 0, sizes, tiles)
        return y

    shrink_calls, expand_calls, copy_us = {}, {}, 0.0
    for names in GROUPS:
        x = torch.randn(num_tokens, SHAPES[names[0]][0], device=device, dtype=dtype)
        out = torch.empty(len(names), num_tokens, ADAPTER_RANK, device=device)
        shrink_calls[names[0]] = functools.partial(shrink, names, x, out)
        if names in EXPANDED:
            lora_out = torch.randn(len(names), num_tokens, ADAPTER_RANK, device=device)
            y0 = torch.randn(num_tokens, sum(group_sizes(names)), device=device, dtype=dtype)
            y_timed = y0.clone()
            expand_calls[names[0]] = functools.partial(expand, names, lora_out, y0, y_timed)
            copy_us += bench_us(y0.clone)  # reads and writes y once, as the expand must
    runs = f"runs of {args.run}"
    print(f"T {num_tokens}, {NUM_ADAPTERS} adapters of rank {ADAPTER_RANK}, {runs}")
    print(f"  a copy of each expanded y (the expand's bytes): {copy_us:.1f} us per layer")
    results: dict[str, object] = {"copy_us": copy_us}
    shrinks = [SHRINK_TILES.lookup(num_tokens)]
    expands = [EXPAND_TILES.lookup(num_tokens)]
    if not args.table_only:
        shrinks += shrink_candidates(num_tokens)
        expands += expand_candidates(num_tokens)
    swept = {
        "shrink": sweep("shrink", shrinks, shrink_calls),
        "expand": sweep("expand", expands, expand_calls),
    }
    results.update(swept)
    for kind, timed in swept.items():
        best = sorted(timed.items(), key=lambda kv: kv[1])[:5]
        print(f"best {kind}:")
        for name, us in best:
            print(f"  {us:8.1f} us  {name}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
