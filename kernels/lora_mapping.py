"""Per-step multi-LoRA batch mapping for the segmented (Punica SGMV) LoRA kernels.

Tokens are grouped by adapter slot so that each slot owns one contiguous segment of
`sorted_token_ids`; tokens without an adapter come last, outside every segment:

    token_lora_slots  [ 1, -1,  0,  1,  0]     slot per token, -1 = no adapter   (max_loras = 2)
    sorted_token_ids  [ 2,  4,  0,  3,  1]     slot 0 | slot 1 | no adapter
    slot_start_loc    [ 0,  2,  4]             slot s owns sorted_token_ids[start[s]:start[s + 1]]

Pure tensor ops on the input's device (no host sync), so it can run inside a CUDA graph capture
region or on CPU alike.
"""

from __future__ import annotations

import torch


def build_lora_mapping(
    token_lora_slots: torch.Tensor,  # [num_tokens] int; -1 = no adapter
    max_loras: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Return `(sorted_token_ids [num_tokens] int32, slot_start_loc [max_loras + 1] int32)`.

    Within a segment, tokens keep their batch order (stable sort). Slot ids must lie in
    `[-1, max_loras)`; that is the caller's invariant and is not checked (checking would sync).
    """
    assert token_lora_slots.dim() == 1, "token_lora_slots must be 1-D"
    assert max_loras >= 1, "max_loras must be >= 1"
    # No-adapter tokens get the key max_loras so that the stable sort puts them last.
    keys = token_lora_slots.to(torch.int64)
    keys = torch.where(keys < 0, torch.full_like(keys, max_loras), keys)
    _, order = torch.sort(keys, stable=True)
    counts = torch.bincount(keys, minlength=max_loras + 1)[:max_loras]  # [max_loras]
    slot_start_loc = torch.zeros(max_loras + 1, dtype=torch.int32, device=keys.device)
    slot_start_loc[1:] = torch.cumsum(counts, dim=0).to(torch.int32)
    return order.to(torch.int32), slot_start_loc
