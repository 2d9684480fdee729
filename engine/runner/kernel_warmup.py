"""Throwaway forwards at start-up, so that no Triton kernel compiles while the engine serves.

Triton compiles a kernel variant the first time a launch needs it: one per row of a tile table
(picked by the step's tokens) and, for the LoRA kernels, per slot-search width (the step's slot
table: 8, 16, ... adapters). The decode graphs compile theirs when they are captured
(cuda_graph.py); prefill and mixed steps would compile the rest while serving, each a pause of
the step loop for every request, the first time a step of a new size class, or a step with more
adapters than any before, comes. `warm_up_kernels` runs one forward per class before the first
request (`loraplex.kernels.warmup_step_shapes`: 33 with slot tables up to 256 and a budget of
8,192 tokens, 6 without adapters). Each forward writes nothing: its tokens' slots are -1, and
its LoRA batch has no active slot, so every LoRA kernel launches, finds no segment and returns.

A variant also follows each pointer's 16-byte alignment, so a step's own tensors must be
aligned as the warm-up's are: its inputs and its LoRA mapping both go to the device through
`device_copy.aligned_to_device`.

On a host whose steps run no Triton kernel (CPU) there is nothing to compile and nothing runs.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence

import torch

from loraplex.engine.lora.lora_manager import LoRAManager
from loraplex.engine.model.forward_context import AttentionMetadata, ForwardContext
from loraplex.engine.model.llama import LlamaForCausalLM
from loraplex.engine.runner.cuda_graph import graph_slot_tables
from loraplex.kernels import warmup_decode_sizes, warmup_step_shapes

logger = logging.getLogger(__name__)


def warm_up_kernels(
    model: LlamaForCausalLM,
    kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
    lora_manager: LoRAManager | None,
    max_num_seqs: int,
    max_num_batched_tokens: int,
    num_kv_heads: int,
    device: torch.device,
) -> None:
    """Compile every kernel variant a step of this engine can launch, before it serves."""
    slot_tables: list[int] = []
    if lora_manager is not None:
        slot_tables = graph_slot_tables(max_num_seqs, lora_manager.max_batch_loras)
    shapes = warmup_step_shapes(device, max_num_batched_tokens, slot_tables)
    decode_sizes = warmup_decode_sizes(device, max_num_seqs, num_kv_heads)
    if not shapes and not decode_sizes:
        return
    start = time.perf_counter()
    run_warmup_steps(model, kv_caches, lora_manager, shapes, decode_sizes)
    logger.info(
        "warmed up the kernels of %d step shapes in %.1f s",
        len(shapes) + len(decode_sizes),
        time.perf_counter() - start,
    )


@torch.inference_mode()
def run_warmup_steps(
    model: LlamaForCausalLM,
    kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
    lora_manager: LoRAManager | None,
    shapes: Sequence[tuple[int, int | None]],
    decode_sizes: Sequence[int] = (),
) -> None:
    """One forward per (tokens of one sequence, LoRA slot table or None), then one per decode
    batch size (one token per sequence, no adapters). Nothing is written to the KV cache or the
    adapters' pages."""
    device = kv_caches[0][0].device
    for num_tokens, slot_table in shapes:
        _forward(model, kv_caches, lora_manager, [num_tokens], slot_table, device)
    for num_seqs in decode_sizes:
        _forward(model, kv_caches, lora_manager, [1] * num_seqs, None, device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _forward(
    model: LlamaForCausalLM,
    kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
    lora_manager: LoRAManager | None,
    query_lens: list[int],
    slot_table: int | None,
    device: torch.device,
) -> None:
    """A forward of sequences of `query_lens` new tokens each and no earlier context, whose
    K/V go nowhere and whose attention reads block 0 (a throwaway result)."""
    num_tokens, block_size = sum(query_lens), kv_caches[0][0].shape[1]
    lens = torch.tensor(query_lens, dtype=torch.int32, device=device)
    blocks_per_seq = -(-max(query_lens) // block_size)
    attn = AttentionMetadata(
        slot_mapping=torch.full((num_tokens,), -1, dtype=torch.int64, device=device),
        block_tables=_int32_zeros((len(query_lens), blocks_per_seq), device),
        seq_lens=lens,
        query_start_loc=torch.cat([_int32_zeros(1, device), lens.cumsum(0, dtype=torch.int32)]),
        max_query_len=max(query_lens),
        max_seq_len=max(query_lens),
    )
    lora = None
    if slot_table is not None:
        assert lora_manager is not None
        lora = lora_manager.create_graph_batch(*idle_lora_mapping(num_tokens, slot_table, device))
    positions = torch.cat([torch.arange(n, device=device) for n in query_lens])
    input_ids = torch.zeros(num_tokens, dtype=torch.int64, device=device)
    model(input_ids, positions, ForwardContext(attn, kv_caches, lora))


def idle_lora_mapping(
    num_tokens: int, slot_table: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(sorted_token_ids, slot_start_loc, slot_adapters, num_active_slots) of a step whose
    `slot_table` slots are all empty: every LoRA kernel launches and returns at once. Each a
    tensor of its own, 16-byte aligned, as a step's own tables are (`map_step`)."""
    return (
        torch.arange(num_tokens, dtype=torch.int32, device=device),
        _int32_zeros(slot_table + 1, device),
        _int32_zeros(slot_table, device),
        _int32_zeros(1, device),  # no active slot
    )


def _int32_zeros(shape: int | tuple[int, ...], device: torch.device) -> torch.Tensor:
    return torch.zeros(shape, dtype=torch.int32, device=device)
