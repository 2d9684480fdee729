"""What one forward pass needs besides token ids and positions.

The model runner builds a `ForwardContext` per step; every layer reads from it. Tokens of all
sequences in the step are packed into one flat batch (no padding):

    input_ids        [t0 t1 t2 | u0 | v0 v1]        num_tokens = 6
    query_start_loc  [0,       3,   4,     6]        num_seqs + 1
    seq_lens         [3,       17,  9]               context length after this step
    slot_mapping     [s, s, s, s, s, s]              cache slot = block_id * block_size + offset

A sequence's query tokens are its last `q_len` positions of `seq_len`; each attends causally to
every cached position before it, read through `block_tables[seq]`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import torch


@dataclass
class AttentionMetadata:
    slot_mapping: torch.Tensor  # [num_tokens] int64; -1 = do not write (padding)
    block_tables: torch.Tensor  # [num_seqs, max_num_blocks_per_seq] int32
    seq_lens: torch.Tensor  # [num_seqs] int32
    query_start_loc: torch.Tensor  # [num_seqs + 1] int32
    max_query_len: int
    max_seq_len: int
    # How many leading sequences have one query token (decodes), counted on the host: a step
    # that mixes them with prefill chunks runs them through the decode kernel.
    num_decode_seqs: int = 0


class LoRAApplier(Protocol):
    """Adds the LoRA deltas of this step's adapters to a projection's output (engine/lora).

    `begin` (the shrink, x @ A.T) is called before the projection's GEMM so the two may
    overlap, and returns an opaque handle (None: nothing to add); `finish` adds the expanded,
    scaled deltas into y (or, given `delta_into` at `begin`, a tensor the caller adds y to next,
    into that one already, and only waits for them). `silu_and_mul` takes the place of `finish`
    for gate_up_proj: the activation of y with the deltas (of a `begin` with `all_slices`)
    added on the way.
    """

    def begin(
        self,
        layer_idx: int,
        slice_names: tuple[str, ...],
        slice_sizes: tuple[int, ...],
        x: torch.Tensor,
        delta_into: torch.Tensor | None = None,
        all_slices: bool = False,
    ) -> Any: ...

    def finish(self, shrunk: Any, y: torch.Tensor) -> None: ...

    def silu_and_mul(self, shrunk: Any, y: torch.Tensor) -> torch.Tensor: ...


@dataclass
class ForwardContext:
    attn: AttentionMetadata
    # Per layer: (key_cache, value_cache), each [num_blocks, block_size, num_kv_heads, head_dim].
    kv_caches: list[tuple[torch.Tensor, torch.Tensor]]
    lora: LoRAApplier | None = None
    # Write FP8 projections' inputs unquantized too, even without `lora`: the memory profile
    # of an engine with adapters enabled, whose peak must be a step with adapters'.
    keep_unquantized: bool = False

    @property
    def needs_unquantized_inputs(self) -> bool:
        """Whether an FP8 projection's input must also be written unquantized (for the LoRA
        shrink that reads it); without, the op before writes only its FP8 copy."""
        return self.lora is not None or self.keep_unquantized
