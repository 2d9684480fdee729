"""Small layers of the Llama-family decoder: RMSNorm (with the fused residual add) and SwiGLU.

The math lives in `loraplex.kernels` (Triton on CUDA, the HF-exact reference on CPU).
"""

from __future__ import annotations

from typing import overload

import torch
from torch import nn

from loraplex.engine.model.quant.linear_method import QuantizedInput
from loraplex.kernels import (
    fused_add_rms_norm,
    fused_add_rms_norm_quant_fp8,
    rms_norm,
    rms_norm_quant_fp8,
    silu_and_mul,
)


class RMSNorm(nn.Module):
    """RMSNorm as Hugging Face computes it: normalize in float32, cast back, then scale.

    Called with a residual it first adds it (vLLM's fused_add_rms_norm):
    `norm(x, residual) -> (norm(x + residual), x + residual)`, one kernel on CUDA.
    """

    def __init__(
        self, hidden_size: int, eps: float, dtype: torch.dtype, device: torch.device
    ) -> None:
        super().__init__()
        self.weight = nn.Parameter(
            torch.ones(hidden_size, dtype=dtype, device=device), requires_grad=False
        )
        self.eps = eps
        # Set by a decoder layer whose projection after this norm takes FP8 input.
        self.quantize_fp8 = False

    @overload
    def forward(self, x: torch.Tensor, residual: None = None) -> torch.Tensor: ...

    @overload
    def forward(
        self, x: torch.Tensor, residual: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]: ...

    def forward(
        self, x: torch.Tensor, residual: torch.Tensor | None = None
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """x, residual [T, hidden] -> normed [T, hidden], or (normed, x + residual)"""
        if residual is None:
            return rms_norm(x, self.weight, self.eps)
        return fused_add_rms_norm(x, residual, self.weight, self.eps)

    def forward_projection_input(
        self, x: torch.Tensor, residual: torch.Tensor | None, keep_unquantized: bool
    ) -> tuple[torch.Tensor | None, torch.Tensor | None, QuantizedInput | None]:
        """A projection's input: (normed, x + residual or None without a residual, and with
        `quantize_fp8` the normed output quantized to FP8 per token in the same pass, else
        None). With `quantize_fp8` and not `keep_unquantized` (no adapter's shrink reads it),
        normed is None: only the FP8 copy is written."""
        if not self.quantize_fp8:  # through __call__, so module hooks see the norm
            if residual is None:
                return self(x), None, None
            normed, new_residual = self(x, residual)
            return normed, new_residual, None
        if residual is None:
            out, values, scale = rms_norm_quant_fp8(x, self.weight, self.eps, keep_unquantized)
            return out, None, QuantizedInput(values, scale)
        out, new_residual, values, scale = fused_add_rms_norm_quant_fp8(
            x, residual, self.weight, self.eps, keep_unquantized
        )
        return out, new_residual, QuantizedInput(values, scale)


class SiluAndMul(nn.Module):
    """SwiGLU on a fused [gate | up] projection: silu(gate) * up."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x [T, 2 * intermediate] -> [T, intermediate]"""
        return silu_and_mul(x)
