"""Candidate LoRA tiles, timed by passing them to launch_lora_shrink / launch_lora_expand.

Each kernel alone over the 4 slice groups of one Llama-3-8B layer (8 adapters x rank 16 in an
AdapterPool's pages, bench/lora_step.py; shrink output 16 wide): decode-row candidates at T = 64
(round robin over the adapters), prefill-row candidates at T = 4096 (runs of 512 tokens per
adapter, offline_throughput.py's prefill step).
The tables' own row comes first in each list. Timing only: tests/kernels checks every tile shape
the launchers accept against the reference.
"""

from __future__ import annotations

import functools

import torch
from kernel_timing import bench_us
from lora_step import (
    ADAPTER_RANK,
    GROUPS,
    NUM_ADAPTERS,
    NUM_SLOTS,
    SHAPES,
    batch_slot_adapters,
    group_sizes,
    group_slices,
)

from loraplex.engine.lora.adapter_pool import AdapterPool
from loraplex.kernels.lora_mapping import build_lora_mapping
from loraplex.kernels.triton.lora_expand import EXPAND_TILES, ExpandTiles, launch_lora_expand
from loraplex.kernels.triton.lora_shrink import SHRINK_TILES, ShrinkTiles, launch_lora_shrink

CANDIDATES: dict[int, tuple[list[ShrinkTiles], list[ExpandTiles]]] = {
    64: (
        [
            SHRINK_TILES.lookup(64),
            ShrinkTiles(16, block_k=128, k_chunk=512, max_block_n=16, num_warps=4, num_stages=2),
            ShrinkTiles(16, block_k=64, k_chunk=256, max_block_n=16, num_warps=4, num_stages=2),
            ShrinkTiles(16, block_k=64, k_chunk=128, max_block_n=16, num_warps=2, num_stages=2),
        ],
        [
            EXPAND_TILES.lookup(64),
            ExpandTiles(16, block_n=64, max_block_k=16, num_warps=2, num_stages=2),
            ExpandTiles(16, block_n=256, max_block_k=16, num_warps=4, num_stages=2),
            ExpandTiles(16, block_n=256, max_block_k=16, num_warps=8, num_stages=2),
        ],
    ),
    4096: (
        [
            SHRINK_TILES.lookup(4096),
            ShrinkTiles(64, block_k=128, k_chunk=1024, max_block_n=64, num_warps=4, num_stages=3),
            ShrinkTiles(128, block_k=64, k_chunk=2048, max_block_n=64, num_warps=8, num_stages=3),
        ],
        [
            EXPAND_TILES.lookup(4096),
            ExpandTiles(64, block_n=256, max_block_k=64, num_warps=4, num_stages=2),
            ExpandTiles(128, block_n=128, max_block_k=64, num_warps=8, num_stages=2),
        ],
    ),
}


def time_tile_candidates(pool: AdapterPool) -> dict[str, float]:
    """us per layer (sum of the 4 slice groups) per (T, kernel, tiles), over the adapters of
    `pool` (lora_step.create_adapter_pool)."""
    print("LoRA tile candidates: us per layer, each kernel alone (the tables' row first)")
    device, dtype = pool.device, pool.pages.dtype
    slot_adapters, num_active_slots = batch_slot_adapters(pool, NUM_ADAPTERS)
    results = {}
    for num_tokens, (shrinks, expands) in CANDIDATES.items():
        run = 1 if num_tokens <= 64 else 512
        token_slots = (torch.arange(num_tokens, device=device) // run) % NUM_ADAPTERS
        ids, loc = build_lora_mapping(token_slots, NUM_SLOTS)
        mapping = (slot_adapters, num_active_slots, ids, loc)
        shrink_calls, expand_calls = [], []
        for names in GROUPS:
            rows, sizes = group_slices(names), group_sizes(names)
            x = torch.randn(num_tokens, SHAPES[names[0]][0], device=device, dtype=dtype)
            lora_out = torch.zeros(len(names), num_tokens, ADAPTER_RANK, device=device)
            y = torch.zeros(num_tokens, sum(sizes), device=device, dtype=dtype)
            a_tables = (pool.pages[0], pool.page_table, pool.first_a[rows], pool.ranks[rows])
            b_tables = (pool.pages[0], pool.page_table, pool.first_b[rows], pool.ranks[rows])
            shrink_calls.append(
                functools.partial(launch_lora_shrink, x, *a_tables, *mapping, lora_out, True)
            )
            expand_args = (pool.scalings, *mapping, y, 0, sizes)
            expand_calls.append(
                functools.partial(launch_lora_expand, lora_out, *b_tables, *expand_args)
            )
        for kind, candidates, calls in (
            ("shrink", shrinks, shrink_calls),
            ("expand", expands, expand_calls),
        ):
            for tiles in candidates:
                us = sum(bench_us(functools.partial(call, tiles=tiles)) for call in calls)
                print(f"  T {num_tokens:>4} {kind:<6} {us:8.1f} us  {tiles}")
                results[f"T {num_tokens} {kind} {tiles}"] = us
    return results
