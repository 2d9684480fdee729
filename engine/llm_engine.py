"""LLMEngine: the synchronous core. `step()` = schedule, execute, update."""

from __future__ import annotations

import logging
import sys
import time
from dataclasses import replace
from typing import Any

from loraplex.engine.cache_sizing import allocate_kv_cache
from loraplex.engine.config import EngineConfig
from loraplex.engine.distributed.sharding import create_tp_layouts
from loraplex.engine.distributed.tp_runner import TensorParallelRunner
from loraplex.engine.engine_args import create_engine_config
from loraplex.engine.errors import (
    EngineDeadError,
    InvalidParameterError,
)
from loraplex.engine.kv_cache import KVCacheManager
from loraplex.engine.lora.lora_manager import LoRAManager
from loraplex.engine.lora.waiting_checks import failed_adapter_requests
from loraplex.engine.output_processor import OutputProcessor
from loraplex.engine.request import (
    LoRARequest,
    Request,
    RequestOutput,
    RequestStatus,
    SamplingParams,
)
from loraplex.engine.runner.model_runner import ModelRunner, PendingOutput
from loraplex.engine.scheduler import Scheduler
from loraplex.engine.scheduler.output import SchedulerOutput
from loraplex.engine.stats import EngineStats, LoRAStats, RateMeter
from loraplex.engine.tokenizer import Tokenizer

logger = logging.getLogger(__name__)

PromptType = str | list[int] | dict[str, Any]
# A step that schedules nothing (every request waits for its adapter) sleeps this long.
EMPTY_STEP_WAIT_S = 0.001


class LLMEngine:
    def __init__(self, config: EngineConfig, output_deltas: bool = False) -> None:
        """`output_deltas`: `step` returns what each request gained since its last output
        rather than everything so far (OutputProcessor)."""
        self.config = config
        if config.scheduler.switch_interval_ms is not None:
            sys.setswitchinterval(config.scheduler.switch_interval_ms / 1000)
        self.tokenizer = Tokenizer.from_model_dir(config.model.model)
        self.runner = (
            ModelRunner(config)
            if config.parallel.tensor_parallel_size == 1
            else TensorParallelRunner(config)
        )
        # Set when the engine stopped for good (a tensor-parallel worker died): no more steps.
        self.dead: EngineDeadError | None = None
        sizes = allocate_kv_cache(config, self.runner)
        self.max_model_len = sizes.max_model_len
        self.kv_cache_manager = KVCacheManager(
            sizes.num_blocks,
            config.cache.block_size,
            config.cache.enable_prefix_caching,
            sizes.num_cpu_blocks,
        )
        self.lora_manager: LoRAManager | None = None
        if config.lora.enable_lora:
            arch, tp = self.runner.arch, self.runner.tp
            self.lora_manager = LoRAManager(
                config.lora,
                arch,
                self.runner.dtype,
                self.kv_cache_manager,
                self.runner.kv_pages,
                max_batch_loras=config.lora.max_loras or config.scheduler.max_num_seqs,
                tp_layouts=[] if tp is None else create_tp_layouts(arch, tp.group.world_size),
                reduce=None if tp is None else tp.group,
            )
        self.runner.initialize_lora(self.lora_manager)
        self.runner.capture_cuda_graphs(self.max_model_len, self.lora_manager)
        self.runner.warm_up_kernels(self.lora_manager)
        self.scheduler = Scheduler(
            config.scheduler,
            self.kv_cache_manager,
            self.max_model_len,
            max_loras=config.lora.max_loras if config.lora.enable_lora else None,
            adapter_gate=self.lora_manager,
            on_finish=self._on_request_finished,
        )
        self.output_processor = OutputProcessor(self.tokenizer, deltas=output_deltas)
        self.num_generated_tokens = 0
        self.num_steps = 0
        self.num_scheduled_tokens = 0  # tokens computed by the steps (prefill and decode)
        self.step_seconds = 0.0  # wall time inside step(), less its waits for adapter loads
        # Of step_seconds, the time blocked on a launched step's tokens (EngineStats says what
        # the rest holds).
        self.result_wait_seconds = 0.0
        # Of step_seconds, the time spent preparing and launching steps (inputs, LoRA mapping,
        # every kernel launch of the forward and the sampler).
        self.launch_seconds = 0.0
        self._throughput = RateMeter()
        self.async_scheduling = (
            config.scheduler.async_scheduling and self.runner.supports_async_scheduling
        )
        # The launched step whose sampled tokens the host has not read yet.
        self._in_flight: tuple[SchedulerOutput, PendingOutput] | None = None

    @classmethod
    def from_engine_args(cls, model: str, **kwargs: Any) -> LLMEngine:
        return cls(create_engine_config(model, **kwargs))

    # ---- requests ----------------------------------------------------------------------

    def tokenize_prompt(self, prompt: PromptType) -> tuple[str | None, list[int]]:
        if isinstance(prompt, str):
            return prompt, self.tokenizer.encode(prompt)
        if isinstance(prompt, dict):
            return prompt.get("prompt"), list(prompt["prompt_token_ids"])
        return None, list(prompt)

    def add_request(
        self,
        request_id: str,
        prompt: PromptType,
        params: SamplingParams,
        lora_request: LoRARequest | None = None,
        priority: int = 0,
        fairness_key: str = "",
        cache_salt: str | None = None,
        arrival_time: float | None = None,
    ) -> None:
        """Queue one user request (n completions). Raises InvalidParameterError if it can't run."""
        self._check_alive()
        if self.output_processor.has(request_id):
            raise ValueError(f"request id {request_id!r} is already in use")
        prompt_text, prompt_token_ids = self.tokenize_prompt(prompt)
        vocab_size = self.runner.arch.vocab_size
        # min and max run in C, not a Python loop over every id: the engine loop adds a burst of
        # requests between two steps
        ids = prompt_token_ids
        if ids and (min(ids) < 0 or max(ids) >= vocab_size):
            raise InvalidParameterError(f"token ids must be in [0, {vocab_size})", param="prompt")
        arrival_time = time.monotonic() if arrival_time is None else arrival_time
        if lora_request is not None:
            if self.lora_manager is None:
                raise InvalidParameterError(
                    "LoRA is not enabled on this engine", param="lora_request"
                )
            lora_request = self.lora_manager.resolve(lora_request)
        children = [
            Request(
                request_id=request_id if params.n == 1 else f"{request_id}#{i}",
                prompt_token_ids=prompt_token_ids,
                sampling_params=_child_params(params, i),
                eos_token_ids=frozenset(self.tokenizer.eos_token_ids),
                lora_request=lora_request,
                priority=priority,
                fairness_key=fairness_key,
                cache_salt=cache_salt,
                arrival_time=arrival_time,
                fork_parent_id=None if i == 0 else f"{request_id}#0",
            )
            for i in range(params.n)
        ]
        added: list[Request] = []
        try:
            for child in children:
                self.scheduler.add_request(child)
                added.append(child)
                if lora_request is not None and self.lora_manager is not None:
                    assert lora_request.content_hash is not None
                    self.lora_manager.pin(lora_request.content_hash)
        except Exception:
            self.scheduler.finish_requests(
                [c.request_id for c in added], RequestStatus.FINISHED_ABORTED
            )
            raise
        self.output_processor.add(request_id, prompt_text, children)

    def abort_request(self, request_id: str) -> list[RequestOutput]:
        """Abort a user request (all its completions); its blocks are freed at once."""
        child_ids = self.output_processor.child_ids(request_id)
        self.scheduler.finish_requests(child_ids, RequestStatus.FINISHED_ABORTED)
        return self.output_processor.finish(child_ids, "abort")

    def has_unfinished_requests(self) -> bool:
        """Requests not finished, or a launched step whose results are still to collect."""
        return self.scheduler.has_unfinished_requests() or self._in_flight is not None

    def _on_request_finished(self, request: Request) -> None:
        if request.lora_request is not None and self.lora_manager is not None:
            assert request.lora_request.content_hash is not None
            self.lora_manager.unpin(request.lora_request.content_hash)

    # ---- adapters ----------------------------------------------------------------------

    def add_lora(self, lora_request: LoRARequest) -> bool:
        """Validate and load an adapter now (else it loads on first use)."""
        if self.lora_manager is None:
            raise InvalidParameterError("LoRA is not enabled on this engine", param="lora_request")
        self.lora_manager.add_lora(lora_request)
        return True

    def remove_lora(self, lora_int_id: int) -> bool:
        """Unregister an adapter; requests already in flight finish on its weights."""
        return self.lora_manager.remove_lora(lora_int_id) if self.lora_manager else False

    def list_loras(self) -> list[int]:
        return self.lora_manager.list_loras() if self.lora_manager else []

    # ---- one step ----------------------------------------------------------------------

    def step(self) -> list[RequestOutput]:
        start = time.perf_counter()
        try:
            return self._step()
        finally:
            self.step_seconds += time.perf_counter() - start

    def _step(self) -> list[RequestOutput]:
        """Schedule and launch a step, then finish the one before it while this one runs
        (async scheduling; see engine/scheduler/scheduler.py). Returns the finished step's
        outputs: a step's tokens come back from the `step()` call after the one launching it,
        or from the same call when it must not overlap the next one."""
        self._check_alive()
        failed_loads: list[RequestOutput] = []
        if self.lora_manager is not None:
            failures = self.lora_manager.poll(self.scheduler.waiting, len(self.scheduler.running))
            failed_loads = self._fail_adapter_requests(failures)
        scheduler_output = self.scheduler.schedule()
        if scheduler_output.is_empty:
            if self._in_flight is not None:  # its results are what the next step waits for
                self._while_gpu_runs()
                return failed_loads + self._finish_in_flight()
            # Requests are waiting for their adapters' loads: let the loader threads work.
            waited = time.perf_counter()
            time.sleep(EMPTY_STEP_WAIT_S)
            self.step_seconds -= time.perf_counter() - waited  # waiting is not step time
        launched = time.perf_counter()
        try:
            lora = None
            if self.lora_manager is not None:
                lora = self.lora_manager.prepare(scheduler_output.scheduled)
            pending = self.runner.launch(scheduler_output, lora)
        except EngineDeadError as exc:
            return failed_loads + self._stop(exc)
        except Exception:
            return failed_loads + self._finish_in_flight() + self._fail_step(scheduler_output)
        finally:
            self.launch_seconds += time.perf_counter() - launched
        self._while_gpu_runs()
        outputs = failed_loads + self._finish_in_flight()
        self._in_flight = (scheduler_output, pending)
        if not self.async_scheduling:
            outputs += self._finish_in_flight()
        return outputs

    def _finish_in_flight(self) -> list[RequestOutput]:
        """Wait for the launched step's tokens; append them, stop and stream (no-op if none)."""
        if self._in_flight is None:
            return []
        scheduler_output, pending = self._in_flight
        self._in_flight = None
        # The deferred text of the step before, while the GPU works (and before the tokens
        # below are appended).
        self.output_processor.flush()
        waited = time.perf_counter()
        try:
            runner_output = pending.result()
        except Exception:
            return self._fail_step(scheduler_output)
        finally:
            self.result_wait_seconds += time.perf_counter() - waited
        updated = self.scheduler.update_from_output(scheduler_output, runner_output)
        outputs, stopped = self.output_processor.process(updated, runner_output.logprobs)
        self.scheduler.finish_requests(stopped, RequestStatus.FINISHED_STOPPED)
        self.num_generated_tokens += len(updated)
        self._throughput.add(len(updated))
        self.num_steps += 1
        self.num_scheduled_tokens += sum(s.num_new_tokens for s in scheduler_output.scheduled)
        return outputs

    def _fail_step(self, scheduler_output: SchedulerOutput) -> list[RequestOutput]:
        """One failed step (e.g. out of memory) fails the requests in it, not the engine."""
        logger.exception(
            "model step failed; failing the %d requests in it", len(scheduler_output.scheduled)
        )
        failed = [
            s.request.request_id for s in scheduler_output.scheduled if not s.request.is_finished
        ]
        self.scheduler.finish_requests(failed, RequestStatus.FINISHED_ERROR)
        return self.output_processor.finish(failed, "error")

    def _while_gpu_runs(self) -> None:
        """Host work that needs no result of this step, done while its forward runs: start the
        adapter reads the step asked for."""
        if self.lora_manager is not None:
            self.lora_manager.start_loads()

    def _check_alive(self) -> None:
        if self.dead is not None:
            raise EngineDeadError(f"the engine stopped: {self.dead}") from self.dead

    def _stop(self, error: EngineDeadError) -> list[RequestOutput]:
        """The model can no longer run (a tensor-parallel worker died): fail every request in
        flight with `error`, stop the runner's workers, refuse any further work."""
        logger.error("engine stopped: %s", error)
        requests = list(self.scheduler.requests.values())
        for request in requests:
            request.error = error
        ids = [request.request_id for request in requests]
        self.scheduler.finish_requests(ids, RequestStatus.FINISHED_ERROR)
        self.dead = error
        self._in_flight = None  # its requests are failed above
        self.runner.shutdown()
        return self.output_processor.finish(ids, "error")

    def shutdown(self) -> None:
        """Release the runner's resources (tensor parallelism: stop the worker processes)."""
        self.runner.shutdown()

    def _fail_adapter_requests(self, failures: dict[str, str]) -> list[RequestOutput]:
        """End the waiting requests whose adapter failed to load, or that could never fit the
        KV cache beside their adapter (nobody else is affected)."""
        if self.lora_manager is None:
            return []
        failed = failed_adapter_requests(
            self.scheduler.waiting,
            failures,
            self.lora_manager,
            self.kv_cache_manager.num_blocks,
            self.config.cache.block_size,
            self.max_model_len,
        )
        if not failed:
            return []
        ids = [request.request_id for request in failed]
        self.scheduler.finish_requests(ids, RequestStatus.FINISHED_ERROR)
        return self.output_processor.finish(ids, "error")

    def get_stats(self) -> EngineStats:
        """A snapshot of the engine's counters and gauges (see engine/stats.py)."""
        scheduler, kv = self.scheduler, self.kv_cache_manager
        swap, block_bytes = kv.swap_space, self.runner.kv_bytes_per_block
        adapter_blocks = sum(len(blocks) for blocks in kv.adapter_blocks.values())
        return EngineStats(
            num_running=len(scheduler.running),
            num_waiting=len(scheduler.waiting),
            num_swapped=scheduler.num_swapped,
            num_waiting_tokens=scheduler.num_waiting_tokens,
            kv_blocks_total=kv.num_blocks,
            kv_blocks_used=kv.num_blocks - kv.num_free_blocks - adapter_blocks,
            kv_blocks_adapters=adapter_blocks,
            kv_blocks_cached=kv.block_pool.num_cached_blocks,
            kv_cpu_blocks_total=swap.num_cpu_blocks,
            kv_cpu_blocks_used=swap.num_cpu_blocks - swap.num_free_blocks,
            num_preemptions_swap=scheduler.num_swap_preemptions,
            num_preemptions_recompute=scheduler.num_recompute_preemptions,
            swap_bytes_out=swap.num_swapped_out_blocks * block_bytes,
            swap_bytes_in=swap.num_swapped_in_blocks * block_bytes,
            prefix_cache_queried_tokens=kv.num_prefix_queried_tokens,
            prefix_cache_hit_tokens=kv.num_prefix_hit_tokens,
            num_generated_tokens=self.num_generated_tokens,
            num_steps=self.num_steps,
            num_scheduled_tokens=self.num_scheduled_tokens,
            step_seconds=self.step_seconds,
            result_wait_seconds=self.result_wait_seconds,
            launch_seconds=self.launch_seconds,
            throughput_tokens_per_s=self._throughput.rate(),
            lora=replace(
                self.lora_manager.get_stats() if self.lora_manager else LoRAStats(),
                num_adapter_waits=scheduler.num_adapter_waits,
                adapter_wait_seconds=scheduler.adapter_wait_seconds,
            ),
        )


def _child_params(params: SamplingParams, index: int) -> SamplingParams:
    """The i-th of n completions: the same parameters, n=1, its own seed if seeded."""
    seed = None if params.seed is None else (params.seed + index) % 2**63
    return replace(params, n=1, seed=seed)
