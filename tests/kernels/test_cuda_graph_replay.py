"""Kernels captured in a CUDA graph and replayed on new data of the same shapes.

The engine replays decode graphs with a new batch every step: the kernels' grids must depend on
shapes only and every launcher-side step (the shrink's memset) must be captured. Each test
captures once, changes the inputs in place, replays, and compares with the reference run
eagerly on the new inputs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from types import ModuleType
from typing import TypeVar

import pytest
import torch

from loraplex.kernels import reference
from tests.kernels.fused_op_inputs import FUSED_OPS, fused_op_call, fused_op_inputs
from tests.kernels.llama3_shapes import (
    BLOCK_SIZE,
    GPU_DTYPES,
    HEAD_DIM,
    LORA_GROUPS,
    NUM_HEADS,
    NUM_KV_HEADS,
    ROUNDED,
    SHRINK,
    assert_close,
)
from tests.kernels.lora_inputs import NAN, LoRACase, copy_inputs, make_inputs
from tests.kernels.paged_inputs import make_paged_batch

pytestmark = pytest.mark.gpu

CUDA = torch.device("cuda")
PAGE_SIZE = 2 * BLOCK_SIZE * NUM_KV_HEADS * HEAD_DIM  # a KV block of every head: 32768
R = TypeVar("R")


def capture(fn: Callable[[], R]) -> tuple[torch.cuda.CUDAGraph, R]:
    """Run `fn` once (compiles, warms up), then capture it; returns the graph and its outputs."""
    fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn()
    return graph, out


@pytest.mark.parametrize("dtype", GPU_DTYPES)
def test_lora_shrink_then_expand_replay_with_new_adapters_and_mapping(
    triton_kernels: ModuleType, dtype: torch.dtype
) -> None:
    """qkv at a 64-token decode step, 8 batch slots of rank <= 16, the shrink output 64 wide.
    After capture every input changes in place: other adapters in other pages (ranks, page
    tables, first pages, scalings), the slots mapped to other adapter rows (two of them unused
    at capture), another token -> slot mapping, another x."""
    in_dim, sizes = LORA_GROUPS["qkv"]
    captured = LoRACase(
        ranks=((16, 16, 8, 0) * 2, (16, 16, 0, 0) * 2, (16, 16, 8, 0) * 2),
        tokens_per_slot=(10, 10, 10, 0) * 2,
        num_plain=4,
        max_rank=64,
        slice_sizes=sizes,
        page_size=PAGE_SIZE,
        in_dim=in_dim,
        slot_adapters=(9, 8, 7, 6, 5, 4, 3, 2),
    )
    replayed = replace(
        captured,
        ranks=(
            (4, 16, 8, 16, 0, 16, 8, 16),
            (16, 8, 0, 4, 16, 16, 8, 0),
            (16, 16, 8, 0, 4, 16, 0, 16),
        ),
        tokens_per_slot=(8, 8, 8, 8, 8, 8, 8, 0),
        num_plain=8,
        slot_adapters=(0, 1, 4, 3, 2, 9, 8, 7),
    )
    # One pool and page-table size for both (a rank-16 qkv adapter takes 10 pages of 32768).
    pool = {"num_pages": 96, "max_pages": 16}
    inputs = make_inputs(captured, dtype, CUDA, **pool)
    shrunk = torch.zeros(inputs.shape, device=CUDA)
    y = torch.zeros(inputs.x.shape[0], sum(sizes), device=CUDA, dtype=dtype)

    def lora_step() -> None:
        triton_kernels.lora_shrink(inputs.x, *inputs.shrink_tables, shrunk)
        triton_kernels.lora_expand(shrunk, *inputs.expand_tables, y, 0, sizes)

    graph, _ = capture(lora_step)
    copy_inputs(inputs, make_inputs(replayed, dtype, CUDA, **pool))
    shrunk.fill_(NAN)  # the captured memset must zero it again
    y.copy_(torch.randn_like(y))
    y_before = y.clone()
    graph.replay()

    expected_shrunk = torch.zeros_like(shrunk)
    reference.lora_shrink(inputs.x, *inputs.shrink_tables, expected_shrunk)
    assert_close(shrunk, expected_shrunk, SHRINK[dtype])
    expected_y = y_before
    reference.lora_expand(expected_shrunk, *inputs.expand_tables, expected_y, 0, sizes)
    assert_close(y, expected_y, ROUNDED[dtype])


@pytest.mark.parametrize("dtype", GPU_DTYPES)
def test_paged_attention_decode_replay_with_longer_sequences(
    triton_kernels: ModuleType, dtype: torch.dtype
) -> None:
    """32 decode sequences captured at one length, replayed 150 tokens later."""
    final_lens = [790 + 3 * i for i in range(32)]  # what the cache holds (NaN past it)
    batch = make_paged_batch(
        final_lens, [1] * 32, NUM_HEADS, NUM_KV_HEADS, HEAD_DIM, BLOCK_SIZE, dtype, CUDA
    )
    batch.seq_lens.sub_(150)
    scale = HEAD_DIM**-0.5
    graph, out = capture(lambda: triton_kernels.paged_attention(*batch.args, scale))
    batch.seq_lens.add_(150)
    batch.query.copy_(torch.randn_like(batch.query))
    graph.replay()
    assert_close(out, reference.paged_attention(*batch.args, scale), ROUNDED[dtype])


@pytest.mark.parametrize("dtype", GPU_DTYPES)
@pytest.mark.parametrize("op", FUSED_OPS)
def test_fused_op_replay_on_new_inputs(
    triton_kernels: ModuleType, op: str, dtype: torch.dtype
) -> None:
    inputs = fused_op_inputs(64, dtype, CUDA)
    graph, out = capture(fused_op_call(triton_kernels, op, inputs))
    fresh = fused_op_inputs(64, dtype, CUDA)
    for name, t in inputs.items():
        t.copy_(fresh[name])
    graph.replay()
    expected = fused_op_call(reference, op, inputs)()
    for a, e in zip(out, expected, strict=True):
        assert_close(a, e, ROUNDED[dtype])
