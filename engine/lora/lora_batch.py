"""One step's multi-LoRA mapping, applied inside every adaptable projection.

The runner's `MergedLinear` layers call `apply` after their base matmul; each slice (q/k/v of a
fused qkv projection, gate/up of gate_up) gets its own shrink (x @ A.T) and expand (@ B.T,
scaled, added into its columns of y). Tokens without an adapter are skipped by the kernels.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from loraplex.engine.lora.lora_slots import LoRASlots
from loraplex.kernels import lora_expand, lora_shrink


@dataclass
class LoRABatch:
    slots: LoRASlots
    sorted_token_ids: torch.Tensor  # [num_tokens] int32
    slot_start_loc: torch.Tensor  # [max_loras + 1] int32
    modules: set[str]  # modules some adapter of this step targets

    def apply(
        self,
        layer_idx: int,
        slice_names: tuple[str, ...],
        slice_sizes: tuple[int, ...],
        x: torch.Tensor,
        y: torch.Tensor,
    ) -> None:
        """y[:, slice] += scaling * x @ A.T @ B.T for every adapted slice (in place)."""
        offset = 0
        for name, size in zip(slice_names, slice_sizes, strict=True):
            if name in self.modules:
                self._apply_one(layer_idx, name, offset, x, y)
            offset += size

    def _apply_one(
        self, layer_idx: int, module: str, offset: int, x: torch.Tensor, y: torch.Tensor
    ) -> None:
        slots = self.slots
        ranks = slots.ranks[module]
        # [num_tokens, max_rank]; rows of tokens without an adapter stay unwritten and unread.
        shrunk = torch.empty(x.shape[0], slots.max_lora_rank, dtype=torch.float32, device=x.device)
        lora_shrink(
            x,
            slots.lora_a[module][layer_idx],
            self.sorted_token_ids,
            self.slot_start_loc,
            ranks,
            shrunk,
        )
        lora_expand(
            shrunk,
            slots.lora_b[module][layer_idx],
            self.sorted_token_ids,
            self.slot_start_loc,
            ranks,
            slots.scalings,
            y,
            offset,
        )
