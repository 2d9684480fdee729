"""Kernels: Triton on CUDA, the plain-PyTorch reference elsewhere (same signatures).

`LORAPLEX_KERNELS=reference` forces the reference everywhere, `reference:rms_norm,paged_attention`
only for the named ops (debugging, A/B checks of one kernel).
"""

from loraplex.kernels.dispatch import (
    fp8_scaled_mm,
    fused_add_rms_norm,
    fused_add_rms_norm_quant_fp8,
    lora_expand,
    lora_shrink,
    paged_attention,
    quantize_fp8_per_token,
    rms_norm,
    rms_norm_quant_fp8,
    rotary_and_cache,
    silu_and_mul,
    silu_and_mul_lora,
    silu_and_mul_quant_fp8,
    w4a16_gemm,
    warmup_decode_sizes,
    warmup_step_shapes,
)
from loraplex.kernels.lora_mapping import build_lora_mapping

__all__ = [
    "build_lora_mapping",
    "fp8_scaled_mm",
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
    "silu_and_mul_lora",
    "silu_and_mul_quant_fp8",
    "w4a16_gemm",
    "warmup_decode_sizes",
    "warmup_step_shapes",
]
