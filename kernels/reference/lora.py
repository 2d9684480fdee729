"""Reference multi-slice multi-LoRA shrink / expand (Punica SGMV semantics) in plain PyTorch.

The executable spec of `kernels/triton/lora_shrink.py` and `kernels/triton/lora_expand.py`, and
the engine's CPU path. Punica (Chen et al., 2023, "Punica: Multi-Tenant LoRA Serving") batches
tokens of many adapters by grouping them per adapter ("segmented gather matrix-vector
multiplication", SGMV). One call serves every slice of a fused projection (q/k/v share x;
gate/up share x). For slot `s`, slice `i` with rank `r = lora_ranks[i, s]` and the segment
`sorted_token_ids[slot_start_loc[s]:slot_start_loc[s + 1]]`:

    shrink:  out[:] = 0 (if zero_out);  out[i, t, :r] += x[t] @ lora_a[s, i, :r].T
    expand:  y[t, y_offset + o_i + j] += scalings[s] * lora_out[i, t, :r] @ lora_b[s, o_i + j, :r]

where o_i = sum(slice_sizes[:i]) and j < slice_sizes[i]: slices are stacked along lora_b's rows.

The shrink adds into `out`: by default it zeroes `out` first, so `out` is zero outside the
computed entries (rows of tokens without an adapter, rows of a slice whose rank is 0 for the
token's slot, columns past the rank). `zero_out=False` skips that (the Triton launcher's memset)
for a buffer known to be zero, e.g. one zeroed once for all launches of a step. The expand
leaves y untouched outside the computed entries. Products are accumulated in float32 and
rounded once on store, as the kernels do. One matmul per non-empty (slot, slice); x and y rows
are gathered once per slot; the loop reads the small mapping tensors on the host.
"""

from __future__ import annotations

import torch


def _check_mapping(
    num_tokens: int,
    max_loras: int,
    num_slices: int,
    sorted_token_ids: torch.Tensor,
    slot_start_loc: torch.Tensor,
    lora_ranks: torch.Tensor,
) -> None:
    assert sorted_token_ids.shape == (num_tokens,), "sorted_token_ids must be [num_tokens]"
    assert slot_start_loc.shape == (max_loras + 1,), "slot_start_loc must be [max_loras + 1]"
    assert lora_ranks.shape == (num_slices, max_loras), "lora_ranks must be [slices, max_loras]"


def _segments(
    slot_start_loc: torch.Tensor, lora_ranks: torch.Tensor, sorted_token_ids: torch.Tensor
) -> list[tuple[int, list[int], torch.Tensor]]:
    """(slot, rank per slice, token ids) of every slot with tokens and some non-zero rank."""
    starts = slot_start_loc.tolist()
    ranks = lora_ranks.T.tolist()  # [max_loras][num_slices]
    segments = []
    for slot, slice_ranks in enumerate(ranks):
        lo, hi = starts[slot], starts[slot + 1]
        if any(slice_ranks) and hi > lo:
            segments.append((slot, slice_ranks, sorted_token_ids[lo:hi].to(torch.int64)))
    return segments


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
    max_loras, num_slices, max_rank, in_dim = lora_a.shape
    num_tokens = x.shape[0]
    assert x.dim() == 2 and x.shape[1] == in_dim, "x must be [num_tokens, in_dim]"
    assert out.shape == (num_slices, num_tokens, max_rank), "out: [slices, num_tokens, max_rank]"
    assert out.dtype == torch.float32, "out must be float32"
    _check_mapping(num_tokens, max_loras, num_slices, sorted_token_ids, slot_start_loc, lora_ranks)
    if zero_out:
        out.zero_()
    for slot, slice_ranks, token_ids in _segments(slot_start_loc, lora_ranks, sorted_token_ids):
        xs = x.index_select(0, token_ids).float()  # [n, in_dim]
        for i, rank in enumerate(slice_ranks):
            if rank > 0:
                out[i, token_ids, :rank] += xs @ lora_a[slot, i, :rank].float().T  # [n, rank]


def lora_expand(
    lora_out: torch.Tensor,  # [num_slices, num_tokens, max_rank]
    lora_b: torch.Tensor,  # [max_loras, sum(slice_sizes), max_rank]: slices stacked along rows
    sorted_token_ids: torch.Tensor,  # [num_tokens] int32
    slot_start_loc: torch.Tensor,  # [max_loras + 1] int32
    lora_ranks: torch.Tensor,  # [num_slices, max_loras] int32
    scalings: torch.Tensor,  # [max_loras] float32
    y: torch.Tensor,  # [num_tokens, y_dim]
    y_offset: int,
    slice_sizes: tuple[int, ...],  # out_dim of each slice, in y's column order
) -> None:
    """y[t, y_offset + o_i + j] += scalings[s] * lora_out[i, t, :r] @ lora_b[s, o_i + j, :r]
    for every slice i (o_i = sum(slice_sizes[:i]), j < slice_sizes[i]) and token t of slot s,
    where r = lora_ranks[i, s]. One launch for all slices."""
    max_loras, total_out, max_rank = lora_b.shape
    num_slices = len(slice_sizes)
    assert sum(slice_sizes) == total_out, "slice sizes must add up to lora_b's rows"
    assert lora_out.dim() == 3 and lora_out.shape[0] == num_slices, "lora_out: [slices, T, r]"
    assert lora_out.shape[2] == max_rank, "lora_out and lora_b must share max_rank"
    num_tokens = lora_out.shape[1]
    assert y.dim() == 2 and y.shape[0] == num_tokens, "y must be [num_tokens, y_dim]"
    assert y_offset >= 0 and y_offset + total_out <= y.shape[1], "y_offset slice out of range"
    assert scalings.shape == (max_loras,), "scalings must be [max_loras]"
    _check_mapping(num_tokens, max_loras, num_slices, sorted_token_ids, slot_start_loc, lora_ranks)
    starts = [sum(slice_sizes[:i]) for i in range(num_slices)]
    scale_list = scalings.tolist()
    y_cols = y[:, y_offset : y_offset + total_out]  # view: writes land in y
    for slot, slice_ranks, token_ids in _segments(slot_start_loc, lora_ranks, sorted_token_ids):
        rows = y_cols.index_select(0, token_ids).float()  # [n, total_out]
        lo = lora_out.index_select(1, token_ids).float()  # [num_slices, n, max_rank]
        for i, rank in enumerate(slice_ranks):
            if rank > 0:
                cols = slice(starts[i], starts[i] + slice_sizes[i])
                b = lora_b[slot, cols, :rank].float()  # [slice_size, rank]
                rows[:, cols] += (lo[i, :, :rank] @ b.T) * scale_list[slot]
        y_cols[token_ids] = rows.to(y.dtype)
