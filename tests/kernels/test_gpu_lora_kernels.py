"""LoRA shrink/expand on the GPU at Llama-3-8B shapes: Triton vs the reference per dtype.

Every slice group of a layer (qkv, o, gate_up, down), 8 adapter slots with storage padded to
max_lora_rank 64 (the padding NaN), at decode, mid and prefill sizes (each tile row of the
tables). Shrink outputs start as NaN (the launcher must zero them); the expand reads a shrink
output that is NaN wherever it must not read.
"""

from __future__ import annotations

from types import ModuleType

import pytest
import torch

from loraplex.kernels.reference import lora as reference
from loraplex.kernels.triton.lora_expand import EXPAND_TILES, launch_lora_expand
from loraplex.kernels.triton.lora_shrink import SHRINK_TILES, launch_lora_shrink
from tests.kernels.llama3_shapes import GPU_DTYPES, LORA_GROUPS, ROUNDED, SHRINK, assert_close
from tests.kernels.lora_inputs import (
    NAN,
    LoRAKernelInputs,
    make_inputs,
    poisoned_lora_out,
    random_y,
)

pytestmark = pytest.mark.gpu

CUDA = torch.device("cuda")
MAX_LORAS = 8
MAX_LORA_RANK = 64  # the engine's default storage width
Y_OFFSET = 128


def llama3_inputs(group: str, rank: int, num_tokens: int, dtype: torch.dtype) -> LoRAKernelInputs:
    """8 slots at `rank`, except slot 3 (empty), slot 6 (half rank) and slot 2 (without its
    second slice, as an adapter without k_proj / up_proj); tokens spread unevenly (slot 5 gets
    none, slot 1 twice its share), every 7th without an adapter."""
    in_dim, sizes = LORA_GROUPS[group]
    ranks = [[rank] * MAX_LORAS for _ in sizes]
    for slice_ranks in ranks:
        slice_ranks[3] = 0
        slice_ranks[6] = max(rank // 2, 1)
    if len(sizes) > 1:
        ranks[1][2] = 0
    num_plain = num_tokens // 7
    tokens_per_slot = [0] * MAX_LORAS
    for i in range(num_tokens - num_plain):
        tokens_per_slot[1 if i % MAX_LORAS == 5 else i % MAX_LORAS] += 1
    return make_inputs(
        ranks, tokens_per_slot, num_plain, MAX_LORA_RANK, sizes, dtype, CUDA, in_dim=in_dim
    )


def reference_shrink(inputs: LoRAKernelInputs, zero_out: bool = True) -> torch.Tensor:
    out = torch.zeros(inputs.shape, device=CUDA)
    reference.lora_shrink(inputs.x, inputs.lora_a, *inputs.mapping, out, zero_out=zero_out)
    return out


def reference_expand(inputs: LoRAKernelInputs, lora_out: torch.Tensor, y: torch.Tensor) -> None:
    args = (inputs.scalings, y, Y_OFFSET, inputs.slice_sizes)
    reference.lora_expand(lora_out, inputs.lora_b, *inputs.mapping, *args)


@pytest.mark.parametrize("dtype", GPU_DTYPES)
@pytest.mark.parametrize("num_tokens", [1, 32, 256, 2048])
@pytest.mark.parametrize("rank", [8, 16, 64])
@pytest.mark.parametrize("group", list(LORA_GROUPS))
def test_shrink_and_expand_match_reference(
    triton_kernels: ModuleType, group: str, rank: int, num_tokens: int, dtype: torch.dtype
) -> None:
    inputs = llama3_inputs(group, rank, num_tokens, dtype)
    out = torch.full(inputs.shape, NAN, device=CUDA)
    triton_kernels.lora_shrink(inputs.x, inputs.lora_a, *inputs.mapping, out)
    assert_close(out, reference_shrink(inputs), SHRINK[dtype])

    lora_out = poisoned_lora_out(inputs)
    expected = random_y(inputs, dtype, extra_cols=2 * Y_OFFSET)
    actual = expected.clone()
    reference_expand(inputs, lora_out, expected)
    args = (inputs.scalings, actual, Y_OFFSET, inputs.slice_sizes)
    triton_kernels.lora_expand(lora_out, inputs.lora_b, *inputs.mapping, *args)
    assert_close(actual, expected, ROUNDED[dtype])


@pytest.mark.parametrize("dtype", GPU_DTYPES)
@pytest.mark.parametrize("group", list(LORA_GROUPS))
def test_split_k_shrink_adds_into_out_without_zero_out(
    triton_kernels: ModuleType, group: str, dtype: torch.dtype
) -> None:
    """A decode step into a buffer that already holds values: every split-K partial lands."""
    inputs = llama3_inputs(group, 16, 64, dtype)
    start = torch.randn(inputs.shape, device=CUDA)
    actual = start.clone()
    triton_kernels.lora_shrink(inputs.x, inputs.lora_a, *inputs.mapping, actual, zero_out=False)
    assert_close(actual, start + reference_shrink(inputs), SHRINK[dtype])


@pytest.mark.parametrize("row", range(len(SHRINK_TILES.rows)))
@pytest.mark.parametrize("group", list(LORA_GROUPS))
def test_each_tile_row_at_any_size(group: str, row: int) -> None:
    """Each table row's tiles, passed explicitly, on a step the table gives another row."""
    shrink_tiles, expand_tiles = SHRINK_TILES.rows[row][1], EXPAND_TILES.rows[row][1]
    num_tokens = 40 if row else 300
    inputs = llama3_inputs(group, 64, num_tokens, torch.bfloat16)
    out = torch.full(inputs.shape, NAN, device=CUDA)
    launch_lora_shrink(inputs.x, inputs.lora_a, *inputs.mapping, out, True, shrink_tiles)
    assert_close(out, reference_shrink(inputs), SHRINK[torch.bfloat16])

    lora_out = poisoned_lora_out(inputs)
    expected = random_y(inputs, torch.bfloat16, extra_cols=2 * Y_OFFSET)
    actual = expected.clone()
    reference_expand(inputs, lora_out, expected)
    args = (inputs.scalings, actual, Y_OFFSET, inputs.slice_sizes, expand_tiles)
    launch_lora_expand(lora_out, inputs.lora_b, *inputs.mapping, *args)
    assert_close(actual, expected, ROUNDED[torch.bfloat16])
