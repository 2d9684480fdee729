"""LoRA shrink/expand on the GPU at Llama-3-8B shapes: Triton vs the reference per dtype.

Every slice group of a layer (qkv, o, gate_up, down), 8 batch slots mapped to adapter rows that
are not their own (tests/kernels/lora_inputs.py: unused rows, pages and page tails are NaN), the
shrink output max_lora_rank 64 wide, at decode, mid and prefill sizes (each tile row of the
tables). Pages are the KV cache's blocks: 32768 elements at block_size 16, so every row of A and
B^T fits a page; at block_size 1 (2048) rows of 4096 and 14336 span pages (the SPLIT_ROWS
kernels). Shrink outputs start as NaN (the launcher must zero them); the expand reads a shrink
output that is NaN wherever it must not read.
"""

from __future__ import annotations

from types import ModuleType

import pytest
import torch

from loraplex.kernels.reference import lora as reference
from loraplex.kernels.triton.lora_expand import EXPAND_TILES, launch_lora_expand
from loraplex.kernels.triton.lora_shrink import SHRINK_TILES, launch_lora_shrink
from tests.kernels.llama3_shapes import (
    BLOCK_SIZE,
    GPU_DTYPES,
    HEAD_DIM,
    LORA_GROUPS,
    NUM_KV_HEADS,
    ROUNDED,
    SHRINK,
    assert_close,
)
from tests.kernels.lora_inputs import (
    NAN,
    LoRACase,
    LoRAKernelInputs,
    make_inputs,
    poisoned_lora_out,
    random_y,
)

pytestmark = pytest.mark.gpu

CUDA = torch.device("cuda")
NUM_SLOTS = 8
MAX_LORA_RANK = 64  # the engine's default: the shrink output's width
Y_OFFSET = 128
PAGE_SIZE = 2 * BLOCK_SIZE * NUM_KV_HEADS * HEAD_DIM  # 32768: one KV block of every head
SMALL_PAGE_SIZE = 2 * 1 * NUM_KV_HEADS * HEAD_DIM  # 2048: block_size 1


def llama3_inputs(
    group: str, rank: int, num_tokens: int, dtype: torch.dtype, page_size: int = PAGE_SIZE
) -> LoRAKernelInputs:
    """8 slots at `rank`, except slot 3 (an adapter targeting no slice of the group), slot 6
    (half rank) and slot 2 (without its second slice, as an adapter without k_proj / up_proj);
    tokens spread unevenly (slot 5 gets none, slot 1 twice its share), every 7th without an
    adapter. Slot s maps to adapter row 9 - s (rows 0 and 1 unused)."""
    in_dim, sizes = LORA_GROUPS[group]
    ranks = [[rank] * NUM_SLOTS for _ in sizes]
    for slice_ranks in ranks:
        slice_ranks[3] = 0
        slice_ranks[6] = max(rank // 2, 1)
    if len(sizes) > 1:
        ranks[1][2] = 0
    num_plain = num_tokens // 7
    tokens_per_slot = [0] * NUM_SLOTS
    for i in range(num_tokens - num_plain):
        tokens_per_slot[1 if i % NUM_SLOTS == 5 else i % NUM_SLOTS] += 1
    case = LoRACase(
        ranks=tuple(tuple(r) for r in ranks),
        tokens_per_slot=tuple(tokens_per_slot),
        num_plain=num_plain,
        max_rank=MAX_LORA_RANK,
        slice_sizes=sizes,
        page_size=page_size,
        in_dim=in_dim,
    )
    return make_inputs(case, dtype, CUDA)


def reference_shrink(inputs: LoRAKernelInputs, zero_out: bool = True) -> torch.Tensor:
    out = torch.zeros(inputs.shape, device=CUDA)
    reference.lora_shrink(inputs.x, *inputs.shrink_tables, out, zero_out=zero_out)
    return out


def reference_expand(inputs: LoRAKernelInputs, lora_out: torch.Tensor, y: torch.Tensor) -> None:
    reference.lora_expand(lora_out, *inputs.expand_tables, y, Y_OFFSET, inputs.slice_sizes)


def check_shrink(kernels: ModuleType, inputs: LoRAKernelInputs) -> None:
    out = torch.full(inputs.shape, NAN, device=CUDA)
    kernels.lora_shrink(inputs.x, *inputs.shrink_tables, out)
    assert_close(out, reference_shrink(inputs), SHRINK[inputs.x.dtype])


def check_expand(kernels: ModuleType, inputs: LoRAKernelInputs) -> None:
    dtype = inputs.x.dtype
    lora_out = poisoned_lora_out(inputs)
    expected = random_y(inputs, dtype, extra_cols=2 * Y_OFFSET)
    actual = expected.clone()
    reference_expand(inputs, lora_out, expected)
    kernels.lora_expand(lora_out, *inputs.expand_tables, actual, Y_OFFSET, inputs.slice_sizes)
    assert_close(actual, expected, ROUNDED[dtype])


@pytest.mark.parametrize("dtype", GPU_DTYPES)
@pytest.mark.parametrize("num_tokens", [1, 32, 256, 2048])
@pytest.mark.parametrize("rank", [8, 16, 64])
@pytest.mark.parametrize("group", list(LORA_GROUPS))
def test_shrink_and_expand_match_reference(
    triton_kernels: ModuleType, group: str, rank: int, num_tokens: int, dtype: torch.dtype
) -> None:
    inputs = llama3_inputs(group, rank, num_tokens, dtype)
    check_shrink(triton_kernels, inputs)
    check_expand(triton_kernels, inputs)


@pytest.mark.parametrize("dtype", GPU_DTYPES)
@pytest.mark.parametrize("num_tokens", [1, 256])
@pytest.mark.parametrize("group", list(LORA_GROUPS))
def test_shrink_rows_spanning_pages_match_reference(
    triton_kernels: ModuleType, group: str, num_tokens: int, dtype: torch.dtype
) -> None:
    """Rows of A (4096 or 14336 elements) span pages of 2048."""
    inputs = llama3_inputs(group, 64, num_tokens, dtype, page_size=SMALL_PAGE_SIZE)
    check_shrink(triton_kernels, inputs)


@pytest.mark.parametrize("dtype", GPU_DTYPES)
@pytest.mark.parametrize("num_tokens", [1, 256])
@pytest.mark.parametrize(
    "group",
    list(LORA_GROUPS),
)
def test_expand_rows_spanning_pages_match_reference(
    triton_kernels: ModuleType, group: str, num_tokens: int, dtype: torch.dtype
) -> None:
    """Rows of B^T of 4096 or 14336 elements span pages of 2048 (k's and v's, of 1024, pack two
    to a page)."""
    inputs = llama3_inputs(group, 64, num_tokens, dtype, page_size=SMALL_PAGE_SIZE)
    check_expand(triton_kernels, inputs)


@pytest.mark.parametrize("dtype", GPU_DTYPES)
@pytest.mark.parametrize("group", list(LORA_GROUPS))
def test_split_k_shrink_adds_into_out_without_zero_out(
    triton_kernels: ModuleType, group: str, dtype: torch.dtype
) -> None:
    """A decode step into a buffer that already holds values: every split-K partial lands."""
    inputs = llama3_inputs(group, 16, 64, dtype)
    start = torch.randn(inputs.shape, device=CUDA)
    actual = start.clone()
    triton_kernels.lora_shrink(inputs.x, *inputs.shrink_tables, actual, zero_out=False)
    assert_close(actual, start + reference_shrink(inputs), SHRINK[dtype])


@pytest.mark.parametrize("row", range(len(SHRINK_TILES.rows)))
@pytest.mark.parametrize("group", list(LORA_GROUPS))
def test_each_tile_row_at_any_size(group: str, row: int) -> None:
    """Each table row's tiles, passed explicitly, on a step the table gives another row."""
    shrink_tiles, expand_tiles = SHRINK_TILES.rows[row][1], EXPAND_TILES.rows[row][1]
    num_tokens = 40 if row else 300
    inputs = llama3_inputs(group, 64, num_tokens, torch.bfloat16)
    out = torch.full(inputs.shape, NAN, device=CUDA)
    launch_lora_shrink(inputs.x, *inputs.shrink_tables, out, True, shrink_tiles)
    assert_close(out, reference_shrink(inputs), SHRINK[torch.bfloat16])

    lora_out = poisoned_lora_out(inputs)
    expected = random_y(inputs, torch.bfloat16, extra_cols=2 * Y_OFFSET)
    actual = expected.clone()
    reference_expand(inputs, lora_out, expected)
    args = (actual, Y_OFFSET, inputs.slice_sizes, expand_tiles)
    launch_lora_expand(lora_out, *inputs.expand_tables, *args)
    assert_close(actual, expected, ROUNDED[torch.bfloat16])


@pytest.mark.parametrize("dtype", GPU_DTYPES)
@pytest.mark.parametrize("num_tokens", [1, 64, 256, 4096])
@pytest.mark.parametrize("page_size", [PAGE_SIZE, SMALL_PAGE_SIZE], ids=["rows-fit", "rows-span"])
def test_silu_and_mul_lora_matches_reference(
    triton_kernels: ModuleType, num_tokens: int, page_size: int, dtype: torch.dtype
) -> None:
    """gate_up's expand fused into the activation, every tile row (4,096 tokens: the prefill
    row), on llama3_inputs' slots (one targeting neither slice, one without up_proj)."""
    inputs = llama3_inputs("gate_up", 16, num_tokens, dtype, page_size=page_size)
    lora_out = poisoned_lora_out(inputs)
    x = torch.randn(num_tokens, 2 * inputs.slice_sizes[0], device=CUDA).to(dtype)
    tables = (inputs.pages, inputs.page_table, inputs.first_b, inputs.lora_ranks)
    args = (x, lora_out, *tables, inputs.scalings, *inputs.mapping)
    actual = triton_kernels.silu_and_mul_lora(*args)
    expected = reference.silu_and_mul_lora(*args)
    # The kernel's delta rounds lora_out to the weights' dtype before the dot, the reference's
    # does not: gate + delta and up + delta may round one step apart (at |v| ~ 4, 1/32 in bf16),
    # and the product carries that step times the other factor. So the tolerance scales with
    # both factors, not with their product (which is ~0 where either factor is).
    gate_up = x.clone()
    sizes = (inputs.slice_sizes[0],) * 2
    reference.lora_expand(lora_out, *inputs.expand_tables, gate_up, 0, sizes)
    gate, up = gate_up.float().chunk(2, dim=1)
    scale = (torch.nn.functional.silu(gate).abs() + 1) * (up.abs() + 1)
    tol = ROUNDED[dtype]
    error = (actual.float() - expected.float()).abs()
    assert not actual.isnan().any()
    assert (error <= tol.atol + tol.rtol * scale).all(), f"max error {error.max().item()}"
