"""Where an adapter's weights live in the KV cache's pages (S-LoRA's unified paging).

Adapters and the KV cache share one pool of GPU memory, in the KV cache's own blocks: block id
`b` is, in every layer, one contiguous page of `page_size = 2 * block_size * num_kv_heads *
head_dim` elements (its K half, then its V half). An adapter holds whole blocks (the same ids in
every layer) for as long as it is resident on the GPU; a request holds blocks for its KV.

Per layer an adapter of rank r stores, for each slice i it targets (SLICES order):

    A_i    r rows of in_dim_i elements     (lora_A: [r, in_dim])
    B_i^T  r rows of out_dim_i elements    (lora_B: [out_dim, r], stored transposed)

Each matrix takes its own run of pages, numbered within the adapter's page list. A row never
straddles a page unless it is longer than one: then it takes `pages_per_row` pages of its own.

    rows_per_page = max(1, page_size // row_len)      pages_per_row = cdiv(row_len, page_size)
    element (j, c) of a matrix placed at first page f:
        page   = f + (j // rows_per_page) * pages_per_row + c // page_size
        offset = (j % rows_per_page) * row_len + c % page_size

so an adapter takes pages in proportion to its own rank (never padded to `max_lora_rank`), and
the kernels (kernels/reference/lora.py) find any row from the adapter's page list and the
matrix's first page alone.

Staged form. On the host a load writes each B_i as the file stores it, [out_dim_i, r] row-major,
flat over B_i^T's pages (page after page, the rest zero): a plain copy, where transposing on the
CPU was the slowest part of a load (a strided gather per row). The upload transposes them on the
GPU (`transpose_staged_b`, a few launches per slice for all layers at once). A_i is written as
the kernels read it in both forms.

    stage_adapter       adapter -> staged pages (host)
    transpose_staged_b  staged pages -> kernel pages, in place (device, or host for tests)
    pack_adapter        both: the kernel pages on the host
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from loraplex.engine.lora.adapter import LoRAAdapter

# Every adaptable projection, in the order of the fused projections' output columns
# (qkv_proj, o_proj, gate_up_proj, down_proj).
SLICES: tuple[str, ...] = (
    "q_proj",
    "k_proj",
    "v_proj",
    "o_proj",
    "gate_proj",
    "up_proj",
    "down_proj",
)
NUM_SLICES = len(SLICES)


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def rows_per_page(row_len: int, page_size: int) -> int:
    return max(1, page_size // row_len)


def pages_per_row(row_len: int, page_size: int) -> int:
    return cdiv(row_len, page_size)


def matrix_pages(rows: int, row_len: int, page_size: int) -> int:
    """Pages a [rows, row_len] matrix takes."""
    return cdiv(rows, rows_per_page(row_len, page_size)) * pages_per_row(row_len, page_size)


def page_chunks(rows: int, row_len: int, page_size: int) -> list[tuple[int, int]]:
    """A [rows, row_len] matrix's elements in order, as (page within the matrix, elements from
    that page's start): each a contiguous run of the matrix's row-major elements."""
    if row_len <= page_size:
        per_page = rows_per_page(row_len, page_size)
        return [
            (page, min(per_page, rows - page * per_page) * row_len)
            for page in range(cdiv(rows, per_page))
        ]
    segments = pages_per_row(row_len, page_size)
    return [
        (j * segments + s, min(page_size, row_len - s * page_size))
        for j in range(rows)
        for s in range(segments)
    ]


@dataclass(frozen=True)
class AdapterPageLayout:
    """An adapter's matrices in its page list: first pages per slice (-1: not targeted)."""

    rank: int
    first_a: tuple[int, ...]  # [NUM_SLICES] first page of A_i
    first_b: tuple[int, ...]  # [NUM_SLICES] first page of B_i^T
    num_pages: int
    out_dims: tuple[int, ...]  # [NUM_SLICES] B_i's rows (0: not targeted)

    @property
    def ranks(self) -> tuple[int, ...]:
        """[NUM_SLICES] the rank of each slice: 0 where the adapter does not target it."""
        return tuple(self.rank if first >= 0 else 0 for first in self.first_a)


def plan_layout(
    rank: int,
    target_modules: tuple[str, ...],
    module_shapes: dict[str, tuple[int, int]],
    page_size: int,
) -> AdapterPageLayout:
    """Place each targeted slice's A, then its B^T, one after the other."""
    first_a, first_b, out_dims = [-1] * NUM_SLICES, [-1] * NUM_SLICES, [0] * NUM_SLICES
    next_page = 0
    for i, module in enumerate(SLICES):
        if module not in target_modules:
            continue
        in_dim, out_dims[i] = module_shapes[module]
        first_a[i] = next_page
        next_page += matrix_pages(rank, in_dim, page_size)
        first_b[i] = next_page
        next_page += matrix_pages(rank, out_dims[i], page_size)
    return AdapterPageLayout(rank, tuple(first_a), tuple(first_b), next_page, tuple(out_dims))


def max_adapter_pages(
    max_lora_rank: int, module_shapes: dict[str, tuple[int, int]], page_size: int
) -> int:
    """Pages of the largest adapter the engine accepts (every slice at max_lora_rank)."""
    return plan_layout(max_lora_rank, SLICES, module_shapes, page_size).num_pages


Matrices = torch.Tensor | Sequence[torch.Tensor]  # one per layer, or stacked [L, rows, cols]


def _put(
    target: torch.Tensor, matrices: Matrices, pick: Callable[[torch.Tensor], torch.Tensor]
) -> None:
    """target[l] = pick(matrices[l]) for every layer l: one copy when the matrices are stacked
    (`pick` indexes from the right, so it serves one matrix and the stack alike)."""
    if isinstance(matrices, torch.Tensor):
        target.copy_(pick(matrices))
    else:
        for layer, matrix in enumerate(matrices):
            target[layer].copy_(pick(matrix))


def _place(dst: torch.Tensor, first: int, matrices: Matrices, page_size: int) -> None:
    """Write layer l's matrix `matrices[l]` [rows, row_len] into dst[l] ([num_layers, pages,
    page_size]) from page `first` on, and zero the unused tails of those pages. One strided
    copy per layer (two when the last page is part-filled or rows are split over pages)."""
    rows, row_len = matrices[0].shape
    if row_len <= page_size:
        per_page = rows_per_page(row_len, page_size)
        num_full, rem = divmod(rows, per_page)  # full pages; rows on a last, part-filled one
        used = per_page * row_len
        pages = dst[:, first : first + num_full]  # [L, num_full, page_size]
        # [L, num_full, per_page, row_len]
        slots = pages[:, :, :used].unflatten(2, (per_page, row_len))
        head = num_full * per_page  # rows on full pages
        _put(slots, matrices, lambda m: m[..., :head, :].unflatten(-2, (num_full, per_page)))
        pages[:, :, used:].zero_()
        if rem:
            last = dst[:, first + num_full]  # [L, page_size]
            target = last[:, : rem * row_len].unflatten(1, (rem, row_len))  # [L, rem, row_len]
            _put(target, matrices, lambda m: m[..., head:, :])
            last[:, rem * row_len :].zero_()
        return
    # A row longer than a page: pages_per_row pages of its own, the last one part-filled.
    segments = pages_per_row(row_len, page_size)
    num_whole, rem = divmod(row_len, page_size)
    # [L, rows, segments, page_size]
    pages = dst[:, first : first + rows * segments].unflatten(1, (rows, segments))
    _put(pages[:, :, :num_whole], matrices,
         lambda m: m[..., : num_whole * page_size].unflatten(-1, (num_whole, page_size)))  # fmt: skip
    if rem:
        _put(pages[:, :, num_whole, :rem], matrices, lambda m: m[..., num_whole * page_size :])
        pages[:, :, num_whole, rem:].zero_()


def _b_pages(layout: AdapterPageLayout, i: int, page_size: int) -> int:
    return matrix_pages(layout.rank, layout.out_dims[i], page_size)


def stage_adapter(
    adapter: LoRAAdapter,
    layout: AdapterPageLayout,
    num_layers: int,
    page_size: int,
    dtype: torch.dtype,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """The adapter's staged pages (the module docstring), [num_layers, layout.num_pages,
    page_size] in `dtype` on the CPU, written into `out` when given (a run of the CPU cache's
    pinned pages: HostPagePool.view). Every element not holding a weight is zero.

    Every page belongs to exactly one matrix (plan_layout places them back to back), so
    writing each matrix and zeroing its pages' tails fills the buffer: no zero-fill first.
    Each weight is copied once, converted to `dtype` on the way, and never transposed."""
    shape = (num_layers, layout.num_pages, page_size)
    if out is None:
        out = torch.empty(shape, dtype=dtype)
    assert out.shape == shape and out.dtype == dtype and out.stride(2) == 1
    for i, module in enumerate(SLICES):
        if layout.first_a[i] < 0:
            continue
        pairs = [adapter.weights[(layer, module)] for layer in range(num_layers)]
        _place(out, layout.first_a[i], [a for a, _ in pairs], page_size)  # A [r, in_dim]
        # B [out_dim, r] row-major, as one row (page_chunks(1, out_dim * r)); then zeros to the
        # end of B^T's pages
        _place(out, layout.first_b[i], [b.reshape(1, -1) for _, b in pairs], page_size)
        used = matrix_pages(1, layout.out_dims[i] * layout.rank, page_size)
        out[
            :, layout.first_b[i] + used : layout.first_b[i] + _b_pages(layout, i, page_size)
        ].zero_()
    return out


def transpose_staged_b(staged: torch.Tensor, layout: AdapterPageLayout) -> None:
    """Turn staged pages ([num_layers, layout.num_pages, page_size], on any device) into the
    kernels' pages in place: each B_i, flat over its pages, becomes B_i^T. All layers of a
    slice at once: a handful of launches per slice."""
    num_layers, _, page_size = staged.shape
    rank = layout.rank
    for i, first in enumerate(layout.first_b):
        if first < 0:
            continue
        out_dim = layout.out_dims[i]
        region = staged[:, first : first + _b_pages(layout, i, page_size)]
        flat = region.reshape(num_layers, -1)[:, : out_dim * rank]  # [L, out_dim * r]
        # [L, r, out_dim]; a copy of its own, as the pages it came from are overwritten.
        b_t = flat.unflatten(1, (out_dim, rank)).transpose(1, 2).clone()
        _place(staged, first, b_t, page_size)


def pack_adapter(
    adapter: LoRAAdapter,
    layout: AdapterPageLayout,
    num_layers: int,
    page_size: int,
    dtype: torch.dtype,
) -> torch.Tensor:
    """The adapter's pages as the kernels read them, [num_layers, layout.num_pages, page_size]
    on the CPU: staged, then transposed there (tests and benchmarks; the engine transposes
    on the device, when it uploads)."""
    packed = stage_adapter(adapter, layout, num_layers, page_size, dtype)
    transpose_staged_b(packed, layout)
    return packed
