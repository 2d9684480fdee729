"""Multi-slice multi-LoRA shrink/expand: reference vs a per-token loop, Triton vs reference.

Rank padding of every weight, and every weight and the scaling of a slot that targets no slice,
is NaN, so a kernel that uses anything past a (slot, slice)'s rank, or computes for an empty
one, poisons its output and fails. Shrink outputs start as a sentinel: the shrink must zero
them (or, told not to, add to them). The fused shrink + expand is checked against the
reference's composition of the two, including when it never sees the shrink's signals.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import pytest
import torch

from loraplex.kernels.lora_mapping import build_lora_mapping
from loraplex.kernels.reference import lora as reference

IN_DIM = 200  # not a multiple of the shrink's BLOCK_K: exercises the K masks
SENTINEL = 1234.0  # exactly representable in fp16/bf16
Y_EXTRA = 40  # y columns beyond the slices, for y_offset
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
    lora_a: torch.Tensor  # [max_loras, num_slices, max_rank, IN_DIM]
    lora_b: torch.Tensor  # [max_loras, sum(slice_sizes), max_rank]
    scalings: torch.Tensor  # [max_loras] float32
    lora_ranks: torch.Tensor  # [num_slices, max_loras] int32
    slice_sizes: tuple[int, ...]
    token_lora_slots: torch.Tensor  # [num_tokens]; -1 = no adapter
    sorted_token_ids: torch.Tensor  # [num_tokens] int32
    slot_start_loc: torch.Tensor  # [max_loras + 1] int32

    @property
    def mapping(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return self.sorted_token_ids, self.slot_start_loc, self.lora_ranks

    @property
    def shape(self) -> tuple[int, int, int]:
        """(num_slices, num_tokens, max_rank): the shrink output's shape."""
        return len(self.slice_sizes), self.x.shape[0], self.lora_a.shape[2]


def make_batch(
    ranks: list[list[int]],
    tokens_per_slot: list[int],
    num_plain_tokens: int,
    max_rank: int,
    slice_sizes: tuple[int, ...],
    dtype: torch.dtype,
    device: torch.device,
) -> LoRABatch:
    """Random weights (ranks[slice][slot]) and a shuffled batch with tokens_per_slot[s] tokens
    on slot s."""
    num_slices, max_loras = len(ranks), len(ranks[0])
    assert len(slice_sizes) == num_slices
    slots = [s for s, n in enumerate(tokens_per_slot) for _ in range(n)]
    slots += [-1] * num_plain_tokens
    token_lora_slots = torch.tensor(slots, dtype=torch.int64)[torch.randperm(len(slots))]
    lora_a = torch.randn(max_loras, num_slices, max_rank, IN_DIM) / IN_DIM**0.5
    lora_b = torch.randn(max_loras, sum(slice_sizes), max_rank) / 4
    scalings = torch.rand(max_loras) + 0.5
    start = 0
    for i, size in enumerate(slice_sizes):
        for slot, rank in enumerate(ranks[i]):
            lora_a[slot, i, rank:] = float("nan")
            lora_b[slot, start : start + size, rank:] = float("nan")
        start += size
    for slot in range(max_loras):
        if not any(r[slot] for r in ranks):
            scalings[slot] = float("nan")  # an unused slot's scaling is stale: never read it
    ids, loc = build_lora_mapping(token_lora_slots, max_loras)
    return LoRABatch(
        x=torch.randn(len(slots), IN_DIM).to(device, dtype),
        lora_a=lora_a.to(device, dtype),
        lora_b=lora_b.to(device, dtype),
        scalings=scalings.to(device),
        lora_ranks=torch.tensor(ranks, dtype=torch.int32, device=device),
        slice_sizes=slice_sizes,
        token_lora_slots=token_lora_slots.to(device),
        sorted_token_ids=ids.to(device),
        slot_start_loc=loc.to(device),
    )


# (ranks[slice][slot], tokens per slot, tokens without adapter, max_rank, slice sizes)
CASES = {
    # 3 segments of BLOCK_M + 1 tokens: the segment-tile grid's bound is exactly reached.
    "tight-segment-tiles": ([[8, 8, 8]], [17, 17, 17], 0, 8, (24,)),
    "1-adapter-r4": ([[4]], [5], 0, 4, (72,)),
    "1-token": ([[8, 16]], [0, 1], 0, 16, (72,)),
    "no-adapter-tokens": ([[16, 8]], [0, 0], 6, 16, (72,)),
    "no-tokens": ([[8]], [0], 0, 8, (72,)),
    "2-slices-padded": ([[8, 16], [8, 0]], [3, 9], 2, 64, (72, 24)),
    # qkv-like: a slot without q, a slot with only v, an unused slot, a slot without tokens.
    "3-slices-uneven-ranks": (
        [[16, 0, 0, 4, 8], [16, 4, 0, 4, 8], [16, 4, 0, 0, 8]],
        [1, 3, 4, 37, 0],
        4,
        16,
        (136, 40, 40),
    ),
    "3-slices-r64-r4": ([[64, 4, 64], [64, 4, 64], [64, 4, 0]], [17, 16, 2], 1, 64, (24, 8, 8)),
    # Ranks past the shrink's MAX_BLOCK_N (64) and the expand's MAX_BLOCK_K: several rank tiles.
    "2-slices-r128": ([[100, 40], [128, 0]], [4, 6], 1, 128, (24, 16)),
}
CASE_PARAMS = [pytest.param(*case, id=name) for name, case in CASES.items()]
CASE_ARGS = ("ranks", "tokens_per_slot", "num_plain", "max_rank", "slice_sizes")


def _adapted(batch: LoRABatch) -> Iterator[tuple[int, int, int, int]]:
    """(slice, token, slot, rank) of every token whose slot has a non-zero rank for the slice."""
    ranks = batch.lora_ranks.tolist()
    for t, s in enumerate(batch.token_lora_slots.tolist()):
        for i in range(len(batch.slice_sizes)):
            if s >= 0 and ranks[i][s]:
                yield i, t, s, ranks[i][s]


def naive_shrink(batch: LoRABatch) -> torch.Tensor:
    out = torch.zeros(batch.shape, device=batch.x.device)
    for i, t, s, rank in _adapted(batch):
        out[i, t, :rank] = (batch.x[t].double() @ batch.lora_a[s, i, :rank].double().T).float()
    return out


def naive_expand(
    batch: LoRABatch, lora_out: torch.Tensor, y: torch.Tensor, y_offset: int
) -> torch.Tensor:
    y = y.clone()
    for i, t, s, rank in _adapted(batch):
        start = y_offset + sum(batch.slice_sizes[:i])
        rows = slice(start - y_offset, start - y_offset + batch.slice_sizes[i])
        delta = lora_out[i, t, :rank].double() @ batch.lora_b[s, rows, :rank].double().T
        cols = slice(start, start + batch.slice_sizes[i])
        y[t, cols] = (y[t, cols].double() + float(batch.scalings[s]) * delta).to(y.dtype)
    return y


def _shrunk(batch: LoRABatch) -> torch.Tensor:
    """A plausible fp32 shrink output (finite everywhere) to feed the expand."""
    return torch.randn(batch.shape, device=batch.x.device)


def _y(batch: LoRABatch, dtype: torch.dtype) -> torch.Tensor:
    width = sum(batch.slice_sizes) + Y_EXTRA
    return torch.randn(batch.x.shape[0], width, device=batch.x.device).to(dtype)


SHRINK = "loraplex.kernels.triton.lora_shrink"
EXPAND = "loraplex.kernels.triton.lora_expand"
FUSED = "loraplex.kernels.triton.lora_shrink_expand"


def _use_slot_grid(monkeypatch: pytest.MonkeyPatch) -> None:
    """A (token tile x slot) grid instead of segment tiles (lora_shrink.COMPACT_GRID)."""
    monkeypatch.setattr(importlib.import_module(SHRINK), "COMPACT_GRID", False)


def launch_params(*variants: str) -> list[Any]:
    """(launch variant, dtype) pairs: the default tiles in every dtype, the other variants (which
    change index arithmetic only) in float32."""
    params = [
        pytest.param("default", p.values[0], marks=p.marks, id=f"default-{p.id}") for p in DTYPES
    ]
    return params + [pytest.param(v, torch.float32, id=f"{v}-fp32") for v in variants]


@pytest.fixture
def shrink_tiles(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """The launcher's tile table (rank tiles of 16 for these small batches); or, for every
    number of tokens, tiny K chunks that split IN_DIM over 7 programs (the last one partial)
    with rank tiles up to 64; or the slot grid."""
    if request.param == "split-k":
        module = importlib.import_module(SHRINK)
        row = module.ShrinkTiles(
            16, block_k=16, k_chunk=32, max_block_n=64, num_warps=4, num_stages=2
        )
        monkeypatch.setattr(module, "SHRINK_TILES", ((1 << 30, row),))
    elif request.param == "slot-grid":
        _use_slot_grid(monkeypatch)
    return str(request.param)


@pytest.fixture
def expand_tiles(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """The launcher's tile table; or rank steps up to 64 (the decode row's are 16) for every
    number of tokens; or the slot grid."""
    if request.param == "wide-rank-steps":
        module = importlib.import_module(EXPAND)
        row = module.ExpandTiles(16, block_n=32, max_block_k=64, num_warps=4, num_stages=2)
        monkeypatch.setattr(module, "EXPAND_TILES", ((1 << 30, row),))
    elif request.param == "slot-grid":
        _use_slot_grid(monkeypatch)
    return str(request.param)


@pytest.fixture
def fused_tiles(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """lora_shrink_expand's tiles (rank tiles and steps of 16); or split-K into 7 chunks with
    rank tiles and steps up to 64 and narrow column tiles; or the slot grid."""
    if request.param == "split-k":
        module = importlib.import_module(FUSED)
        row = module.FusedTiles(
            16, block_k=16, k_chunk=32, block_n=32, max_block_r=64, num_warps=4, num_stages=2
        )
        monkeypatch.setattr(module, "FUSED_TILES", row)
    elif request.param == "slot-grid":
        _use_slot_grid(monkeypatch)
    return str(request.param)


# --- the reference is the spec: check it against the obvious per-token loop -------------------


@pytest.mark.parametrize(CASE_ARGS, CASE_PARAMS)
def test_reference_shrink_matches_per_token_loop(
    ranks: list[list[int]],
    tokens_per_slot: list[int],
    num_plain: int,
    max_rank: int,
    slice_sizes: tuple[int, ...],
) -> None:
    cpu = torch.device("cpu")
    batch = make_batch(ranks, tokens_per_slot, num_plain, max_rank, slice_sizes, torch.float32, cpu)
    out = torch.full(batch.shape, SENTINEL)
    reference.lora_shrink(batch.x, batch.lora_a, *batch.mapping, out)
    torch.testing.assert_close(out, naive_shrink(batch), atol=1e-5, rtol=1e-5)


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
    cpu = torch.device("cpu")
    batch = make_batch(ranks, tokens_per_slot, num_plain, max_rank, slice_sizes, torch.float32, cpu)
    lora_out = _shrunk(batch)
    y = _y(batch, torch.float32)
    expected = naive_expand(batch, lora_out, y, y_offset)
    args = (batch.scalings, y, y_offset, batch.slice_sizes)
    reference.lora_expand(lora_out, batch.lora_b, *batch.mapping, *args)
    torch.testing.assert_close(y, expected, atol=1e-5, rtol=1e-5)


def test_reference_shrink_without_zero_out_adds_into_out() -> None:
    cpu = torch.device("cpu")
    batch = make_batch([[8, 0], [4, 16]], [3, 5], 2, 16, (16, 8), torch.float32, cpu)
    start = torch.randn(batch.shape)
    out = start.clone()
    reference.lora_shrink(batch.x, batch.lora_a, *batch.mapping, out, zero_out=False)
    torch.testing.assert_close(out, start + naive_shrink(batch), atol=1e-5, rtol=1e-5)


def test_reference_shrink_expand_is_shrink_then_expand() -> None:
    cpu = torch.device("cpu")
    batch = make_batch([[8, 0], [4, 16]], [3, 5], 2, 16, (16, 8), torch.float32, cpu)
    lora_out = torch.zeros(batch.shape)
    y = _y(batch, torch.float32)
    expected = naive_expand(batch, naive_shrink(batch), y, 3)
    counters = torch.zeros_like(batch.lora_ranks)
    args = (batch.scalings, y, 3, batch.slice_sizes, lora_out, counters)
    reference.lora_shrink_expand(batch.x, batch.lora_a, batch.lora_b, *batch.mapping, *args)
    torch.testing.assert_close(lora_out, naive_shrink(batch), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(y, expected, atol=1e-5, rtol=1e-5)


def test_reference_zeroes_shrink_rows_and_leaves_y_rows_without_adapter() -> None:
    """Shrink rows of no-adapter tokens and of rank-0 (slot, slice) pairs become 0; the expand
    leaves those y columns untouched and changes every adapted one."""
    cpu = torch.device("cpu")
    batch = make_batch([[8, 0], [0, 0]], [4, 3], 5, 8, (16, 8), torch.float32, cpu)
    adapted = torch.tensor(batch.token_lora_slots.tolist()) == 0  # slot 0, slice 0 only
    out = torch.full(batch.shape, SENTINEL)
    reference.lora_shrink(batch.x, batch.lora_a, *batch.mapping, out)
    assert (out[0, ~adapted] == 0).all() and (out[1] == 0).all()
    assert (out[0, adapted] != 0).all()
    y = torch.randn(batch.x.shape[0], 24)
    y0 = y.clone()
    reference.lora_expand(out, batch.lora_b, *batch.mapping, batch.scalings, y, 0, (16, 8))
    assert torch.equal(y[~adapted], y0[~adapted]) and torch.equal(y[:, 16:], y0[:, 16:])
    assert not torch.isclose(y[adapted, :16], y0[adapted, :16]).any()


# --- Triton vs reference ----------------------------------------------------------------------


@pytest.mark.parametrize(CASE_ARGS, CASE_PARAMS)
@pytest.mark.parametrize(
    ("shrink_tiles", "dtype"), launch_params("split-k", "slot-grid"), indirect=["shrink_tiles"]
)
def test_triton_shrink_matches_reference(
    triton_kernels: ModuleType,
    device: torch.device,
    shrink_tiles: str,
    ranks: list[list[int]],
    tokens_per_slot: list[int],
    num_plain: int,
    max_rank: int,
    slice_sizes: tuple[int, ...],
    dtype: torch.dtype,
) -> None:
    batch = make_batch(ranks, tokens_per_slot, num_plain, max_rank, slice_sizes, dtype, device)
    expected = torch.full(batch.shape, SENTINEL, device=device)
    actual = expected.clone()
    reference.lora_shrink(batch.x, batch.lora_a, *batch.mapping, expected)
    triton_kernels.lora_shrink(batch.x, batch.lora_a, *batch.mapping, actual)
    torch.testing.assert_close(actual, expected, atol=ATOL[dtype], rtol=1e-2)


@pytest.mark.parametrize(CASE_ARGS, CASE_PARAMS)
@pytest.mark.parametrize(
    ("expand_tiles", "dtype"),
    launch_params("wide-rank-steps", "slot-grid"),
    indirect=["expand_tiles"],
)
@pytest.mark.parametrize("y_offset", [0, 24])
def test_triton_expand_matches_reference(
    triton_kernels: ModuleType,
    device: torch.device,
    expand_tiles: str,
    ranks: list[list[int]],
    tokens_per_slot: list[int],
    num_plain: int,
    max_rank: int,
    slice_sizes: tuple[int, ...],
    dtype: torch.dtype,
    y_offset: int,
) -> None:
    batch = make_batch(ranks, tokens_per_slot, num_plain, max_rank, slice_sizes, dtype, device)
    lora_out = _shrunk(batch)
    expected = _y(batch, dtype)
    actual = expected.clone()
    args = (batch.scalings, y_offset, batch.slice_sizes)
    reference.lora_expand(lora_out, batch.lora_b, *batch.mapping, args[0], expected, *args[1:])
    triton_kernels.lora_expand(lora_out, batch.lora_b, *batch.mapping, args[0], actual, *args[1:])
    torch.testing.assert_close(actual, expected, atol=ATOL[dtype], rtol=1e-2)


@pytest.mark.parametrize(
    ("shrink_tiles", "dtype"), launch_params("split-k"), indirect=["shrink_tiles"]
)
def test_triton_shrink_without_zero_out_adds_into_out(
    triton_kernels: ModuleType, device: torch.device, shrink_tiles: str, dtype: torch.dtype
) -> None:
    batch = make_batch([[16, 0, 4], [8, 16, 0]], [3, 20, 6], 2, 16, (16, 8), dtype, device)
    expected = torch.randn(batch.shape, device=device)
    actual = expected.clone()
    reference.lora_shrink(batch.x, batch.lora_a, *batch.mapping, expected, zero_out=False)
    triton_kernels.lora_shrink(batch.x, batch.lora_a, *batch.mapping, actual, zero_out=False)
    torch.testing.assert_close(actual, expected, atol=ATOL[dtype], rtol=1e-2)


def _shrink_expand(
    impl: ModuleType, batch: LoRABatch, dtype: torch.dtype, counters: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """(lora_out, y) after impl.lora_shrink_expand from zeroed buffers (or these counters)."""
    torch.manual_seed(1)
    y = _y(batch, dtype)
    lora_out = torch.zeros(batch.shape, device=batch.x.device)
    if counters is None:
        counters = torch.zeros_like(batch.lora_ranks)
    args = (batch.scalings, y, 24, batch.slice_sizes, lora_out, counters)
    impl.lora_shrink_expand(batch.x, batch.lora_a, batch.lora_b, *batch.mapping, *args)
    return lora_out, y


@pytest.mark.parametrize(CASE_ARGS, CASE_PARAMS)
@pytest.mark.parametrize(
    ("fused_tiles", "dtype"), launch_params("split-k", "slot-grid"), indirect=["fused_tiles"]
)
def test_triton_shrink_expand_matches_reference(
    triton_kernels: ModuleType,
    device: torch.device,
    fused_tiles: str,
    ranks: list[list[int]],
    tokens_per_slot: list[int],
    num_plain: int,
    max_rank: int,
    slice_sizes: tuple[int, ...],
    dtype: torch.dtype,
) -> None:
    batch = make_batch(ranks, tokens_per_slot, num_plain, max_rank, slice_sizes, dtype, device)
    fused = importlib.import_module(FUSED)
    lora_out, y = _shrink_expand(fused, batch, dtype)
    expected_lora_out, expected_y = _shrink_expand(reference, batch, dtype)
    torch.testing.assert_close(lora_out, expected_lora_out, atol=ATOL[dtype], rtol=1e-2)
    torch.testing.assert_close(y, expected_y, atol=ATOL[dtype], rtol=1e-2)


def test_triton_shrink_expand_without_signals_computes_rows_itself(
    triton_kernels: ModuleType, device: torch.device, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Counters that never reach their expected counts, as if no shrink program ran first: every
    expand program gives up waiting after MAX_SPINS polls and computes its rows itself."""
    fused = importlib.import_module(FUSED)
    monkeypatch.setattr(fused, "MAX_SPINS", 2)
    ranks = [[16, 0, 4, 40], [8, 16, 0, 40], [0, 4, 16, 40]]
    batch = make_batch(ranks, [3, 17, 6, 2], 2, 64, (40, 16, 24), torch.float32, device)
    stuck = torch.full_like(batch.lora_ranks, -(1 << 20))
    _, y = _shrink_expand(fused, batch, torch.float32, counters=stuck)
    _, expected_y = _shrink_expand(reference, batch, torch.float32)
    torch.testing.assert_close(y, expected_y, atol=ATOL[torch.float32], rtol=1e-2)


def test_triton_on_a_range_of_slices(triton_kernels: ModuleType, device: torch.device) -> None:
    """Strided views of stacked weights (slices 1..2 of 3, as LoRABatch launches when slice 0
    is not targeted): the launchers follow strides and offsets."""
    sizes = (40, 24, 24)
    batch = make_batch([[8, 8], [8, 4], [0, 16]], [5, 6], 2, 16, sizes, torch.float32, device)
    lora_a, lora_b, ranks = batch.lora_a[:, 1:], batch.lora_b[:, 40:], batch.lora_ranks[1:]
    mapping = (batch.sorted_token_ids, batch.slot_start_loc, ranks)
    outs, ys = [], []
    for impl in (reference, triton_kernels):
        out = torch.full((2, batch.x.shape[0], 16), SENTINEL, device=device)
        impl.lora_shrink(batch.x, lora_a, *mapping, out)
        y = torch.ones(batch.x.shape[0], 100, device=device)
        impl.lora_expand(out, lora_b, *mapping, batch.scalings, y, 40 + 3, sizes[1:])
        outs.append(out)
        ys.append(y)
    torch.testing.assert_close(outs[1], outs[0], atol=1e-4, rtol=1e-2)
    torch.testing.assert_close(ys[1], ys[0], atol=1e-4, rtol=1e-2)
    assert not torch.equal(ys[0][:, 43:], torch.ones_like(ys[0][:, 43:]))


@pytest.mark.parametrize("dtype", DTYPES)
def test_triton_shrink_then_expand_prefill_sized(
    triton_kernels: ModuleType, device: torch.device, dtype: torch.dtype
) -> None:
    """Enough tokens for the prefill tile row; the expand reads the shrink's own output."""
    sizes = (72, 24)
    ranks = [[16, 8, 0], [4, 16, 0]]
    batch = make_batch(ranks, [300, 200, 10], 20, 16, sizes, dtype, device)
    num_tokens = batch.x.shape[0]
    shrink = importlib.import_module("loraplex.kernels.triton.lora_shrink")
    expand = importlib.import_module("loraplex.kernels.triton.lora_expand")
    assert shrink.shrink_tiles(num_tokens) == shrink.SHRINK_TILES[-1][1]
    assert expand.expand_tiles(num_tokens) == expand.EXPAND_TILES[-1][1]
    shrunk = {}
    ys = {}
    for name, impl in (("reference", reference), ("triton", triton_kernels)):
        shrunk[name] = torch.zeros(batch.shape, device=device)
        impl.lora_shrink(batch.x, batch.lora_a, *batch.mapping, shrunk[name])
        ys[name] = torch.ones(num_tokens, sum(sizes), device=device, dtype=dtype)
        impl.lora_expand(
            shrunk[name], batch.lora_b, *batch.mapping, batch.scalings, ys[name], 0, sizes
        )
    torch.testing.assert_close(shrunk["triton"], shrunk["reference"], atol=ATOL[dtype], rtol=1e-2)
    torch.testing.assert_close(ys["triton"], ys["reference"], atol=ATOL[dtype], rtol=1e-2)


def test_triton_launchers_reject_bad_inputs(
    triton_kernels: ModuleType, device: torch.device
) -> None:
    batch = make_batch([[8], [8]], [3], 0, 8, (16, 16), torch.float32, device)
    out = torch.zeros(batch.shape, device=device)
    with pytest.raises(ValueError, match="dtype"):
        triton_kernels.lora_shrink(batch.x.half(), batch.lora_a, *batch.mapping, out)
    with pytest.raises(ValueError, match="out must be"):
        triton_kernels.lora_shrink(batch.x, batch.lora_a, *batch.mapping, out[:1])
    with pytest.raises(ValueError, match="float32"):
        triton_kernels.lora_shrink(batch.x, batch.lora_a, *batch.mapping, out.half())
    with pytest.raises(ValueError, match="int32"):
        ids64 = batch.sorted_token_ids.long()
        triton_kernels.lora_shrink(batch.x, batch.lora_a, ids64, *batch.mapping[1:], out)
    with pytest.raises(ValueError, match="lora_ranks"):
        ranks = batch.lora_ranks[:1]
        triton_kernels.lora_shrink(batch.x, batch.lora_a, *batch.mapping[:2], ranks, out)
    y = torch.zeros(3, 32, device=device)
    args = (*batch.mapping, batch.scalings, y)
    with pytest.raises(ValueError, match="y_offset"):
        triton_kernels.lora_expand(out, batch.lora_b, *args, 1, (16, 16))
    with pytest.raises(ValueError, match="slice sizes"):
        triton_kernels.lora_expand(out, batch.lora_b, *args, 0, (16, 8))
    y = torch.zeros(3, 32, device=device)
    fused = importlib.import_module(FUSED)
    for counters in (batch.lora_ranks.float(), batch.lora_ranks[:, :0]):
        with pytest.raises(ValueError, match="counters"):
            fused.lora_shrink_expand(
                batch.x,
                batch.lora_a,
                batch.lora_b,
                *batch.mapping,
                batch.scalings,
                y,
                0,
                (16, 16),
                out,
                counters,
            )
