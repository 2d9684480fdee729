"""Llama-3-8B shapes and per-dtype tolerances of the GPU kernel tests (`pytest -m gpu`).

Tolerances compare Triton with the reference on O(1) values. Outputs rounded to a 16-bit dtype
may differ by a rounding or two (bf16 keeps 8 significant bits: ~1e-2 relative); float32
outputs and the float32 shrink output only by the order of float32 additions. NaN never
passes: `torch.testing.assert_close` treats NaN as unequal to everything.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch

from loraplex.engine.model.hf_config import RopeConfig

HIDDEN_SIZE = 4096
INTERMEDIATE_SIZE = 14336
NUM_HEADS = 32
NUM_KV_HEADS = 8
HEAD_DIM = 128
BLOCK_SIZE = 16
LLAMA3_ROPE = RopeConfig(
    rope_type="llama3",
    rope_theta=500000.0,
    factor=8.0,
    low_freq_factor=1.0,
    high_freq_factor=4.0,
    original_max_position_embeddings=8192,
)
# One layer's LoRA slice groups, as LoRASlots stacks them: name -> (in_dim, out_dim per slice).
LORA_GROUPS: dict[str, tuple[int, tuple[int, ...]]] = {
    "qkv": (HIDDEN_SIZE, (NUM_HEADS * HEAD_DIM, NUM_KV_HEADS * HEAD_DIM, NUM_KV_HEADS * HEAD_DIM)),
    "o": (NUM_HEADS * HEAD_DIM, (HIDDEN_SIZE,)),
    "gate_up": (HIDDEN_SIZE, (INTERMEDIATE_SIZE, INTERMEDIATE_SIZE)),
    "down": (INTERMEDIATE_SIZE, (HIDDEN_SIZE,)),
}
GPU_DTYPES = [
    pytest.param(torch.bfloat16, id="bf16"),
    pytest.param(torch.float16, id="fp16"),
    pytest.param(torch.float32, id="fp32"),
]


@dataclass(frozen=True)
class Tolerance:
    atol: float
    rtol: float


# Outputs rounded to the activation dtype (y of the expand, attention, the fused ops).
ROUNDED = {
    torch.bfloat16: Tolerance(atol=2e-2, rtol=2e-2),
    torch.float16: Tolerance(atol=5e-3, rtol=5e-3),
    torch.float32: Tolerance(atol=1e-4, rtol=1e-4),
}
# The shrink's float32 output: exact products of the inputs, summed in another order.
SHRINK = {
    torch.bfloat16: Tolerance(atol=1e-3, rtol=1e-3),
    torch.float16: Tolerance(atol=1e-3, rtol=1e-3),
    torch.float32: Tolerance(atol=1e-4, rtol=1e-4),
}


def assert_close(actual: torch.Tensor, expected: torch.Tensor, tol: Tolerance) -> None:
    """Same dtype and shape, close within `tol`, no NaN on either side."""
    torch.testing.assert_close(actual, expected, atol=tol.atol, rtol=tol.rtol)
