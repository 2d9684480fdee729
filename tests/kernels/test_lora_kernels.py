"""Multi-slice multi-LoRA shrink/expand over paged weights: Triton vs the reference, at small
shapes.

Every launch is checked with the tile tables' choice in every dtype, and (in float32, since
tiles change index arithmetic only) with each table row and with tiles no row uses, passed to
the launchers explicitly. The cases (tests/kernels/lora_inputs.py) place rows both ways (several
to a page, and spanning pages: the SPLIT_ROWS kernels), map batch slots to adapter rows that are
not the slots' own, and poison with NaN whatever a kernel must not read; shrink outputs start
as a sentinel the shrink must zero (or, told not to, add to). bf16 runs on CUDA only: Triton's
CPU interpreter has no bf16 tl.dot. Llama-3-8B shapes run on the GPU (test_gpu_lora_kernels.py).
"""

from __future__ import annotations

import sys
from types import ModuleType
from typing import Any

import pytest
import torch

from loraplex.kernels.reference import lora as reference
from loraplex.kernels.triton.lora_expand import EXPAND_TILES, ExpandTiles, launch_lora_expand
from loraplex.kernels.triton.lora_shrink import (
    MAX_GRID_Z,
    SHRINK_TILES,
    ShrinkTiles,
    launch_lora_shrink,
)
from loraplex.kernels.triton.tile_table import TileTable
from tests.kernels.interpreter_dtypes import DTYPES
from tests.kernels.lora_inputs import (
    ATOL,
    NAN,
    SENTINEL,
    LoRACase,
    LoRAKernelInputs,
    case_params,
    lora_case,
    make_inputs,
    poisoned_lora_out,
    random_y,
)

# Tiles passed explicitly: each table row, and shapes no row has. "split-k" splits the inputs'
# in_dim (200) over 7 programs, the last one partial, with rank tiles up to 64; "wide-rank-steps"
# walks ranks in steps of up to 64 over narrow column tiles; "column-runs" has each program walk
# a run of column tiles (every column of its slice at target_programs 1; runs of 2-3 at 5), the
# way a decode step of many adapters runs.
SHRINK_VARIANTS: dict[str, ShrinkTiles] = {
    **{f"row{i}": tiles for i, (_, tiles) in enumerate(SHRINK_TILES.rows)},
    "split-k": ShrinkTiles(16, block_k=16, k_chunk=32, max_block_n=64, num_warps=4, num_stages=2),
}
EXPAND_VARIANTS: dict[str, ExpandTiles] = {
    **{f"row{i}": tiles for i, (_, tiles) in enumerate(EXPAND_TILES.rows)},
    "wide-rank-steps": ExpandTiles(16, block_n=32, max_block_k=64, num_warps=4, num_stages=2),
    "column-runs-1": ExpandTiles(
        16, 32, max_block_k=16, num_warps=4, num_stages=2, target_programs=1
    ),
    "column-runs-5": ExpandTiles(
        16, 32, max_block_k=16, num_warps=4, num_stages=2, target_programs=5
    ),
}


def launch_params(variants: dict[str, Any]) -> list[Any]:
    """(variant, dtype): the table's tiles ("table") in every dtype, the others in float32."""
    params = [pytest.param("table", p.values[0], marks=p.marks, id=f"table-{p.id}") for p in DTYPES]
    return params + [pytest.param(v, torch.float32, id=f"{v}-fp32") for v in variants]


def shrink(
    kernels: ModuleType,
    variant: str,
    inputs: LoRAKernelInputs,
    out: torch.Tensor,
    zero_out: bool = True,
) -> None:
    """The Triton shrink: `lora_shrink` (the table's tiles) or the variant's tiles."""
    args = (inputs.x, *inputs.shrink_tables, out, zero_out)
    if variant == "table":
        kernels.lora_shrink(*args)
    else:
        launch_lora_shrink(*args, SHRINK_VARIANTS[variant])


def expand(
    kernels: ModuleType,
    variant: str,
    inputs: LoRAKernelInputs,
    lora_out: torch.Tensor,
    y: torch.Tensor,
    y_offset: int,
) -> None:
    """The Triton expand: `lora_expand` (the table's tiles) or the variant's tiles."""
    args = (lora_out, *inputs.expand_tables, y, y_offset, inputs.slice_sizes)
    if variant == "table":
        kernels.lora_expand(*args)
    else:
        launch_lora_expand(*args, EXPAND_VARIANTS[variant])


@pytest.mark.parametrize("case", case_params())
@pytest.mark.parametrize(("variant", "dtype"), launch_params(SHRINK_VARIANTS))
def test_triton_shrink_matches_reference(
    triton_kernels: ModuleType,
    device: torch.device,
    variant: str,
    case: LoRACase,
    dtype: torch.dtype,
) -> None:
    inputs = make_inputs(case, dtype, device)
    expected = torch.full(inputs.shape, SENTINEL, device=device)
    actual = expected.clone()
    reference.lora_shrink(inputs.x, *inputs.shrink_tables, expected)
    shrink(triton_kernels, variant, inputs, actual)
    torch.testing.assert_close(actual, expected, atol=ATOL[dtype], rtol=1e-2)


@pytest.mark.parametrize("case", case_params())
@pytest.mark.parametrize(("variant", "dtype"), launch_params(EXPAND_VARIANTS))
@pytest.mark.parametrize("y_offset", [0, 24])
def test_triton_expand_matches_reference(
    triton_kernels: ModuleType,
    device: torch.device,
    variant: str,
    case: LoRACase,
    dtype: torch.dtype,
    y_offset: int,
) -> None:
    inputs = make_inputs(case, dtype, device)
    lora_out = poisoned_lora_out(inputs)
    expected = random_y(inputs, dtype)
    actual = expected.clone()
    reference.lora_expand(lora_out, *inputs.expand_tables, expected, y_offset, inputs.slice_sizes)
    expand(triton_kernels, variant, inputs, lora_out, actual, y_offset)
    torch.testing.assert_close(actual, expected, atol=ATOL[dtype], rtol=1e-2)


@pytest.mark.parametrize(
    ("variant", "dtype"), launch_params({"split-k": SHRINK_VARIANTS["split-k"]})
)
@pytest.mark.parametrize("page_size", [64, 256], ids=["rows-span", "rows-fit"])
def test_triton_shrink_without_zero_out_adds_into_out(
    triton_kernels: ModuleType,
    device: torch.device,
    variant: str,
    dtype: torch.dtype,
    page_size: int,
) -> None:
    """Split-K partials added into a buffer that already holds values (one zeroed once for
    many launches, as LoRABatch's step workspace)."""
    case = lora_case([[16, 0, 4], [8, 16, 0]], [3, 20, 6], 2, 16, (16, 8), page_size)
    inputs = make_inputs(case, dtype, device)
    expected = torch.randn(inputs.shape, device=device)
    actual = expected.clone()
    reference.lora_shrink(inputs.x, *inputs.shrink_tables, expected, zero_out=False)
    shrink(triton_kernels, variant, inputs, actual, zero_out=False)
    torch.testing.assert_close(actual, expected, atol=ATOL[dtype], rtol=1e-2)


def test_triton_on_a_range_of_slices(triton_kernels: ModuleType, device: torch.device) -> None:
    """As LoRABatch launches when slice 0 is not targeted: row views of the tables (slices 1..2
    of 3), and one layer's pages out of a [num_layers, num_pages, page_size] pool (the other
    layer NaN). The launchers follow strides and offsets."""
    sizes = (40, 24, 24)
    case = lora_case([[8, 8], [8, 4], [0, 16]], [5, 6], 2, 16, sizes, page_size=64)
    inputs = make_inputs(case, torch.float32, device)
    layers = torch.full((2, *inputs.pages.shape), NAN, device=device)
    layers[1] = inputs.pages
    pages, page_table = layers[1], inputs.page_table
    first_a, first_b, ranks = inputs.first_a[1:], inputs.first_b[1:], inputs.lora_ranks[1:]
    outs, ys = [], []
    for impl in (reference, triton_kernels):
        out = torch.full((2, inputs.x.shape[0], 16), SENTINEL, device=device)
        impl.lora_shrink(inputs.x, pages, page_table, first_a, ranks, *inputs.mapping, out)
        y = torch.ones(inputs.x.shape[0], 100, device=device)
        tables = (pages, page_table, first_b, ranks, inputs.scalings, *inputs.mapping)
        impl.lora_expand(out, *tables, y, 40 + 3, sizes[1:])
        outs.append(out)
        ys.append(y)
    torch.testing.assert_close(outs[1], outs[0], atol=1e-4, rtol=1e-2)
    torch.testing.assert_close(ys[1], ys[0], atol=1e-4, rtol=1e-2)
    assert not torch.equal(ys[0][:, 43:], torch.ones_like(ys[0][:, 43:]))


@pytest.mark.parametrize("dtype", DTYPES)
def test_triton_shrink_then_expand_prefill_sized(
    triton_kernels: ModuleType, device: torch.device, dtype: torch.dtype
) -> None:
    """Enough tokens for the tables' last row; the expand reads the shrink's own output. A's
    rows span pages, B^T's pack several to a page."""
    sizes = (72, 24)
    case = lora_case([[16, 8, 0], [4, 16, 0]], [1100, 940, 10], 20, 16, sizes, page_size=144)
    inputs = make_inputs(case, dtype, device)
    num_tokens = inputs.x.shape[0]
    assert SHRINK_TILES.lookup(num_tokens) == SHRINK_TILES.rows[-1][1]
    assert EXPAND_TILES.lookup(num_tokens) == EXPAND_TILES.rows[-1][1]
    shrunk, ys = {}, {}
    for name, impl in (("reference", reference), ("triton", triton_kernels)):
        shrunk[name] = torch.full(inputs.shape, SENTINEL, device=device)
        impl.lora_shrink(inputs.x, *inputs.shrink_tables, shrunk[name])
        ys[name] = torch.ones(num_tokens, sum(sizes), device=device, dtype=dtype)
        impl.lora_expand(shrunk[name], *inputs.expand_tables, ys[name], 0, sizes)
    torch.testing.assert_close(shrunk["triton"], shrunk["reference"], atol=ATOL[dtype], rtol=1e-2)
    torch.testing.assert_close(ys["triton"], ys["reference"], atol=ATOL[dtype], rtol=1e-2)


def test_triton_launchers_reject_bad_inputs(
    triton_kernels: ModuleType, device: torch.device
) -> None:
    case = lora_case([[8], [8]], [3], 0, 8, (16, 16), page_size=64)
    inputs = make_inputs(case, torch.float32, device)
    x, tables = inputs.x, inputs.shrink_tables
    pages, page_table, first_a, ranks, slot_adapters, num_active, ids, loc = tables
    out = torch.zeros(inputs.shape, device=device)
    # A valid launch first: its mapping's check is remembered, and must not let the same
    # tensors through at another size, nor a changed set of tensors.
    triton_kernels.lora_shrink(x, *tables, out)
    with pytest.raises(ValueError, match=r"sorted_token_ids must be \[num_tokens\]"):
        triton_kernels.lora_shrink(x[:2], *tables, out[:, :2])
    with pytest.raises(ValueError, match="dtype"):
        triton_kernels.lora_shrink(x.half(), *tables, out)
    with pytest.raises(ValueError, match="out must be"):
        triton_kernels.lora_shrink(x, *tables, out[:, :1])
    with pytest.raises(ValueError, match="float32"):
        triton_kernels.lora_shrink(x, *tables, out.half())
    with pytest.raises(ValueError, match="sorted_token_ids must be contiguous int32"):
        triton_kernels.lora_shrink(x, *tables[:6], ids.long(), loc, out)
    with pytest.raises(ValueError, match="slot_adapters must be contiguous int32"):
        triton_kernels.lora_shrink(x, *tables[:4], slot_adapters.long(), *tables[5:], out)
    with pytest.raises(ValueError, match="num_active_slots must be"):
        triton_kernels.lora_shrink(x, *tables[:5], num_active.repeat(2), ids, loc, out)
    with pytest.raises(ValueError, match="page_table must be int32"):
        triton_kernels.lora_shrink(x, pages, page_table.long(), *tables[2:], out)
    with pytest.raises(ValueError, match="lora_ranks"):
        triton_kernels.lora_shrink(x, pages, page_table, first_a, ranks[:1], *tables[4:], out)
    with pytest.raises(ValueError, match="first_page"):
        triton_kernels.lora_shrink(x, pages, page_table, first_a[:, :1], *tables[3:], out)
    with pytest.raises(ValueError, match="slot_start_loc"):
        triton_kernels.lora_shrink(x, *tables[:7], loc[:-1], out)
    with pytest.raises(ValueError, match="one device"):
        triton_kernels.lora_shrink(x, *tables[:7], loc.to("meta"), out)
    with pytest.raises(ValueError, match="one device"):
        triton_kernels.lora_shrink(x.to("meta"), *tables, out)
    y = torch.zeros(3, 32, device=device)
    args = (out, *inputs.expand_tables, y)
    with pytest.raises(ValueError, match="y_offset"):
        triton_kernels.lora_expand(*args, 1, (16, 16))
    with pytest.raises(ValueError, match="slice size"):
        triton_kernels.lora_expand(*args, 0, (16,))
    with pytest.raises(ValueError, match="scalings"):
        bad = (*inputs.expand_tables[:4], inputs.scalings[:1], *inputs.mapping)
        triton_kernels.lora_expand(out, *bad, y, 0, (16, 16))


def test_tile_tables_pick_the_first_row_that_fits() -> None:
    decode, mid, prefill = (tiles for _, tiles in SHRINK_TILES.rows)
    assert [SHRINK_TILES.lookup(n) for n in (0, 1, 64, 65, 512, 513, 1 << 40)] == [
        decode,
        decode,
        decode,
        mid,
        mid,
        prefill,
        prefill,
    ]
    sizes = (0, 1, 64, 65, 512, 513, 1 << 40)
    assert [SHRINK_TILES.row_index(n) for n in sizes] == [0, 0, 0, 1, 1, 2, 2]
    for table in (SHRINK_TILES, EXPAND_TILES):
        assert table.rows[-1][0] == sys.maxsize


def test_lora_shrink_rejects_more_segment_tiles_than_the_grid_holds(device: torch.device) -> None:
    # The segment tiles are the grid's third dimension, which CUDA caps at 65,535 programs.
    case = lora_case([[8], [8]], [3], 0, 8, (16, 16), page_size=64)
    inputs = make_inputs(case, torch.float32, device)
    pages, page_table, first_a, ranks, slot_adapters, num_active, _, loc = inputs.shrink_tables
    tiles = SHRINK_TILES.rows[0][1]
    num_tokens = tiles.block_m * MAX_GRID_Z  # plus the slots' tiles: one grid row too many
    x = torch.zeros(num_tokens, inputs.x.shape[1], device=device)
    ids = torch.arange(num_tokens, dtype=torch.int32, device=device)
    out = torch.full((inputs.shape[0], num_tokens, inputs.shape[2]), 7.0, device=device)
    tables = (pages, page_table, first_a, ranks, slot_adapters, num_active, ids, loc)
    with pytest.raises(ValueError, match="tiles"):
        launch_lora_shrink(x, *tables, out, True, tiles)
    assert bool((out == 7.0).all()), "a rejected launch must leave out as it was"


def test_tile_tables_and_tiles_reject_bad_data() -> None:
    tiles = SHRINK_VARIANTS["split-k"]
    with pytest.raises(ValueError, match="cover every size"):
        TileTable(((64, tiles),))
    with pytest.raises(ValueError, match="increase"):
        TileTable(((64, tiles), (16, tiles), (sys.maxsize, tiles)))
    with pytest.raises(ValueError, match="multiple of block_k"):
        ShrinkTiles(16, block_k=64, k_chunk=96, max_block_n=16, num_warps=4, num_stages=2)
    with pytest.raises(ValueError, match="power of two"):
        ExpandTiles(16, block_n=96, max_block_k=16, num_warps=4, num_stages=2)
    with pytest.raises(ValueError, match="target_programs 0 must be positive"):
        ExpandTiles(16, 32, max_block_k=16, num_warps=4, num_stages=2, target_programs=0)


def test_slots_past_the_active_ones_cost_nothing_and_change_nothing(
    triton_kernels: ModuleType, device: torch.device
) -> None:
    """As the engine fills its mapping: the step's adapters in the first slots, every other
    slot empty, `num_active_slots` = how many are used (the kernels' programs past the step's
    tiles leave at once). The same results as with every slot declared active."""
    sizes = (40, 24)
    case = lora_case([[8, 16, 4, 4, 4, 4], [16, 8, 4, 4, 4, 4]], [5, 9, 0, 0, 0, 0], 3, 16,
                     sizes, page_size=64)  # fmt: skip
    inputs = make_inputs(case, torch.float32, device)
    results = {}
    for name, impl, active in (("reference", reference, 6), ("triton", triton_kernels, 2)):
        inputs.num_active_slots.fill_(active)
        out = torch.full(inputs.shape, SENTINEL, device=device)
        impl.lora_shrink(inputs.x, *inputs.shrink_tables, out)
        y = torch.ones(inputs.x.shape[0], sum(sizes), device=device)
        impl.lora_expand(out, *inputs.expand_tables, y, 0, sizes)
        results[name] = (out, y)
    for got, want in zip(results["triton"], results["reference"], strict=True):
        torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-2)
