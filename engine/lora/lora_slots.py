"""The device-side home of active adapters: stacked weights, one slot per adapter.

Weights are stored per fused projection of the model (`SLICE_GROUPS`: qkv, o, gate_up, down),
so that one shrink and one expand launch serve every slice of a `MergedLinear`. For a group
with slices i = 0..S-1 (one in_dim, out dims n_i) and layer l:

    group.lora_a[l]  [max_loras, S, max_lora_rank, in_dim]  slot s, slice i: A in rows [:rank]
    group.lora_b[l]  [max_loras, sum n_i, max_lora_rank]    slice i: B in rows o_i + [0, n_i),
                                                            columns [:rank]
    group.ranks      [S, max_loras] int32                   0 where slot s does not target i

with o_i = n_0 + ... + n_{i-1}: B rows follow the y columns of the fused projection.

The per-module views `lora_a[m]` [L, max_loras, r, in], `lora_b[m]` [L, max_loras, out, r] and
`ranks[m]` [max_loras] share this storage. Memory is sized by `max_lora_rank` (as in vLLM);
compute is not: the kernels stop at each slot's own rank and skip slices an adapter does not
target. Tensors are allocated once and never move (CUDA graphs capture their addresses).

The step workspace holds the fp32 shrink outputs of one step, every layer and slice its own
region, zeroed by one memset per step (LoRABatch) for a step of T tokens:

    workspace  [ lora_out: L x NUM_SLICES x T x max_rank ]

It is sized for steps of up to `max_workspace_tokens` tokens (the CUDA-graph batch sizes; larger
steps take a buffer per launch) and never reallocated.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from loraplex.engine.lora.adapter import ArchLike, LoRAAdapter, lora_module_shapes

# The slices the model's MergedLinear layers hand to the LoRA applier, in y's column order.
SLICE_GROUPS: tuple[tuple[str, ...], ...] = (
    ("q_proj", "k_proj", "v_proj"),
    ("o_proj",),
    ("gate_proj", "up_proj"),
    ("down_proj",),
)
NUM_SLICES = sum(len(names) for names in SLICE_GROUPS)
# Steps of up to this many tokens use the step workspace: the largest CUDA-graph batch
# (engine/runner/cuda_graph.py), unless the byte cap below allows fewer (large max_lora_rank).
WORKSPACE_MAX_TOKENS = 512
WORKSPACE_MAX_BYTES = 64 << 20


@dataclass(frozen=True)
class LoRASliceGroup:
    """Stacked weights of the slices of one fused projection (all layers, all slots)."""

    slice_names: tuple[str, ...]
    slice_sizes: tuple[int, ...]  # out_dim per slice
    first_slice: int  # index of slice 0 among all groups' slices (the workspace's slice axis)
    lora_a: torch.Tensor  # [num_layers, max_loras, num_slices, max_rank, in_dim]
    lora_b: torch.Tensor  # [num_layers, max_loras, sum(slice_sizes), max_rank]
    ranks: torch.Tensor  # [num_slices, max_loras] int32


class LoRASlots:
    def __init__(
        self,
        arch: ArchLike,
        max_loras: int,
        max_lora_rank: int,
        dtype: torch.dtype,
        device: torch.device,
        max_workspace_tokens: int = WORKSPACE_MAX_TOKENS,
    ) -> None:
        self.max_loras = max_loras
        self.max_lora_rank = max_lora_rank
        self.num_layers = arch.num_hidden_layers
        self.module_shapes = lora_module_shapes(arch)
        assert sorted(m for g in SLICE_GROUPS for m in g) == sorted(self.module_shapes)
        self.groups: dict[tuple[str, ...], LoRASliceGroup] = {}
        # Per-module views into the groups' storage.
        self.lora_a: dict[str, torch.Tensor] = {}  # [num_layers, max_loras, max_rank, in_dim]
        self.lora_b: dict[str, torch.Tensor] = {}  # [num_layers, max_loras, out_dim, max_rank]
        self.ranks: dict[str, torch.Tensor] = {}  # [max_loras] int32
        first_slice = 0
        for names in SLICE_GROUPS:
            group = self._create_group(names, first_slice, dtype, device)
            self.groups[names] = group
            first_slice += len(names)
            start = 0
            for i, (module, size) in enumerate(zip(names, group.slice_sizes, strict=True)):
                self.lora_a[module] = group.lora_a[:, :, i]
                self.lora_b[module] = group.lora_b[:, :, start : start + size]
                self.ranks[module] = group.ranks[i]
                start += size
        self.scalings = torch.zeros(max_loras, dtype=torch.float32, device=device)
        # Host copies, to know which modules a step needs without a device sync.
        self.host_ranks: dict[str, list[int]] = {m: [0] * max_loras for m in self.module_shapes}
        per_token = self.num_layers * NUM_SLICES * max_lora_rank
        budget_tokens = WORKSPACE_MAX_BYTES // (4 * per_token)
        self.max_workspace_tokens = max(0, min(max_workspace_tokens, budget_tokens))
        self._workspace = torch.zeros(
            per_token * self.max_workspace_tokens, dtype=torch.float32, device=device
        )
        self.side_stream = torch.cuda.Stream(device) if device.type == "cuda" else None

    def step_workspace(self, num_tokens: int) -> torch.Tensor | None:
        """The workspace for a step of `num_tokens` tokens, [num_layers, NUM_SLICES, num_tokens,
        max_rank] float32 (contiguous); None if it does not fit."""
        if num_tokens > self.max_workspace_tokens:
            return None
        shape = (self.num_layers, NUM_SLICES, num_tokens, self.max_lora_rank)
        return self._workspace[: math.prod(shape)].view(shape)

    def _create_group(
        self, names: tuple[str, ...], first_slice: int, dtype: torch.dtype, device: torch.device
    ) -> LoRASliceGroup:
        in_dims = {self.module_shapes[m][0] for m in names}
        assert len(in_dims) == 1, f"slices {names} must share in_dim"
        sizes = tuple(self.module_shapes[m][1] for m in names)
        a_shape = (self.num_layers, self.max_loras, len(names), self.max_lora_rank, in_dims.pop())
        b_shape = (self.num_layers, self.max_loras, sum(sizes), self.max_lora_rank)
        return LoRASliceGroup(
            slice_names=names,
            slice_sizes=sizes,
            first_slice=first_slice,
            lora_a=torch.zeros(a_shape, dtype=dtype, device=device),
            lora_b=torch.zeros(b_shape, dtype=dtype, device=device),
            ranks=torch.zeros(len(names), self.max_loras, dtype=torch.int32, device=device),
        )

    def load(self, slot: int, adapter: LoRAAdapter) -> None:
        """Copy an adapter's weights into `slot` (one copy per module)."""
        rank = adapter.rank
        for module in self.module_shapes:
            if module not in adapter.target_modules:
                self._set_rank(module, slot, 0)
                continue
            a = torch.stack(
                [adapter.weights[(layer, module)][0] for layer in range(self.num_layers)]
            )
            b = torch.stack(
                [adapter.weights[(layer, module)][1] for layer in range(self.num_layers)]
            )
            self.lora_a[module][:, slot, :rank].copy_(a, non_blocking=True)  # [L, r, in]
            self.lora_b[module][:, slot, :, :rank].copy_(b, non_blocking=True)  # [L, out, r]
            self._set_rank(module, slot, rank)
        self.scalings[slot] = adapter.scaling

    def clear(self, slot: int) -> None:
        for module in self.module_shapes:
            self._set_rank(module, slot, 0)

    def modules_in_use(self, slots: set[int]) -> set[str]:
        return {m for m, ranks in self.host_ranks.items() if any(ranks[s] > 0 for s in slots)}

    def _set_rank(self, module: str, slot: int, rank: int) -> None:
        self.ranks[module][slot] = rank
        self.host_ranks[module][slot] = rank
