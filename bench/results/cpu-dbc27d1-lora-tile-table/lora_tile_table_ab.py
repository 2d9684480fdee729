"""A/B of the LoRA shrink and expand with their segment tiles precomputed per step
(`build_tile_table`, one table per BLOCK_M) against finding them in every program, on W1-like
steps: per layer, the shrinks of q/k/v, o, gate/up and down and the expands of q/k/v, o and
down, each launch replayed alone from a CUDA graph (bench/lora_step_tiles.py's method), 8
adapters of rank 16. The tables are built outside the timed graphs (the engine would build them
once per step). Run from the repo root: python3 <this file> [--json out.json]"""

import argparse
import functools
import json
import sys

sys.path.insert(0, "bench")
import torch  # noqa: E402
from kernel_timing import graph_us  # noqa: E402
from lora_step import (  # noqa: E402
    ADAPTER_RANK,
    GROUPS,
    NUM_ADAPTERS,
    SHAPES,
    batch_slot_adapters,
    create_adapter_pool,
    group_sizes,
    group_slices,
    num_slots,
)

from loraplex.kernels.lora_mapping import build_lora_mapping  # noqa: E402
from loraplex.kernels.triton.lora_expand import EXPAND_TILES, launch_lora_expand  # noqa: E402
from loraplex.kernels.triton.lora_segments import build_tile_table  # noqa: E402
from loraplex.kernels.triton.lora_shrink import SHRINK_TILES, launch_lora_shrink  # noqa: E402

EXPANDED = (GROUPS[0], GROUPS[1], GROUPS[3])  # q/k/v, o, down


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json")
    args = ap.parse_args()
    device, dtype = torch.device("cuda"), torch.bfloat16
    pool = create_adapter_pool(dtype, device)
    slot_adapters, num_active = batch_slot_adapters(pool, NUM_ADAPTERS)
    results = {}
    # (tokens, consecutive tokens of one adapter): decode steps take the adapters in turn, a
    # prefill step of 4,096 tokens is 8 prompts of 512.
    for num_tokens, run in ((64, 1), (256, 1), (512, 1), (4096, 512)):
        slots = (torch.arange(num_tokens, device=device) // run) % NUM_ADAPTERS
        ids, loc = build_lora_mapping(slots.to(torch.int32), num_slots(NUM_ADAPTERS))
        mapping = (slot_adapters, num_active, ids, loc)
        s_tiles, e_tiles = SHRINK_TILES.lookup(num_tokens), EXPAND_TILES.lookup(num_tokens)
        s_table = build_tile_table(loc, slot_adapters, num_active, num_tokens, s_tiles.block_m)
        e_table = build_tile_table(loc, slot_adapters, num_active, num_tokens, e_tiles.block_m)
        row = {}
        for with_table in (False, True):
            total_s = total_e = 0.0
            for names in GROUPS:
                rows = group_slices(names)
                x = torch.randn(num_tokens, SHAPES[names[0]][0], device=device, dtype=dtype)
                out = torch.empty(len(names), num_tokens, ADAPTER_RANK, device=device)
                a = (pool.pages[0], pool.page_table, pool.first_a[rows], pool.ranks[rows])
                table = s_table if with_table else None
                call = functools.partial(
                    launch_lora_shrink, x, *a, *mapping, out, True, s_tiles, table
                )
                ref = out.clone()
                launch_lora_shrink(x, *a, *mapping, ref, True, s_tiles, None)
                call()
                assert torch.allclose(out, ref, atol=1e-2, rtol=1e-2), names
                total_s += graph_us(call)
                if names in EXPANDED:
                    b = (pool.pages[0], pool.page_table, pool.first_b[rows], pool.ranks[rows])
                    lora_out = torch.randn(len(names), num_tokens, ADAPTER_RANK, device=device)
                    y = torch.randn(num_tokens, sum(group_sizes(names)), device=device, dtype=dtype)
                    sizes = group_sizes(names)
                    table = e_table if with_table else None
                    expand = functools.partial(
                        launch_lora_expand, lora_out, *b, pool.scalings, *mapping, y, 0, sizes,
                        e_tiles, table,
                    )  # fmt: skip
                    total_e += graph_us(expand)
            key = "table" if with_table else "search"
            row[key] = {"shrink_us": total_s, "expand_us": total_e}
            print(f"T {num_tokens:5d} {key:>6}: shrink {total_s:7.1f}  expand {total_e:7.1f} us/layer",
                  flush=True)  # fmt: skip
        results[num_tokens] = row
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
