"""Triton kernels (the CUDA fast path); same signatures as `loraplex.kernels.reference`."""

from loraplex.kernels.triton.lora_expand import lora_expand
from loraplex.kernels.triton.lora_shrink import lora_shrink
from loraplex.kernels.triton.paged_attention import paged_attention
from loraplex.kernels.triton.reshape_and_cache import reshape_and_cache

__all__ = ["lora_expand", "lora_shrink", "paged_attention", "reshape_and_cache"]
