"""Which compiled variants a step's size selects, for warming them all up before serving.

A launch's compiled variant follows its constexprs: the row of its tile table (keyed by the
launch's tokens, or by query tokens per sequence for attention) and, for the LoRA kernels, SLOTS,
the width of their slot search (`segment_grid`: the step's slot table, or fewer slots when the
step has fewer tokens). Every other argument that changes from step to step is kept out of the
key (`do_not_specialize`), and the model's shapes are fixed. So a step of one sequence of T
tokens, with a slot table of S slots (or no adapters), launches the variants of every step whose
`launch_class` is the same. Decode steps (one token per sequence) select the split-KV kernel's
variant by num_seqs x num_kv_heads instead (`decode_warmup_sizes`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from loraplex.kernels.triton.lora_expand import EXPAND_TILES
from loraplex.kernels.triton.lora_segments import segment_grid
from loraplex.kernels.triton.lora_shrink import SHRINK_TILES
from loraplex.kernels.triton.paged_attention import ATTENTION_TILES
from loraplex.kernels.triton.paged_decode_attention import DECODE_ATTENTION_TILES
from loraplex.kernels.triton.silu_and_mul_lora import SILU_LORA_TILES
from loraplex.kernels.triton.tile_table import TileTable
from loraplex.kernels.triton.w4a16 import DEQUANT_MIN_M, W4A16_TILES

# Tables keyed by a launch's tokens (attention's by tokens per sequence: one sequence here).
TOKEN_TABLES: tuple[TileTable[Any], ...] = (
    SHRINK_TILES,
    EXPAND_TILES,
    SILU_LORA_TILES,
    ATTENTION_TILES,
    W4A16_TILES,
)


def launch_class(num_tokens: int, slot_table: int | None) -> tuple[object, ...]:
    """What selects the variants of a step of `num_tokens` tokens (one sequence) with a LoRA
    slot table of `slot_table` slots (None: no adapters): each table's row, the W4A16 path, and
    the LoRA kernels' SLOTS (which does not depend on their tiles' rows: any block_m gives it)."""
    rows = tuple(table.row_index(num_tokens) for table in TOKEN_TABLES)
    slots = None if slot_table is None else segment_grid(num_tokens, slot_table, 1)[1]
    return (*rows, num_tokens >= DEQUANT_MIN_M, slots)


def warmup_shapes(max_tokens: int, slot_tables: Sequence[int]) -> list[tuple[int, int | None]]:
    """(tokens, slot table or None) of the smallest one-sequence steps, one per `launch_class`
    that steps of 1..max_tokens tokens, without adapters or with any of `slot_tables`, reach.

    A class only changes where a token count passes a bound: a table row's, the W4A16 path's,
    or a power of two (SLOTS); so only the counts just past a bound need looking at."""
    bounds = {bound for table in TOKEN_TABLES for bound, _ in table.rows}
    bounds |= {DEQUANT_MIN_M - 1} | {1 << k for k in range(max_tokens.bit_length())}
    starts = sorted({1} | {b + 1 for b in bounds if b + 1 <= max_tokens})
    shapes: dict[tuple[object, ...], tuple[int, int | None]] = {}
    for table in [None, *slot_tables]:
        for num_tokens in starts:
            shapes.setdefault(launch_class(num_tokens, table), (num_tokens, table))
    return list(shapes.values())


def decode_warmup_sizes(max_num_seqs: int, num_kv_heads: int) -> list[int]:
    """The smallest number of sequences of each row of DECODE_ATTENTION_TILES that decode steps
    of 1..max_num_seqs sequences reach."""
    sizes: dict[int, int] = {}
    for num_seqs in range(1, max_num_seqs + 1):
        sizes.setdefault(DECODE_ATTENTION_TILES.row_index(num_seqs * num_kv_heads), num_seqs)
    return list(sizes.values())
