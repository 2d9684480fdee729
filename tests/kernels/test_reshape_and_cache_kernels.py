"""reshape_and_cache: Triton vs reference; -1 slots skipped, every other slot untouched."""

from __future__ import annotations

from types import ModuleType

import pytest
import torch

from loraplex.kernels import reference


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize(("num_kv_heads", "head_dim"), [(2, 16), (3, 24)])
@pytest.mark.parametrize("block_size", [16, 32])
def test_triton_reshape_and_cache_matches_reference(
    triton_kernels: ModuleType,
    device: torch.device,
    block_size: int,
    num_kv_heads: int,
    head_dim: int,
    dtype: torch.dtype,
) -> None:
    num_tokens, num_blocks = 37, 6
    # key/value as strided views of a fused qkv output, as the model produces them.
    qkv = torch.randn(num_tokens, 4 * num_kv_heads, head_dim, device=device).to(dtype)
    key, value = qkv[:, 2 * num_kv_heads : 3 * num_kv_heads], qkv[:, 3 * num_kv_heads :]
    slot_mapping = torch.randperm(num_blocks * block_size)[:num_tokens]
    slot_mapping[::5] = -1  # padding tokens: skipped
    slot_mapping = slot_mapping.to(device)
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    initial_k = torch.randn(shape, device=device).to(dtype)
    initial_v = torch.randn(shape, device=device).to(dtype)
    expected_k, expected_v = initial_k.clone(), initial_v.clone()
    key_cache, value_cache = initial_k.clone(), initial_v.clone()
    reference.reshape_and_cache(key, value, expected_k, expected_v, slot_mapping)
    triton_kernels.reshape_and_cache(key, value, key_cache, value_cache, slot_mapping)
    assert torch.equal(key_cache, expected_k)
    assert torch.equal(value_cache, expected_v)
    # The reference itself: written slots hold their token's K/V, all other slots are unchanged.
    keep = slot_mapping >= 0
    written = torch.zeros(num_blocks * block_size, dtype=torch.bool, device=device)
    written[slot_mapping[keep]] = True
    flat_v = expected_v.view(-1, num_kv_heads, head_dim)
    assert torch.equal(flat_v[slot_mapping[keep]], value[keep])
    assert torch.equal(flat_v[~written], initial_v.view(-1, num_kv_heads, head_dim)[~written])


def test_triton_reshape_and_cache_leaves_skipped_slots_untouched(
    triton_kernels: ModuleType, device: torch.device
) -> None:
    key = torch.randn(4, 2, 16, device=device)
    cache = torch.zeros(2, 16, 2, 16, device=device)
    value_cache = torch.zeros_like(cache)
    slot_mapping = torch.tensor([-1, 3, -1, 17], device=device)
    triton_kernels.reshape_and_cache(key, key, cache, value_cache, slot_mapping)
    flat = cache.view(-1, 2, 16)
    assert torch.equal(flat[3], key[1]) and torch.equal(flat[17], key[3])
    assert int((flat.abs().sum(dim=(1, 2)) != 0).sum()) == 2
    assert torch.equal(value_cache, cache)
