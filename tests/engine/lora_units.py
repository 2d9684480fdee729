"""A tiny architecture and random in-memory adapters for the LoRA unit tests."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from loraplex.engine.lora.adapter import LoRAAdapter, lora_module_shapes


@dataclass(frozen=True)
class Arch:
    model_type: str = "llama"
    hidden_size: int = 32
    intermediate_size: int = 48
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    head_dim: int = 8


ARCH = Arch()
SHAPES = lora_module_shapes(ARCH)  # (in_dim, out_dim) per module


def make_adapter(rank: int, target_modules: tuple[str, ...], seed: int) -> LoRAAdapter:
    """Random float32 weights for every layer of `ARCH`; scaling 2 + seed."""
    gen = torch.Generator().manual_seed(seed)
    weights = {}
    for layer in range(ARCH.num_hidden_layers):
        for module in target_modules:
            in_dim, out_dim = SHAPES[module]
            weights[(layer, module)] = (
                torch.randn(rank, in_dim, generator=gen),
                torch.randn(out_dim, rank, generator=gen),
            )
    return LoRAAdapter(
        rank=rank,
        lora_alpha=2.0 * rank,
        scaling=2.0 + seed,
        target_modules=target_modules,
        weights=weights,
        content_hash=f"hash-{seed}",
        size_bytes=0,
        base_model_name_or_path=None,
    )
