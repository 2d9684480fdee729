"""Adapters under tensor parallelism (S-LoRA's scheme, docs/tensor_parallel.md): which part
of each LoRA matrix a rank holds.

    column-parallel slices (q, k, v, gate, up): A whole (the shrink sees the whole input),
        B's rows of the rank's output columns (the expand writes its shard of y);
    row-parallel slices (o, down): A's columns of the rank's input shard (a partial shrink,
        all-reduced: LoRABatch), B whole (the delta goes into the replicated residual stream).

Every rank's shard has the same shapes, so one page layout serves all ranks.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from loraplex.engine.distributed.sharding import ShardSpec, TPLayout, take_shard

if TYPE_CHECKING:  # engine/lora's loader imports this module
    from loraplex.engine.lora.adapter import LoRAAdapter

ROW_PARALLEL = frozenset({"o_proj", "down_proj"})


def _shards(layout: TPLayout) -> dict[str, ShardSpec]:
    """Per module: the rows of B (column-parallel) or the columns of A (row-parallel)."""
    return {
        "q_proj": layout.q_shard,
        "k_proj": layout.kv_shard,
        "v_proj": layout.kv_shard,
        "o_proj": layout.q_shard,
        "gate_proj": layout.intermediate_shard,
        "up_proj": layout.intermediate_shard,
        "down_proj": layout.intermediate_shard,
    }


def shard_module_shapes(
    shapes: dict[str, tuple[int, int]], layout: TPLayout
) -> dict[str, tuple[int, int]]:
    """(in_dim, out_dim) of each adaptable projection on one rank."""
    out = {}
    for module, (in_dim, out_dim) in shapes.items():
        size = _shards(layout)[module].size
        out[module] = (size, out_dim) if module in ROW_PARALLEL else (in_dim, size)
    return out


def shard_adapter(adapter: LoRAAdapter, layout: TPLayout) -> LoRAAdapter:
    """The rank's share of `adapter` (views of its weights, no copy)."""
    shards = _shards(layout)
    weights = {}
    for (layer, module), (a, b) in adapter.weights.items():
        shard = shards[module]
        if module in ROW_PARALLEL:  # A [r, in_dim]: the input columns
            a = take_shard(a, ShardSpec(1, shard.start, shard.size, shard.full))
        else:  # B [out_dim, r]: the output rows
            b = take_shard(b, shard)
        weights[(layer, module)] = (a, b)
    return replace(adapter, weights=weights)
