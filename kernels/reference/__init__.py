"""Plain-PyTorch references: the executable spec of every kernel (and the CPU path)."""

from loraplex.kernels.reference.lora import lora_expand, lora_shrink
from loraplex.kernels.reference.paged_attention import paged_attention, reshape_and_cache

__all__ = ["lora_expand", "lora_shrink", "paged_attention", "reshape_and_cache"]
