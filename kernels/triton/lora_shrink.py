"""Multi-LoRA shrink (x @ A.T per adapter segment) in Triton: Punica SGMV.

Method: Punica's segmented gather matrix multiplication (Chen et al., 2023, "Punica: Multi-Tenant
LoRA Serving"). Tokens are grouped by adapter slot (`kernels/lora_mapping.py`); a program owns
one (token tile of a slot's segment, rank tile, slot), gathers its token rows of `x` through
`sorted_token_ids` (no copy of x) and multiplies them by that slot's `lora_a`.

    grid = (cdiv(num_tokens, BLOCK_M), cdiv(max_rank, BLOCK_N), max_loras)

The grid depends on shapes only, never on the mapping's values, so a launch can be captured in
a CUDA graph. The token-tile axis is an upper bound (one slot may own every token): programs
whose tile starts past their slot's segment, whose rank tile starts at or past the slot's rank,
or whose slot is empty (rank 0) return at once. Rank padding costs at most one BLOCK_N tile.

The accumulator is float32; `out` may be float32 (recommended: the expand then reads an
unrounded intermediate) or x's dtype. Rows of tokens outside every segment are not written.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

# Tile sizes: the rank dimension is tiny (4..64), so BLOCK_N stays small and the reduction over
# in_dim (4096..14336) runs in long BLOCK_K steps. Prefill-sized batches use taller token tiles.
BLOCK_N = 16
BLOCK_K = 128
BLOCK_M_DECODE = 16
BLOCK_M_PREFILL = 64
PREFILL_MIN_TOKENS = 512
NUM_WARPS = 4
NUM_STAGES = 3


@triton.jit
def _lora_shrink_kernel(  # type: ignore[no-untyped-def]
    x_ptr,
    lora_a_ptr,
    out_ptr,
    sorted_token_ids_ptr,
    slot_start_loc_ptr,
    lora_ranks_ptr,
    in_dim,
    stride_xm,
    stride_al,
    stride_an,
    stride_om,
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
    n_start = pid_n * BLOCK_N
    if (m_start >= seg_end) | (n_start >= rank):
        return  # also covers rank == 0

    offs_m = m_start + tl.arange(0, BLOCK_M)
    mask_m = offs_m < seg_end
    token_ids = tl.load(sorted_token_ids_ptr + offs_m, mask=mask_m, other=0).to(tl.int64)
    offs_n = n_start + tl.arange(0, BLOCK_N)
    mask_n = offs_n < rank
    offs_k = tl.arange(0, BLOCK_K)

    x_ptrs = x_ptr + token_ids[:, None] * stride_xm + offs_k[None, :]  # [BLOCK_M, BLOCK_K]
    a_ptrs = (
        lora_a_ptr + slot.to(tl.int64) * stride_al + offs_n[None, :] * stride_an + offs_k[:, None]
    )  # [BLOCK_K, BLOCK_N]: A[slot, n, k] read transposed
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k_start in range(0, in_dim, BLOCK_K):
        mask_k = offs_k < in_dim - k_start
        x = tl.load(x_ptrs, mask=mask_m[:, None] & mask_k[None, :], other=0.0)
        a = tl.load(a_ptrs, mask=mask_k[:, None] & mask_n[None, :], other=0.0)
        acc = tl.dot(x, a, acc, input_precision=DOT_PRECISION)
        x_ptrs += BLOCK_K
        a_ptrs += BLOCK_K

    out_ptrs = out_ptr + token_ids[:, None] * stride_om + offs_n[None, :]
    tl.store(out_ptrs, acc.to(out_ptr.dtype.element_ty), mask=mask_m[:, None] & mask_n[None, :])


def _check(cond: bool, msg: str) -> None:
    if not cond:
        raise ValueError(f"lora_shrink: {msg}")


def lora_shrink(
    x: torch.Tensor,  # [num_tokens, in_dim]
    lora_a: torch.Tensor,  # [max_loras, max_rank, in_dim]
    sorted_token_ids: torch.Tensor,  # [num_tokens] int32
    slot_start_loc: torch.Tensor,  # [max_loras + 1] int32
    lora_ranks: torch.Tensor,  # [max_loras] int32
    out: torch.Tensor,  # [num_tokens, max_rank], float32 or x.dtype
) -> None:
    """out[t, :rank_s] = x[t] @ lora_a[s, :rank_s].T for every token t of slot s (in place)."""
    _check(x.dim() == 2 and lora_a.dim() == 3, "x must be 2-D and lora_a 3-D")
    num_tokens, in_dim = x.shape
    max_loras, max_rank, a_in_dim = lora_a.shape
    _check(a_in_dim == in_dim, f"lora_a in_dim {a_in_dim} != x in_dim {in_dim}")
    _check(x.dtype == lora_a.dtype, f"x dtype {x.dtype} != lora_a dtype {lora_a.dtype}")
    _check(x.dtype in (torch.float16, torch.bfloat16, torch.float32), f"bad dtype {x.dtype}")
    _check(out.shape == (num_tokens, max_rank), f"out must be {(num_tokens, max_rank)}")
    _check(out.dtype in (torch.float32, x.dtype), f"out dtype must be float32 or {x.dtype}")
    _check(sorted_token_ids.shape == (num_tokens,), "sorted_token_ids must be [num_tokens]")
    _check(slot_start_loc.shape == (max_loras + 1,), "slot_start_loc must be [max_loras + 1]")
    _check(lora_ranks.shape == (max_loras,), "lora_ranks must be [max_loras]")
    for name, t in (
        ("sorted_token_ids", sorted_token_ids),
        ("slot_start_loc", slot_start_loc),
        ("lora_ranks", lora_ranks),
    ):
        _check(t.dtype == torch.int32 and t.is_contiguous(), f"{name} must be contiguous int32")
    _check(x.stride(1) == 1 and out.stride(1) == 1, "x and out need contiguous rows")
    _check(lora_a.stride(2) == 1, "lora_a needs a contiguous last dim")
    devices = {t.device for t in (x, lora_a, out, sorted_token_ids, slot_start_loc, lora_ranks)}
    _check(len(devices) == 1, f"all tensors must be on one device, got {devices}")
    if num_tokens == 0 or max_rank == 0:
        return

    block_m = BLOCK_M_PREFILL if num_tokens >= PREFILL_MIN_TOKENS else BLOCK_M_DECODE
    grid = (triton.cdiv(num_tokens, block_m), triton.cdiv(max_rank, BLOCK_N), max_loras)
    _lora_shrink_kernel[grid](
        x,
        lora_a,
        out,
        sorted_token_ids,
        slot_start_loc,
        lora_ranks,
        in_dim,
        x.stride(0),
        lora_a.stride(0),
        lora_a.stride(1),
        out.stride(0),
        BLOCK_M=block_m,
        BLOCK_N=BLOCK_N,
        BLOCK_K=BLOCK_K,
        DOT_PRECISION="ieee" if x.dtype == torch.float32 else "tf32",
        num_warps=NUM_WARPS,
        num_stages=NUM_STAGES,
    )
