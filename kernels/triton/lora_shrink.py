"""Multi-slice, split-K multi-LoRA shrink (x @ A.T per adapter segment) in Triton: Punica SGMV.

Method: Punica's segmented gather matrix multiplication (Chen et al., 2023, "Punica: Multi-Tenant
LoRA Serving"), with the slices of a fused projection (q/k/v, gate/up) in one launch as vLLM's
`lora_shrink` does. Tokens are grouped by adapter slot (`kernels/lora_mapping.py`); a program
owns one (segment tile, in_dim chunk, rank tile, slice), gathers its token rows of `x` through
`sorted_token_ids` (no copy of x), multiplies them by its slot's slice of `lora_a` over its chunk
of in_dim and atomically adds the partial product into `out` (split-K):

    grid = (num_segment_tiles, cdiv(in_dim, K_CHUNK) * cdiv(max_rank, BLOCK_N), num_slices)
    program_id(1) = k_chunk * num_rank_tiles + rank_tile

Segment tiles (`segment_tile`, shared with the expand): the BLOCK_M-token tiles of every segment
whose slot has a rank for the program's slice, numbered in slot order. Each program finds its
(slot, first token) from `slot_start_loc` and the slice's ranks, loaded as vectors:

    slot_start_loc [0, 5, 5, 22]   ranks [8, 16, 4]   BLOCK_M 16
    tiles per slot  1, 0, 2        tile 0 -> slot 0, tokens [0, 5); 1 -> slot 2, [5, 21);
                                   2 -> slot 2, [21, 22); 3.. -> none (returns at once)

The grid depends on shapes only, never on the mapping's values (CUDA-graph friendly): the bound
num_tokens // BLOCK_M + min(max_loras, num_tokens) holds for any mapping (each segment adds at
most one partial tile). At decode this launches ~max_loras times fewer programs than a
(token tile x slot) grid, whose programs mostly find no tokens. `COMPACT_GRID = False` restores
that grid (one tile row per slot) for comparison. Programs whose rank tile starts at or past
their slot's rank for their slice return at once. BLOCK_N is max_rank rounded up to a power of
two, capped per tile row (`max_block_n`); columns past a slot's rank are masked (not read).

Why split-K: at decode a slot owns a few tokens, so without it only `max_loras` programs per
slice are busy and each walks all of in_dim (4096..14336) serially: latency bound. With chunks
of K_CHUNK, every (slot, slice) gets cdiv(in_dim, K_CHUNK) programs. The launcher zeroes `out`
first (a memset), unless told that `out` is already zero (`zero_out=False`: one buffer zeroed
once for many launches, engine/lora/lora_batch.py); the kernel then always adds.

Tiles (`SHRINK_TILES`, by number of tokens of the launch):
- decode (<= 64 tokens): segments of a few tokens, so BLOCK_M = 16 (tl.dot's minimum) and
  K_CHUNK = 512 (4 steps of 128): 8 adapters x 3 slices x 8 chunks of in_dim 4096 = 192 busy
  programs, >= 1 per SM of an H100/H200, each a short pipelined loop. Rank tiles of 16: with
  storage padded to a larger max_lora_rank (64 by default) a rank-16 adapter costs one program
  per chunk, and registers and shared memory stay those of a 16-column tile.
- mid (<= 512): segments of tens of tokens: BLOCK_M = 32, same chunks.
- prefill: BLOCK_M = 64, BLOCK_K = 64 and longer chunks (1024): thousands of tokens already
  fill the GPU; split-K only keeps short batches busy and bounds the serial loop. BLOCK_K = 64
  keeps 3 pipeline stages of fp32 tiles at rank 64 under 100 KB of shared memory.

Numerics: products accumulate in float32; `out` is float32 (the expand reads an unrounded
intermediate). Split-K makes the order of the fp32 additions, hence the last bits of `out`,
vary between runs (as in vLLM). With `zero_out`, rows of `out` of tokens outside every segment,
and columns past a slot's rank, are 0; without it they are left as they were.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

import torch
import triton
import triton.language as tl


@dataclass(frozen=True)
class ShrinkTiles:
    """Tile shape of one launch."""

    block_m: int  # token rows per program
    block_k: int  # in_dim step of the inner loop
    k_chunk: int  # in_dim per program (split-K); a multiple of block_k
    max_block_n: int  # rank columns per program: max_rank rounded up to a power of 2, capped
    num_warps: int
    num_stages: int


# (largest number of tokens, tiles): the first row that fits the launch is used. The benchmark
# (bench/kernels_check.py) swaps the decode row to compare candidates.
SHRINK_TILES: tuple[tuple[int, ShrinkTiles], ...] = (
    # Decode: k_chunk 256 measured best on the H200 (34 vs 39 us per layer at T 64, rank 16).
    (64, ShrinkTiles(16, block_k=128, k_chunk=256, max_block_n=16, num_warps=4, num_stages=2)),
    (512, ShrinkTiles(32, block_k=128, k_chunk=512, max_block_n=64, num_warps=4, num_stages=3)),
    (
        sys.maxsize,
        ShrinkTiles(64, block_k=64, k_chunk=1024, max_block_n=64, num_warps=4, num_stages=3),
    ),
)
MIN_BLOCK_N = 16  # tl.dot's smallest N
COMPACT_GRID = True  # segment tiles (see above); False: one row of token tiles per slot


def shrink_tiles(num_tokens: int) -> ShrinkTiles:
    return next(tiles for bound, tiles in SHRINK_TILES if num_tokens <= bound)


def rank_block(max_rank: int, max_block: int) -> int:
    """A rank tile: max_rank rounded up to a power of two, within [MIN_BLOCK_N, max_block]."""
    return min(max_block, max(MIN_BLOCK_N, triton.next_power_of_2(max_rank)))


def segment_grid(num_tokens: int, max_loras: int, block_m: int) -> tuple[int, int, bool]:
    """(number of segment tiles to launch, SLOTS, COMPACT) for `segment_tile`."""
    slots = max(2, triton.next_power_of_2(max_loras))
    if COMPACT_GRID:
        return num_tokens // block_m + min(max_loras, num_tokens), slots, True
    return triton.cdiv(num_tokens, block_m) * max_loras, slots, False


@triton.jit
def segment_tile(  # type: ignore[no-untyped-def]
    tile,
    slot_start_loc_ptr,
    ranks_ptr,  # one slice's ranks: [max_loras]
    max_loras,
    BLOCK_M: tl.constexpr,
    SLOTS: tl.constexpr,  # max_loras rounded up to a power of two
    COMPACT: tl.constexpr,
):
    """(slot, m_start, seg_end, rank) of a segment tile: tokens sorted_token_ids[m_start:
    min(m_start + BLOCK_M, seg_end)] of `slot`, whose rank for the slice is `rank`. No work when
    m_start >= seg_end (and slot is then meaningless)."""
    if COMPACT:
        offs = tl.arange(0, SLOTS)
        valid = offs < max_loras
        starts = tl.load(slot_start_loc_ptr + offs, mask=valid, other=0)
        ends = tl.load(slot_start_loc_ptr + offs + 1, mask=valid, other=0)
        ranks = tl.load(ranks_ptr + offs, mask=valid, other=0)
        num_tiles = tl.where(ranks > 0, (ends - starts + BLOCK_M - 1) // BLOCK_M, 0)
        tiles_end = tl.cumsum(num_tiles, 0)  # inclusive: slot s owns tiles [end - n, end)
        slot = tl.sum((tiles_end <= tile).to(tl.int32), 0)
        here = offs == slot  # all False past the last tile: m_start = seg_end = 0
        first = starts + (tile - tiles_end + num_tiles) * BLOCK_M
        m_start = tl.sum(tl.where(here, first, 0), 0)
        seg_end = tl.sum(tl.where(here, ends, 0), 0)
        rank = tl.sum(tl.where(here, ranks, 0), 0)
    else:
        slot = tile % max_loras
        m_start = tl.load(slot_start_loc_ptr + slot) + (tile // max_loras) * BLOCK_M
        seg_end = tl.load(slot_start_loc_ptr + slot + 1)
        rank = tl.load(ranks_ptr + slot)
    return slot, m_start, seg_end, rank


@triton.jit
def shrink_tile(  # type: ignore[no-untyped-def]
    x_ptr,
    a_ptr,  # lora_a[slot, slice]: [max_rank, in_dim]
    token_ids,  # [BLOCK_M] int64
    mask_m,
    offs_n,  # [BLOCK_N] rank columns
    mask_n,
    k_start,
    num_k_steps,
    in_dim,
    stride_xm,
    stride_an,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    """fp32 [BLOCK_M, BLOCK_N]: x[token_ids, k] @ A[offs_n, k].T over k in
    [k_start, k_start + num_k_steps * BLOCK_K) (masked past in_dim)."""
    offs_k = tl.arange(0, BLOCK_K)
    x_ptrs = x_ptr + token_ids[:, None] * stride_xm + (k_start + offs_k)[None, :]
    a_ptrs = a_ptr + offs_n[None, :] * stride_an + (k_start + offs_k)[:, None]  # A read transposed
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for step in range(num_k_steps):
        mask_k = offs_k < in_dim - k_start - step * BLOCK_K
        x = tl.load(x_ptrs, mask=mask_m[:, None] & mask_k[None, :], other=0.0)
        a = tl.load(a_ptrs, mask=mask_k[:, None] & mask_n[None, :], other=0.0)
        acc = tl.dot(x, a, acc, input_precision=DOT_PRECISION)
        x_ptrs += BLOCK_K
        a_ptrs += BLOCK_K
    return acc


@triton.jit
def _lora_shrink_kernel(  # type: ignore[no-untyped-def]
    x_ptr,
    lora_a_ptr,
    out_ptr,
    sorted_token_ids_ptr,
    slot_start_loc_ptr,
    lora_ranks_ptr,
    in_dim,
    max_loras,
    num_rank_tiles,
    stride_xm,
    stride_al,
    stride_as,
    stride_an,
    stride_os,
    stride_om,
    stride_rs,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    K_CHUNK: tl.constexpr,
    SLOTS: tl.constexpr,
    COMPACT: tl.constexpr,
    USE_ATOMIC: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    pid_k = tl.program_id(1) // num_rank_tiles
    n_start = (tl.program_id(1) % num_rank_tiles) * BLOCK_N
    slice_id = tl.program_id(2)
    slot, m_start, seg_end, rank = segment_tile(
        tl.program_id(0),
        slot_start_loc_ptr,
        lora_ranks_ptr + slice_id * stride_rs,
        max_loras,
        BLOCK_M,
        SLOTS,
        COMPACT,
    )
    if (m_start >= seg_end) | (n_start >= rank):
        return  # also covers rank == 0

    offs_m = m_start + tl.arange(0, BLOCK_M)
    mask_m = offs_m < seg_end
    token_ids = tl.load(sorted_token_ids_ptr + offs_m, mask=mask_m, other=0).to(tl.int64)
    offs_n = n_start + tl.arange(0, BLOCK_N)
    mask_n = offs_n < rank
    a_ptr = lora_a_ptr + slot.to(tl.int64) * stride_al + slice_id.to(tl.int64) * stride_as
    acc = shrink_tile(
        x_ptr,
        a_ptr,
        token_ids,
        mask_m,
        offs_n,
        mask_n,
        pid_k * K_CHUNK,
        K_CHUNK // BLOCK_K,
        in_dim,
        stride_xm,
        stride_an,
        BLOCK_M,
        BLOCK_N,
        BLOCK_K,
        DOT_PRECISION,
    )
    out_ptrs = out_ptr + slice_id * stride_os + token_ids[:, None] * stride_om + offs_n[None, :]
    mask = mask_m[:, None] & mask_n[None, :]
    if USE_ATOMIC:
        tl.atomic_add(out_ptrs, acc, mask=mask, sem="relaxed")
    else:
        tl.store(out_ptrs, acc, mask=mask)


def _check(op: str, cond: bool, msg: str) -> None:
    if not cond:
        raise ValueError(f"{op}: {msg}")


def check_shrink_args(
    op: str,
    x: torch.Tensor,
    lora_a: torch.Tensor,
    sorted_token_ids: torch.Tensor,
    slot_start_loc: torch.Tensor,
    lora_ranks: torch.Tensor,
    out: torch.Tensor,
) -> None:
    """Raise ValueError (prefixed with `op`) unless the arguments fit `lora_shrink`."""
    _check(op, x.dim() == 2 and lora_a.dim() == 4, "x must be 2-D and lora_a 4-D")
    num_tokens, in_dim = x.shape
    max_loras, num_slices, max_rank, a_in_dim = lora_a.shape
    _check(op, a_in_dim == in_dim, f"lora_a in_dim {a_in_dim} != x in_dim {in_dim}")
    _check(op, x.dtype == lora_a.dtype, f"x dtype {x.dtype} != lora_a dtype {lora_a.dtype}")
    _check(op, x.dtype in (torch.float16, torch.bfloat16, torch.float32), f"bad dtype {x.dtype}")
    out_shape = (num_slices, num_tokens, max_rank)
    _check(op, out.shape == out_shape, f"out must be {out_shape}")
    _check(op, out.dtype == torch.float32, "out dtype must be float32 (split-K adds atomically)")
    _check(op, sorted_token_ids.shape == (num_tokens,), "sorted_token_ids must be [num_tokens]")
    _check(op, slot_start_loc.shape == (max_loras + 1,), "slot_start_loc must be [max_loras + 1]")
    _check(op, lora_ranks.shape == (num_slices, max_loras), "lora_ranks must be [slices, loras]")
    for name, t in (("sorted_token_ids", sorted_token_ids), ("slot_start_loc", slot_start_loc)):
        _check(op, t.dtype == torch.int32 and t.is_contiguous(), f"{name} must be contiguous int32")
    _check(op, lora_ranks.dtype == torch.int32 and lora_ranks.stride(1) == 1, "lora_ranks: int32")
    _check(op, x.stride(1) == 1 and out.stride(2) == 1, "x and out need contiguous rows")
    _check(op, lora_a.stride(3) == 1, "lora_a needs a contiguous last dim")
    devices = {t.device for t in (x, lora_a, out, sorted_token_ids, slot_start_loc, lora_ranks)}
    _check(op, len(devices) == 1, f"all tensors must be on one device, got {devices}")


def lora_shrink(
    x: torch.Tensor,  # [num_tokens, in_dim]
    lora_a: torch.Tensor,  # [max_loras, num_slices, max_rank, in_dim]
    sorted_token_ids: torch.Tensor,  # [num_tokens] int32
    slot_start_loc: torch.Tensor,  # [max_loras + 1] int32
    lora_ranks: torch.Tensor,  # [num_slices, max_loras] int32
    out: torch.Tensor,  # [num_slices, num_tokens, max_rank] float32
    zero_out: bool = True,
) -> None:
    """Zero `out` (unless `zero_out` is False), then out[i, t, :r] += x[t] @ lora_a[s, i, :r].T
    for every slice i and token t of slot s, where r = lora_ranks[i, s]. One launch for all
    slices."""
    check_shrink_args("lora_shrink", x, lora_a, sorted_token_ids, slot_start_loc, lora_ranks, out)
    num_tokens, in_dim = x.shape
    max_loras, num_slices, max_rank, _ = lora_a.shape
    if zero_out:
        out.zero_()
    if num_tokens == 0 or max_rank == 0 or num_slices == 0 or in_dim == 0:
        return

    tiles = shrink_tiles(num_tokens)
    # Never chunk finer than in_dim needs: small in_dim gets one chunk (and plain stores).
    k_chunk = min(tiles.k_chunk, triton.cdiv(in_dim, tiles.block_k) * tiles.block_k)
    split_k = triton.cdiv(in_dim, k_chunk)
    block_n = rank_block(max_rank, tiles.max_block_n)
    num_rank_tiles = triton.cdiv(max_rank, block_n)
    num_tiles, slots, compact = segment_grid(num_tokens, max_loras, tiles.block_m)
    grid = (num_tiles, split_k * num_rank_tiles, num_slices)
    _lora_shrink_kernel[grid](
        x,
        lora_a,
        out,
        sorted_token_ids,
        slot_start_loc,
        lora_ranks,
        in_dim,
        max_loras,
        num_rank_tiles,
        x.stride(0),
        lora_a.stride(0),
        lora_a.stride(1),
        lora_a.stride(2),
        out.stride(0),
        out.stride(1),
        lora_ranks.stride(0),
        BLOCK_M=tiles.block_m,
        BLOCK_N=block_n,
        BLOCK_K=tiles.block_k,
        K_CHUNK=k_chunk,
        SLOTS=slots,
        COMPACT=compact,
        USE_ATOMIC=split_k > 1 or not zero_out,
        DOT_PRECISION="ieee" if x.dtype == torch.float32 else "tf32",
        num_warps=tiles.num_warps,
        num_stages=tiles.num_stages,
    )
