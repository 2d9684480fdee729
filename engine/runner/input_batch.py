"""SchedulerOutput -> the flat tensors of one forward pass (see model/forward_context.py)."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from loraplex.engine.device_copy import host_ints, packed_to_device
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

    Per request in Python (its token ids, its block ids), per token in torch: a prefill step
    has thousands of tokens, and a Python loop over them cost the host milliseconds a step.
    Copied to the device in two packed copies (int64 and int32 tensors). A request's last token
    may still be sampled by the step in flight: that row is left for the runner to fill in.

        row r, tokens [start_r, start_r + num_new_r):  token t of the step (row r, offset i)
            position      = start_r + i
            slot_mapping  = block_table[r, position // block_size] * block_size
                            + position % block_size
    """
    input_ids: list[int] = []
    starts: list[int] = []
    num_new: list[int] = []
    seq_lens: list[int] = []
    block_ids: list[int] = []  # every row's block ids, one after another
    block_counts: list[int] = []
    logits_indices: list[int] = []
    sample_requests: list[ScheduledRequest] = []
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
        starts.append(start)
        num_new.append(item.num_new_tokens)
        seq_lens.append(end)
        block_ids.extend(item.block_ids)
        block_counts.append(len(item.block_ids))
        if item.needs_sample:
            logits_indices.append(len(input_ids) - 1)
            sample_requests.append(item)

    num_rows, num_tokens = len(scheduled), len(input_ids)
    new = host_ints(num_new, torch.int64)
    query_start_loc = torch.zeros(num_rows + 1, dtype=torch.int64)
    torch.cumsum(new, 0, out=query_start_loc[1:])
    # [num_rows, max_blocks], padded with 0 (never read past seq_len)
    counts = host_ints(block_counts, torch.int64)
    block_tables = torch.zeros(num_rows, max(block_counts), dtype=torch.int32)
    block_tables[torch.arange(block_tables.shape[1]) < counts[:, None]] = host_ints(
        block_ids, torch.int32
    )
    rows = torch.arange(num_rows).repeat_interleave(new, output_size=num_tokens)
    offsets = torch.arange(num_tokens) - query_start_loc[rows]
    positions = host_ints(starts, torch.int64)[rows] + offsets
    blocks = block_tables[rows, positions // block_size].to(torch.int64)
    slot_mapping = blocks * block_size + positions % block_size

    (input_ids_d, positions_d, slot_mapping_d, logits_indices_d), int32s = packed_to_device(
        [host_ints(input_ids, torch.int64), positions, slot_mapping,
         host_ints(logits_indices, torch.int64)],
        [block_tables, host_ints(seq_lens, torch.int32), query_start_loc.to(torch.int32)],
        device,
    )  # fmt: skip
    block_tables_d, seq_lens_d, query_start_loc_d = int32s
    attn = AttentionMetadata(
        slot_mapping=slot_mapping_d,
        block_tables=block_tables_d,
        seq_lens=seq_lens_d,
        query_start_loc=query_start_loc_d,
        max_query_len=max(num_new),
        max_seq_len=max(seq_lens),
        num_decode_seqs=count_leading_decodes(scheduled),
    )
    return ModelInputs(
        input_ids=input_ids_d,
        positions=positions_d,
        attn=attn,
        logits_indices=logits_indices_d,
        sample_requests=sample_requests,
        placeholder_rows=placeholder_rows,
        placeholder_request_ids=placeholder_request_ids,
    )
