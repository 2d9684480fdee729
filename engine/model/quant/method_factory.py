"""`QuantConfig` -> the `LinearMethod` each `MergedLinear` gets."""

from __future__ import annotations

from loraplex.engine.model.quant.fp8 import Fp8LinearMethod
from loraplex.engine.model.quant.int4 import Int4LinearMethod
from loraplex.engine.model.quant.linear_method import LinearMethod
from loraplex.engine.model.quant.quant_config import Fp8Config, QuantConfig


def create_linear_method(quant: QuantConfig | None) -> LinearMethod:
    """A fresh method object for one layer (4-bit methods keep per-layer loading state)."""
    if quant is None:
        return LinearMethod()
    if isinstance(quant, Fp8Config):
        return Fp8LinearMethod(quant)
    return Int4LinearMethod(quant)
