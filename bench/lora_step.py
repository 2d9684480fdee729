"""The LoRA work of a Llama-3-8B step as the engine runs it, for bench/kernels_bench.py.

Every slot of a 32-layer LoRASlots holds a rank-16 adapter on all 7 modules; each projection
of each layer runs as MergedLinear runs it: `LoRABatch.begin` (the shrink; on the side stream at
<= 64 tokens), the base GEMM, `LoRABatch.finish`, with o_proj's and down_proj's deltas going
into the residual stream.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from loraplex.engine.lora.lora_batch import LoRABatch
from loraplex.engine.lora.lora_slots import LoRASlots
from loraplex.kernels.lora_mapping import build_lora_mapping
from loraplex.kernels.reference import lora as reference

NUM_LAYERS = 32
MAX_LORAS = 8
ADAPTER_RANK = 16
INTO_RESIDUAL = {("o_proj",), ("down_proj",)}  # MergedLinear passes them the residual stream

Projection = tuple[str, ...]


@dataclass(frozen=True)
class Llama3Arch:
    """Llama-3-8B's shape, as engine/lora/adapter.py's ArchLike."""

    model_type: str = "llama"
    hidden_size: int = 4096
    intermediate_size: int = 14336
    num_hidden_layers: int = NUM_LAYERS
    num_attention_heads: int = 32
    num_key_value_heads: int = 8
    head_dim: int = 128


LLAMA3_8B = Llama3Arch()


def create_lora_slots(max_lora_rank: int, dtype: torch.dtype, device: torch.device) -> LoRASlots:
    """Random rank-16 adapters on every module of every slot, written straight into the stacked
    storage (LoRASlots.load would copy 8 x 32 x 7 CPU pairs)."""
    slots = LoRASlots(LLAMA3_8B, MAX_LORAS, max_lora_rank, dtype, device)
    for group in slots.groups.values():
        in_dim = group.lora_a.shape[-1]
        group.lora_a[..., :ADAPTER_RANK, :].normal_(0.0, in_dim**-0.5)
        group.lora_b[..., :ADAPTER_RANK].normal_(0.0, ADAPTER_RANK**-0.5)
        group.ranks.fill_(ADAPTER_RANK)
    slots.scalings.fill_(1.0)
    for module in slots.host_ranks:
        slots.host_ranks[module] = [ADAPTER_RANK] * MAX_LORAS
    return slots


def create_base_weights(
    slots: LoRASlots, dtype: torch.dtype, device: torch.device
) -> list[dict[Projection, torch.Tensor]]:
    """Per layer, each fused projection's weight [out_dim, in_dim] (all layers: GEMMs read HBM)."""
    shapes = {names: (sum(g.slice_sizes), g.lora_a.shape[-1]) for names, g in slots.groups.items()}
    return [
        {
            names: torch.empty(shape, device=device, dtype=dtype).normal_(0.0, shape[1] ** -0.5)
            for names, shape in shapes.items()
        }
        for _ in range(slots.num_layers)
    ]


class LoRAStep:
    """One step of `num_tokens` tokens, round robin over the adapters."""

    def __init__(
        self, slots: LoRASlots, num_tokens: int, weights: list[dict[Projection, torch.Tensor]]
    ) -> None:
        device, dtype = slots.scalings.device, slots.groups[("o_proj",)].lora_a.dtype
        self.slots = slots
        self.weights = weights
        token_slots = torch.arange(num_tokens, device=device) % MAX_LORAS
        self.sorted_token_ids, self.slot_start_loc = build_lora_mapping(token_slots, MAX_LORAS)
        mapping = (self.sorted_token_ids, self.slot_start_loc)
        self.batch = LoRABatch(slots, *mapping, set(slots.module_shapes))
        self.x: dict[Projection, torch.Tensor] = {}
        self.y: dict[Projection, torch.Tensor] = {}
        for names, group in slots.groups.items():
            in_dim, out_dim = group.lora_a.shape[-1], sum(group.slice_sizes)
            self.x[names] = torch.randn(num_tokens, in_dim, device=device, dtype=dtype)
            self.y[names] = torch.zeros(num_tokens, out_dim, device=device, dtype=dtype)
        hidden = slots.module_shapes["o_proj"][1]
        self.residual = torch.zeros(num_tokens, hidden, device=device, dtype=dtype)

    def run(self, lora: bool, gemms: bool, num_layers: int | None = None) -> None:
        """The step's projections (of the first `num_layers` layers, default all): base GEMMs,
        LoRA, or both (begin, GEMM, finish)."""
        for layer in range(num_layers or self.slots.num_layers):
            for names, group in self.slots.groups.items():
                x, y, sizes = self.x[names], self.y[names], group.slice_sizes
                into = self.residual if names in INTO_RESIDUAL else None
                shrunk = self.batch.begin(layer, names, sizes, x, delta_into=into) if lora else None
                if gemms:
                    torch.matmul(x, self.weights[layer][names].T, out=y)
                if lora:
                    self.batch.finish(shrunk, y)

    def sanity_check(self) -> bool:
        """Layer 0's deltas from y = 0 and residual = 0 against the reference kernels: qkv's
        and gate_up's in y, o's plus down's in the residual (through a bf16 intermediate, so
        within two bf16 steps of the largest delta)."""
        self.residual.zero_()
        for y in self.y.values():
            y.zero_()
        self.run(lora=True, gemms=False, num_layers=1)
        torch.cuda.synchronize()
        ok = True
        residual = torch.zeros_like(self.residual, dtype=torch.float32)
        for names, group in self.slots.groups.items():
            mapping = (self.sorted_token_ids, self.slot_start_loc, group.ranks)
            shape = (len(names), self.x[names].shape[0], self.slots.max_lora_rank)
            lora_out = torch.zeros(shape, device=residual.device)
            reference.lora_shrink(self.x[names], group.lora_a[0], *mapping, lora_out)
            expected = torch.zeros_like(self.y[names], dtype=torch.float32)
            args = (self.slots.scalings, expected, 0, group.slice_sizes)
            reference.lora_expand(lora_out, group.lora_b[0], *mapping, *args)
            if names in INTO_RESIDUAL:
                residual += expected
                expected.zero_()
            ok &= torch.allclose(self.y[names].float(), expected, atol=2e-2, rtol=2e-2)
        return ok and torch.allclose(self.residual.float(), residual, atol=1 / 16, rtol=2e-2)
