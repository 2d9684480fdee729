"""Fused multi-LoRA shrink + expand of one projection, one launch, for decode: Punica SGMV.

Method: Punica's segmented gather matrix multiplication (Chen et al., 2023, "Punica: Multi-Tenant
LoRA Serving"): `lora_shrink` (x @ A.T into an fp32 buffer, split-K) then `lora_expand`
(y += scaling * buffer @ B.T), both over segment tiles (`lora_shrink.segment_tile`). At decode
both are latency bound: each costs a launch (a CUDA-graph node) and a few dependent memory round
trips, and the expand's loads of B and y wait for the shrink's launch to end. Here the two are
one grid, and the expand programs load their B and y tiles while the shrink runs:

    grid = (P_s + P_e,)   pid < P_s: shrink program (segment tile, k chunk, rank tile, slice)
                          else:      expand program (segment tile, column tile, slice)

    shrink program: atomically add its partial product into lora_out; CTA barrier; then
                    counters[slice, slot] += 1 (release)
    expand program: load B tile, scaling, token ids and y tile; poll counters[slice, slot]
                    (acquire) until it equals that (slice, slot)'s number of shrink programs,
                    cdiv(segment length, BLOCK_M) * split_k * cdiv(rank, BLOCK_R); then, in rank
                    steps of BLOCK_R, load its lora_out rows and B tile; finish as lora_expand

Forward progress: every expand program has a higher id than every shrink program, and NVIDIA
GPUs dispatch a grid's programs in increasing id order in practice (not a documented guarantee),
so by the time an expand program polls, every shrink program has been dispatched, and shrink
programs wait on nothing. Should a scheduler ever not do that, an expand program that polled
MAX_SPINS times computes its lora_out rows itself (`shrink_tile` over all of in_dim): slower,
same result, never a hang. The release is the CTA barrier then one thread's red.release.gpu; the
poll, one thread's ld.acquire.gpu broadcast to the CTA (what Triton emits for these atomics);
lora_out is then read with volatile loads (L2, never a stale L1 line).

Buffers: `lora_out` and `counters` must be zero at launch; the launch leaves lora_out holding the
shrink and the counters at their final counts, so the caller zeroes both before reusing them
(engine/lora/lora_batch.py gives each projection of a step its own region of a workspace that
one memset per step zeroes). The grid depends on shapes only (CUDA-graph friendly).

Tiles (`FUSED_TILES`): one row for decode batches; the shrink and expand share BLOCK_M.
Numerics: as `lora_shrink` (fp32 split-K partials, order varies) then `lora_expand`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from loraplex.kernels.triton.lora_expand import (
    check_expand_args,
    load_b_tile,
    slice_ends,
    slice_rows,
)
from loraplex.kernels.triton.lora_shrink import (
    check_shrink_args,
    rank_block,
    segment_grid,
    segment_tile,
    shrink_tile,
)


@dataclass(frozen=True)
class FusedTiles:
    block_m: int  # token rows per program (shrink and expand)
    block_k: int  # shrink: in_dim step of the inner loop
    k_chunk: int  # shrink: in_dim per program (split-K); a multiple of block_k
    block_n: int  # expand: output columns per program
    max_block_r: int  # rank tile (shrink) and rank step (expand), as ShrinkTiles.max_block_n
    num_warps: int
    num_stages: int


# The bench (bench/kernels_check.py) swaps this to compare candidates.
FUSED_TILES = FusedTiles(
    block_m=16, block_k=128, k_chunk=512, block_n=128, max_block_r=16, num_warps=4, num_stages=2
)
MAX_SPINS = 1 << 14  # polls (~0.5 us each) before an expand program computes its rows itself
FALLBACK_BLOCK_K = 32  # that computation's K step: small, to keep the kernel's registers low


@triton.jit
def _lora_shrink_expand_kernel(  # type: ignore[no-untyped-def]
    x_ptr,
    lora_a_ptr,
    lora_b_ptr,
    y_ptr,
    lora_out_ptr,
    counters_ptr,
    sorted_token_ids_ptr,
    slot_start_loc_ptr,
    lora_ranks_ptr,
    scalings_ptr,
    in_dim,
    max_loras,
    max_rank,
    num_tiles,
    split_k,
    num_rank_tiles,
    num_n_tiles,
    num_shrink_programs,
    slice_end_0,
    slice_end_1,
    slice_end_2,
    y_offset,
    stride_xm,
    stride_al,
    stride_as,
    stride_an,
    stride_bl,
    stride_bn,
    stride_ym,
    stride_ls,
    stride_lm,
    stride_cs,
    stride_rs,
    BLOCK_M: tl.constexpr,
    BLOCK_R: tl.constexpr,  # the shrink's N tile and the expand's K step
    BLOCK_K: tl.constexpr,
    K_CHUNK: tl.constexpr,
    BLOCK_N: tl.constexpr,
    SLOTS: tl.constexpr,
    COMPACT: tl.constexpr,
    MAX_SPINS: tl.constexpr,
    FALLBACK_BLOCK_K: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    pid = tl.program_id(0)
    is_shrink = pid < num_shrink_programs
    work = tl.where(is_shrink, pid, pid - num_shrink_programs)
    tile = work % num_tiles
    per_slice = tl.where(is_shrink, split_k * num_rank_tiles, num_n_tiles)
    slice_id = work // num_tiles // per_slice
    job = work // num_tiles % per_slice  # shrink: k_chunk * num_rank_tiles + rank tile; expand: n
    slot, m_start, seg_end, rank = segment_tile(
        tile,
        slot_start_loc_ptr,
        lora_ranks_ptr + slice_id * stride_rs,
        max_loras,
        BLOCK_M,
        SLOTS,
        COMPACT,
    )
    slice_start, slice_end = slice_rows(slice_id, slice_end_0, slice_end_1, slice_end_2)
    r_start = tl.where(is_shrink, job % num_rank_tiles * BLOCK_R, 0)
    n_start = tl.where(is_shrink, slice_start, slice_start + job * BLOCK_N)
    if (m_start >= seg_end) | (r_start >= rank) | (n_start >= slice_end):
        return  # also covers rank == 0

    offs_m = m_start + tl.arange(0, BLOCK_M)
    mask_m = offs_m < seg_end
    offs_r = tl.arange(0, BLOCK_R)
    a_ptr = lora_a_ptr + slot.to(tl.int64) * stride_al + slice_id.to(tl.int64) * stride_as
    counter_ptr = counters_ptr + slice_id * stride_cs + slot
    if is_shrink:
        token_ids = tl.load(sorted_token_ids_ptr + offs_m, mask=mask_m, other=0).to(tl.int64)
        cols = r_start + offs_r
        part = shrink_tile(
            x_ptr,
            a_ptr,
            token_ids,
            mask_m,
            cols,
            cols < rank,
            job // num_rank_tiles * K_CHUNK,
            K_CHUNK // BLOCK_K,
            in_dim,
            stride_xm,
            stride_an,
            BLOCK_M,
            BLOCK_R,
            BLOCK_K,
            DOT_PRECISION,
        )
        out_ptrs = lora_out_ptr + slice_id * stride_ls + token_ids[:, None] * stride_lm
        part_mask = mask_m[:, None] & (cols < rank)[None, :]
        tl.atomic_add(out_ptrs + cols[None, :], part, mask=part_mask, sem="relaxed")
        tl.debug_barrier()  # every thread's adds precede the release below
        tl.atomic_add(counter_ptr, 1, sem="release", scope="gpu")
    else:
        # Everything that does not depend on the shrink first.
        offs_n = n_start + tl.arange(0, BLOCK_N)
        mask_n = offs_n < slice_end
        b_ptrs = (
            lora_b_ptr
            + slot.to(tl.int64) * stride_bl
            + offs_n[None, :] * stride_bn
            + offs_r[:, None]
        )  # [BLOCK_R, BLOCK_N]: B[slot, n, k] read transposed
        b = load_b_tile(b_ptrs, offs_r, mask_n, 0, rank, max_rank)
        scaling = tl.load(scalings_ptr + slot)
        seg_start = tl.load(slot_start_loc_ptr + slot)
        token_ids = tl.load(sorted_token_ids_ptr + offs_m, mask=mask_m, other=0).to(tl.int64)
        y_ptrs = y_ptr + token_ids[:, None] * stride_ym + (y_offset + offs_n)[None, :]
        mask = mask_m[:, None] & mask_n[None, :]
        y = tl.load(y_ptrs, mask=mask, other=0.0)

        num_rank_steps = (rank + BLOCK_R - 1) // BLOCK_R
        expected = (seg_end - seg_start + BLOCK_M - 1) // BLOCK_M * split_k * num_rank_steps
        done = tl.atomic_add(counter_ptr, 0, sem="acquire", scope="gpu")
        spins = tl.full((), 0, tl.int32)
        while (done < expected) & (spins < MAX_SPINS):
            done = tl.atomic_add(counter_ptr, 0, sem="acquire", scope="gpu")
            spins += 1
        lo_ptrs = lora_out_ptr + slice_id * stride_ls + token_ids[:, None] * stride_lm
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        if done >= expected:
            for k_start in range(0, rank, BLOCK_R):
                cols = k_start + offs_r
                lo_mask = mask_m[:, None] & (cols < rank)[None, :]
                # volatile: from L2, never a stale L1 line
                lo = tl.load(lo_ptrs + cols[None, :], mask=lo_mask, other=0.0, volatile=True)
                acc = tl.dot(lo.to(b.dtype), b, acc, input_precision=DOT_PRECISION)
                b_ptrs += BLOCK_R
                b = load_b_tile(b_ptrs, offs_r, mask_n, k_start + BLOCK_R, rank, max_rank)
        else:  # no progress seen (see the module docstring): compute the rows here
            for k_start in range(0, rank, BLOCK_R):
                cols = k_start + offs_r
                lo = shrink_tile(
                    x_ptr,
                    a_ptr,
                    token_ids,
                    mask_m,
                    cols,
                    cols < rank,
                    0,
                    tl.cdiv(in_dim, FALLBACK_BLOCK_K),
                    in_dim,
                    stride_xm,
                    stride_an,
                    BLOCK_M,
                    BLOCK_R,
                    FALLBACK_BLOCK_K,
                    DOT_PRECISION,
                )
                b_k = load_b_tile(b_ptrs + k_start, offs_r, mask_n, k_start, rank, max_rank)
                acc = tl.dot(lo.to(b_k.dtype), b_k, acc, input_precision=DOT_PRECISION)
            y = tl.load(y_ptrs, mask=mask, other=0.0)
        tl.store(y_ptrs, (y.to(tl.float32) + acc * scaling).to(y.dtype), mask=mask)


def lora_shrink_expand(
    x: torch.Tensor,  # [num_tokens, in_dim]
    lora_a: torch.Tensor,  # [max_loras, num_slices, max_rank, in_dim]
    lora_b: torch.Tensor,  # [max_loras, sum(slice_sizes), max_rank]
    sorted_token_ids: torch.Tensor,  # [num_tokens] int32
    slot_start_loc: torch.Tensor,  # [max_loras + 1] int32
    lora_ranks: torch.Tensor,  # [num_slices, max_loras] int32
    scalings: torch.Tensor,  # [max_loras] float32
    y: torch.Tensor,  # [num_tokens, y_dim]
    y_offset: int,
    slice_sizes: tuple[int, ...],
    lora_out: torch.Tensor,  # [num_slices, num_tokens, max_rank] float32, zero
    counters: torch.Tensor,  # [num_slices, max_loras] int32, zero
) -> None:
    """lora_shrink(..., lora_out, zero_out=False) then lora_expand(lora_out, ...) in one launch.
    lora_out and counters must be zero; both are left non-zero (zero them before reuse)."""
    op = "lora_shrink_expand"
    mapping = (sorted_token_ids, slot_start_loc, lora_ranks)
    check_shrink_args(op, x, lora_a, *mapping, lora_out)
    check_expand_args(op, lora_out, lora_b, *mapping, scalings, y, y_offset, slice_sizes)
    num_tokens, in_dim = x.shape
    max_loras, num_slices, max_rank, _ = lora_a.shape
    if counters.shape != lora_ranks.shape or counters.dtype != torch.int32:
        raise ValueError(f"{op}: counters must be int32 {tuple(lora_ranks.shape)}")
    if counters.stride(1) != 1 or counters.device != x.device:
        raise ValueError(f"{op}: counters need contiguous rows on x's device")
    if num_tokens == 0 or max_rank == 0 or num_slices == 0 or in_dim == 0:
        return

    tiles = FUSED_TILES
    k_chunk = min(tiles.k_chunk, triton.cdiv(in_dim, tiles.block_k) * tiles.block_k)
    split_k = triton.cdiv(in_dim, k_chunk)
    block_r = rank_block(max_rank, tiles.max_block_r)
    num_rank_tiles = triton.cdiv(max_rank, block_r)
    num_n_tiles = triton.cdiv(max(slice_sizes), tiles.block_n)
    num_tiles, slots, compact = segment_grid(num_tokens, max_loras, tiles.block_m)
    num_shrink_programs = num_tiles * split_k * num_rank_tiles * num_slices
    grid = (num_shrink_programs + num_tiles * num_n_tiles * num_slices,)
    _lora_shrink_expand_kernel[grid](
        x,
        lora_a,
        lora_b,
        y,
        lora_out,
        counters,
        *mapping,
        scalings,
        in_dim,
        max_loras,
        max_rank,
        num_tiles,
        split_k,
        num_rank_tiles,
        num_n_tiles,
        num_shrink_programs,
        *slice_ends(slice_sizes),
        y_offset,
        x.stride(0),
        lora_a.stride(0),
        lora_a.stride(1),
        lora_a.stride(2),
        lora_b.stride(0),
        lora_b.stride(1),
        y.stride(0),
        lora_out.stride(0),
        lora_out.stride(1),
        counters.stride(0),
        lora_ranks.stride(0),
        BLOCK_M=tiles.block_m,
        BLOCK_R=block_r,
        BLOCK_K=tiles.block_k,
        K_CHUNK=k_chunk,
        BLOCK_N=tiles.block_n,
        SLOTS=slots,
        COMPACT=compact,
        MAX_SPINS=MAX_SPINS,
        FALLBACK_BLOCK_K=FALLBACK_BLOCK_K,
        DOT_PRECISION="ieee" if x.dtype == torch.float32 else "tf32",
        num_warps=tiles.num_warps,
        num_stages=tiles.num_stages,
    )
