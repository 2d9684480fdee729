"""One step's multi-LoRA mapping, applied inside every adaptable projection.

The runner's `MergedLinear` layers call `apply` after their base matmul. All slices of the call
(q/k/v of qkv_proj, gate/up of gate_up_proj) share x, so they take one shrink launch into an fp32
[num_slices, num_tokens, max_rank] buffer and one expand launch that adds every slice's scaled
delta into its columns of y: two launches per projection, eight per decoder layer.

Slices no adapter of the step targets (outside `modules`) are skipped by launching over the
contiguous range of slices that some adapter targets (a slice inside that range that nobody
targets has rank 0 in every busy slot, and its programs exit at once). The CUDA-graph path
passes every module, so the captured launches always cover every slice.
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
        used = [i for i, name in enumerate(slice_names) if name in self.modules]
        if not used:
            return
        group = self.slots.groups[slice_names]
        assert group.slice_sizes == slice_sizes, f"{slice_names}: {slice_sizes} != slots'"
        lo, hi = used[0], used[-1] + 1
        col_lo, col_hi = sum(slice_sizes[:lo]), sum(slice_sizes[:hi])
        lora_a = group.lora_a[layer_idx]  # [max_loras, num_slices, max_rank, in_dim]
        lora_b = group.lora_b[layer_idx]  # [max_loras, sum(slice_sizes), max_rank]
        ranks = group.ranks  # [num_slices, max_loras]
        if (lo, hi) != (0, len(slice_names)):
            lora_a, lora_b, ranks = lora_a[:, lo:hi], lora_b[:, col_lo:col_hi], ranks[lo:hi]
        # [num_slices, num_tokens, max_rank]; zeroed by the shrink.
        shrunk = torch.empty(
            hi - lo, x.shape[0], self.slots.max_lora_rank, dtype=torch.float32, device=x.device
        )
        lora_shrink(x, lora_a, self.sorted_token_ids, self.slot_start_loc, ranks, shrunk)
        lora_expand(
            shrunk,
            lora_b,
            self.sorted_token_ids,
            self.slot_start_loc,
            ranks,
            self.slots.scalings,
            y,
            col_lo,
            slice_sizes[lo:hi],
        )
