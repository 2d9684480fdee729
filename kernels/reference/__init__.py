"""Plain-PyTorch references: the executable spec of every kernel (and the CPU path)."""

from loraplex.kernels.reference.fused_ops import (
    apply_rotary_pos_emb,
    fused_add_rms_norm,
    rms_norm,
    silu_and_mul,
)
from loraplex.kernels.reference.lora import lora_expand, lora_shrink
from loraplex.kernels.reference.paged_attention import paged_attention, reshape_and_cache

__all__ = [
    "apply_rotary_pos_emb",
    "fused_add_rms_norm",
    "lora_expand",
    "lora_shrink",
    "paged_attention",
    "reshape_and_cache",
    "rms_norm",
    "silu_and_mul",
]
