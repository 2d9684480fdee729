"""Kernels: Triton on CUDA, the plain-PyTorch reference elsewhere (same signatures).

`LORAPLEX_KERNELS=reference` forces the reference everywhere (debugging, A/B checks).
"""

from loraplex.kernels.dispatch import lora_expand, lora_shrink, paged_attention, reshape_and_cache
from loraplex.kernels.lora_mapping import build_lora_mapping

__all__ = [
    "build_lora_mapping",
    "lora_expand",
    "lora_shrink",
    "paged_attention",
    "reshape_and_cache",
]
