"""Triton kernels (the CUDA fast path); same signatures as `loraplex.kernels.reference`."""

from loraplex.kernels.triton.fp8_quant import quantize_fp8_per_token
from loraplex.kernels.triton.lora_expand import lora_expand
from loraplex.kernels.triton.lora_shrink import lora_shrink
from loraplex.kernels.triton.paged_attention import paged_attention
from loraplex.kernels.triton.rms_norm import (
    fused_add_rms_norm,
    fused_add_rms_norm_quant_fp8,
    rms_norm,
    rms_norm_quant_fp8,
)
from loraplex.kernels.triton.rotary_and_cache import rotary_and_cache
from loraplex.kernels.triton.silu_and_mul import silu_and_mul
from loraplex.kernels.triton.silu_and_mul_fp8 import silu_and_mul_quant_fp8
from loraplex.kernels.triton.silu_and_mul_lora import silu_and_mul_lora
from loraplex.kernels.triton.w4a16 import w4a16_gemm
from loraplex.kernels.triton.w4a16_dequantize import w4a16_dequantize

__all__ = [
    "fused_add_rms_norm",
    "fused_add_rms_norm_quant_fp8",
    "lora_expand",
    "lora_shrink",
    "paged_attention",
    "quantize_fp8_per_token",
    "rms_norm",
    "rms_norm_quant_fp8",
    "rotary_and_cache",
    "silu_and_mul",
    "silu_and_mul_quant_fp8",
    "silu_and_mul_lora",
    "w4a16_dequantize",
    "w4a16_gemm",
]
