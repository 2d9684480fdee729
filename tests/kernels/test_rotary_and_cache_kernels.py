"""rotary_and_cache: Triton vs reference (RoPE on q and k, k and v into the paged cache); -1
slots skipped, every other slot untouched, q/k/v read in place as views of a fused qkv."""

from __future__ import annotations

from types import ModuleType

import pytest
import torch

from loraplex.engine.model.hf_config import RopeConfig
from loraplex.engine.model.rotary import RotaryEmbedding
from loraplex.kernels import reference

# yarn: its attention factor scales cos/sin, so |cos|, |sin| may exceed 1.
YARN = RopeConfig(
    rope_type="yarn", rope_theta=10000.0, factor=4.0, original_max_position_embeddings=16
)
# The interpreter truncates fp32 -> bf16 casts (GPUs round to nearest even, as PyTorch does).
INTERPRETED_BF16_TOLERANCE = 3e-2


def assert_interpreted_close(actual: torch.Tensor, expected: torch.Tensor) -> None:
    tol = INTERPRETED_BF16_TOLERANCE
    torch.testing.assert_close(actual, expected, atol=tol, rtol=tol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize(
    ("num_heads", "num_kv_heads", "head_dim"), [(4, 2, 16), (3, 1, 24), (8, 8, 32), (9, 3, 64)]
)
@pytest.mark.parametrize("block_size", [4, 16])
def test_triton_rotary_and_cache_matches_reference(
    triton_kernels: ModuleType,
    device: torch.device,
    dtype: torch.dtype,
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    block_size: int,
) -> None:
    num_tokens = 13
    num_blocks = num_tokens // block_size + 3
    # q, k and v as strided views of a fused qkv output, as the attention layer passes them.
    qkv = torch.randn(num_tokens, num_heads + 2 * num_kv_heads, head_dim, device=device)
    qkv = qkv.to(dtype)
    q, k, v = qkv.split([num_heads, num_kv_heads, num_kv_heads], dim=1)
    qkv_before = qkv.clone()
    positions = torch.randint(0, 200, (num_tokens,), device=device)
    cos, sin = RotaryEmbedding(YARN, head_dim, device)(positions, dtype)
    slot_mapping = torch.randperm(num_blocks * block_size)[:num_tokens]
    slot_mapping[::4] = -1  # padding tokens: no slot
    slot_mapping = slot_mapping.to(device)
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    initial_k = torch.randn(shape, device=device).to(dtype)
    initial_v = torch.randn(shape, device=device).to(dtype)
    key_cache, value_cache = initial_k.clone(), initial_v.clone()
    expected_k, expected_v = initial_k.clone(), initial_v.clone()

    q_out = triton_kernels.rotary_and_cache(q, k, v, cos, sin, key_cache, value_cache, slot_mapping)
    expected_q = reference.rotary_and_cache(q, k, v, cos, sin, expected_k, expected_v, slot_mapping)
    assert q_out.shape == (num_tokens, num_heads, head_dim) and q_out.is_contiguous()
    assert torch.equal(value_cache, expected_v)  # a copy: exact everywhere
    # Bit for bit: each product and sum rounded to the dtype as the reference's separate ops
    # round (on CUDA the launch turns FMA contraction off). The CPU interpreter's bfloat16
    # casts are not the GPU's, so there only close.
    if dtype == torch.bfloat16 and device.type == "cpu":
        assert_interpreted_close(q_out, expected_q)
        assert_interpreted_close(key_cache, expected_k)
    else:
        assert torch.equal(q_out, expected_q)
        assert torch.equal(key_cache, expected_k)
    assert torch.equal(qkv, qkv_before)  # q, k, v only read
    # The reference itself: written slots hold the rotated key and the value, others unchanged.
    keep = slot_mapping >= 0
    _, rotated_k = reference.apply_rotary_pos_emb(q, k, cos, sin)
    flat_k = expected_k.view(-1, num_kv_heads, head_dim)
    flat_v = expected_v.view(-1, num_kv_heads, head_dim)
    assert torch.equal(flat_k[slot_mapping[keep]], rotated_k[keep])
    assert torch.equal(flat_v[slot_mapping[keep]], v[keep])
    written = torch.zeros(num_blocks * block_size, dtype=torch.bool, device=device)
    written[slot_mapping[keep]] = True
    assert torch.equal(flat_k[~written], initial_k.view(-1, num_kv_heads, head_dim)[~written])
    assert torch.equal(flat_v[~written], initial_v.view(-1, num_kv_heads, head_dim)[~written])


def test_triton_rotary_and_cache_accepts_zero_tokens(
    triton_kernels: ModuleType, device: torch.device
) -> None:
    q, k = torch.empty(0, 4, 16, device=device), torch.empty(0, 2, 16, device=device)
    cos = torch.empty(0, 16, device=device)
    cache = torch.zeros(2, 4, 2, 16, device=device)
    slots = torch.empty(0, dtype=torch.int64, device=device)
    q_out = triton_kernels.rotary_and_cache(q, k, k, cos, cos, cache, cache.clone(), slots)
    assert q_out.shape == (0, 4, 16)
    assert not cache.any()


def test_triton_rotary_and_cache_rejects_mismatched_cache(
    triton_kernels: ModuleType, device: torch.device
) -> None:
    q, k = torch.zeros(3, 4, 16, device=device), torch.zeros(3, 2, 16, device=device)
    cos = torch.zeros(3, 16, device=device)
    cache = torch.zeros(2, 4, 3, 16, device=device)  # 3 KV heads, k has 2
    slots = torch.zeros(3, dtype=torch.int64, device=device)
    with pytest.raises(ValueError, match="rotary_and_cache"):
        triton_kernels.rotary_and_cache(q, k, k, cos, cos, cache, cache.clone(), slots)
