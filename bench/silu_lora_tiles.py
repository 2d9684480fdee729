"""gate_up's LoRA expand fused into SiLU-and-mul, timed against the unfused pair, per tile candidate.

Llama-3-8B's gate_up (intermediate 14336) with 8 adapters x rank 16 in an AdapterPool's pages
(bench/lora_step.py), at decode, mid and prefill step sizes (round robin over the adapters at
64 tokens and fewer, else runs of up to 512 tokens per adapter, as prefill chunks come):

- `silu alone`: silu_and_mul of y, the floor of the fused kernel (same bytes read and written);
- `unfused`: lora_expand of gate_up into y (EXPAND_TILES' row), then silu_and_mul;
- `fused`: launch_silu_and_mul_lora with each candidate (SILU_LORA_TILES' own row first).

Each call replayed from a CUDA graph, L2 flushed before each replay (kernel_timing.graph_us): a
launch from Python takes longer than the small steps' kernels run, so eager timings measured
the host. The other expands' tiles: bench/lora_step_tiles.py. Timing only: the kernels' tests
check every tile shape against the reference.

    python3 bench/silu_lora_tiles.py [--table-only] [--json PATH]
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
from collections.abc import Callable
from pathlib import Path

import torch
from kernel_timing import graph_us
from lora_step import (
    ADAPTER_RANK,
    NUM_ADAPTERS,
    SHAPES,
    batch_slot_adapters,
    create_adapter_pool,
    group_sizes,
    group_slices,
    num_slots,
)

from loraplex.kernels.lora_mapping import build_lora_mapping
from loraplex.kernels.triton import silu_and_mul
from loraplex.kernels.triton.lora_expand import EXPAND_TILES, ExpandTiles, launch_lora_expand
from loraplex.kernels.triton.silu_and_mul_lora import SILU_LORA_TILES, launch_silu_and_mul_lora

SIZES = (64, 256, 1024, 2048, 4096)
GATE_UP = ("gate_proj", "up_proj")
FUSED_CANDIDATES = (
    ExpandTiles(16, 128, max_block_k=64, num_warps=4, num_stages=2),
    ExpandTiles(16, 128, max_block_k=64, num_warps=4, num_stages=2, target_programs=1024),
    ExpandTiles(16, 128, max_block_k=64, num_warps=4, num_stages=2, target_programs=4096),
    ExpandTiles(16, 256, max_block_k=64, num_warps=8, num_stages=2),
    ExpandTiles(32, 128, max_block_k=64, num_warps=4, num_stages=2),
    ExpandTiles(64, 64, max_block_k=64, num_warps=4, num_stages=2),
    ExpandTiles(64, 128, max_block_k=64, num_warps=4, num_stages=2),
    ExpandTiles(64, 128, max_block_k=64, num_warps=8, num_stages=2),
    ExpandTiles(64, 128, max_block_k=64, num_warps=8, num_stages=2, target_programs=4096),
)


def mapping_for(num_tokens: int, pool_device: torch.device) -> tuple[torch.Tensor, ...]:
    run = 1 if num_tokens <= 64 else min(512, num_tokens // NUM_ADAPTERS)
    token_slots = (torch.arange(num_tokens, device=pool_device) // run) % NUM_ADAPTERS
    return build_lora_mapping(token_slots, num_slots(NUM_ADAPTERS))


def expand_then_silu(expand: Callable[..., None], tiles: ExpandTiles, y: torch.Tensor) -> None:
    expand(tiles=tiles)
    silu_and_mul(y)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json")
    ap.add_argument("--table-only", action="store_true", help="time the table's rows alone")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("silu_lora_tiles needs a CUDA GPU", file=sys.stderr)
        return 2
    device, dtype = torch.device("cuda"), torch.bfloat16
    pool = create_adapter_pool(dtype, device)
    slot_adapters, num_active = batch_slot_adapters(pool, NUM_ADAPTERS)
    results: dict[str, float] = {}

    def report(num_tokens: int, what: str, us: float) -> None:
        print(f"  T {num_tokens:>4}  {us:8.1f} us  {what}", flush=True)
        results[f"T {num_tokens} {what}"] = us

    print("us per call, one layer (bf16, 8 adapters x rank 16)")
    for num_tokens in SIZES:
        ids, loc = mapping_for(num_tokens, device)
        mapping = (slot_adapters, num_active, ids, loc)
        rows, sizes = group_slices(GATE_UP), group_sizes(GATE_UP)
        lora_out = torch.randn(2, num_tokens, ADAPTER_RANK, device=device)
        y = torch.randn(num_tokens, sum(sizes), device=device, dtype=dtype)
        b_tables = (pool.pages[0], pool.page_table, pool.first_b[rows], pool.ranks[rows])
        expand = functools.partial(
            launch_lora_expand, lora_out, *b_tables, pool.scalings, *mapping, y, 0, sizes
        )
        report(num_tokens, "silu alone", graph_us(functools.partial(silu_and_mul, y)))
        unfused = functools.partial(expand_then_silu, expand, EXPAND_TILES.lookup(num_tokens), y)
        report(num_tokens, "unfused", graph_us(unfused))
        fused = functools.partial(
            launch_silu_and_mul_lora, y, lora_out, *b_tables, pool.scalings, *mapping
        )
        own = SILU_LORA_TILES.lookup(num_tokens)
        others = () if args.table_only else tuple(c for c in FUSED_CANDIDATES if c != own)
        for candidate in (own, *others):
            mark = "fused (table)" if candidate == own else "fused"
            report(
                num_tokens,
                f"{mark} {candidate}",
                graph_us(functools.partial(fused, tiles=candidate)),
            )
    assert SHAPES["gate_proj"][1] == y.shape[1] // 2
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
