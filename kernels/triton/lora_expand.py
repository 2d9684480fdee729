"""Multi-LoRA expand (y += scaling * lora_out @ B.T per adapter segment) in Triton: Punica SGMV.

Method: Punica's segmented gather matrix multiplication (Chen et al., 2023, "Punica: Multi-Tenant
LoRA Serving"), the second half of a LoRA delta after `lora_shrink`. A program owns one (token
tile of a slot's segment, output-column tile, slot); it gathers its token rows of `lora_out`
through `sorted_token_ids`, multiplies them by that slot's `lora_b` over the slot's own rank
only, scales, and adds the result into the column slice `y[:, y_offset:y_offset + out_dim]`.

    grid = (cdiv(num_tokens, BLOCK_M), cdiv(out_dim, BLOCK_N), max_loras)

The grid depends on shapes only (CUDA-graph friendly); programs whose token tile starts past
their slot's segment or whose slot is empty (rank 0) return at once. The K loop stops at the
slot's rank, so rank padding costs at most one BLOCK_K tile.

Numerics: the `lora_out` tile is cast to `lora_b`'s dtype for the tensor-core dot (as vLLM's
expand does), products accumulate in float32, and `y` is read, added to in float32 and rounded
once. Each token appears in at most one segment, so the read-modify-write needs no atomics.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

# Tile sizes: out_dim is wide (1024..28672) and the reduction (the rank) is short.
BLOCK_N = 128
BLOCK_K = 16
BLOCK_M_DECODE = 16
BLOCK_M_PREFILL = 64
PREFILL_MIN_TOKENS = 512
NUM_WARPS = 4
NUM_STAGES = 2


@triton.jit
def _lora_expand_kernel(  # type: ignore[no-untyped-def]
    lora_out_ptr,
    lora_b_ptr,
    y_ptr,
    sorted_token_ids_ptr,
    slot_start_loc_ptr,
    lora_ranks_ptr,
    scalings_ptr,
    out_dim,
    y_offset,
    stride_lm,
    stride_bl,
    stride_bn,
    stride_ym,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    slot = tl.program_id(2)
    rank = tl.load(lora_ranks_ptr + slot)
    seg_end = tl.load(slot_start_loc_ptr + slot + 1)
    m_start = tl.load(slot_start_loc_ptr + slot) + pid_m * BLOCK_M
    if (m_start >= seg_end) | (rank == 0):
        return

    offs_m = m_start + tl.arange(0, BLOCK_M)
    mask_m = offs_m < seg_end
    token_ids = tl.load(sorted_token_ids_ptr + offs_m, mask=mask_m, other=0).to(tl.int64)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_n = offs_n < out_dim
    offs_k = tl.arange(0, BLOCK_K)

    lo_ptrs = lora_out_ptr + token_ids[:, None] * stride_lm + offs_k[None, :]  # [BLOCK_M, BLOCK_K]
    b_ptrs = (
        lora_b_ptr + slot.to(tl.int64) * stride_bl + offs_n[None, :] * stride_bn + offs_k[:, None]
    )  # [BLOCK_K, BLOCK_N]: B[slot, n, k] read transposed
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k_start in range(0, rank, BLOCK_K):
        mask_k = offs_k < rank - k_start
        lo = tl.load(lo_ptrs, mask=mask_m[:, None] & mask_k[None, :], other=0.0)
        b = tl.load(b_ptrs, mask=mask_k[:, None] & mask_n[None, :], other=0.0)
        acc = tl.dot(lo.to(b.dtype), b, acc, input_precision=DOT_PRECISION)
        lo_ptrs += BLOCK_K
        b_ptrs += BLOCK_K

    acc *= tl.load(scalings_ptr + slot)
    y_ptrs = y_ptr + token_ids[:, None] * stride_ym + (y_offset + offs_n)[None, :]
    mask = mask_m[:, None] & mask_n[None, :]
    y = tl.load(y_ptrs, mask=mask, other=0.0)
    tl.store(y_ptrs, (y.to(tl.float32) + acc).to(y.dtype), mask=mask)


def _check(cond: bool, msg: str) -> None:
    if not cond:
        raise ValueError(f"lora_expand: {msg}")


def lora_expand(
    lora_out: torch.Tensor,  # [num_tokens, max_rank], float32 or lora_b.dtype
    lora_b: torch.Tensor,  # [max_loras, out_dim, max_rank]
    sorted_token_ids: torch.Tensor,  # [num_tokens] int32
    slot_start_loc: torch.Tensor,  # [max_loras + 1] int32
    lora_ranks: torch.Tensor,  # [max_loras] int32
    scalings: torch.Tensor,  # [max_loras] float32
    y: torch.Tensor,  # [num_tokens, y_dim]
    y_offset: int,
) -> None:
    """y[t, y_offset:y_offset + out_dim] += scalings[s] * lora_out[t, :r] @ lora_b[s, :, :r].T."""
    _check(lora_out.dim() == 2 and lora_b.dim() == 3 and y.dim() == 2, "bad tensor ranks")
    num_tokens, max_rank = lora_out.shape
    max_loras, out_dim, b_rank = lora_b.shape
    _check(b_rank == max_rank, f"lora_b max_rank {b_rank} != lora_out max_rank {max_rank}")
    _check(y.shape[0] == num_tokens, "y and lora_out must have the same number of tokens")
    _check(y_offset >= 0 and y_offset + out_dim <= y.shape[1], "y_offset slice out of range")
    float_dtypes = (torch.float16, torch.bfloat16, torch.float32)
    _check(lora_b.dtype in float_dtypes and y.dtype in float_dtypes, "bad floating dtype")
    _check(lora_out.dtype in (torch.float32, lora_b.dtype), "lora_out must be fp32 or lora_b's")
    _check(
        scalings.shape == (max_loras,) and scalings.dtype == torch.float32,
        "scalings must be float32 [max_loras]",
    )
    _check(sorted_token_ids.shape == (num_tokens,), "sorted_token_ids must be [num_tokens]")
    _check(slot_start_loc.shape == (max_loras + 1,), "slot_start_loc must be [max_loras + 1]")
    _check(lora_ranks.shape == (max_loras,), "lora_ranks must be [max_loras]")
    for name, t in (
        ("sorted_token_ids", sorted_token_ids),
        ("slot_start_loc", slot_start_loc),
        ("lora_ranks", lora_ranks),
    ):
        _check(t.dtype == torch.int32 and t.is_contiguous(), f"{name} must be contiguous int32")
    _check(lora_out.stride(1) == 1 and y.stride(1) == 1, "lora_out and y need contiguous rows")
    _check(lora_b.stride(2) == 1, "lora_b needs a contiguous last dim")
    devices = {
        t.device
        for t in (lora_out, lora_b, y, sorted_token_ids, slot_start_loc, lora_ranks, scalings)
    }
    _check(len(devices) == 1, f"all tensors must be on one device, got {devices}")
    if num_tokens == 0 or out_dim == 0:
        return

    block_m = BLOCK_M_PREFILL if num_tokens >= PREFILL_MIN_TOKENS else BLOCK_M_DECODE
    grid = (triton.cdiv(num_tokens, block_m), triton.cdiv(out_dim, BLOCK_N), max_loras)
    _lora_expand_kernel[grid](
        lora_out,
        lora_b,
        y,
        sorted_token_ids,
        slot_start_loc,
        lora_ranks,
        scalings,
        out_dim,
        y_offset,
        lora_out.stride(0),
        lora_b.stride(0),
        lora_b.stride(1),
        y.stride(0),
        BLOCK_M=block_m,
        BLOCK_N=BLOCK_N,
        BLOCK_K=BLOCK_K,
        DOT_PRECISION="ieee" if lora_b.dtype == torch.float32 else "tf32",
        num_warps=NUM_WARPS,
        num_stages=NUM_STAGES,
    )
