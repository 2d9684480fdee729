"""Plain-PyTorch references: the executable spec of every kernel (and the CPU path)."""

from loraplex.kernels.reference.fp8 import (
    fp8_scaled_mm,
    fused_add_rms_norm_quant_fp8,
    quantize_fp8_per_token,
    rms_norm_quant_fp8,
    silu_and_mul_quant_fp8,
)
from loraplex.kernels.reference.fused_ops import (
    apply_rotary_pos_emb,
    fused_add_rms_norm,
    rms_norm,
    silu_and_mul,
)
from loraplex.kernels.reference.lora import lora_expand, lora_shrink, silu_and_mul_lora
from loraplex.kernels.reference.paged_attention import (
    paged_attention,
    reshape_and_cache,
    rotary_and_cache,
)
from loraplex.kernels.reference.w4a16 import dequantize_w4, w4a16_dequantize, w4a16_gemm

__all__ = [
    "apply_rotary_pos_emb",
    "dequantize_w4",
    "fp8_scaled_mm",
    "fused_add_rms_norm",
    "fused_add_rms_norm_quant_fp8",
    "lora_expand",
    "lora_shrink",
    "paged_attention",
    "quantize_fp8_per_token",
    "reshape_and_cache",
    "rms_norm",
    "rms_norm_quant_fp8",
    "rotary_and_cache",
    "silu_and_mul",
    "silu_and_mul_quant_fp8",
    "silu_and_mul_lora",
    "w4a16_dequantize",
    "w4a16_gemm",
]
