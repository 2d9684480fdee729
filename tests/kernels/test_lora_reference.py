"""The multi-LoRA reference (the kernels' spec) against the obvious per-token loop."""

from __future__ import annotations

import pytest
import torch

from loraplex.kernels.reference import lora as reference
from tests.kernels.lora_inputs import (
    CASE_ARGS,
    CASE_PARAMS,
    SENTINEL,
    make_inputs,
    naive_expand,
    naive_shrink,
    poisoned_lora_out,
    random_y,
)

CPU = torch.device("cpu")


@pytest.mark.parametrize(CASE_ARGS, CASE_PARAMS)
def test_reference_shrink_matches_per_token_loop(
    ranks: list[list[int]],
    tokens_per_slot: list[int],
    num_plain: int,
    max_rank: int,
    slice_sizes: tuple[int, ...],
) -> None:
    inputs = make_inputs(
        ranks, tokens_per_slot, num_plain, max_rank, slice_sizes, torch.float32, CPU
    )
    out = torch.full(inputs.shape, SENTINEL)
    reference.lora_shrink(inputs.x, inputs.lora_a, *inputs.mapping, out)
    torch.testing.assert_close(out, naive_shrink(inputs), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(CASE_ARGS, CASE_PARAMS)
@pytest.mark.parametrize("y_offset", [0, 24])
def test_reference_expand_matches_per_token_loop(
    ranks: list[list[int]],
    tokens_per_slot: list[int],
    num_plain: int,
    max_rank: int,
    slice_sizes: tuple[int, ...],
    y_offset: int,
) -> None:
    inputs = make_inputs(
        ranks, tokens_per_slot, num_plain, max_rank, slice_sizes, torch.float32, CPU
    )
    lora_out = poisoned_lora_out(inputs)
    y = random_y(inputs, torch.float32)
    expected = naive_expand(inputs, lora_out, y, y_offset)
    args = (inputs.scalings, y, y_offset, inputs.slice_sizes)
    reference.lora_expand(lora_out, inputs.lora_b, *inputs.mapping, *args)
    torch.testing.assert_close(y, expected, atol=1e-5, rtol=1e-5)


def test_reference_shrink_without_zero_out_adds_into_out() -> None:
    inputs = make_inputs([[8, 0], [4, 16]], [3, 5], 2, 16, (16, 8), torch.float32, CPU)
    start = torch.randn(inputs.shape)
    out = start.clone()
    reference.lora_shrink(inputs.x, inputs.lora_a, *inputs.mapping, out, zero_out=False)
    torch.testing.assert_close(out, start + naive_shrink(inputs), atol=1e-5, rtol=1e-5)


def test_reference_zeroes_shrink_rows_and_leaves_y_rows_without_adapter() -> None:
    """Shrink rows of no-adapter tokens and of rank-0 (slot, slice) pairs become 0; the expand
    leaves those y columns untouched and changes every adapted one."""
    inputs = make_inputs([[8, 0], [0, 0]], [4, 3], 5, 8, (16, 8), torch.float32, CPU)
    adapted = inputs.token_lora_slots == 0  # slot 0, slice 0 only
    out = torch.full(inputs.shape, SENTINEL)
    reference.lora_shrink(inputs.x, inputs.lora_a, *inputs.mapping, out)
    assert (out[0, ~adapted] == 0).all() and (out[1] == 0).all()
    assert (out[0, adapted] != 0).all()
    y = torch.randn(inputs.x.shape[0], 24)
    y0 = y.clone()
    reference.lora_expand(out, inputs.lora_b, *inputs.mapping, inputs.scalings, y, 0, (16, 8))
    assert torch.equal(y[~adapted], y0[~adapted]) and torch.equal(y[:, 16:], y0[:, 16:])
    assert not torch.isclose(y[adapted, :16], y0[adapted, :16]).any()
