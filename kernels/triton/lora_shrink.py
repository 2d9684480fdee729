"""Multi-slice, split-K multi-LoRA shrink (x @ A.T per adapter segment) in Triton: Punica SGMV.

Method: Punica's segmented gather matrix multiplication (Chen et al., 2023, "Punica: Multi-Tenant
LoRA Serving"), with the slices of a fused projection (q/k/v, gate/up) in one launch as vLLM's
`lora_shrink` does. Tokens are grouped by adapter slot (`kernels/lora_mapping.py`); a program
owns one (token tile of a slot's segment, in_dim chunk, rank tile, slice, slot), gathers its
token rows of `x` through `sorted_token_ids` (no copy of x), multiplies them by that slot's
slice of `lora_a` over its chunk of in_dim and atomically adds the partial product into `out`
(split-K):

    grid = (cdiv(num_tokens, BLOCK_M), cdiv(in_dim, K_CHUNK) * cdiv(max_rank, BLOCK_N),
            num_slices * max_loras)
    program_id(1) = k_chunk * num_rank_tiles + rank_tile;  program_id(2) = slice * max_loras + slot

Why split-K: at decode a slot owns a few tokens, so without it only `max_loras` programs per
slice are busy and each walks all of in_dim (4096..14336) serially: latency bound. With chunks
of K_CHUNK, every (slot, slice) gets cdiv(in_dim, K_CHUNK) programs. The launcher zeroes `out`
first (a memset, captured in a CUDA graph like any launch).

The grid depends on shapes only, never on the mapping's values, so a launch can be captured in
a CUDA graph. The token-tile axis is an upper bound (one slot may own every token): programs
whose tile starts past their slot's segment, or whose rank tile starts at or past their slot's
rank for their slice (rank 0 included), return at once. BLOCK_N covers ranks up to MAX_BLOCK_N
in one tile; columns past a slot's rank are masked (not read).

Tiles (`SHRINK_TILES`, by number of tokens of the launch):
- decode (<= 64 tokens): segments of a few tokens, so BLOCK_M = 16 (tl.dot's minimum) and
  K_CHUNK = 512 (4 steps of 128): 8 adapters x 3 slices x 8 chunks of in_dim 4096 = 192 busy
  programs, >= 1 per SM of an H100/H200, each a short pipelined loop.
- mid (<= 512): segments of tens of tokens: BLOCK_M = 32, same chunks.
- prefill: BLOCK_M = 64, BLOCK_K = 64 and longer chunks (1024): thousands of tokens already
  fill the GPU; split-K only keeps short batches busy and bounds the serial loop. BLOCK_K = 64
  keeps 3 pipeline stages of fp32 tiles at rank 64 under 100 KB of shared memory.

Numerics: products accumulate in float32; `out` is float32 (the expand reads an unrounded
intermediate). Split-K makes the order of the fp32 additions, hence the last bits of `out`,
vary between runs (as in vLLM). Rows of `out` of tokens outside every segment, and columns past
a slot's rank, are 0.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

import torch
import triton
import triton.language as tl


@dataclass(frozen=True)
class ShrinkTiles:
    """Tile shape of one launch; BLOCK_N is max_rank rounded up to a power of two (16..64)."""

    block_m: int  # token rows per program
    block_k: int  # in_dim step of the inner loop
    k_chunk: int  # in_dim per program (split-K); a multiple of block_k
    num_warps: int
    num_stages: int


# (largest number of tokens, tiles): the first row that fits the launch is used. The benchmark
# (bench/kernels_check.py) swaps the decode row to compare candidates.
SHRINK_TILES: tuple[tuple[int, ShrinkTiles], ...] = (
    (64, ShrinkTiles(block_m=16, block_k=128, k_chunk=512, num_warps=4, num_stages=2)),
    (512, ShrinkTiles(block_m=32, block_k=128, k_chunk=512, num_warps=4, num_stages=3)),
    (sys.maxsize, ShrinkTiles(block_m=64, block_k=64, k_chunk=1024, num_warps=4, num_stages=3)),
)
MIN_BLOCK_N = 16  # tl.dot's smallest N
MAX_BLOCK_N = 64  # larger ranks (up to 512) take several rank tiles


def shrink_tiles(num_tokens: int) -> ShrinkTiles:
    return next(tiles for bound, tiles in SHRINK_TILES if num_tokens <= bound)


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
    USE_ATOMIC: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    pid_m = tl.program_id(0)
    pid_k = tl.program_id(1) // num_rank_tiles
    n_start = (tl.program_id(1) % num_rank_tiles) * BLOCK_N
    slice_id = tl.program_id(2) // max_loras
    slot = tl.program_id(2) % max_loras
    rank = tl.load(lora_ranks_ptr + slice_id * stride_rs + slot)
    seg_end = tl.load(slot_start_loc_ptr + slot + 1)
    m_start = tl.load(slot_start_loc_ptr + slot) + pid_m * BLOCK_M
    if (m_start >= seg_end) | (n_start >= rank):
        return  # also covers rank == 0

    offs_m = m_start + tl.arange(0, BLOCK_M)
    mask_m = offs_m < seg_end
    token_ids = tl.load(sorted_token_ids_ptr + offs_m, mask=mask_m, other=0).to(tl.int64)
    offs_n = n_start + tl.arange(0, BLOCK_N)
    mask_n = offs_n < rank
    offs_k = pid_k * K_CHUNK + tl.arange(0, BLOCK_K)

    x_ptrs = x_ptr + token_ids[:, None] * stride_xm + offs_k[None, :]  # [BLOCK_M, BLOCK_K]
    a_ptrs = (
        lora_a_ptr
        + slot.to(tl.int64) * stride_al
        + slice_id.to(tl.int64) * stride_as
        + offs_n[None, :] * stride_an
        + offs_k[:, None]
    )  # [BLOCK_K, BLOCK_N]: A[slot, slice, n, k] read transposed
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, K_CHUNK, BLOCK_K):
        mask_k = offs_k < in_dim - k
        x = tl.load(x_ptrs, mask=mask_m[:, None] & mask_k[None, :], other=0.0)
        a = tl.load(a_ptrs, mask=mask_k[:, None] & mask_n[None, :], other=0.0)
        acc = tl.dot(x, a, acc, input_precision=DOT_PRECISION)
        x_ptrs += BLOCK_K
        a_ptrs += BLOCK_K

    out_ptrs = out_ptr + slice_id * stride_os + token_ids[:, None] * stride_om + offs_n[None, :]
    mask = mask_m[:, None] & mask_n[None, :]
    if USE_ATOMIC:
        tl.atomic_add(out_ptrs, acc, mask=mask, sem="relaxed")
    else:
        tl.store(out_ptrs, acc, mask=mask)


def _check(cond: bool, msg: str) -> None:
    if not cond:
        raise ValueError(f"lora_shrink: {msg}")


def lora_shrink(
    x: torch.Tensor,  # [num_tokens, in_dim]
    lora_a: torch.Tensor,  # [max_loras, num_slices, max_rank, in_dim]
    sorted_token_ids: torch.Tensor,  # [num_tokens] int32
    slot_start_loc: torch.Tensor,  # [max_loras + 1] int32
    lora_ranks: torch.Tensor,  # [num_slices, max_loras] int32
    out: torch.Tensor,  # [num_slices, num_tokens, max_rank] float32
) -> None:
    """Zero `out`, then out[i, t, :r] = x[t] @ lora_a[s, i, :r].T for every slice i and token t
    of slot s, where r = lora_ranks[i, s]. One launch for all slices."""
    _check(x.dim() == 2 and lora_a.dim() == 4, "x must be 2-D and lora_a 4-D")
    num_tokens, in_dim = x.shape
    max_loras, num_slices, max_rank, a_in_dim = lora_a.shape
    _check(a_in_dim == in_dim, f"lora_a in_dim {a_in_dim} != x in_dim {in_dim}")
    _check(x.dtype == lora_a.dtype, f"x dtype {x.dtype} != lora_a dtype {lora_a.dtype}")
    _check(x.dtype in (torch.float16, torch.bfloat16, torch.float32), f"bad dtype {x.dtype}")
    out_shape = (num_slices, num_tokens, max_rank)
    _check(out.shape == out_shape, f"out must be {out_shape}")
    _check(out.dtype == torch.float32, "out dtype must be float32 (split-K adds atomically)")
    _check(sorted_token_ids.shape == (num_tokens,), "sorted_token_ids must be [num_tokens]")
    _check(slot_start_loc.shape == (max_loras + 1,), "slot_start_loc must be [max_loras + 1]")
    _check(lora_ranks.shape == (num_slices, max_loras), "lora_ranks must be [slices, max_loras]")
    for name, t in (("sorted_token_ids", sorted_token_ids), ("slot_start_loc", slot_start_loc)):
        _check(t.dtype == torch.int32 and t.is_contiguous(), f"{name} must be contiguous int32")
    _check(lora_ranks.dtype == torch.int32 and lora_ranks.stride(1) == 1, "lora_ranks: int32 rows")
    _check(x.stride(1) == 1 and out.stride(2) == 1, "x and out need contiguous rows")
    _check(lora_a.stride(3) == 1, "lora_a needs a contiguous last dim")
    devices = {t.device for t in (x, lora_a, out, sorted_token_ids, slot_start_loc, lora_ranks)}
    _check(len(devices) == 1, f"all tensors must be on one device, got {devices}")
    out.zero_()
    if num_tokens == 0 or max_rank == 0 or num_slices == 0 or in_dim == 0:
        return

    tiles = shrink_tiles(num_tokens)
    # Never chunk finer than in_dim needs: small in_dim gets one chunk (and plain stores).
    k_chunk = min(tiles.k_chunk, triton.cdiv(in_dim, tiles.block_k) * tiles.block_k)
    split_k = triton.cdiv(in_dim, k_chunk)
    block_n = min(MAX_BLOCK_N, max(MIN_BLOCK_N, triton.next_power_of_2(max_rank)))
    num_rank_tiles = triton.cdiv(max_rank, block_n)
    grid = (
        triton.cdiv(num_tokens, tiles.block_m),
        split_k * num_rank_tiles,
        num_slices * max_loras,
    )
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
        USE_ATOMIC=split_k > 1,
        DOT_PRECISION="ieee" if x.dtype == torch.float32 else "tf32",
        num_warps=tiles.num_warps,
        num_stages=tiles.num_stages,
    )
