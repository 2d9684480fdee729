"""silu_and_mul with the gate_up LoRA expand fused in: Triton vs the reference, and the reference
vs the unfused pair computed naively (the expand token by token in float64, then SiLU-and-mul).

The batches (tests/kernels/lora_inputs.py, poisoned with NaN wherever a kernel must not read)
have tokens without an adapter, a slot whose adapter has neither gate_proj nor up_proj (its rows
need the plain activation, and its scaling is NaN), slots with only one of the two, rows of B^T
that fit a page and rows that span pages. bf16 runs on CUDA only (no bf16 tl.dot in Triton's
CPU interpreter).
"""

from __future__ import annotations

from types import ModuleType

import pytest
import torch

from loraplex.kernels.reference import lora as reference
from loraplex.kernels.reference.fused_ops import silu_and_mul
from loraplex.kernels.triton.lora_expand import ExpandTiles
from loraplex.kernels.triton.silu_and_mul_lora import SILU_LORA_TILES, launch_silu_and_mul_lora
from tests.kernels.interpreter_dtypes import DTYPES
from tests.kernels.lora_inputs import (
    ATOL,
    MANY_SLOT_RANKS,
    MANY_SLOT_TOKENS,
    LoRACase,
    LoRAKernelInputs,
    lora_case,
    make_inputs,
    naive_expand,
    poisoned_lora_out,
)

INTER = 72  # the intermediate size: gate and up are 72 columns each
CASES = {
    # Slot 1 without up, slot 2 without gate; 6 tokens without an adapter. Rows fit a page.
    "uneven-ranks": lora_case([[8, 16, 0], [8, 0, 4]], [5, 9, 3], 6, 16, (INTER, INTER), 256),
    # Slot 1's adapter targets neither slice (NaN scaling). B^T rows span 2 pages.
    "no-target-rows-span": lora_case([[4, 0], [4, 0]], [7, 4], 2, 8, (INTER, INTER), 64),
    "no-adapter-tokens": lora_case([[8], [8]], [0], 7, 8, (INTER, INTER), 256),
    "all-adapted": lora_case([[16, 8], [16, 8]], [17, 16], 0, 16, (INTER, INTER), 256),
    # More than 64 tokens: the mid row of the tiles (column runs).
    "mid-sized": lora_case([[16, 4], [16, 4]], [50, 17], 6, 16, (INTER, INTER), 256),
    # Many slots of a few tokens each.
    "many-small-segments": lora_case(
        [MANY_SLOT_RANKS, MANY_SLOT_RANKS[::-1]], MANY_SLOT_TOKENS, 5, 16, (INTER, INTER), 256
    ),
}
VARIANTS: dict[str, ExpandTiles] = {
    **{f"row{i}": tiles for i, (_, tiles) in enumerate(SILU_LORA_TILES.rows)},
    "column-runs-1": ExpandTiles(16, 32, max_block_k=16, num_warps=4, num_stages=2, target_programs=1),
    "column-runs-5": ExpandTiles(16, 32, max_block_k=16, num_warps=4, num_stages=2, target_programs=5),
}  # fmt: skip


def fused_args(inputs: LoRAKernelInputs, x: torch.Tensor, lora_out: torch.Tensor) -> tuple:
    tables = (inputs.pages, inputs.page_table, inputs.first_b, inputs.lora_ranks)
    return (x, lora_out, *tables, inputs.scalings, *inputs.mapping)


def gate_up(inputs: LoRAKernelInputs, dtype: torch.dtype) -> torch.Tensor:
    """A random gate_up output [num_tokens, 2 * INTER]."""
    return torch.randn(inputs.x.shape[0], 2 * INTER, device=inputs.x.device).to(dtype)


@pytest.mark.parametrize("case", [pytest.param(c, id=n) for n, c in CASES.items()])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_triton_matches_reference_and_leaves_x_alone(
    triton_kernels: ModuleType,
    device: torch.device,
    case: LoRACase,
    dtype: torch.dtype,
    variant: str,
) -> None:
    inputs = make_inputs(case, dtype, device)
    x, lora_out = gate_up(inputs, dtype), poisoned_lora_out(inputs)
    x_before = x.clone()
    expected = reference.silu_and_mul_lora(*fused_args(inputs, x, lora_out))
    actual = launch_silu_and_mul_lora(*fused_args(inputs, x, lora_out), VARIANTS[variant])
    assert actual.shape == (x.shape[0], INTER) and actual.dtype == dtype
    torch.testing.assert_close(actual, expected, atol=ATOL[dtype], rtol=1e-2)
    assert torch.equal(x, x_before)


@pytest.mark.parametrize("case", [pytest.param(c, id=n) for n, c in CASES.items()])
def test_reference_is_the_expand_then_the_activation(case: LoRACase) -> None:
    """Rows of tokens without an adapter, or whose adapter has neither slice, are the plain
    activation exactly; the others are the naive float64 expand, then SiLU-and-mul."""
    inputs = make_inputs(case, torch.float32, torch.device("cpu"))
    x, lora_out = gate_up(inputs, torch.float32), poisoned_lora_out(inputs)
    actual = reference.silu_and_mul_lora(*fused_args(inputs, x, lora_out))
    expected = silu_and_mul(naive_expand(inputs, lora_out, x, 0))
    torch.testing.assert_close(actual, expected, atol=1e-5, rtol=1e-5)
    ranks = inputs.slot_ranks()
    for t, s in enumerate(inputs.token_lora_slots.tolist()):
        if s < 0 or not (ranks[0][s] or ranks[1][s]):
            assert torch.equal(actual[t], silu_and_mul(x[t : t + 1])[0])


def test_launcher_rejects_bad_inputs(triton_kernels: ModuleType, device: torch.device) -> None:
    inputs = make_inputs(CASES["uneven-ranks"], torch.float32, device)
    x, lora_out = gate_up(inputs, torch.float32), poisoned_lora_out(inputs)
    with pytest.raises(ValueError, match="silu_and_mul_lora"):  # three slices
        triton_kernels.silu_and_mul_lora(*fused_args(inputs, x, lora_out.repeat(2, 1, 1)[:3]))
    with pytest.raises(ValueError, match="even"):
        triton_kernels.silu_and_mul_lora(*fused_args(inputs, x[:, :-1], lora_out))
    with pytest.raises(ValueError, match="float32"):
        triton_kernels.silu_and_mul_lora(*fused_args(inputs, x, lora_out.half()))
