"""CPU fast paths: the same signatures as the reference, through PyTorch's fused CPU kernels."""

from loraplex.kernels.cpu.paged_attention import paged_attention

__all__ = ["paged_attention"]
