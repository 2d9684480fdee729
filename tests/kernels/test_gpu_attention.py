"""Paged attention and the KV-cache write on the GPU at Llama-3-8B shapes, per dtype.

32 query heads over 8 kv heads, head_dim 128, block_size 16; cache blocks nobody owns and
slots past each sequence's length hold NaN (tests/kernels/paged_inputs.py).
"""

from __future__ import annotations

from types import ModuleType

import pytest
import torch

from loraplex.engine.model.rotary import RotaryEmbedding
from loraplex.kernels import reference
from tests.kernels.llama3_shapes import (
    BLOCK_SIZE,
    GPU_DTYPES,
    HEAD_DIM,
    LLAMA3_ROPE,
    NUM_HEADS,
    NUM_KV_HEADS,
    ROUNDED,
    assert_close,
)
from tests.kernels.paged_inputs import make_paged_batch

pytestmark = pytest.mark.gpu

CUDA = torch.device("cuda")
SCALE = HEAD_DIM**-0.5
# name -> (seq_lens, query tokens per sequence, sliding window)
BATCHES = {
    "mixed-2-chunks-1-prompt-13-decodes": (
        [700, 1000, 333] + [640 + 7 * i for i in range(13)],
        [200, 512, 333] + [1] * 13,
        None,
    ),
    "decode-64-seqs-ctx-640": ([640] * 64, [1] * 64, None),
    # split-KV: lengths from 1 to 4,096, so some sequences use every split and some one
    "decode-64-seqs-ctx-1-to-4096": (
        [1 + (i * 977) % 4096 for i in range(63)] + [4096],
        [1] * 64,
        None,
    ),
    "decode-4-seqs-16-splits": ([4096, 1, 700, 2049], [1] * 4, None),
    "decode-32-seqs-sliding-window-1000": (
        [1 + (i * 331) % 3000 for i in range(32)],
        [1] * 32,
        1000,
    ),
    "mixed-sliding-window-256": ([700, 1000, 90, 640], [200, 512, 90, 1], 256),
}


@pytest.mark.parametrize("dtype", GPU_DTYPES)
@pytest.mark.parametrize("batch_name", list(BATCHES))
def test_paged_attention_matches_reference(
    triton_kernels: ModuleType, batch_name: str, dtype: torch.dtype
) -> None:
    seq_lens, q_lens, window = BATCHES[batch_name]
    batch = make_paged_batch(
        seq_lens, q_lens, NUM_HEADS, NUM_KV_HEADS, HEAD_DIM, BLOCK_SIZE, dtype, CUDA
    )
    expected = reference.paged_attention(*batch.args, SCALE, window)
    actual = triton_kernels.paged_attention(*batch.args, SCALE, window)
    assert_close(actual, expected, ROUNDED[dtype])


@pytest.mark.parametrize("dtype", GPU_DTYPES)
@pytest.mark.parametrize("num_tokens", [64, 4096])
def test_rotary_and_cache_matches_reference_bit_for_bit(
    triton_kernels: ModuleType, dtype: torch.dtype, num_tokens: int
) -> None:
    """RoPE rounds as HF's separate ops do (no FMA contraction); k and v land in their slots
    exactly, -1 slots are skipped and every other slot keeps what it held."""
    num_blocks = num_tokens // BLOCK_SIZE + 8
    qkv = torch.randn(num_tokens, NUM_HEADS + 2 * NUM_KV_HEADS, HEAD_DIM, device=CUDA).to(dtype)
    q, k, v = qkv.split([NUM_HEADS, NUM_KV_HEADS, NUM_KV_HEADS], dim=1)
    positions = torch.randint(0, 8192, (num_tokens,), device=CUDA)
    cos, sin = RotaryEmbedding(LLAMA3_ROPE, HEAD_DIM, CUDA)(positions, dtype)
    slot_mapping = torch.randperm(num_blocks * BLOCK_SIZE, device=CUDA)[:num_tokens]
    slot_mapping[::9] = -1
    shape = (num_blocks, BLOCK_SIZE, NUM_KV_HEADS, HEAD_DIM)
    key_cache, value_cache = (torch.randn(shape, device=CUDA).to(dtype) for _ in range(2))
    ref_k, ref_v = key_cache.clone(), value_cache.clone()
    ref_q = reference.rotary_and_cache(q, k, v, cos, sin, ref_k, ref_v, slot_mapping)
    q_out = triton_kernels.rotary_and_cache(q, k, v, cos, sin, key_cache, value_cache, slot_mapping)
    assert torch.equal(q_out, ref_q)
    assert torch.equal(key_cache, ref_k)
    assert torch.equal(value_cache, ref_v)
