"""Adapter pages: exact placement, packing, and reading back through the kernels' gather."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from loraplex.engine.lora.adapter import LoRAAdapter
from loraplex.engine.lora.page_layout import (
    SLICES,
    matrix_pages,
    max_adapter_pages,
    pack_adapter,
    pages_per_row,
    plan_layout,
    rows_per_page,
    stage_adapter,
    transpose_staged_b,
)
from loraplex.kernels.reference.lora import gather_matrix
from tests.engine.lora_units import ARCH, SHAPES, make_adapter

PAGE_SIZE = 96  # rows of 32 (q/k/v/o/gate/up in, q/o/down out): 3 a page; rows of 48: 2; of
# 16 (k/v out): 6. In tests/engine/lora_units.ARCH: hidden 32, kv 16, intermediate 48.


def test_matrix_pages_round_up_and_split_long_rows() -> None:
    assert matrix_pages(rows=4, row_len=32, page_size=96) == 2  # 3 + 1 rows
    assert matrix_pages(rows=3, row_len=32, page_size=96) == 1
    assert matrix_pages(rows=2, row_len=200, page_size=96) == 6  # 3 pages a row
    assert matrix_pages(rows=5, row_len=96, page_size=96) == 5


def test_plan_layout_places_targeted_slices_in_order() -> None:
    layout = plan_layout(4, ("q_proj", "v_proj", "down_proj"), SHAPES, PAGE_SIZE)
    # q: A 4 rows of 32 -> 2 pages, B^T 4 rows of 32 -> 2; v: A 2, B^T 4 rows of 16 -> 1;
    # down: A 4 rows of 48 -> 2, B^T 4 rows of 32 -> 2.
    assert layout.first_a == (0, -1, 4, -1, -1, -1, 7)
    assert layout.first_b == (2, -1, 6, -1, -1, -1, 9)
    assert layout.num_pages == 11
    assert layout.ranks == (4, 0, 4, 0, 0, 0, 4)
    full = plan_layout(8, SLICES, SHAPES, PAGE_SIZE)
    assert max_adapter_pages(8, SHAPES, PAGE_SIZE) == full.num_pages


def test_packed_pages_read_back_as_the_adapters_matrices() -> None:
    for page_size in (PAGE_SIZE, 40):  # 40: rows of 48 take two pages each
        adapter = make_adapter(5, ("k_proj", "o_proj", "gate_proj", "down_proj"), seed=3)
        layout = plan_layout(5, adapter.target_modules, SHAPES, page_size)
        packed = pack_adapter(adapter, layout, ARCH.num_hidden_layers, page_size, torch.float32)
        assert packed.shape == (ARCH.num_hidden_layers, layout.num_pages, page_size)
        # As on the GPU: the adapter's pages scattered over a pool, in a shuffled order.
        pool = torch.full((ARCH.num_hidden_layers, 64, page_size), float("nan"))
        block_ids = torch.randperm(64)[: layout.num_pages].to(torch.int32)
        pool[:, block_ids.long()] = packed
        for layer in range(ARCH.num_hidden_layers):
            for i, module in enumerate(SLICES):
                if module not in adapter.target_modules:
                    continue
                a, b = adapter.weights[(layer, module)]
                in_dim, out_dim = SHAPES[module]
                got_a = gather_matrix(pool[layer], block_ids, layout.first_a[i], 5, in_dim)
                got_b = gather_matrix(pool[layer], block_ids, layout.first_b[i], 5, out_dim)
                assert torch.equal(got_a, a) and torch.equal(got_b, b.T)


def expected_pages(adapter: LoRAAdapter, page_size: int, dtype: torch.dtype) -> torch.Tensor:
    """The packed buffer element by element from the module docstring's formula; zeros elsewhere."""
    layout = plan_layout(adapter.rank, adapter.target_modules, SHAPES, page_size)
    out = torch.zeros(ARCH.num_hidden_layers, layout.num_pages, page_size, dtype=dtype)
    for (layer, module), (a, b) in adapter.weights.items():
        i = SLICES.index(module)
        for first, matrix in ((layout.first_a[i], a), (layout.first_b[i], b.T)):
            rows, row_len = matrix.shape
            per_page, segments = (
                rows_per_page(row_len, page_size),
                pages_per_row(row_len, page_size),
            )
            for j in range(rows):
                for c in range(row_len):
                    page = first + (j // per_page) * segments + c // page_size
                    out[layer, page, (j % per_page) * row_len + c % page_size] = matrix[j, c]
    return out


@pytest.mark.parametrize("page_size", [96, 40, 64, 16])  # 16: every row split over pages
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_pack_follows_the_formula_and_zeroes_every_unused_element(
    page_size: int, dtype: torch.dtype
) -> None:
    adapter = make_adapter(5, ("q_proj", "k_proj", "v_proj", "gate_proj", "down_proj"), seed=1)
    adapter = replace(  # non-contiguous sources, as tensor-parallel shards are
        adapter, weights={k: (a[:, :], b) for k, (a, b) in adapter.weights.items()}
    )
    layout = plan_layout(5, adapter.target_modules, SHAPES, page_size)
    size = ARCH.num_hidden_layers * layout.num_pages * page_size
    # The packed buffer starts uninitialized: leave NaN where the allocator will likely reuse it.
    del_me = torch.full((size,), float("nan"), dtype=dtype)
    del del_me
    packed = pack_adapter(adapter, layout, ARCH.num_hidden_layers, page_size, dtype)
    assert torch.equal(packed, expected_pages(adapter, page_size, dtype))


@pytest.mark.parametrize("page_size", [96, 40, 16])
def test_staged_pages_hold_each_b_flat_until_transposed_in_place(page_size: int) -> None:
    adapter = make_adapter(3, ("q_proj", "v_proj", "up_proj", "down_proj"), seed=5)
    layout = plan_layout(3, adapter.target_modules, SHAPES, page_size)
    num_layers = ARCH.num_hidden_layers
    out = torch.full((num_layers, layout.num_pages, page_size), float("nan"))
    staged = stage_adapter(adapter, layout, num_layers, page_size, torch.float32, out=out)
    assert staged.data_ptr() == out.data_ptr()
    kernel_pages = expected_pages(adapter, page_size, torch.float32)
    for i, module in enumerate(SLICES):
        if module not in adapter.target_modules:
            continue
        first_a, first_b = layout.first_a[i], layout.first_b[i]
        # A as the kernels read it; B as stored, page after page, then zeros.
        assert torch.equal(staged[:, first_a:first_b], kernel_pages[:, first_a:first_b])
        num_b_pages = matrix_pages(3, SHAPES[module][1], page_size)
        region = staged[:, first_b : first_b + num_b_pages].reshape(num_layers, -1)
        for layer in range(num_layers):
            b = adapter.weights[(layer, module)][1].reshape(-1)
            assert torch.equal(region[layer, : b.numel()], b)
            assert not region[layer, b.numel() :].any()
    transpose_staged_b(staged, layout)
    assert torch.equal(staged, kernel_pages)
