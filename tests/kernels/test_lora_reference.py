"""The multi-LoRA reference (the kernels' spec) against the obvious per-token loop over the
dense matrices that the inputs placed in pages."""

from __future__ import annotations

import pytest
import torch

from loraplex.kernels.reference import lora as reference
from tests.kernels.lora_inputs import (
    CASES,
    SENTINEL,
    LoRACase,
    case_params,
    lora_case,
    make_inputs,
    naive_expand,
    naive_shrink,
    poisoned_lora_out,
    random_y,
)

CPU = torch.device("cpu")


@pytest.mark.parametrize("case", case_params())
def test_placed_matrices_read_back_through_the_page_table(case: LoRACase) -> None:
    """The inputs' placement is the one the reference reads (and page_layout writes:
    tests/engine/test_page_layout.py), and nothing else of the pool is finite."""
    inputs = make_inputs(case, torch.float32, CPU)
    finite = 0
    for i, size in enumerate(case.slice_sizes):
        for s, adapter in enumerate(inputs.slot_adapters.tolist()):
            rank = case.ranks[i][s]
            if rank == 0:
                continue
            pages = inputs.page_table[adapter]
            a = reference.gather_matrix(
                inputs.pages, pages, int(inputs.first_a[i, adapter]), rank, case.in_dim
            )
            b_t = reference.gather_matrix(
                inputs.pages, pages, int(inputs.first_b[i, adapter]), rank, size
            )
            assert torch.equal(a, inputs.lora_a[i][s]) and torch.equal(b_t, inputs.lora_b_t[i][s])
            finite += rank * (case.in_dim + size)
    assert int(inputs.pages.isfinite().sum()) == finite


@pytest.mark.parametrize("case", case_params())
def test_reference_shrink_matches_per_token_loop(case: LoRACase) -> None:
    inputs = make_inputs(case, torch.float32, CPU)
    out = torch.full(inputs.shape, SENTINEL)
    reference.lora_shrink(inputs.x, *inputs.shrink_tables, out)
    torch.testing.assert_close(out, naive_shrink(inputs), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("case", case_params())
@pytest.mark.parametrize("y_offset", [0, 24])
def test_reference_expand_matches_per_token_loop(case: LoRACase, y_offset: int) -> None:
    inputs = make_inputs(case, torch.float32, CPU)
    lora_out = poisoned_lora_out(inputs)
    y = random_y(inputs, torch.float32)
    expected = naive_expand(inputs, lora_out, y, y_offset)
    reference.lora_expand(lora_out, *inputs.expand_tables, y, y_offset, inputs.slice_sizes)
    torch.testing.assert_close(y, expected, atol=1e-5, rtol=1e-5)


def test_reference_shrink_without_zero_out_adds_into_out() -> None:
    inputs = make_inputs(CASES["2-slices-padded"], torch.float32, CPU)
    start = torch.randn(inputs.shape)
    out = start.clone()
    reference.lora_shrink(inputs.x, *inputs.shrink_tables, out, zero_out=False)
    torch.testing.assert_close(out, start + naive_shrink(inputs), atol=1e-5, rtol=1e-5)


def test_reference_zeroes_shrink_rows_and_leaves_y_rows_without_adapter() -> None:
    """Shrink rows of no-adapter tokens and of rank-0 (slot, slice) pairs become 0; the expand
    leaves those y columns untouched and changes every adapted one."""
    case = lora_case([[8, 0], [0, 0]], [4, 3], 5, 8, (16, 8), page_size=64)
    inputs = make_inputs(case, torch.float32, CPU)
    adapted = inputs.token_lora_slots == 0  # slot 0, slice 0 only
    out = torch.full(inputs.shape, SENTINEL)
    reference.lora_shrink(inputs.x, *inputs.shrink_tables, out)
    assert (out[0, ~adapted] == 0).all() and (out[1] == 0).all()
    assert (out[0, adapted] != 0).all()
    y = torch.randn(inputs.x.shape[0], 24)
    y0 = y.clone()
    reference.lora_expand(out, *inputs.expand_tables, y, 0, (16, 8))
    assert torch.equal(y[~adapted], y0[~adapted]) and torch.equal(y[:, 16:], y0[:, 16:])
    assert not torch.isclose(y[adapted, :16], y0[adapted, :16]).any()
