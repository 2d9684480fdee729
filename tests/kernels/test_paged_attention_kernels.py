"""Paged attention: reference vs dense causal SDPA, Triton vs reference.

Cache blocks that no sequence owns, and the slots past each sequence's length, hold NaN: a
kernel that reads outside a sequence's blocks or past its length fails.
"""

from __future__ import annotations

from types import ModuleType

import pytest
import torch
import torch.nn.functional as F

from loraplex.kernels import reference
from loraplex.kernels.triton.paged_attention import ATTENTION_TILES, launch_paged_attention
from loraplex.kernels.triton.paged_decode_attention import (
    DECODE_ATTENTION_TILES,
    DecodeAttentionTiles,
    launch_paged_decode_attention,
)
from tests.kernels.interpreter_dtypes import DTYPES
from tests.kernels.paged_inputs import PagedBatch, make_paged_batch

ATOL = {torch.float32: 1e-4, torch.float16: 5e-3, torch.bfloat16: 3e-2}


def dense_attention(batch: PagedBatch, scale: float, sliding_window: int | None) -> torch.Tensor:
    """Unpack each sequence's K/V and run causal SDPA in float64: the oracle of the reference."""
    num_heads = batch.query.shape[1]
    _, block_size, num_kv_heads, head_dim = batch.key_cache.shape
    out = torch.zeros(batch.query.shape, dtype=torch.float64)
    starts = batch.query_start_loc.tolist()
    for seq, seq_len in enumerate(batch.seq_lens.tolist()):
        q_start, q_end = starts[seq], starts[seq + 1]
        if q_end == q_start:
            continue
        k = torch.stack(
            [
                batch.key_cache[batch.block_tables[seq, p // block_size], p % block_size]
                for p in range(seq_len)
            ]
        ).double()  # [seq_len, Hkv, D]
        v = torch.stack(
            [
                batch.value_cache[batch.block_tables[seq, p // block_size], p % block_size]
                for p in range(seq_len)
            ]
        ).double()
        q = batch.query[q_start:q_end].double()  # [q_len, H, D]
        q_pos = torch.arange(seq_len - (q_end - q_start), seq_len)[:, None]
        k_pos = torch.arange(seq_len)[None, :]
        allowed = k_pos <= q_pos
        if sliding_window is not None:
            allowed &= k_pos > q_pos - sliding_window
        group = num_heads // num_kv_heads
        o = F.scaled_dot_product_attention(
            q.transpose(0, 1),
            k.repeat_interleave(group, dim=1).transpose(0, 1),
            v.repeat_interleave(group, dim=1).transpose(0, 1),
            attn_mask=allowed,
            scale=scale,
        )
        out[q_start:q_end] = o.transpose(0, 1)
    return out


# (seq_lens, q_lens): a fresh prompt, decode, a full prompt, a chunked-prefill continuation, a
# second decode, and a long single-block-crossing prompt chunk.
MIXED = ([5, 40, 17, 70, 33, 50], [5, 1, 17, 30, 1, 49])
DECODE = ([1, 16, 17, 64, 90, 33], [1] * 6)
# (num_heads, num_kv_heads): GQA 2:1, plain MHA, GQA with a non-power-of-two group.
HEADS = [pytest.param(4, 2, id="gqa2"), pytest.param(2, 2, id="mha"), pytest.param(6, 2, id="gqa3")]


@pytest.mark.parametrize("sliding_window", [None, 8])
@pytest.mark.parametrize(("num_heads", "num_kv_heads"), HEADS)
@pytest.mark.parametrize("block_size", [16, 32])
def test_reference_matches_dense_causal_sdpa(
    num_heads: int, num_kv_heads: int, block_size: int, sliding_window: int | None
) -> None:
    cpu = torch.device("cpu")
    batch = make_paged_batch(*MIXED, num_heads, num_kv_heads, 32, block_size, torch.float32, cpu)
    actual = reference.paged_attention(*batch.args, 0.2, sliding_window)
    expected = dense_attention(batch, 0.2, sliding_window)
    torch.testing.assert_close(actual.double(), expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("num_heads", "num_kv_heads"), HEADS)
@pytest.mark.parametrize("block_size", [16, 32])
@pytest.mark.parametrize("head_dim", [16, 32])
@pytest.mark.parametrize("batch_kind", ["mixed", "decode"])
def test_triton_matches_reference(
    triton_kernels: ModuleType,
    device: torch.device,
    batch_kind: str,
    head_dim: int,
    block_size: int,
    num_heads: int,
    num_kv_heads: int,
    dtype: torch.dtype,
) -> None:
    seq_lens, q_lens = MIXED if batch_kind == "mixed" else DECODE
    batch = make_paged_batch(
        seq_lens, q_lens, num_heads, num_kv_heads, head_dim, block_size, dtype, device
    )
    scale = head_dim**-0.5
    expected = reference.paged_attention(*batch.args, scale)
    actual = triton_kernels.paged_attention(*batch.args, scale)
    assert actual.shape == expected.shape and actual.dtype == dtype
    torch.testing.assert_close(actual, expected, atol=ATOL[dtype], rtol=1e-2)


# Three leading decodes, then a fresh prompt, a chunk, and a decode that is not leading.
LEADING_DECODES = ([12, 40, 3, 5, 70, 33], [1, 1, 1, 5, 30, 1])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("num_heads", "num_kv_heads"), HEADS)
@pytest.mark.parametrize("sliding_window", [None, 8])
def test_mixed_step_runs_leading_decodes_split_kv(
    triton_kernels: ModuleType,
    device: torch.device,
    num_heads: int,
    num_kv_heads: int,
    sliding_window: int | None,
    dtype: torch.dtype,
) -> None:
    """With `num_decode_seqs`, a mixed step's leading decodes go through the decode kernel
    (bit for bit what a decode step of them alone gives) and the rest through the prefill
    kernel, into one output that matches the reference."""
    seq_lens, q_lens = LEADING_DECODES
    batch = make_paged_batch(seq_lens, q_lens, num_heads, num_kv_heads, 32, 16, dtype, device)
    scale = 32**-0.5
    actual = triton_kernels.paged_attention(*batch.args, scale, sliding_window, 3)
    expected = reference.paged_attention(*batch.args, scale, sliding_window)
    torch.testing.assert_close(actual, expected, atol=ATOL[dtype], rtol=1e-2)
    decodes_alone = triton_kernels.paged_attention(
        batch.query[:3],
        batch.key_cache,
        batch.value_cache,
        batch.block_tables[:3],
        batch.seq_lens[:3],
        batch.query_start_loc[:4],
        scale,
        sliding_window,
    )
    assert torch.equal(actual[:3], decodes_alone)
    # Without the hint the whole step runs through the prefill kernel: the same attention.
    unsplit = triton_kernels.paged_attention(*batch.args, scale, sliding_window)
    torch.testing.assert_close(actual, unsplit, atol=ATOL[dtype], rtol=1e-2)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("sliding_window", [1, 8, 20, 1000])
@pytest.mark.parametrize("batch_kind", ["mixed", "decode"])
def test_triton_sliding_window_matches_reference(
    triton_kernels: ModuleType,
    device: torch.device,
    batch_kind: str,
    sliding_window: int,
    dtype: torch.dtype,
) -> None:
    seq_lens, q_lens = MIXED if batch_kind == "mixed" else DECODE
    batch = make_paged_batch(seq_lens, q_lens, 4, 2, 32, 16, dtype, device)
    expected = reference.paged_attention(*batch.args, 0.2, sliding_window)
    actual = triton_kernels.paged_attention(*batch.args, 0.2, sliding_window)
    torch.testing.assert_close(actual, expected, atol=ATOL[dtype], rtol=1e-2)


def test_triton_odd_head_dim_and_empty_sequence(
    triton_kernels: ModuleType, device: torch.device
) -> None:
    """head_dim 24 is padded to 32 inside the kernel; a sequence with no query tokens is legal."""
    batch = make_paged_batch([9, 20, 31], [9, 0, 3], 4, 1, 24, 16, torch.float32, device)
    expected = reference.paged_attention(*batch.args, 0.3)
    actual = triton_kernels.paged_attention(*batch.args, 0.3)
    torch.testing.assert_close(actual, expected, atol=1e-4, rtol=1e-3)


def test_triton_paged_attention_rejects_bad_inputs(
    triton_kernels: ModuleType, device: torch.device
) -> None:
    batch = make_paged_batch([5], [5], 4, 2, 16, 16, torch.float32, device)
    with pytest.raises(ValueError, match="dtype"):
        triton_kernels.paged_attention(batch.query.half(), *batch.args[1:], 0.2)
    with pytest.raises(ValueError, match="int32"):
        args = list(batch.args)
        args[4] = batch.seq_lens.long()
        triton_kernels.paged_attention(*args, 0.2)
    with pytest.raises(ValueError, match="multiple"):
        triton_kernels.paged_attention(batch.query[:, :3], *batch.args[1:], 0.2)


@pytest.mark.parametrize("sliding_window", [None, 8])
@pytest.mark.parametrize("row", range(len(ATTENTION_TILES.rows)))
@pytest.mark.parametrize("batch_kind", ["mixed", "decode"])
def test_triton_matches_reference_with_each_tile_row(
    triton_kernels: ModuleType,
    device: torch.device,
    batch_kind: str,
    row: int,
    sliding_window: int | None,
) -> None:
    """Each row's tiles, passed explicitly, on decode and mixed batches alike."""
    seq_lens, q_lens = MIXED if batch_kind == "mixed" else DECODE
    batch = make_paged_batch(seq_lens, q_lens, 6, 2, 32, 16, torch.float32, device)
    expected = reference.paged_attention(*batch.args, 0.2, sliding_window)
    tiles = ATTENTION_TILES.rows[row][1]
    actual = launch_paged_attention(*batch.args, 0.2, sliding_window, tiles)
    torch.testing.assert_close(actual, expected, atol=1e-4, rtol=1e-2)


def test_attention_tiles_are_keyed_by_query_tokens_per_sequence() -> None:
    decode, prefill = (tiles for _, tiles in ATTENTION_TILES.rows)
    assert ATTENTION_TILES.lookup(1) == decode
    assert ATTENTION_TILES.lookup(2) == prefill


# Decode sequences long enough that tile_n 16 x 1 tile per split uses every split of 4, and
# short ones that use one; 3 splits (not a power of two) pads the merge.
LONG_DECODE = ([1, 15, 16, 17, 70, 129], [1] * 6)
SPLIT_TILES = [
    pytest.param(DecodeAttentionTiles(16, 1, 1, num_warps=4, num_stages=1), id="1-split"),
    pytest.param(DecodeAttentionTiles(16, 3, 1, num_warps=4, num_stages=1), id="3-splits"),
    pytest.param(DecodeAttentionTiles(16, 4, 2, num_warps=2, num_stages=2), id="4-splits-min-2"),
    pytest.param(DecodeAttentionTiles(32, 8, 1, num_warps=4, num_stages=2), id="8-splits-tile-32"),
] + [pytest.param(t, id=f"table-row-{i}") for i, (_, t) in enumerate(DECODE_ATTENTION_TILES.rows)]


@pytest.mark.parametrize("sliding_window", [None, 1, 20])
@pytest.mark.parametrize("tiles", SPLIT_TILES)
@pytest.mark.parametrize(("num_heads", "num_kv_heads"), HEADS)
def test_split_kv_decode_matches_reference(
    triton_kernels: ModuleType,
    device: torch.device,
    num_heads: int,
    num_kv_heads: int,
    tiles: DecodeAttentionTiles,
    sliding_window: int | None,
) -> None:
    """Every split count, used in full or in part, merges to the reference's output."""
    batch = make_paged_batch(*LONG_DECODE, num_heads, num_kv_heads, 32, 16, torch.float32, device)
    expected = reference.paged_attention(*batch.args, 0.2, sliding_window)
    actual = launch_paged_decode_attention(*batch.args, 0.2, sliding_window, tiles)
    torch.testing.assert_close(actual, expected, atol=1e-4, rtol=1e-3)


def test_split_kv_decode_rejects_more_tokens_than_sequences(
    triton_kernels: ModuleType, device: torch.device
) -> None:
    batch = make_paged_batch([5, 9], [1, 2], 4, 2, 16, 16, torch.float32, device)
    tiles = DECODE_ATTENTION_TILES.lookup(1)
    with pytest.raises(ValueError, match="one query token per sequence"):
        launch_paged_decode_attention(*batch.args, 0.2, None, tiles)


def test_decode_tiles_reject_zero_splits_and_odd_tiles() -> None:
    with pytest.raises(ValueError, match="max_splits"):
        DecodeAttentionTiles(16, 0, 1, num_warps=4, num_stages=1)
    with pytest.raises(ValueError, match="tile_n"):
        DecodeAttentionTiles(24, 2, 1, num_warps=4, num_stages=1)
