"""lora_expand_silu_and_mul: the gate/up expand fused into SwiGLU.

The reference is by definition lora_expand into a copy of y, then silu_and_mul; it is checked
against a per-token formula in float64. The Triton kernel must equal the reference for every
token, adapted or not (the no-adapter tail is computed too), with NaN in every weight past a
(slot, slice)'s rank and in the scaling of slots that target nothing (tests/kernels/
test_lora_kernels.make_batch), and must leave y as it was.
"""

from __future__ import annotations

import importlib
from types import ModuleType

import pytest
import torch
import torch.nn.functional as F

from loraplex.kernels.reference import lora as reference
from tests.kernels.test_lora_kernels import ATOL, DTYPES, EXPAND, LoRABatch, make_batch

INTER = 40  # the intermediate size: two slices of 40 columns (gate, up)

# (gate and up ranks per slot, tokens per slot, tokens without adapter, max_rank)
CASES = {
    "mixed": ([[8, 16, 0], [8, 0, 4]], [5, 3, 2], 4, 16),
    "no-adapter-tokens-only": ([[8, 8]], [0, 0], 7, 8),
    "every-token-adapted": ([[4, 16], [4, 16]], [17, 2], 0, 16),
    "one-token": ([[8], [8]], [1], 0, 8),
    "no-tokens": ([[8], [8]], [0], 0, 8),
    # Ranks past the decode row's rank step (16): the kernel walks the rank in steps.
    "rank-steps": ([[40, 64, 0], [64, 0, 24]], [3, 18, 1], 2, 64),
}
CASE_PARAMS = [pytest.param(*case, id=name) for name, case in CASES.items()]


def _batch(ranks: list[list[int]], tokens: list[int], num_plain: int, max_rank: int,
           dtype: torch.dtype, device: torch.device) -> tuple[LoRABatch, torch.Tensor]:
    if len(ranks) == 1:  # one row given: the same ranks for gate and up
        ranks = ranks * 2
    batch = make_batch(ranks, tokens, num_plain, max_rank, (INTER, INTER), dtype, device)
    lora_out = torch.randn(batch.shape, device=device)
    return batch, lora_out


def _y(batch: LoRABatch, dtype: torch.dtype) -> torch.Tensor:
    return torch.randn(batch.x.shape[0], 2 * INTER, device=batch.x.device).to(dtype)


def _args(batch: LoRABatch, lora_out: torch.Tensor, y: torch.Tensor) -> tuple:
    return (lora_out, batch.lora_b, *batch.mapping, batch.scalings, y)


@pytest.mark.parametrize(("ranks", "tokens", "num_plain", "max_rank"), CASE_PARAMS)
def test_reference_matches_per_token_formula(
    ranks: list[list[int]], tokens: list[int], num_plain: int, max_rank: int
) -> None:
    batch, lora_out = _batch(ranks, tokens, num_plain, max_rank, torch.float32, torch.device("cpu"))
    y = _y(batch, torch.float32)
    y_before = y.clone()
    out = reference.lora_expand_silu_and_mul(*_args(batch, lora_out, y))
    torch.testing.assert_close(y, y_before)  # y is only read
    ranks_full = batch.lora_ranks.tolist()
    expected = torch.empty(y.shape[0], INTER, dtype=torch.float64)
    for t, slot in enumerate(batch.token_lora_slots.tolist()):
        gate_up = y[t].double().clone()
        for i in range(2):
            rank = ranks_full[i][slot] if slot >= 0 else 0
            if rank:
                b = batch.lora_b[slot, i * INTER : (i + 1) * INTER, :rank].double()
                delta = lora_out[i, t, :rank].double() @ b.T
                gate_up[i * INTER : (i + 1) * INTER] += float(batch.scalings[slot]) * delta
        expected[t] = F.silu(gate_up[:INTER]) * gate_up[INTER:]
    torch.testing.assert_close(out.double(), expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("ranks", "tokens", "num_plain", "max_rank"), CASE_PARAMS)
def test_triton_matches_reference(
    triton_kernels: ModuleType,
    device: torch.device,
    ranks: list[list[int]],
    tokens: list[int],
    num_plain: int,
    max_rank: int,
    dtype: torch.dtype,
) -> None:
    batch, lora_out = _batch(ranks, tokens, num_plain, max_rank, dtype, device)
    y = _y(batch, dtype)
    y_before = y.clone()
    expected = reference.lora_expand_silu_and_mul(*_args(batch, lora_out, y))
    actual = triton_kernels.lora_expand_silu_and_mul(*_args(batch, lora_out, y))
    torch.testing.assert_close(y, y_before)
    assert actual.shape == (y.shape[0], INTER) and actual.dtype == dtype
    torch.testing.assert_close(actual, expected, atol=ATOL[dtype], rtol=1e-2)


def test_triton_with_wide_rank_steps_and_narrow_column_tiles(
    triton_kernels: ModuleType, device: torch.device, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Other tiles change only index arithmetic: rank steps of 64, column tiles of 16 (so I =
    40 spans a partial third tile)."""
    module = importlib.import_module(EXPAND)
    row = module.ExpandTiles(16, block_n=16, max_block_k=64, num_warps=4, num_stages=2)
    monkeypatch.setattr(module, "EXPAND_TILES", ((1 << 30, row),))
    batch, lora_out = _batch(*CASES["rank-steps"], torch.float32, device)
    y = _y(batch, torch.float32)
    expected = reference.lora_expand_silu_and_mul(*_args(batch, lora_out, y))
    actual = triton_kernels.lora_expand_silu_and_mul(*_args(batch, lora_out, y))
    torch.testing.assert_close(actual, expected, atol=1e-4, rtol=1e-2)


def test_triton_rejects_bad_inputs(triton_kernels: ModuleType, device: torch.device) -> None:
    batch, lora_out = _batch(*CASES["mixed"], torch.float32, device)
    y = _y(batch, torch.float32)
    fn = triton_kernels.lora_expand_silu_and_mul
    with pytest.raises(ValueError, match="slice sizes"):
        fn(lora_out, batch.lora_b, *batch.mapping, batch.scalings, y[:, :-2])
    with pytest.raises(ValueError, match="one slice size per lora_out slice"):
        fn(lora_out[:1], batch.lora_b, *batch.mapping, batch.scalings, y)
    with pytest.raises(ValueError, match="int32"):
        ids = batch.sorted_token_ids.long()
        fn(lora_out, batch.lora_b, ids, *batch.mapping[1:], batch.scalings, y)
