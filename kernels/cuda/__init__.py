"""CUDA paths that are not Triton kernels (cuBLAS through PyTorch); same signatures as the
references."""

from loraplex.kernels.cuda.fp8_scaled_mm import fp8_scaled_mm

__all__ = ["fp8_scaled_mm"]
