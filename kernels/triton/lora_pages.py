"""Addressing an adapter's weights in its pages (S-LoRA; the layout is kernels/reference/lora.py's).

A matrix of rows of `row_len` elements starts at page number `first` of its adapter's page list
(`adapter_pages`, a row of page_table). When a row fits a page, rows are packed
rows_per_page = page_size // row_len to a page, and a row is contiguous:

    row j -> page first + j // rows_per_page, offset (j % rows_per_page) * row_len

Longer rows take pages_per_row = cdiv(row_len, page_size) pages of their own:

    element (j, c) -> page first + j * pages_per_row + c // page_size, offset c % page_size

`lora_delta` is the expand's inner product over those pages (a tile of lora_out times a tile of
an adapter's B^T), shared by `lora_expand` and `silu_and_mul_lora`.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def page_rows(  # type: ignore[no-untyped-def]
    adapter_pages, first, rows, mask_rows, row_len, page_size, stride_pp
):
    """Offsets (int64) in `pages` of where each of `rows` starts; rows that fit a page."""
    per_page = tl.maximum(page_size // row_len, 1)
    blocks = tl.load(adapter_pages + first + rows // per_page, mask=mask_rows, other=0)
    return blocks.to(tl.int64) * stride_pp + (rows % per_page) * row_len


@triton.jit
def matrix_ptrs(  # type: ignore[no-untyped-def]
    pages_ptr, adapter_pages, first, rows, cols, mask, row_len, page_size, stride_pp
):
    """Pointers to elements (rows, cols) (broadcast 2-D index tensors) of a matrix, whatever
    the length of its rows: the general form of the module docstring's two cases (`page_rows`
    is the fast one for rows that fit a page)."""
    per_page = tl.maximum(page_size // row_len, 1)
    per_row = (row_len + page_size - 1) // page_size
    page = first + (rows // per_page) * per_row + cols // page_size
    blocks = tl.load(adapter_pages + page, mask=mask, other=0)
    offset = (rows % per_page) * row_len + cols % page_size
    return pages_ptr + blocks.to(tl.int64) * stride_pp + offset


@triton.jit
def lora_rank_rows(  # type: ignore[no-untyped-def]
    lo_rows,  # [BLOCK_M, 1] pointers to the token rows of lora_out[slice]
    mask_m,
    rank,
    adapter_pages,
    first,
    width,
    page_size,
    stride_pp,
    BLOCK_K: tl.constexpr,
    ONE_STEP: tl.constexpr,  # every rank fits BLOCK_K and a row of B^T fits a page
):
    """What every column tile of a program shares, loaded once per program with ONE_STEP:
    (the lora_out tile [BLOCK_M, BLOCK_K], the offsets in `pages` of B^T's rows [BLOCK_K],
    their mask). Without ONE_STEP, placeholders: `lora_delta` finds them per step."""
    if ONE_STEP:
        k = tl.arange(0, BLOCK_K)
        mask_k = k < rank
        row_base = page_rows(adapter_pages, first, k, mask_k, width, page_size, stride_pp)
        lo = tl.load(lo_rows + k[None, :], mask=mask_m[:, None] & mask_k[None, :], other=0.0)
    else:
        lo, row_base, mask_k = 0, 0, 0
    return lo, row_base, mask_k


@triton.jit
def lora_delta(  # type: ignore[no-untyped-def]
    offs_n,  # [BLOCK_N] columns of the slice
    mask_n,
    lo_rows,  # [BLOCK_M, 1] pointers to the token rows of lora_out[slice]
    mask_m,
    rank,
    pages_ptr,
    adapter_pages,
    first,
    width,
    page_size,
    stride_pp,
    lo_tile,  # lora_rank_rows' results (placeholders without ONE_STEP)
    row_base,
    mask_k,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    SPLIT_ROWS: tl.constexpr,
    ONE_STEP: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    """lora_out[rows, :rank] @ B^T[:rank, offs_n], unscaled, float32 [BLOCK_M, BLOCK_N]; zero
    (and nothing read from the pages) when rank is 0."""
    if ONE_STEP:  # one dot with the program's own operands: only B^T's tile is read here
        b_ptrs = pages_ptr + row_base[:, None] + offs_n[None, :]
        b = tl.load(b_ptrs, mask=mask_k[:, None] & mask_n[None, :], other=0.0)
        acc = tl.dot(lo_tile.to(b.dtype), b, input_precision=DOT_PRECISION)
    else:
        offs_k = tl.arange(0, BLOCK_K)
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k_start in range(0, rank, BLOCK_K):
            k = k_start + offs_k  # [BLOCK_K] rank rows of B^T
            step_mask = k < rank
            mask_b = step_mask[:, None] & mask_n[None, :]
            if SPLIT_ROWS:
                b_ptrs = matrix_ptrs(
                    pages_ptr, adapter_pages, first, k[:, None], offs_n[None, :], mask_b, width,
                    page_size, stride_pp,
                )  # fmt: skip
            else:
                rows = page_rows(adapter_pages, first, k, step_mask, width, page_size, stride_pp)
                b_ptrs = pages_ptr + rows[:, None] + offs_n[None, :]
            b = tl.load(b_ptrs, mask=mask_b, other=0.0)  # [BLOCK_K, BLOCK_N]
            lo_mask = mask_m[:, None] & step_mask[None, :]
            lo = tl.load(lo_rows + k[None, :], mask=lo_mask, other=0.0)  # [BLOCK_M, BLOCK_K]
            acc = tl.dot(lo.to(b.dtype), b, acc, input_precision=DOT_PRECISION)
    return acc
