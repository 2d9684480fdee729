"""ModelRunner: owns the model, the KV cache tensors and the sampler; runs one step.

It never decides who runs: it executes a `SchedulerOutput` and returns sampled tokens.
Under tensor parallelism every rank has one, built with its `TensorParallel` share (its
shard of the weights and of the KV heads); rank 0's samples (engine/distributed/).
"""

from __future__ import annotations

import logging

import torch

from loraplex.engine.config import EngineConfig
from loraplex.engine.device_copy import to_device
from loraplex.engine.distributed.tp_group import TensorParallel
from loraplex.engine.errors import ConfigError
from loraplex.engine.lora.lora_batch import LoRABatch
from loraplex.engine.lora.lora_manager import LoRAManager
from loraplex.engine.model.dummy_weights import create_dummy_model
from loraplex.engine.model.forward_context import AttentionMetadata, ForwardContext
from loraplex.engine.model.weight_loader import load_model, resolve_device
from loraplex.engine.request import Request
from loraplex.engine.runner.cuda_graph import CUDAGraphRunner
from loraplex.engine.runner.input_batch import ModelInputs, prepare_inputs
from loraplex.engine.runner.kernel_warmup import warm_up_kernels
from loraplex.engine.sampler import SampledTensors, Sampler
from loraplex.engine.sampling_metadata import PAD_TOKEN_ID, SamplingMetadata, create_generator
from loraplex.engine.scheduler.output import BlockCopies, ModelRunnerOutput, SchedulerOutput

logger = logging.getLogger(__name__)

GiB = 1 << 30


class ModelRunner:
    # Whether a step may launch before the last step's tokens reach the host (see launch).
    supports_async_scheduling = True

    def __init__(self, config: EngineConfig, tp: TensorParallel | None = None) -> None:
        """`tp`: this rank's share of a tensor-parallel model (None: the whole model)."""
        self.config = config
        self.tp = tp
        self.device = resolve_device(config.model.device)
        if self.device.type == "cuda" and not torch.cuda.is_available():
            raise ConfigError(f"device={config.model.device!r}: no CUDA device is available")
        if tp is not None and self.device.type == "cuda":
            self.device = torch.device("cuda", tp.group.rank)
            torch.cuda.set_device(self.device)  # the current device is per thread
        torch.manual_seed(config.model.seed)
        model = config.model
        if model.load_format == "dummy":
            self.model, self.arch = create_dummy_model(
                model.model, model.dtype, self.device, model.quantization, tp
            )
        else:
            self.model, self.arch = load_model(
                model.model, model.dtype, self.device, model.quantization, tp
            )
        # KV heads in this rank's cache (all of them without tensor parallelism).
        self.num_kv_heads = self.arch.num_key_value_heads if tp is None else tp.layout.num_kv_heads
        self.dtype = self.model.dtype  # activations and KV cache (weights may be quantized)
        self.block_size = config.cache.block_size
        # The KV cache (see initialize_kv_cache) and its CPU twin for swapped-out requests.
        self.kv_cache = torch.empty(0)
        self.cpu_kv_cache = torch.empty(0)
        self.kv_caches: list[tuple[torch.Tensor, torch.Tensor]] = []
        self.sampler = Sampler()
        self._generators: dict[str, torch.Generator] = {}
        # The last step's sampled tokens on the device [num_sample], and each request's row.
        self._last_sampled: tuple[torch.Tensor, dict[str, int]] | None = None
        self.cuda_graphs: CUDAGraphRunner | None = None

    def capture_cuda_graphs(self, max_model_len: int, lora_manager: LoRAManager | None) -> None:
        """Capture decode graphs (CUDA only, unless enforce_eager; not yet under tensor
        parallelism), once the KV cache exists."""
        if self.device.type != "cuda" or self.config.model.enforce_eager or self.tp is not None:
            return
        self.cuda_graphs = CUDAGraphRunner(
            self.model,
            self.kv_caches,
            self.config.scheduler.max_num_seqs,
            -(-max_model_len // self.block_size),
            lora_manager,
            self.device,
        )
        self.cuda_graphs.capture()

    def warm_up_kernels(self, lora_manager: LoRAManager | None) -> None:
        """Compile the kernels of every step shape before serving (kernel_warmup.py; where
        steps run Triton kernels, and not yet under tensor parallelism)."""
        if self.tp is not None:
            return
        scheduler = self.config.scheduler
        warm_up_kernels(
            self.model,
            self.kv_caches,
            lora_manager,
            scheduler.max_num_seqs,
            scheduler.max_num_batched_tokens,
            self.num_kv_heads,
            self.device,
        )

    # ---- KV cache --------------------------------------------------------------------------

    @property
    def kv_bytes_per_block(self) -> int:
        arch = self.arch
        per_token = 2 * arch.num_hidden_layers * self.num_kv_heads * arch.head_dim
        return per_token * self.block_size * self.dtype.itemsize

    def determine_num_blocks(self, max_useful_blocks: int) -> int:
        """How many KV blocks fit: the override, else the memory budget (GPU: after profiling)."""
        cache = self.config.cache
        if cache.num_kv_blocks is not None:
            return cache.num_kv_blocks
        if self.device.type == "cuda":
            budget = self._profile_free_gpu_bytes()
        else:
            budget = int(cache.cpu_kv_cache_gb * GiB)
        num_blocks = min(budget // self.kv_bytes_per_block, max_useful_blocks)
        if num_blocks <= 0:
            raise RuntimeError(
                "no memory is left for the KV cache; raise gpu_memory_utilization or use a "
                "smaller model"
            )
        return num_blocks

    def _profile_free_gpu_bytes(self) -> int:
        # Run the largest step the scheduler may produce, on a throwaway cache, and keep
        # utilization * total minus that peak for the KV cache.
        num_tokens = min(self.config.scheduler.max_num_batched_tokens, 8192)
        num_blocks = -(-num_tokens // self.block_size)
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(self.device)
        self.initialize_kv_cache(num_blocks)
        slots = torch.arange(num_tokens, device=self.device)
        attn = AttentionMetadata(
            slot_mapping=slots,
            block_tables=torch.arange(num_blocks, device=self.device, dtype=torch.int32)[None],
            seq_lens=torch.tensor([num_tokens], device=self.device, dtype=torch.int32),
            query_start_loc=torch.tensor([0, num_tokens], device=self.device, dtype=torch.int32),
            max_query_len=num_tokens,
            max_seq_len=num_tokens,
        )
        with torch.inference_mode():
            hidden = self.model(
                torch.zeros(num_tokens, dtype=torch.int64, device=self.device),
                slots,
                # With adapters enabled, as much memory as a step with adapters takes.
                ForwardContext(attn, self.kv_caches, keep_unquantized=self.config.lora.enable_lora),
            )
            # float32, as the sampler takes them for all but greedy rows
            self.model.compute_logits(hidden[-self.config.scheduler.max_num_seqs :]).float()
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated(self.device) - self.kv_cache.nbytes
        self.kv_cache, self.kv_caches = torch.empty(0), []
        torch.cuda.empty_cache()
        total = torch.cuda.get_device_properties(self.device).total_memory
        return int(total * self.config.cache.gpu_memory_utilization) - peak

    def _kv_shape(self, num_blocks: int) -> tuple[int, ...]:
        arch = self.arch
        return (
            arch.num_hidden_layers, num_blocks, 2, self.block_size, self.num_kv_heads,
            arch.head_dim,
        )  # fmt: skip

    def initialize_kv_cache(self, num_blocks: int) -> None:
        """Allocate the KV cache, one tensor for every layer and block:

            kv_cache  [num_layers, num_blocks, 2 (K, V), block_size, num_kv_heads, head_dim]

        Attention reads per-layer (K, V) views, [num_blocks, block_size, num_kv_heads,
        head_dim] each; block b of every layer is also one page of `kv_pages`, where resident
        adapters keep their weights (engine/lora/page_layout.py)."""
        self.kv_cache = torch.zeros(
            self._kv_shape(num_blocks), dtype=self.dtype, device=self.device
        )
        self.kv_caches = [(layer[:, 0], layer[:, 1]) for layer in self.kv_cache]
        logger.info(
            "KV cache: %d blocks of %d tokens (%.2f GiB)",
            num_blocks,
            self.block_size,
            self.kv_cache.nbytes / GiB,
        )

    @property
    def kv_pages(self) -> torch.Tensor:
        """[num_layers, num_blocks, page_size]: the KV cache as pages of one block each."""
        num_layers, num_blocks = self.kv_cache.shape[:2]
        return self.kv_cache.view(num_layers, num_blocks, -1)

    def initialize_swap_space(self, num_cpu_blocks: int) -> None:
        """The CPU twin of the KV cache for swapped-out requests (pinned when on CUDA)."""
        pin = self.device.type == "cuda" and num_cpu_blocks > 0
        self.cpu_kv_cache = torch.empty(
            self._kv_shape(num_cpu_blocks), dtype=self.dtype, pin_memory=pin
        )

    def num_swap_blocks(self, max_useful_blocks: int) -> int:
        bytes_total = int(self.config.cache.swap_space_gb * GiB)
        if self.config.scheduler.preemption_mode != "swap":
            return 0
        return min(bytes_total // self.kv_bytes_per_block, max_useful_blocks)

    @staticmethod
    def _copy_blocks(src: torch.Tensor, dst: torch.Tensor, mapping: list[tuple[int, int]]) -> None:
        """Copy whole blocks, every layer at once: (src block, dst block) pairs."""
        if not mapping:
            return
        # A copy to or from the CPU waits for the stream; one on the GPU does not.
        src_ids = to_device([m[0] for m in mapping], torch.int64, src.device)
        dst_ids = to_device([m[1] for m in mapping], torch.int64, dst.device)
        dst[:, dst_ids] = src[:, src_ids].to(dst.device)

    # ---- one step --------------------------------------------------------------------------

    def execute(
        self, scheduler_output: SchedulerOutput, lora: LoRABatch | None = None
    ) -> ModelRunnerOutput:
        """Run one step and wait for its sampled tokens (`launch`, then its `result`)."""
        return self.launch(scheduler_output, lora).result()

    @torch.inference_mode()
    def launch(
        self, scheduler_output: SchedulerOutput, lora: LoRABatch | None = None
    ) -> PendingOutput:
        """Queue one step on the device without waiting for it: KV block copies, then the
        forward pass of the scheduled tokens (with `lora`, this step's adapter mapping, from
        LoRAManager.prepare) and sampling. Tokens the previous step is still sampling are fed
        from its results on the device."""
        for request_id in scheduler_output.finished_request_ids:
            self._generators.pop(request_id, None)
        self.copy_blocks(scheduler_output.block_copies)
        if not scheduler_output.scheduled:
            return PendingOutput.empty()
        inputs = prepare_inputs(scheduler_output.scheduled, self.block_size, self.device)
        self._fill_placeholders(inputs)
        logits = self.forward(inputs, lora)
        if logits is None:
            return PendingOutput.empty()
        return self._start_sample(logits, inputs)

    def _fill_placeholders(self, inputs: ModelInputs) -> None:
        """Copy the tokens the previous step sampled into this step's input rows (on the
        device: the host has not seen them yet)."""
        if not inputs.placeholder_rows:
            return
        rows, tokens = self._tokens_in_flight(
            inputs.placeholder_request_ids, inputs.placeholder_rows
        )
        inputs.input_ids[rows] = tokens

    def _fill_pending_outputs(
        self, output_token_ids: torch.Tensor, requests: list[Request], rows: list[int]
    ) -> None:
        """Put the tokens the previous step sampled in the PAD slots `_start_sample` left for
        them: output_token_ids [num_seqs, max_len], row r, column len(known outputs)."""
        columns = [len(requests[row].output_token_ids) for row in rows]
        cells, tokens = self._tokens_in_flight(
            [requests[row].request_id for row in rows], rows + columns
        )
        output_token_ids[cells[: len(rows)], cells[len(rows) :]] = tokens

    def _tokens_in_flight(
        self, request_ids: list[str], destination: list[int]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(`destination` on the device, the tokens the previous step sampled for
        `request_ids` [len(request_ids)]), with one host-to-device copy for both."""
        assert self._last_sampled is not None, "tokens in flight need a step that sampled"
        sampled, row_of = self._last_sampled
        sources = [row_of[request_id] for request_id in request_ids]
        index = to_device(destination + sources, torch.int64, self.device)
        split = len(destination)
        return index[:split], sampled[index[split:]]

    def copy_blocks(self, block_copies: BlockCopies) -> None:
        """The step's swap-outs, swap-ins and copy-on-write copies, in that order."""
        swap_out, swap_in, copy = block_copies
        # Swap-outs first: their GPU blocks may be handed to others in this very step.
        self._copy_blocks(self.kv_cache, self.cpu_kv_cache, swap_out)
        self._copy_blocks(self.cpu_kv_cache, self.kv_cache, swap_in)
        self._copy_blocks(self.kv_cache, self.kv_cache, copy)

    def forward(self, inputs: ModelInputs, lora: LoRABatch | None = None) -> torch.Tensor | None:
        """The forward pass -> the sampled rows' logits [num_sample, vocab] (None: no row)."""
        if self.cuda_graphs is not None and self.cuda_graphs.can_run(inputs):
            hidden = self.cuda_graphs.run(inputs, lora)  # [num_tokens, hidden]
        else:
            ctx = ForwardContext(attn=inputs.attn, kv_caches=self.kv_caches, lora=lora)
            hidden = self.model(inputs.input_ids, inputs.positions, ctx)
        if inputs.logits_indices.numel() == 0:
            return None
        return self.model.compute_logits(hidden[inputs.logits_indices])

    def _start_sample(self, logits: torch.Tensor, inputs: ModelInputs) -> PendingOutput:
        requests = [item.request for item in inputs.sample_requests]
        # Rows whose last output token the step before is still sampling: penalties count it
        # (a PAD_TOKEN_ID slot here, filled in on the device below).
        pending = [row for row, r in enumerate(requests) if r.num_output_placeholders > 1]
        outputs = [r.output_token_ids for r in requests]
        for row in pending:
            outputs[row] = [*outputs[row], PAD_TOKEN_ID]
        metadata = SamplingMetadata.build(
            [r.sampling_params for r in requests],
            [r.prompt_token_ids for r in requests],
            outputs,
            [self._generator_for(r.request_id, r.sampling_params.seed) for r in requests],
            self.device,
            stop_token_ids=_min_tokens_stops(requests),
        )
        if pending and metadata.output_token_ids is not None:
            self._fill_pending_outputs(metadata.output_token_ids, requests, pending)
        sampled = self.sampler.sample(logits, metadata)
        self._last_sampled = (
            sampled.token_ids,
            {request.request_id: row for row, request in enumerate(requests)},
        )
        host = sampled.to_host()
        done = None
        if self.device.type == "cuda":
            done = torch.cuda.Event()
            done.record()
        return PendingOutput(requests, host, metadata.num_logprobs, done)

    def initialize_lora(self, lora_manager: LoRAManager | None) -> None:
        """Once the LoRA manager exists (tensor parallelism: the workers' adapter tables)."""

    def shutdown(self) -> None:
        """Release what outlives the runner (tensor parallelism: its workers); here nothing."""

    def _generator_for(self, request_id: str, seed: int | None) -> torch.Generator | None:
        if seed is None:
            return None
        if request_id not in self._generators:
            self._generators[request_id] = create_generator(seed, self.device)
        return self._generators[request_id]


def _min_tokens_stops(requests: list[Request]) -> list[list[int]] | None:
    """Per row, the tokens banned until `min_tokens` is reached (None when no row needs it).
    The token sampled now follows the known outputs and the placeholders before it."""
    if all(r.sampling_params.min_tokens == 0 for r in requests):
        return None
    return [
        ([] if r.sampling_params.ignore_eos else sorted(r.eos_token_ids))
        + r.sampling_params.stop_token_ids
        if r.num_output_tokens + r.num_output_placeholders - 1 < r.sampling_params.min_tokens
        else []
        for r in requests
    ]


class PendingOutput:
    """A launched step's sampled tokens, on their way to the host."""

    def __init__(
        self,
        requests: list[Request],
        sampled: SampledTensors,
        num_logprobs: list[int | None],
        done: torch.cuda.Event | None = None,
    ) -> None:
        """`sampled`: host tensors that copies queued on the stream fill; `done`: an event
        recorded after those copies (None on the CPU, where they are complete)."""
        self.requests = requests
        self._sampled = sampled
        self._num_logprobs = num_logprobs
        self._done = done

    @classmethod
    def empty(cls) -> PendingOutput:
        return cls([], SampledTensors(torch.empty(0, dtype=torch.int64)), [])

    def result(self) -> ModelRunnerOutput:
        """Wait for the copies, then the step's tokens (and logprobs) by request id."""
        if self._done is not None:
            self._done.synchronize()
        sampled = self._sampled.to_output(self._num_logprobs)
        output = ModelRunnerOutput()
        for row, request in enumerate(self.requests):
            output.sampled_token_ids[request.request_id] = sampled.sampled_token_ids[row]
            row_logprobs = sampled.logprobs[row] if sampled.logprobs is not None else None
            if row_logprobs is not None and request.sampling_params.logprobs is not None:
                output.logprobs[request.request_id] = row_logprobs
        return output
