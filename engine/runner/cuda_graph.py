"""CUDA graphs for decode steps: one captured forward per padded batch size.

A decode step (one new token per sequence) launches the same few hundred small kernels
every time; replaying them as one graph removes the per-launch CPU cost that otherwise
dominates. Inputs live in static buffers; a step of `n` sequences is copied into them and
padded to the next captured size with rows that write nowhere (slot -1) and read one token.

Graphs per size: one without LoRA, and with LoRA for every module (slots that do not target
a module have rank 0 there, and the kernels skip them) one per slot table a step of that size
can have (`slot_table_size`: 8, 16, ... up to max_batch_loras). The LoRA kernels' grids and
slot searches scale with the table, so a decode step of 8 adapters replays a graph that launches
8 slot rows, not one per sequence.
"""

from __future__ import annotations

import bisect
import logging
import time

import torch

from loraplex.engine.lora.lora_batch import LoRABatch
from loraplex.engine.lora.lora_manager import LoRAManager
from loraplex.engine.lora.step_mapping import slot_table_size
from loraplex.engine.model.forward_context import AttentionMetadata, ForwardContext
from loraplex.engine.model.llama import LlamaForCausalLM
from loraplex.engine.runner.input_batch import ModelInputs

logger = logging.getLogger(__name__)

CAPTURE_SIZES = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 160, 192, 224, 256, 320, 384, 448, 512)


def graph_slot_tables(size: int, max_batch_loras: int) -> list[int]:
    """The slot tables of the steps of up to `size` sequences (an adapter each at most)."""
    max_adapters = min(size, max_batch_loras)
    return sorted({slot_table_size(n, max_batch_loras) for n in range(1, max_adapters + 1)})


class CUDAGraphRunner:
    def __init__(
        self,
        model: LlamaForCausalLM,
        kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
        max_num_seqs: int,
        max_blocks_per_seq: int,
        lora_manager: LoRAManager | None,
        device: torch.device,
    ) -> None:
        self.model = model
        self.kv_caches = kv_caches
        self.lora_manager = lora_manager
        self.sizes = [s for s in CAPTURE_SIZES if s < max_num_seqs] + [max_num_seqs]
        n = self.sizes[-1]
        self.input_ids = torch.zeros(n, dtype=torch.int64, device=device)
        self.positions = torch.zeros(n, dtype=torch.int64, device=device)
        self.slot_mapping = torch.full((n,), -1, dtype=torch.int64, device=device)
        self.block_tables = torch.zeros((n, max_blocks_per_seq), dtype=torch.int32, device=device)
        self.seq_lens = torch.ones(n, dtype=torch.int32, device=device)
        self.query_start_loc = torch.arange(n + 1, dtype=torch.int32, device=device)
        # Every token its own id until a step maps its first n (see copy_lora_mapping).
        self._token_ids = torch.arange(n, dtype=torch.int32, device=device)
        self.sorted_token_ids = self._token_ids.clone()
        max_batch_loras = lora_manager.max_batch_loras if lora_manager else 1
        self.slot_start_loc = torch.zeros(max_batch_loras + 1, dtype=torch.int32, device=device)
        self.slot_adapters = torch.zeros(max_batch_loras, dtype=torch.int32, device=device)
        self.num_active_slots = torch.zeros(1, dtype=torch.int32, device=device)
        self.max_batch_loras = max_batch_loras
        # (size, the LoRA mapping's slot table or None without LoRA) -> (graph, its output)
        self._graphs: dict[tuple[int, int | None], tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}

    @property
    def max_batch_size(self) -> int:
        return self.sizes[-1]

    def _context(self, size: int, slot_table: int | None) -> ForwardContext:
        attn = AttentionMetadata(
            slot_mapping=self.slot_mapping[:size],
            block_tables=self.block_tables[:size],
            seq_lens=self.seq_lens[:size],
            query_start_loc=self.query_start_loc[: size + 1],
            max_query_len=1,
            max_seq_len=self.block_tables.shape[1],
        )
        lora = None
        if slot_table is not None:
            assert self.lora_manager is not None
            lora = self.lora_manager.create_graph_batch(
                self.sorted_token_ids[:size],
                self.slot_start_loc[: slot_table + 1],
                self.slot_adapters[:slot_table],
                self.num_active_slots,
            )
        return ForwardContext(attn, self.kv_caches, lora)

    @torch.inference_mode()
    def capture(self) -> None:
        """Capture every size (and slot table), largest first so smaller graphs reuse its
        memory pool."""
        start = time.perf_counter()
        pool = None
        keys: list[tuple[int, int | None]] = [(size, None) for size in reversed(self.sizes)]
        if self.lora_manager is not None:
            keys += [
                (size, table)
                for size in reversed(self.sizes)
                for table in reversed(graph_slot_tables(size, self.max_batch_loras))
            ]
        for size, slot_table in keys:
            ctx = self._context(size, slot_table)
            args = (self.input_ids[:size], self.positions[:size], ctx)
            for _ in range(2):  # warm-up: Triton compiles, allocator settles
                self.model(*args)
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                out = self.model(*args)
            pool = graph.pool()
            self._graphs[(size, slot_table)] = (graph, out)
        logger.info(
            "captured %d CUDA graphs for decode batch sizes %s in %.1f s",
            len(self._graphs),
            self.sizes,
            time.perf_counter() - start,
        )

    def can_run(self, inputs: ModelInputs) -> bool:
        num_seqs = inputs.attn.seq_lens.shape[0]
        return inputs.attn.max_query_len == 1 and num_seqs <= self.max_batch_size

    def padded_size(self, num_seqs: int) -> int:
        """The captured batch size a decode step of `num_seqs` sequences replays."""
        return self.sizes[bisect.bisect_left(self.sizes, num_seqs)]

    def copy_lora_mapping(
        self,
        sorted_token_ids: torch.Tensor,  # [n] int32
        slot_start_loc: torch.Tensor,
        slot_adapters: torch.Tensor,
        num_active_slots: torch.Tensor,
        size: int,
    ) -> None:
        """A step's LoRA mapping of n tokens into the static buffers of graph `size`.

        The padding rows [n, size) are tokens without an adapter, each with its own id, last
        in sorted_token_ids as `build_lora_mapping` puts them. `silu_and_mul_lora` visits every
        token from slot_start_loc[num_active] up to `size` through sorted_token_ids: a stale id
        there (an earlier step's) would have it rewrite a real token's activation without that
        token's adapter delta, racing the right write, or reach rows past the graph's own."""
        n = sorted_token_ids.shape[0]
        self.sorted_token_ids[:n].copy_(sorted_token_ids)
        self.sorted_token_ids[n:size].copy_(self._token_ids[n:size])
        # The step's slot table: the first slots of the buffers (its graph's view of them).
        self.slot_start_loc[: slot_start_loc.shape[0]].copy_(slot_start_loc)
        self.slot_adapters[: slot_adapters.shape[0]].copy_(slot_adapters)
        self.num_active_slots.copy_(num_active_slots)

    def run(self, inputs: ModelInputs, lora: LoRABatch | None) -> torch.Tensor:
        """Replay the graph for this decode step; returns hidden states [n, hidden]."""
        n = inputs.input_ids.shape[0]
        size = self.padded_size(n)
        self.input_ids[:n].copy_(inputs.input_ids)
        self.positions[:n].copy_(inputs.positions)
        self.slot_mapping[:n].copy_(inputs.attn.slot_mapping)
        self.slot_mapping[n:size].fill_(-1)
        self.seq_lens[:n].copy_(inputs.attn.seq_lens)
        self.seq_lens[n:size].fill_(1)
        width = inputs.attn.block_tables.shape[1]
        self.block_tables[:n, :width].copy_(inputs.attn.block_tables)
        slot_table = None
        if lora is not None:
            self.copy_lora_mapping(lora.sorted_token_ids, lora.slot_start_loc,
                                   lora.slot_adapters, lora.num_active_slots, size)  # fmt: skip
            slot_table = lora.slot_adapters.shape[0]
        graph, out = self._graphs[(size, slot_table)]
        graph.replay()
        return out[:n]
