"""Reference multi-slice multi-LoRA shrink / expand over paged adapter weights, in PyTorch.

The executable spec of `kernels/triton/lora_shrink.py` and `kernels/triton/lora_expand.py`, and
the engine's CPU path. Punica (Chen et al., 2023, "Punica: Multi-Tenant LoRA Serving") batches
tokens of many adapters by grouping them per adapter ("segmented gather matrix-vector
multiplication", SGMV); S-LoRA (Sheng et al., 2023) keeps the adapters' weights in pages of the
KV cache's memory pool, at each adapter's own rank. One call serves every slice of a fused
projection (q/k/v share x; gate/up share x).

Weights. Adapter `a` (a row of the tables) owns pages `page_table[a, :]` of `pages` (one layer's
[num_pages, page_size] view of the pool). Slice i's matrix, [r, row_len] with r = ranks[i, a]
(A_i: row_len = in_dim; B_i^T: row_len = out_dim_i), starts at the adapter's page number
`first_page[i, a]`; its element (j, c) is at

    page   = page_table[a, first + (j // rows_per_page) * pages_per_row + c // page_size]
    offset = (j % rows_per_page) * row_len + c % page_size

with rows_per_page = max(1, page_size // row_len), pages_per_row = cdiv(row_len, page_size)
(engine/lora/page_layout.py writes this layout).

Batch. Tokens are grouped by batch slot: slot s owns sorted_token_ids[slot_start_loc[s]:
slot_start_loc[s + 1]] and its adapter is `slot_adapters[s]`; slots from `num_active_slots[0]` on
are empty (the kernels skip them without looking). With r = ranks[i, slot_adapters[s]]
and token t of slot s:

    shrink:  out[:] = 0 (if zero_out);   out[i, t, :r] += x[t] @ A_i[:r].T
    expand:  y[t, y_offset + o_i + j] += scalings[a] * lora_out[i, t, :r] @ B_i^T[:r, j]

where o_i = sum(slice_sizes[:i]) and j < slice_sizes[i]. `out` is zero outside the computed
entries when zeroed (rows of tokens without an adapter, slices of rank 0, columns past the
rank); `zero_out=False` adds into a buffer known to be zero (one zeroed once for all launches
of a step). The expand leaves y untouched outside the computed entries. Products accumulate in
float32 and round once on store, as the kernels do. The loops read the small mapping tensors
on the host.
"""

from __future__ import annotations

import torch

from loraplex.kernels.reference.fused_ops import silu_and_mul


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def gather_matrix(
    pages: torch.Tensor,  # [num_pages, page_size]
    adapter_pages: torch.Tensor,  # [max_pages] int32: one adapter's row of page_table
    first: int,
    rows: int,
    row_len: int,
) -> torch.Tensor:
    """The [rows, row_len] matrix placed at the adapter's page number `first`."""
    page_size = pages.shape[1]
    if row_len <= page_size:
        per_page = page_size // row_len
        ids = adapter_pages[first : first + _cdiv(rows, per_page)].to(torch.int64)
        chunk = pages.index_select(0, ids)[:, : per_page * row_len]  # [n, per_page * row_len]
        return chunk.reshape(-1, row_len)[:rows]
    segments = _cdiv(row_len, page_size)
    ids = adapter_pages[first : first + rows * segments].to(torch.int64)
    return pages.index_select(0, ids).reshape(rows, segments * page_size)[:, :row_len]


def _check_mapping(
    num_tokens: int,
    num_slices: int,
    page_table: torch.Tensor,
    first_page: torch.Tensor,
    lora_ranks: torch.Tensor,
    slot_adapters: torch.Tensor,
    num_active_slots: torch.Tensor,
    sorted_token_ids: torch.Tensor,
    slot_start_loc: torch.Tensor,
) -> None:
    num_adapters = page_table.shape[0]
    assert num_active_slots.shape == (1,), "num_active_slots must be [1]"
    assert first_page.shape == lora_ranks.shape == (num_slices, num_adapters), (
        "first_page and lora_ranks must be [num_slices, num_adapters]"
    )
    assert slot_start_loc.shape == (slot_adapters.shape[0] + 1,), "slot_start_loc: [slots + 1]"
    assert sorted_token_ids.shape == (num_tokens,), "sorted_token_ids must be [num_tokens]"


def _segments(
    slot_adapters: torch.Tensor,
    num_active_slots: torch.Tensor,
    slot_start_loc: torch.Tensor,
    sorted_token_ids: torch.Tensor,
) -> list[tuple[int, torch.Tensor]]:
    """(adapter, token ids) of every active batch slot that has tokens."""
    starts, adapters = slot_start_loc.tolist(), slot_adapters.tolist()
    return [
        (adapters[s], sorted_token_ids[starts[s] : starts[s + 1]].to(torch.int64))
        for s in range(min(int(num_active_slots[0]), len(adapters)))
        if starts[s + 1] > starts[s]
    ]


def lora_shrink(
    x: torch.Tensor,  # [num_tokens, in_dim]
    pages: torch.Tensor,  # [num_pages, page_size]
    page_table: torch.Tensor,  # [num_adapters, max_pages] int32
    first_page: torch.Tensor,  # [num_slices, num_adapters] int32: first page of A_i
    lora_ranks: torch.Tensor,  # [num_slices, num_adapters] int32
    slot_adapters: torch.Tensor,  # [num_slots] int32
    num_active_slots: torch.Tensor,  # [1] int32
    sorted_token_ids: torch.Tensor,  # [num_tokens] int32
    slot_start_loc: torch.Tensor,  # [num_slots + 1] int32
    out: torch.Tensor,  # [num_slices, num_tokens, max_rank] float32
    zero_out: bool = True,
) -> None:
    """Zero `out` (unless `zero_out` is False), then out[i, t, :r] += x[t] @ A_i[:r].T for every
    slice i and token t of an adapter's segment. One launch for all slices."""
    num_slices, num_tokens, max_rank = out.shape
    in_dim = x.shape[1]
    assert x.dim() == 2 and x.shape[0] == num_tokens, "x must be [num_tokens, in_dim]"
    assert out.dtype == torch.float32, "out must be float32"
    mapping = (
        page_table, first_page, lora_ranks, slot_adapters, num_active_slots, sorted_token_ids,
        slot_start_loc,
    )  # fmt: skip
    _check_mapping(num_tokens, num_slices, *mapping)
    if zero_out:
        out.zero_()
    ranks, firsts = lora_ranks.tolist(), first_page.tolist()
    for adapter, token_ids in _segments(
        slot_adapters, num_active_slots, slot_start_loc, sorted_token_ids
    ):
        xs = x.index_select(0, token_ids).float()  # [n, in_dim]
        for i in range(num_slices):
            rank = ranks[i][adapter]
            if rank > 0:
                assert rank <= max_rank, "an adapter's rank exceeds out's max_rank"
                a = gather_matrix(pages, page_table[adapter], firsts[i][adapter], rank, in_dim)
                out[i, token_ids, :rank] += xs @ a.float().T  # [n, rank]


def lora_expand(
    lora_out: torch.Tensor,  # [num_slices, num_tokens, max_rank]
    pages: torch.Tensor,  # [num_pages, page_size]
    page_table: torch.Tensor,  # [num_adapters, max_pages] int32
    first_page: torch.Tensor,  # [num_slices, num_adapters] int32: first page of B_i^T
    lora_ranks: torch.Tensor,  # [num_slices, num_adapters] int32
    scalings: torch.Tensor,  # [num_adapters] float32
    slot_adapters: torch.Tensor,  # [num_slots] int32
    num_active_slots: torch.Tensor,  # [1] int32
    sorted_token_ids: torch.Tensor,  # [num_tokens] int32
    slot_start_loc: torch.Tensor,  # [num_slots + 1] int32
    y: torch.Tensor,  # [num_tokens, y_dim]
    y_offset: int,
    slice_sizes: tuple[int, ...],  # out_dim of each slice, in y's column order
) -> None:
    """y[t, y_offset + o_i + j] += scalings[a] * lora_out[i, t, :r] @ B_i^T[:r, j] for every
    slice i (o_i = sum(slice_sizes[:i]), j < slice_sizes[i]) and token t of an adapter's
    segment. One launch for all slices."""
    num_slices, num_tokens, _ = lora_out.shape
    assert len(slice_sizes) == num_slices, "one slice size per lora_out slice"
    assert y.dim() == 2 and y.shape[0] == num_tokens, "y must be [num_tokens, y_dim]"
    assert y_offset >= 0 and y_offset + sum(slice_sizes) <= y.shape[1], "y_offset out of range"
    assert scalings.shape == (page_table.shape[0],), "scalings must be [num_adapters]"
    mapping = (
        page_table, first_page, lora_ranks, slot_adapters, num_active_slots, sorted_token_ids,
        slot_start_loc,
    )  # fmt: skip
    _check_mapping(num_tokens, num_slices, *mapping)
    ranks, firsts, scale = lora_ranks.tolist(), first_page.tolist(), scalings.tolist()
    starts = [y_offset + sum(slice_sizes[:i]) for i in range(num_slices)]
    for adapter, token_ids in _segments(
        slot_adapters, num_active_slots, slot_start_loc, sorted_token_ids
    ):
        lo = lora_out.index_select(1, token_ids).float()  # [num_slices, n, max_rank]
        for i, size in enumerate(slice_sizes):
            rank = ranks[i][adapter]
            if rank == 0:
                continue
            b_t = gather_matrix(pages, page_table[adapter], firsts[i][adapter], rank, size)
            cols = slice(starts[i], starts[i] + size)
            rows = y[token_ids, cols].float() + (lo[i, :, :rank] @ b_t.float()) * scale[adapter]
            y[token_ids, cols] = rows.to(y.dtype)


def silu_and_mul_lora(
    x: torch.Tensor,  # [num_tokens, 2 * intermediate]: the gate_up GEMM's output, [gate | up]
    lora_out: torch.Tensor,  # [2, num_tokens, max_rank] float32: gate's and up's shrink
    pages: torch.Tensor,  # [num_pages, page_size]
    page_table: torch.Tensor,  # [num_adapters, max_pages] int32
    first_page: torch.Tensor,  # [2, num_adapters] int32: first page of B_gate^T, B_up^T
    lora_ranks: torch.Tensor,  # [2, num_adapters] int32
    scalings: torch.Tensor,  # [num_adapters] float32
    slot_adapters: torch.Tensor,  # [num_slots] int32
    num_active_slots: torch.Tensor,  # [1] int32
    sorted_token_ids: torch.Tensor,  # [num_tokens] int32
    slot_start_loc: torch.Tensor,  # [num_slots + 1] int32
) -> torch.Tensor:
    """`silu_and_mul` of x after `lora_expand` of its two slices (gate, up) into it ->
    [num_tokens, intermediate] in x's dtype; x is left as it was. The Triton kernel fuses the
    two and never writes the sum back."""
    assert x.dim() == 2 and x.shape[1] % 2 == 0, "x must be [num_tokens, 2 * intermediate]"
    assert lora_out.shape[0] == 2, "lora_out must hold the gate and up slices"
    intermediate = x.shape[1] // 2
    tables = (pages, page_table, first_page, lora_ranks, scalings)
    mapping = (slot_adapters, num_active_slots, sorted_token_ids, slot_start_loc)
    y = x.clone()
    lora_expand(lora_out, *tables, *mapping, y, 0, (intermediate, intermediate))
    return silu_and_mul(y)
