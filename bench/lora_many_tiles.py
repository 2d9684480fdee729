"""Candidate LoRA tiles with many adapters, timed over all 32 layers of a step in a CUDA graph.

q/k/v/o adapters of ranks 8/16/32/64 in turn (bench/lora_step.py's AdapterMix, max_lora_rank 64)
resident in an AdapterPool's pages; a step of T tokens whose token t belongs to adapter
t % count. Per (count, T): the shrink and the expand of the two slice groups (q/k/v, o) of every
layer, each kernel alone, for the table's tiles (`table`) and for candidates around them:
block_m, and for the expand the column runs (ExpandTiles.target_programs; None = one column tile
per program). Every candidate is checked against the reference on layer 0 first (`bad` lists the
ones that differ). Prints ms per step per candidate; `--json` writes them.

This is how the tables' rows for many adapters were chosen (bench/results/h200-*-many-tiles).
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import sys
from collections.abc import Callable
from pathlib import Path

import torch
from kernel_timing import graph_us
from lora_step import (
    NUM_LAYERS,
    SHAPES,
    AdapterMix,
    batch_slot_adapters,
    create_adapter_pool,
    group_sizes,
    group_slices,
    num_slots,
)

from loraplex.engine.lora.adapter_pool import AdapterPool
from loraplex.kernels.lora_mapping import build_lora_mapping
from loraplex.kernels.reference import lora as reference
from loraplex.kernels.triton.lora_expand import EXPAND_TILES, ExpandTiles, launch_lora_expand
from loraplex.kernels.triton.lora_shrink import SHRINK_TILES, ShrinkTiles, launch_lora_shrink

DTYPE = torch.bfloat16
RANKS = (8, 16, 32, 64)
QKVO = ("q_proj", "k_proj", "v_proj", "o_proj")
SLICE_GROUPS = (("q_proj", "k_proj", "v_proj"), ("o_proj",))
CASES = ((8, 64), (64, 64), (8, 256), (32, 256), (128, 256), (8, 2048), (128, 2048), (8, 8192),
         (128, 8192))  # fmt: skip


def expand_candidates(num_tokens: int) -> dict[str, ExpandTiles]:
    table = EXPAND_TILES.lookup(num_tokens)
    out = {"table": table}
    for block_m in (16, 32) if num_tokens <= 512 else (16, 32, 64):
        for target in (None, 1024, 2048, 4096):
            tiles = dataclasses.replace(table, block_m=block_m, target_programs=target)
            out[f"bm{block_m}-tp{target}"] = tiles
    return out


def shrink_candidates(num_tokens: int) -> dict[str, ShrinkTiles]:
    table = SHRINK_TILES.lookup(num_tokens)
    out = {"table": table}
    if num_tokens > 64:
        out["bm16"] = dataclasses.replace(table, block_m=16)
        out["bm16-k256"] = dataclasses.replace(table, block_m=16, k_chunk=256, num_stages=2)
    if num_tokens > 512:
        out["bm32"] = dataclasses.replace(table, block_m=32)
    return out


def paged_tables(pool: AdapterPool, first: torch.Tensor, rows: slice, layer: int) -> tuple:
    """A kernel's (pages, page_table, first_page, lora_ranks) for one layer and slice group."""
    return pool.pages[layer], pool.page_table, first[rows], pool.ranks[rows]


def time_case(pool: AdapterPool, count: int, num_tokens: int, device: torch.device) -> dict:
    token_slots = torch.arange(num_tokens, device=device) % count
    mapping = (
        *batch_slot_adapters(pool, count),
        *build_lora_mapping(token_slots, num_slots(count)),
    )
    shrinks, expands = shrink_candidates(num_tokens), expand_candidates(num_tokens)
    calls: dict[str, list[Callable[[], None]]] = {}
    bad: set[str] = set()
    for names in SLICE_GROUPS:
        rows, sizes = group_slices(names), group_sizes(names)
        x = torch.randn(num_tokens, SHAPES[names[0]][0], device=device, dtype=DTYPE)
        lora_out = torch.zeros(len(names), num_tokens, max(RANKS), device=device)
        y = torch.zeros(num_tokens, sum(sizes), device=device, dtype=DTYPE)

        a_of = functools.partial(paged_tables, pool, pool.first_a, rows)
        b_of = functools.partial(paged_tables, pool, pool.first_b, rows)

        want_out = torch.zeros_like(lora_out)
        reference.lora_shrink(x, *a_of(0), *mapping, want_out)
        want_y = torch.zeros(num_tokens, sum(sizes), device=device)
        reference.lora_expand(want_out, *b_of(0), pool.scalings, *mapping, want_y, 0, sizes)
        for name, st in shrinks.items():
            got = torch.zeros_like(lora_out)
            launch_lora_shrink(x, *a_of(0), *mapping, got, True, st)
            if not torch.allclose(got, want_out, atol=5e-2, rtol=2e-2):
                bad.add(f"shrink {name}")
            for layer in range(NUM_LAYERS):
                run = functools.partial(
                    launch_lora_shrink, x, *a_of(layer), *mapping, lora_out, True, st
                )
                calls.setdefault(f"shrink {name}", []).append(run)
        lora_out.copy_(want_out)
        for name, et in expands.items():
            got_y = torch.zeros_like(y)
            launch_lora_expand(lora_out, *b_of(0), pool.scalings, *mapping, got_y, 0, sizes, et)
            if not torch.allclose(got_y.float(), want_y, atol=5e-2, rtol=2e-2):
                bad.add(f"expand {name}")
            for layer in range(NUM_LAYERS):
                args = (lora_out, *b_of(layer), pool.scalings, *mapping, y, 0, sizes, et)
                calls.setdefault(f"expand {name}", []).append(
                    functools.partial(launch_lora_expand, *args)
                )

    def step_ms(fns: list[Callable[[], None]]) -> float:
        return graph_us(lambda: [fn() for fn in fns]) / 1e3

    return {
        "bad": sorted(bad),
        "ms_per_step": {k: round(step_ms(fns), 3) for k, fns in calls.items()},
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", type=Path, help="write the results here")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("lora_many_tiles needs a CUDA GPU", file=sys.stderr)
        return 2
    torch.manual_seed(0)
    device = torch.device("cuda")
    pool = create_adapter_pool(DTYPE, device, AdapterMix(max(c for c, _ in CASES), RANKS, QKVO))
    results = {}
    for count, num_tokens in CASES:
        row = time_case(pool, count, num_tokens, device)
        results[f"{count} adapters T {num_tokens}"] = row
        print(f"{count} adapters, T {num_tokens}: {json.dumps(row)}", flush=True)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    return 1 if any(row["bad"] for row in results.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
