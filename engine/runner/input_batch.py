"""SchedulerOutput -> the flat tensors of one forward pass (see model/forward_context.py)."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from loraplex.engine.device_copy import tensor_to_device, to_device
from loraplex.engine.model.forward_context import AttentionMetadata
from loraplex.engine.scheduler.output import ScheduledRequest


@dataclass
class ModelInputs:
    input_ids: torch.Tensor  # [num_tokens] int64
    positions: torch.Tensor  # [num_tokens] int64
    attn: AttentionMetadata
    # Row of each sampling request's last token in the flat batch.
    logits_indices: torch.Tensor  # [num_sample] int64
    sample_requests: list[ScheduledRequest]
    # Rows of `input_ids` whose token the step in flight is still sampling (async scheduling;
    # 0 until ModelRunner fills them in on the device), and the requests they belong to.
    placeholder_rows: list[int] = field(default_factory=list)
    placeholder_request_ids: list[str] = field(default_factory=list)


def count_leading_decodes(scheduled: list[ScheduledRequest]) -> int:
    """How many requests at the front of the step have one new token each."""
    count = 0
    for item in scheduled:
        if item.num_new_tokens != 1:
            break
        count += 1
    return count


def prepare_inputs(
    scheduled: list[ScheduledRequest], block_size: int, device: torch.device
) -> ModelInputs:
    """Pack the step's tokens flat, with positions, cache slots and block tables.

    Built as Python lists and copied to the device once per tensor. A request's last token
    may still be sampled by the step in flight: that row is left for the runner to fill in.
    """
    input_ids: list[int] = []
    positions: list[int] = []
    slot_mapping: list[int] = []
    seq_lens: list[int] = []
    query_start_loc = [0]
    logits_indices: list[int] = []
    sample_requests: list[ScheduledRequest] = []
    max_blocks = max(len(s.block_ids) for s in scheduled)
    block_table_rows: list[list[int]] = []  # padded with 0 (never read past seq_len)
    placeholder_rows: list[int] = []
    placeholder_request_ids: list[str] = []

    for item in scheduled:
        request, start = item.request, item.start_position
        end = start + item.num_new_tokens
        known_end = min(end, request.num_tokens)
        input_ids.extend(request.token_ids_between(start, known_end))
        if end > known_end:
            assert end == known_end + 1, "only the last step's token can be unknown"
            placeholder_rows.append(len(input_ids))
            placeholder_request_ids.append(request.request_id)
            input_ids.append(0)
        positions.extend(range(start, end))
        block_ids = item.block_ids
        slot_mapping.extend(
            block_ids[p // block_size] * block_size + p % block_size for p in range(start, end)
        )
        seq_lens.append(end)
        query_start_loc.append(len(input_ids))
        block_table_rows.append(block_ids + [0] * (max_blocks - len(block_ids)))
        if item.needs_sample:
            logits_indices.append(len(input_ids) - 1)
            sample_requests.append(item)

    attn = AttentionMetadata(
        slot_mapping=to_device(slot_mapping, torch.int64, device),
        # One tensor for all rows: a torch.tensor per row cost ~10 us each, every step.
        block_tables=tensor_to_device(torch.tensor(block_table_rows, dtype=torch.int32), device),
        seq_lens=to_device(seq_lens, torch.int32, device),
        query_start_loc=to_device(query_start_loc, torch.int32, device),
        max_query_len=max(s.num_new_tokens for s in scheduled),
        max_seq_len=max(seq_lens),
        num_decode_seqs=count_leading_decodes(scheduled),
    )
    return ModelInputs(
        input_ids=to_device(input_ids, torch.int64, device),
        positions=to_device(positions, torch.int64, device),
        attn=attn,
        logits_indices=to_device(logits_indices, torch.int64, device),
        sample_requests=sample_requests,
        placeholder_rows=placeholder_rows,
        placeholder_request_ids=placeholder_request_ids,
    )
