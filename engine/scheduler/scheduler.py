"""Continuous batching at iteration level, with chunked prefill under a token budget.

Each step hands out `max_num_batched_tokens` tokens: first to running requests (a decode
needs 1, an unfinished prefill its next chunk), then to waiting ones in queue order, up to
`max_num_seqs` running. A request with no room for its next tokens makes the scheduler preempt
the least valuable running request (recompute: its blocks are freed and it is re-prefilled
later, output tokens included, so its output is unchanged).
"""

from __future__ import annotations

from collections.abc import Callable

from loraplex.engine.config import SchedulerConfig
from loraplex.engine.kv_cache import KVCacheManager
from loraplex.engine.request import (
    InvalidRequestError,
    Request,
    RequestStatus,
    RequestTooLongError,
)
from loraplex.engine.scheduler.output import ModelRunnerOutput, ScheduledRequest, SchedulerOutput
from loraplex.engine.scheduler.request_queue import WaitingQueue, priority_key

# How many steps a request may be passed over because the adapter cap is reached before
# admission stops for everyone behind it (bounds its wait; see schedule()).
LORA_MAX_SKIP_STEPS = 8


class Scheduler:
    def __init__(self, config: SchedulerConfig, kv_cache_manager: KVCacheManager,
                 max_model_len: int, max_loras: int | None = None,
                 on_finish: Callable[[Request], None] | None = None) -> None:
        self.config = config
        self.kv_cache_manager = kv_cache_manager
        self.max_model_len = max_model_len
        # Distinct adapters allowed among running requests (the GPU slots), None = no LoRA.
        self.max_loras = max_loras
        self.on_finish = on_finish
        self.waiting = WaitingQueue(config.scheduling_policy)
        self.running: list[Request] = []
        self.requests: dict[str, Request] = {}
        self._finished_request_ids: set[str] = set()
        self.num_preemptions = 0

    # ---- requests in and out -------------------------------------------------------------

    def add_request(self, request: Request) -> None:
        """Queue a request; raise if it can never be served (instead of waiting forever)."""
        if request.num_prompt_tokens == 0:
            raise InvalidRequestError("prompt", "must not be empty")
        if request.num_tokens >= self.max_model_len:
            raise RequestTooLongError(
                "prompt",
                f"the prompt has {request.num_prompt_tokens} tokens; this model's context holds "
                f"{self.max_model_len} (prompt plus at least one generated token)",
            )
        assert request.request_id not in self.requests, f"duplicate id {request.request_id}"
        request.status = RequestStatus.WAITING
        self.requests[request.request_id] = request
        self.waiting.add(request)

    def finish_requests(self, request_ids: list[str], status: RequestStatus) -> None:
        """End requests (abort, stop string, error) and free their blocks at once."""
        assert status.is_finished
        for request_id in request_ids:
            request = self.requests.get(request_id)
            if request is None:
                continue
            if request.status == RequestStatus.RUNNING:
                self.running.remove(request)
            else:
                self.waiting.remove(request)
            request.status = status
            self._free_request(request)

    def has_unfinished_requests(self) -> bool:
        return bool(self.requests)

    @property
    def num_waiting_tokens(self) -> int:
        return sum(r.num_tokens - r.num_computed_tokens for r in self.waiting)

    # ---- one step ------------------------------------------------------------------------

    def schedule(self) -> SchedulerOutput:
        budget = self.config.max_num_batched_tokens
        scheduled: dict[str, ScheduledRequest] = {}
        preempted = False

        for request in list(self.running):
            if request.status != RequestStatus.RUNNING:
                continue  # preempted earlier in this loop
            num_new = min(request.num_tokens - request.num_computed_tokens, budget)
            if num_new <= 0:
                break
            while not self.kv_cache_manager.allocate_slots(request, num_new):
                victim = self._pick_victim()
                dropped = scheduled.pop(victim.request_id, None)
                if dropped is not None:
                    budget += dropped.num_new_tokens
                self._preempt(victim)
                preempted = True
                if victim is request:
                    break
            else:
                scheduled[request.request_id] = self._scheduled(request, num_new)
                budget -= num_new

        # Admit waiting requests only in a step without preemption: blocks are short otherwise.
        if not preempted:
            running_loras = {r.lora_int_id for r in self.running if r.lora_int_id}
            for request in self.waiting:
                if len(self.running) >= self.config.max_num_seqs or budget <= 0:
                    break
                if not self._lora_fits(request, running_loras):
                    # Skip ahead while the step's adapters are all taken, but only for a
                    # bounded number of steps: then admission stops until its adapter fits,
                    # so running adapters drain and it gets a slot.
                    request.num_lora_wait_steps += 1
                    if request.num_lora_wait_steps > LORA_MAX_SKIP_STEPS:
                        break
                    continue
                computed_blocks, num_cached = [], 0
                if request.num_computed_tokens == 0:
                    computed_blocks, num_cached = self.kv_cache_manager.get_computed_blocks(request)
                num_new = min(request.num_tokens - request.num_computed_tokens - num_cached, budget)
                if not self.kv_cache_manager.allocate_slots(request, num_new, computed_blocks):
                    break  # no skipping ahead: the queue head must not starve
                request.num_computed_tokens += num_cached
                if request.lora_int_id:
                    running_loras.add(request.lora_int_id)
                self.waiting.remove(request)
                self.running.append(request)
                request.status = RequestStatus.RUNNING
                scheduled[request.request_id] = self._scheduled(request, num_new)
                budget -= num_new

        output = SchedulerOutput(
            scheduled=list(scheduled.values()),
            finished_request_ids=self._finished_request_ids,
        )
        self._finished_request_ids = set()
        return output

    def update_from_output(self, scheduler_output: SchedulerOutput,
                           runner_output: ModelRunnerOutput) -> list[Request]:
        """Advance computed tokens, append sampled tokens, finish requests that stop.

        Returns the requests that got a new token (finished or not).
        """
        updated = []
        for item in scheduler_output.scheduled:
            request = item.request
            sampled = item.needs_sample
            request.num_computed_tokens += item.num_new_tokens
            if not sampled:
                continue
            token_id = runner_output.sampled_token_ids[request.request_id]
            request.output_token_ids.append(token_id)
            status = self._check_stop(request, token_id)
            if status is not None:
                self.running.remove(request)
                request.status = status
                self._free_request(request)
            updated.append(request)
        return updated

    # ---- internals -----------------------------------------------------------------------

    def _scheduled(self, request: Request, num_new: int) -> ScheduledRequest:
        block_ids = self.kv_cache_manager.get_block_ids(request.request_id)
        return ScheduledRequest(request, num_new, block_ids)

    def _lora_fits(self, request: Request, running_loras: set[int]) -> bool:
        if self.max_loras is None or not request.lora_int_id:
            return True
        return request.lora_int_id in running_loras or len(running_loras) < self.max_loras

    def _pick_victim(self) -> Request:
        """The least urgent, most recent running request (vLLM's order)."""
        if self.config.scheduling_policy == "priority":
            return max(self.running, key=priority_key)
        return self.running[-1]

    def _preempt(self, request: Request) -> None:
        self.running.remove(request)
        self.kv_cache_manager.free(request)
        request.num_computed_tokens = 0
        request.num_preemptions += 1
        request.status = RequestStatus.PREEMPTED
        self.num_preemptions += 1
        self.waiting.add_front(request)

    def _check_stop(self, request: Request, token_id: int) -> RequestStatus | None:
        params = request.sampling_params
        if request.num_output_tokens >= params.min_tokens:
            if not params.ignore_eos and token_id in request.eos_token_ids:
                return RequestStatus.FINISHED_STOPPED
            if token_id in params.stop_token_ids:
                return RequestStatus.FINISHED_STOPPED
        if request.num_output_tokens >= params.max_tokens:
            return RequestStatus.FINISHED_LENGTH
        if request.num_tokens >= self.max_model_len:
            return RequestStatus.FINISHED_LENGTH
        return None

    def _free_request(self, request: Request) -> None:
        self.kv_cache_manager.free(request)
        del self.requests[request.request_id]
        self._finished_request_ids.add(request.request_id)
        if self.on_finish is not None:
            self.on_finish(request)
