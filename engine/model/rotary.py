"""Rotary position embedding (RoPE) with the scalings Llama-family checkpoints use.

Numerics follow Hugging Face transformers exactly: `inv_freq` in float32, angles
`position * inv_freq` in float32, the "rotate_half" layout (the two halves of a head are the
real and imaginary parts), cos/sin cast to the activation dtype before they are applied.
`RotaryEmbedding` computes cos/sin once per step; each attention layer applies them with
`loraplex.kernels.rotary_and_cache` (which also writes the rotated keys into the KV cache).
"""

from __future__ import annotations

import math

import torch
from torch import nn

from loraplex.engine.model.hf_config import RopeConfig


def compute_inv_freq(rope: RopeConfig, head_dim: int) -> tuple[torch.Tensor, float]:
    """Inverse frequencies [head_dim // 2] float32 and the cos/sin scale ("attention factor")."""
    dim = head_dim
    exponents = torch.arange(0, dim, 2, dtype=torch.int64).to(torch.float32) / dim
    inv_freq = 1.0 / (rope.rope_theta**exponents)  # [dim // 2]
    if rope.rope_type in ("default", "dynamic"):
        return inv_freq, 1.0
    if rope.rope_type == "linear":
        return inv_freq / rope.factor, 1.0
    if rope.rope_type == "llama3":
        return _llama3_inv_freq(rope, inv_freq), 1.0
    if rope.rope_type == "yarn":
        return _yarn_inv_freq(rope, dim)
    raise ValueError(f"unknown rope type {rope.rope_type!r}")


def _llama3_inv_freq(rope: RopeConfig, inv_freq: torch.Tensor) -> torch.Tensor:
    # Long wavelengths are slowed down by `factor`, short ones kept, the band between blended.
    assert rope.original_max_position_embeddings is not None
    old_context_len = rope.original_max_position_embeddings
    low_freq_wavelen = old_context_len / rope.low_freq_factor
    high_freq_wavelen = old_context_len / rope.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / rope.factor, inv_freq)
    smooth = (old_context_len / wavelen - rope.low_freq_factor) / (
        rope.high_freq_factor - rope.low_freq_factor
    )
    smoothed = (1 - smooth) * scaled / rope.factor + smooth * scaled
    is_medium = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
    return torch.where(is_medium, smoothed, scaled)


def _yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def _yarn_inv_freq(rope: RopeConfig, dim: int) -> tuple[torch.Tensor, float]:
    assert rope.original_max_position_embeddings is not None
    base, factor = rope.rope_theta, rope.factor
    original_max = rope.original_max_position_embeddings
    attention_factor = rope.attention_factor
    if attention_factor is None:
        if rope.mscale and rope.mscale_all_dim:
            attention_factor = _yarn_mscale(factor, rope.mscale) / _yarn_mscale(
                factor, rope.mscale_all_dim
            )
        else:
            attention_factor = _yarn_mscale(factor)

    def correction_dim(num_rotations: float) -> float:
        return (dim * math.log(original_max / (num_rotations * 2 * math.pi))) / (2 * math.log(base))

    low, high = correction_dim(rope.beta_fast), correction_dim(rope.beta_slow)
    if rope.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # avoid a zero-width ramp
    pos_freqs = base ** (torch.arange(0, dim, 2).to(torch.float32) / dim)
    ramp = torch.clamp((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low), 0, 1)
    extrapolation_factor = 1 - ramp
    inv_freq = (1.0 / (factor * pos_freqs)) * (1 - extrapolation_factor) + (
        1.0 / pos_freqs
    ) * extrapolation_factor
    return inv_freq, float(attention_factor)


class RotaryEmbedding(nn.Module):
    """Computes cos/sin for a step's positions once; every attention layer applies them."""

    def __init__(self, rope: RopeConfig, head_dim: int, device: torch.device) -> None:
        super().__init__()
        inv_freq, self.attention_scaling = compute_inv_freq(rope, head_dim)
        self.inv_freq: torch.Tensor
        self.register_buffer("inv_freq", inv_freq.to(device), persistent=False)

    def forward(
        self, positions: torch.Tensor, dtype: torch.dtype
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """positions [T] int64 -> (cos, sin), each [T, head_dim] in `dtype`."""
        freqs = positions[:, None].float() * self.inv_freq[None, :]  # [T, head_dim // 2]
        emb = torch.cat((freqs, freqs), dim=-1)  # [T, head_dim]
        cos = emb.cos() * self.attention_scaling
        sin = emb.sin() * self.attention_scaling
        return cos.to(dtype), sin.to(dtype)
