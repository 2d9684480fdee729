"""Multi-LoRA shrink/expand: reference vs a per-token loop, Triton vs reference.

Rank padding of every weight, and every weight and the scaling of an empty slot, is NaN, so a
kernel that reads past a slot's rank, or computes for an empty slot, poisons its output and fails.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from types import ModuleType

import pytest
import torch

from loraplex.kernels.lora_mapping import build_lora_mapping
from loraplex.kernels.reference import lora as reference

IN_DIM = 200  # not a multiple of the shrink's BLOCK_K: exercises the K masks
OUT_DIM = 72  # not a multiple of the expand's BLOCK_N
SENTINEL = 1234.0  # exactly representable in fp16/bf16
BF16 = pytest.param(
    torch.bfloat16,
    id="bf16",
    marks=pytest.mark.skipif(
        not torch.cuda.is_available(), reason="Triton's CPU interpreter has no bfloat16 tl.dot"
    ),
)
DTYPES = [pytest.param(torch.float32, id="fp32"), pytest.param(torch.float16, id="fp16"), BF16]
# Absolute tolerance of Triton vs reference, per input dtype (values are O(1)).
ATOL = {torch.float32: 1e-4, torch.float16: 2e-2, torch.bfloat16: 1e-1}


@dataclass
class LoRABatch:
    x: torch.Tensor  # [num_tokens, IN_DIM]
    lora_a: torch.Tensor  # [max_loras, max_rank, IN_DIM]
    lora_b: torch.Tensor  # [max_loras, OUT_DIM, max_rank]
    scalings: torch.Tensor  # [max_loras] float32
    lora_ranks: torch.Tensor  # [max_loras] int32
    token_lora_slots: torch.Tensor  # [num_tokens]; -1 = no adapter
    sorted_token_ids: torch.Tensor  # [num_tokens] int32
    slot_start_loc: torch.Tensor  # [max_loras + 1] int32

    @property
    def mapping(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return self.sorted_token_ids, self.slot_start_loc, self.lora_ranks


def make_batch(
    ranks: list[int],
    tokens_per_slot: list[int],
    num_plain_tokens: int,
    max_rank: int,
    dtype: torch.dtype,
    device: torch.device,
) -> LoRABatch:
    """Random weights and a shuffled batch with tokens_per_slot[s] tokens on slot s."""
    max_loras = len(ranks)
    slots = [s for s, n in enumerate(tokens_per_slot) for _ in range(n)]
    slots += [-1] * num_plain_tokens
    token_lora_slots = torch.tensor(slots, dtype=torch.int64)[torch.randperm(len(slots))]
    lora_a = torch.randn(max_loras, max_rank, IN_DIM) / IN_DIM**0.5
    lora_b = torch.randn(max_loras, OUT_DIM, max_rank) / 4
    scalings = torch.rand(max_loras) + 0.5
    for slot, rank in enumerate(ranks):
        lora_a[slot, rank:] = float("nan")
        lora_b[slot, :, rank:] = float("nan")
        if rank == 0:
            scalings[slot] = float("nan")  # an empty slot's scaling is stale: never read it
    ids, loc = build_lora_mapping(token_lora_slots, max_loras)
    return LoRABatch(
        x=torch.randn(len(slots), IN_DIM).to(device, dtype),
        lora_a=lora_a.to(device, dtype),
        lora_b=lora_b.to(device, dtype),
        scalings=scalings.to(device),
        lora_ranks=torch.tensor(ranks, dtype=torch.int32, device=device),
        token_lora_slots=token_lora_slots.to(device),
        sorted_token_ids=ids.to(device),
        slot_start_loc=loc.to(device),
    )


# (ranks per slot, tokens per slot, tokens without adapter, max_rank)
CASES = {
    "1-adapter-r4": ([4], [5], 0, 4),
    "1-token": ([8, 16], [0, 1], 0, 16),
    "no-adapter-tokens": ([16, 8], [0, 0], 6, 16),
    "no-tokens": ([8], [0], 0, 8),
    "2-adapters-padded": ([8, 16], [3, 9], 2, 64),
    "5-uneven-with-empty-slot": ([16, 0, 64, 4, 8], [1, 3, 37, 0, 5], 4, 64),
    "3-adapters-r64-r4": ([64, 4, 64], [17, 16, 2], 1, 64),
}
CASE_PARAMS = [pytest.param(*case, id=name) for name, case in CASES.items()]


def _adapter_rows(batch: LoRABatch) -> tuple[list[int], list[int]]:
    """(token, slot) pairs of tokens whose slot has a non-zero rank."""
    ranks = batch.lora_ranks.tolist()
    pairs = [(t, s) for t, s in enumerate(batch.token_lora_slots.tolist()) if s >= 0 and ranks[s]]
    return [t for t, _ in pairs], [s for _, s in pairs]


def naive_shrink(batch: LoRABatch, out: torch.Tensor) -> torch.Tensor:
    out = out.clone()
    for t, s in zip(*_adapter_rows(batch), strict=True):
        rank = int(batch.lora_ranks[s])
        out[t, :rank] = (batch.x[t].double() @ batch.lora_a[s, :rank].double().T).to(out.dtype)
    return out


def naive_expand(
    batch: LoRABatch, lora_out: torch.Tensor, y: torch.Tensor, y_offset: int
) -> torch.Tensor:
    y = y.clone()
    for t, s in zip(*_adapter_rows(batch), strict=True):
        rank = int(batch.lora_ranks[s])
        delta = lora_out[t, :rank].double() @ batch.lora_b[s, :, :rank].double().T
        cols = slice(y_offset, y_offset + OUT_DIM)
        y[t, cols] = (y[t, cols].double() + float(batch.scalings[s]) * delta).to(y.dtype)
    return y


def _shrunk(batch: LoRABatch, max_rank: int) -> torch.Tensor:
    """A plausible fp32 shrink output (finite everywhere) to feed the expand."""
    return torch.randn(batch.x.shape[0], max_rank, device=batch.x.device)


# --- the reference is the spec: check it against the obvious per-token loop -------------------


@pytest.mark.parametrize(("ranks", "tokens_per_slot", "num_plain", "max_rank"), CASE_PARAMS)
def test_reference_shrink_matches_per_token_loop(
    ranks: list[int], tokens_per_slot: list[int], num_plain: int, max_rank: int
) -> None:
    cpu = torch.device("cpu")
    batch = make_batch(ranks, tokens_per_slot, num_plain, max_rank, torch.float32, cpu)
    out = torch.full((batch.x.shape[0], max_rank), SENTINEL)
    expected = naive_shrink(batch, out)
    reference.lora_shrink(batch.x, batch.lora_a, *batch.mapping, out)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(("ranks", "tokens_per_slot", "num_plain", "max_rank"), CASE_PARAMS)
@pytest.mark.parametrize("y_offset", [0, 24])
def test_reference_expand_matches_per_token_loop(
    ranks: list[int], tokens_per_slot: list[int], num_plain: int, max_rank: int, y_offset: int
) -> None:
    cpu = torch.device("cpu")
    batch = make_batch(ranks, tokens_per_slot, num_plain, max_rank, torch.float32, cpu)
    lora_out = _shrunk(batch, max_rank)
    y = torch.randn(batch.x.shape[0], OUT_DIM + 40)
    expected = naive_expand(batch, lora_out, y, y_offset)
    reference.lora_expand(lora_out, batch.lora_b, *batch.mapping, batch.scalings, y, y_offset)
    torch.testing.assert_close(y, expected, atol=1e-5, rtol=1e-5)


def test_reference_leaves_rows_without_adapter_untouched() -> None:
    cpu = torch.device("cpu")
    batch = make_batch([8, 0], [4, 3], 5, 8, torch.float32, cpu)
    untouched = torch.tensor(batch.token_lora_slots.tolist()) != 0  # no adapter or empty slot
    out = torch.full((batch.x.shape[0], 8), SENTINEL)
    reference.lora_shrink(batch.x, batch.lora_a, *batch.mapping, out)
    assert (out[untouched] == SENTINEL).all()
    assert (out[~untouched] != SENTINEL).all()
    y = torch.randn(batch.x.shape[0], OUT_DIM)
    y0 = y.clone()
    reference.lora_expand(out, batch.lora_b, *batch.mapping, batch.scalings, y, 0)
    assert torch.equal(y[untouched], y0[untouched])
    assert not torch.isclose(y[~untouched], y0[~untouched]).any()


# --- Triton vs reference ----------------------------------------------------------------------


@pytest.mark.parametrize(("ranks", "tokens_per_slot", "num_plain", "max_rank"), CASE_PARAMS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("fp32_out", [True, False], ids=["out-fp32", "out-x-dtype"])
def test_triton_shrink_matches_reference(
    triton_kernels: ModuleType,
    device: torch.device,
    ranks: list[int],
    tokens_per_slot: list[int],
    num_plain: int,
    max_rank: int,
    dtype: torch.dtype,
    fp32_out: bool,
) -> None:
    batch = make_batch(ranks, tokens_per_slot, num_plain, max_rank, dtype, device)
    out_dtype = torch.float32 if fp32_out else dtype
    expected = torch.full((batch.x.shape[0], max_rank), SENTINEL, dtype=out_dtype, device=device)
    actual = expected.clone()
    reference.lora_shrink(batch.x, batch.lora_a, *batch.mapping, expected)
    triton_kernels.lora_shrink(batch.x, batch.lora_a, *batch.mapping, actual)
    torch.testing.assert_close(actual, expected, atol=ATOL[dtype], rtol=1e-2)


@pytest.mark.parametrize(("ranks", "tokens_per_slot", "num_plain", "max_rank"), CASE_PARAMS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("y_offset", [0, 24])
def test_triton_expand_matches_reference(
    triton_kernels: ModuleType,
    device: torch.device,
    ranks: list[int],
    tokens_per_slot: list[int],
    num_plain: int,
    max_rank: int,
    dtype: torch.dtype,
    y_offset: int,
) -> None:
    batch = make_batch(ranks, tokens_per_slot, num_plain, max_rank, dtype, device)
    lora_out = _shrunk(batch, max_rank)
    expected = torch.randn(batch.x.shape[0], OUT_DIM + 40, device=device).to(dtype)
    actual = expected.clone()
    reference.lora_expand(
        lora_out, batch.lora_b, *batch.mapping, batch.scalings, expected, y_offset
    )
    triton_kernels.lora_expand(
        lora_out, batch.lora_b, *batch.mapping, batch.scalings, actual, y_offset
    )
    torch.testing.assert_close(actual, expected, atol=ATOL[dtype], rtol=1e-2)


@pytest.mark.parametrize("dtype", DTYPES)
def test_triton_shrink_then_expand_prefill_sized(
    triton_kernels: ModuleType, device: torch.device, dtype: torch.dtype
) -> None:
    """Enough tokens for the prefill tile shape; the expand reads the shrink's own output."""
    batch = make_batch([16, 8, 0], [300, 200, 10], 20, 16, dtype, device)
    num_tokens = batch.x.shape[0]
    for module in ("lora_shrink", "lora_expand"):
        tiles = importlib.import_module(f"loraplex.kernels.triton.{module}")
        assert num_tokens >= tiles.PREFILL_MIN_TOKENS
    shrunk = {}
    ys = {}
    for name, impl in (("reference", reference), ("triton", triton_kernels)):
        shrunk[name] = torch.zeros(num_tokens, 16, device=device)
        impl.lora_shrink(batch.x, batch.lora_a, *batch.mapping, shrunk[name])
        ys[name] = torch.ones(num_tokens, OUT_DIM, device=device, dtype=dtype)
        impl.lora_expand(shrunk[name], batch.lora_b, *batch.mapping, batch.scalings, ys[name], 0)
    torch.testing.assert_close(shrunk["triton"], shrunk["reference"], atol=ATOL[dtype], rtol=1e-2)
    torch.testing.assert_close(ys["triton"], ys["reference"], atol=ATOL[dtype], rtol=1e-2)


def test_triton_launchers_reject_bad_inputs(
    triton_kernels: ModuleType, device: torch.device
) -> None:
    batch = make_batch([8], [3], 0, 8, torch.float32, device)
    out = torch.zeros(3, 8, device=device)
    with pytest.raises(ValueError, match="dtype"):
        triton_kernels.lora_shrink(batch.x.half(), batch.lora_a, *batch.mapping, out)
    with pytest.raises(ValueError, match="out must be"):
        triton_kernels.lora_shrink(batch.x, batch.lora_a, *batch.mapping, out[:, :4])
    with pytest.raises(ValueError, match="int32"):
        ids64 = batch.sorted_token_ids.long()
        triton_kernels.lora_shrink(batch.x, batch.lora_a, ids64, *batch.mapping[1:], out)
    y = torch.zeros(3, OUT_DIM, device=device)
    with pytest.raises(ValueError, match="y_offset"):
        triton_kernels.lora_expand(out, batch.lora_b, *batch.mapping, batch.scalings, y, 1)
