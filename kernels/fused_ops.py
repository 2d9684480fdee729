"""The decoder's small fused ops: Triton for CUDA tensors, the reference everywhere else.

Same rule as `kernels/dispatch.py` (`LORAPLEX_KERNELS=reference` forces the reference); kept
in its own module so the model's elementwise ops and the attention/LoRA kernels evolve
separately. Triton modules are imported on first CUDA use, so CPU hosts need no Triton.
Every op here is CUDA-graph safe on both paths: no host syncs, and output shapes depend on
input shapes only.
"""

from __future__ import annotations

import torch

from loraplex.kernels.dispatch import _use_triton
from loraplex.kernels.reference import fused_ops as reference


def rms_norm(
    x: torch.Tensor,  # [num_tokens, hidden_size]
    weight: torch.Tensor,  # [hidden_size]
    eps: float,
) -> torch.Tensor:
    """HF-style RMSNorm -> [num_tokens, hidden_size]."""
    if _use_triton(x):
        from loraplex.kernels.triton.rms_norm import rms_norm as triton_rms_norm

        return triton_rms_norm(x, weight, eps)
    return reference.rms_norm(x, weight, eps)


def fused_add_rms_norm(
    x: torch.Tensor,  # [num_tokens, hidden_size]
    residual: torch.Tensor,  # [num_tokens, hidden_size]
    weight: torch.Tensor,  # [hidden_size]
    eps: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(rms_norm(x + residual), x + residual), out of place."""
    if _use_triton(x):
        from loraplex.kernels.triton.rms_norm import fused_add_rms_norm as triton_fused

        return triton_fused(x, residual, weight, eps)
    return reference.fused_add_rms_norm(x, residual, weight, eps)


def apply_rotary_pos_emb(
    q: torch.Tensor,  # [num_tokens, num_heads, head_dim]
    k: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
    cos: torch.Tensor,  # [num_tokens, head_dim]
    sin: torch.Tensor,  # [num_tokens, head_dim]
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotate-half RoPE on q and k -> new contiguous (q, k)."""
    if _use_triton(q):
        from loraplex.kernels.triton.rotary import apply_rotary_pos_emb as triton_rotary

        return triton_rotary(q, k, cos, sin)
    return reference.apply_rotary_pos_emb(q, k, cos, sin)


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:  # x [num_tokens, 2 * intermediate_size]
    """silu(gate) * up on a fused [gate | up] row -> [num_tokens, intermediate_size]."""
    if _use_triton(x):
        from loraplex.kernels.triton.silu_and_mul import silu_and_mul as triton_silu_and_mul

        return triton_silu_and_mul(x)
    return reference.silu_and_mul(x)
