"""The decoder's fused ops at Llama-3-8B shapes: inputs as the model hands them, and calls."""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType
from typing import Any

import torch

from tests.kernels.llama3_shapes import (
    HIDDEN_SIZE,
    INTERMEDIATE_SIZE,
)

EPS = 1e-5
FUSED_OPS = ("rms_norm", "fused_add_rms_norm", "silu_and_mul")


def fused_op_inputs(
    num_tokens: int, dtype: torch.dtype, device: torch.device
) -> dict[str, torch.Tensor]:
    """The tensors each op sees in the model."""
    return {
        "x": torch.randn(num_tokens, HIDDEN_SIZE, device=device).to(dtype),
        "residual": (4 * torch.randn(num_tokens, HIDDEN_SIZE, device=device)).to(dtype),
        "weight": (1 + 0.1 * torch.randn(HIDDEN_SIZE, device=device)).to(dtype),
        "gate_up": torch.randn(num_tokens, 2 * INTERMEDIATE_SIZE, device=device).to(dtype),
    }


def fused_op_call(
    impl: ModuleType, name: str, t: dict[str, torch.Tensor]
) -> Callable[[], tuple[torch.Tensor, ...]]:
    """A closure running op `name` of `impl` (a kernels module) on `t`; its outputs as a tuple."""
    calls: dict[str, Callable[[], Any]] = {
        "rms_norm": lambda: impl.rms_norm(t["x"], t["weight"], EPS),
        "fused_add_rms_norm": lambda: impl.fused_add_rms_norm(
            t["x"], t["residual"], t["weight"], EPS
        ),
        "silu_and_mul": lambda: impl.silu_and_mul(t["gate_up"]),
    }
    call = calls[name]

    def run() -> tuple[torch.Tensor, ...]:
        out = call()
        return out if isinstance(out, tuple) else (out,)

    return run
