"""Plain-PyTorch references: the executable spec of every kernel (and the CPU path)."""

from loraplex.kernels.reference.paged_attention import paged_attention, reshape_and_cache

__all__ = ["paged_attention", "reshape_and_cache"]
