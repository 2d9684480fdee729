"""The decoder's fused ops at Llama-3-8B shapes: inputs as the model hands them, and calls."""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType
from typing import Any

import torch

from loraplex.engine.model.hf_config import RopeConfig
from loraplex.engine.model.rotary import RotaryEmbedding
from tests.kernels.llama3_shapes import (
    HEAD_DIM,
    HIDDEN_SIZE,
    INTERMEDIATE_SIZE,
    NUM_HEADS,
    NUM_KV_HEADS,
)

EPS = 1e-5
LLAMA3_ROPE = RopeConfig(
    rope_type="llama3",
    rope_theta=500000.0,
    factor=8.0,
    low_freq_factor=1.0,
    high_freq_factor=4.0,
    original_max_position_embeddings=8192,
)
FUSED_OPS = ("rms_norm", "fused_add_rms_norm", "apply_rotary_pos_emb", "silu_and_mul")


def fused_op_inputs(
    num_tokens: int, dtype: torch.dtype, device: torch.device
) -> dict[str, torch.Tensor]:
    """The tensors each op sees in the model; q and k are strided views of a fused qkv output."""
    qkv = torch.randn(num_tokens, NUM_HEADS + 2 * NUM_KV_HEADS, HEAD_DIM, device=device)
    qkv = qkv.to(dtype)
    positions = torch.randint(0, 8192, (num_tokens,), device=device)
    cos, sin = RotaryEmbedding(LLAMA3_ROPE, HEAD_DIM, device)(positions, dtype)
    return {
        "x": torch.randn(num_tokens, HIDDEN_SIZE, device=device).to(dtype),
        "residual": (4 * torch.randn(num_tokens, HIDDEN_SIZE, device=device)).to(dtype),
        "weight": (1 + 0.1 * torch.randn(HIDDEN_SIZE, device=device)).to(dtype),
        "q": qkv[:, :NUM_HEADS],
        "k": qkv[:, NUM_HEADS : NUM_HEADS + NUM_KV_HEADS],
        "cos": cos,
        "sin": sin,
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
        "apply_rotary_pos_emb": lambda: impl.apply_rotary_pos_emb(
            t["q"], t["k"], t["cos"], t["sin"]
        ),
        "silu_and_mul": lambda: impl.silu_and_mul(t["gate_up"]),
    }
    call = calls[name]

    def run() -> tuple[torch.Tensor, ...]:
        out = call()
        return out if isinstance(out, tuple) else (out,)

    return run
