"""Write this step's keys and values into the paged KV cache (PagedAttention) in Triton.

Method: vLLM's `reshape_and_cache` (Kwon et al., 2023, "Efficient Memory Management for Large
Language Model Serving with PagedAttention"). Token t goes to cache slot `slot_mapping[t]`:

    slot = block_id * block_size + offset   ->   key_cache[block_id, offset, :, :] = key[t]

One program per token copies its [num_kv_heads, head_dim] key and value rows; a slot of -1
(padding) is skipped. A kernel rather than `index_copy_`: skipping -1 slots in PyTorch needs a
boolean mask and hence a host sync (not CUDA-graph capturable), the copy reads strided key/value
views (slices of the fused qkv output) without making them contiguous, and K and V go in one
launch.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from loraplex.kernels.launch_checks import check, check_contiguous_last_dim, check_one_device
from loraplex.kernels.triton.grid_math import next_power_of_2

OP = "reshape_and_cache"

NUM_WARPS = 4


@triton.jit
def copy_heads(  # type: ignore[no-untyped-def]
    src_ptr,
    dst_ptr,
    stride_h,
    dst_stride_h,
    NUM_HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    HEADS_PAD: tl.constexpr,
    HEAD_DIM_PAD: tl.constexpr,
):
    """One token's [NUM_HEADS, HEAD_DIM] row from src_ptr to dst_ptr (head strides given)."""
    offs_h = tl.arange(0, HEADS_PAD)
    offs_d = tl.arange(0, HEAD_DIM_PAD)
    mask = (offs_h < NUM_HEADS)[:, None] & (offs_d < HEAD_DIM)[None, :]
    row = tl.load(src_ptr + offs_h[:, None] * stride_h + offs_d[None, :], mask=mask)
    tl.store(dst_ptr + offs_h[:, None] * dst_stride_h + offs_d[None, :], row, mask=mask)


@triton.jit
def _reshape_and_cache_kernel(  # type: ignore[no-untyped-def]
    key_ptr,
    value_ptr,
    key_cache_ptr,
    value_cache_ptr,
    slot_mapping_ptr,
    stride_kt,
    stride_kh,
    stride_vt,
    stride_vh,
    stride_kcb,
    stride_kcs,
    stride_kch,
    stride_vcb,
    stride_vcs,
    stride_vch,
    NUM_KV_HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    HEADS_PAD: tl.constexpr,
    HEAD_DIM_PAD: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
):
    token = tl.program_id(0).to(tl.int64)
    slot = tl.load(slot_mapping_ptr + token).to(tl.int64)
    if slot < 0:
        return
    block_id = slot // BLOCK_SIZE
    offset = slot % BLOCK_SIZE
    copy_heads(
        key_ptr + token * stride_kt,
        key_cache_ptr + block_id * stride_kcb + offset * stride_kcs,
        stride_kh,
        stride_kch,
        NUM_KV_HEADS,
        HEAD_DIM,
        HEADS_PAD,
        HEAD_DIM_PAD,
    )
    copy_heads(
        value_ptr + token * stride_vt,
        value_cache_ptr + block_id * stride_vcb + offset * stride_vcs,
        stride_vh,
        stride_vch,
        NUM_KV_HEADS,
        HEAD_DIM,
        HEADS_PAD,
        HEAD_DIM_PAD,
    )


def reshape_and_cache(
    key: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
    value: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
    key_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    value_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    slot_mapping: torch.Tensor,  # [num_tokens] int64; -1 = skip
) -> None:
    """key_cache/value_cache[slot // block_size, slot % block_size] = key/value[t] (in place)."""
    check_cache_write_args(OP, key, value, key_cache, value_cache, slot_mapping)
    num_tokens, num_kv_heads, head_dim = key.shape
    if num_tokens == 0:
        return

    _reshape_and_cache_kernel[(num_tokens,)](
        key,
        value,
        key_cache,
        value_cache,
        slot_mapping,
        key.stride(0),
        key.stride(1),
        value.stride(0),
        value.stride(1),
        key_cache.stride(0),
        key_cache.stride(1),
        key_cache.stride(2),
        value_cache.stride(0),
        value_cache.stride(1),
        value_cache.stride(2),
        NUM_KV_HEADS=num_kv_heads,
        HEAD_DIM=head_dim,
        HEADS_PAD=next_power_of_2(num_kv_heads),
        HEAD_DIM_PAD=next_power_of_2(head_dim),
        BLOCK_SIZE=key_cache.shape[1],
        num_warps=NUM_WARPS,
    )


def check_cache_write_args(
    op: str,
    key: torch.Tensor,
    value: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Raise ValueError unless key/value [T, H, D] can be written into the caches at the slots."""
    check(op, key.dim() == 3 and key.shape == value.shape, "key and value must be equal [T, H, D]")
    check(
        op,
        key_cache.dim() == 4 and key_cache.shape == value_cache.shape,
        "key_cache and value_cache must be equal [num_blocks, block_size, H, D]",
    )
    num_tokens, num_kv_heads, head_dim = key.shape
    check(op, key_cache.shape[2:] == (num_kv_heads, head_dim), "cache heads/head_dim != key's")
    check(
        op,
        key.dtype == value.dtype == key_cache.dtype == value_cache.dtype,
        "key, value and caches must share one dtype",
    )
    check(
        op,
        slot_mapping.shape == (num_tokens,) and slot_mapping.dtype == torch.int64,
        "slot_mapping must be int64 [num_tokens]",
    )
    check(op, slot_mapping.is_contiguous(), "slot_mapping must be contiguous")
    check_contiguous_last_dim(
        op, key=key, value=value, key_cache=key_cache, value_cache=value_cache
    )
    check_one_device(op, key, value, key_cache, value_cache, slot_mapping)
