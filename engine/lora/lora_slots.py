"""The device-side home of active adapters: per-module stacked weights, one slot per adapter.

For every adaptable module m and layer l:

    lora_a[m][l]  [max_loras, max_lora_rank, in_dim]     slot s holds A in rows [:rank_s]
    lora_b[m][l]  [max_loras, out_dim, max_lora_rank]    slot s holds B in columns [:rank_s]
    ranks[m]      [max_loras] int32                      0 where slot s does not target m

Memory is sized by `max_lora_rank` (as in vLLM); compute is not: the kernels stop at each
slot's own rank and skip modules an adapter does not target.
"""

from __future__ import annotations

import torch
from loraplex.engine.lora.adapter import ArchLike, LoRAAdapter, lora_module_shapes


class LoRASlots:
    def __init__(
        self,
        arch: ArchLike,
        max_loras: int,
        max_lora_rank: int,
        dtype: torch.dtype,
        device: torch.device,
    ) -> None:
        self.max_loras = max_loras
        self.max_lora_rank = max_lora_rank
        self.num_layers = arch.num_hidden_layers
        self.module_shapes = lora_module_shapes(arch)
        self.lora_a: dict[str, torch.Tensor] = {}
        self.lora_b: dict[str, torch.Tensor] = {}
        self.ranks: dict[str, torch.Tensor] = {}
        for module, (in_dim, out_dim) in self.module_shapes.items():
            # [num_layers, max_loras, max_rank, in_dim] and [num_layers, max_loras, out_dim, max_rank]
            self.lora_a[module] = torch.zeros(
                self.num_layers, max_loras, max_lora_rank, in_dim, dtype=dtype, device=device
            )
            self.lora_b[module] = torch.zeros(
                self.num_layers, max_loras, out_dim, max_lora_rank, dtype=dtype, device=device
            )
            self.ranks[module] = torch.zeros(max_loras, dtype=torch.int32, device=device)
        self.scalings = torch.zeros(max_loras, dtype=torch.float32, device=device)
        # Host copies, to know which modules a step needs without a device sync.
        self.host_ranks: dict[str, list[int]] = {m: [0] * max_loras for m in self.module_shapes}

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
