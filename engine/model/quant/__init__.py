"""Quantized linear layers: FP8 W8A8 and AWQ / GPTQ 4-bit W4A16 (docs/quantization.md)."""

from loraplex.engine.errors import QuantizationError
from loraplex.engine.model.quant.linear_method import LinearMethod, WeightTarget
from loraplex.engine.model.quant.method_factory import create_linear_method
from loraplex.engine.model.quant.quant_config import (
    QUANT_METHODS,
    Fp8Config,
    Int4Config,
    QuantConfig,
    resolve_quant_config,
)

__all__ = [
    "QUANT_METHODS",
    "Fp8Config",
    "Int4Config",
    "LinearMethod",
    "QuantConfig",
    "QuantizationError",
    "WeightTarget",
    "create_linear_method",
    "resolve_quant_config",
]
