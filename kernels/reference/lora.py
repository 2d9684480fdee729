"""Reference multi-LoRA shrink / expand (Punica SGMV semantics) in plain PyTorch.

The executable spec of `kernels/triton/lora_shrink.py` and `kernels/triton/lora_expand.py`, and
the engine's CPU path. Punica (Chen et al., 2023, "Punica: Multi-Tenant LoRA Serving") batches
tokens of many adapters by grouping them per adapter ("segmented gather matrix-vector
multiplication", SGMV). For slot `s` with rank `r = lora_ranks[s]` and segment
`sorted_token_ids[slot_start_loc[s]:slot_start_loc[s + 1]]`:

    shrink:  out[t, :r]                  = x[t] @ lora_a[s, :r].T
    expand:  y[t, off:off + out_dim]    += scalings[s] * (lora_out[t, :r] @ lora_b[s, :, :r].T)

Empty slots (rank 0) and tokens outside every segment (no adapter) are left untouched. Products
are accumulated in float32 and rounded once on store, as the kernels do. One matmul per
non-empty slot; the loop reads the small mapping tensors on the host.
"""

from __future__ import annotations

import torch


def _check_mapping(
    num_tokens: int,
    max_loras: int,
    sorted_token_ids: torch.Tensor,
    slot_start_loc: torch.Tensor,
    lora_ranks: torch.Tensor,
) -> None:
    assert sorted_token_ids.shape == (num_tokens,), "sorted_token_ids must be [num_tokens]"
    assert slot_start_loc.shape == (max_loras + 1,), "slot_start_loc must be [max_loras + 1]"
    assert lora_ranks.shape == (max_loras,), "lora_ranks must be [max_loras]"


def _segments(
    slot_start_loc: torch.Tensor, lora_ranks: torch.Tensor, sorted_token_ids: torch.Tensor
) -> list[tuple[int, int, torch.Tensor]]:
    """(slot, rank, token ids) of every non-empty slot with at least one token."""
    starts = slot_start_loc.tolist()
    ranks = lora_ranks.tolist()
    segments = []
    for slot, rank in enumerate(ranks):
        lo, hi = starts[slot], starts[slot + 1]
        if rank > 0 and hi > lo:
            segments.append((slot, rank, sorted_token_ids[lo:hi].to(torch.int64)))
    return segments


def lora_shrink(
    x: torch.Tensor,  # [num_tokens, in_dim]
    lora_a: torch.Tensor,  # [max_loras, max_rank, in_dim]
    sorted_token_ids: torch.Tensor,  # [num_tokens] int32
    slot_start_loc: torch.Tensor,  # [max_loras + 1] int32
    lora_ranks: torch.Tensor,  # [max_loras] int32
    out: torch.Tensor,  # [num_tokens, max_rank], float32 or x.dtype
) -> None:
    """out[t, :rank_s] = x[t] @ lora_a[s, :rank_s].T for every token t of slot s (in place)."""
    max_loras, max_rank, in_dim = lora_a.shape
    assert x.dim() == 2 and x.shape[1] == in_dim, "x must be [num_tokens, in_dim]"
    assert out.shape == (x.shape[0], max_rank), "out must be [num_tokens, max_rank]"
    _check_mapping(x.shape[0], max_loras, sorted_token_ids, slot_start_loc, lora_ranks)
    for slot, rank, token_ids in _segments(slot_start_loc, lora_ranks, sorted_token_ids):
        xs = x.index_select(0, token_ids).float()  # [n, in_dim]
        shrunk = xs @ lora_a[slot, :rank].float().T  # [n, rank]
        out[token_ids, :rank] = shrunk.to(out.dtype)


def lora_expand(
    lora_out: torch.Tensor,  # [num_tokens, max_rank]
    lora_b: torch.Tensor,  # [max_loras, out_dim, max_rank]
    sorted_token_ids: torch.Tensor,  # [num_tokens] int32
    slot_start_loc: torch.Tensor,  # [max_loras + 1] int32
    lora_ranks: torch.Tensor,  # [max_loras] int32
    scalings: torch.Tensor,  # [max_loras] float32
    y: torch.Tensor,  # [num_tokens, y_dim]
    y_offset: int,
) -> None:
    """y[t, y_offset:y_offset + out_dim] += scalings[s] * lora_out[t, :r] @ lora_b[s, :, :r].T."""
    max_loras, out_dim, max_rank = lora_b.shape
    assert lora_out.dim() == 2 and lora_out.shape[1] == max_rank, "lora_out: [T, max_rank]"
    assert y.dim() == 2 and y.shape[0] == lora_out.shape[0], "y must be [num_tokens, y_dim]"
    assert y_offset >= 0 and y_offset + out_dim <= y.shape[1], "y_offset slice out of range"
    assert scalings.shape == (max_loras,), "scalings must be [max_loras]"
    _check_mapping(y.shape[0], max_loras, sorted_token_ids, slot_start_loc, lora_ranks)
    scale_list = scalings.tolist()
    y_slice = y[:, y_offset : y_offset + out_dim]  # view: writes land in y
    for slot, rank, token_ids in _segments(slot_start_loc, lora_ranks, sorted_token_ids):
        lo = lora_out.index_select(0, token_ids)[:, :rank].float()  # [n, rank]
        delta = (lo @ lora_b[slot, :, :rank].float().T) * scale_list[slot]  # [n, out_dim]
        y_slice[token_ids] = (y_slice.index_select(0, token_ids).float() + delta).to(y.dtype)
