"""Small layers of the Llama-family decoder: RMSNorm and the SwiGLU activation."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class RMSNorm(nn.Module):
    """RMSNorm as Hugging Face computes it: normalize in float32, cast back, then scale."""

    def __init__(self, hidden_size: int, eps: float, dtype: torch.dtype,
                 device: torch.device) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size, dtype=dtype, device=device),
                                   requires_grad=False)
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x [T, hidden] -> [T, hidden]"""
        input_dtype = x.dtype
        h = x.to(torch.float32)
        variance = h.pow(2).mean(-1, keepdim=True)
        h = h * torch.rsqrt(variance + self.eps)
        return self.weight * h.to(input_dtype)


class SiluAndMul(nn.Module):
    """SwiGLU on a fused [gate | up] projection: silu(gate) * up."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x [T, 2 * intermediate] -> [T, intermediate]"""
        gate, up = x.chunk(2, dim=-1)
        return F.silu(gate) * up
