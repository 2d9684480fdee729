"""Addressing an adapter's weights in its pages (S-LoRA; the layout is kernels/reference/lora.py's).

A matrix of rows of `row_len` elements starts at page number `first` of its adapter's page list
(`adapter_pages`, a row of page_table). When a row fits a page, rows are packed
rows_per_page = page_size // row_len to a page, and a row is contiguous:

    row j -> page first + j // rows_per_page, offset (j % rows_per_page) * row_len

Longer rows take pages_per_row = cdiv(row_len, page_size) pages of their own:

    element (j, c) -> page first + j * pages_per_row + c // page_size, offset c % page_size
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
