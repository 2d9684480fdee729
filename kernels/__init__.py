"""Kernels: Triton on CUDA, the plain-PyTorch reference elsewhere (same signatures).

`LORAPLEX_KERNELS=reference` forces the reference everywhere (debugging, A/B checks).
"""

from loraplex.kernels.dispatch import paged_attention, reshape_and_cache

__all__ = ["paged_attention", "reshape_and_cache"]
