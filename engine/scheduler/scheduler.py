"""Continuous batching at iteration level, with chunked prefill under a token budget.

Each step hands out `max_num_batched_tokens` tokens: first to running requests (a decode
needs 1, an unfinished prefill its next chunk; most urgent first under the priority policy),
then to waiting ones in queue order, up to `max_num_seqs` running. Under the priority policy a
running prefill's chunk leaves room for waiting requests more urgent than it, so an urgent
request starts at the next step boundary instead of waiting out a long prompt.

Preemption frees room for others: when a running request has no blocks for its next tokens,
or (priority policy) a waiting request is more urgent than a running one that blocks it, the
least urgent, most recent running request is preempted. `swap` copies its KV to CPU swap space
and keeps its progress; `recompute` (also the fallback when swap space is short) frees its
blocks and re-prefills it later, output tokens included. Either way its output is unchanged.

Async scheduling: the engine may schedule step N+1 before step N's sampled tokens are back.
Scheduling advances `num_computed_tokens` at once and counts each token a step will sample as
a placeholder (`num_output_placeholders`), so the next step continues after it; the model
runner feeds that token to the next step on the device. A request that reached its length
limit with its placeholders is not scheduled again; one that stops on a token (EOS, a stop id
or string) or is aborted while a step for it runs has that step's token dropped.

Adapters: a request joins a step only once its adapter is ready on the GPU (`AdapterGate`, the
LoRA manager), and at most `max_loras` distinct adapters run at once if that cap is set. A
request whose adapter is not ready is passed over, so requests behind it with resident adapters
go first; while its adapter is loading that costs nothing, but a request passed over for
`LORA_MAX_SKIP_STEPS` steps without progress (no room for its adapter) stops admission behind
it until running requests drain and its adapter gets in: nobody starves.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from loraplex.engine.config import SchedulerConfig
from loraplex.engine.errors import InvalidParameterError, RequestTooLongError
from loraplex.engine.kv_cache import KVCacheBlock, KVCacheManager
from loraplex.engine.kv_cache.kv_cache_manager import cdiv
from loraplex.engine.request import Request, RequestStatus
from loraplex.engine.scheduler.adapter_gate import AdapterGate
from loraplex.engine.scheduler.fairness import VirtualTokenCounter
from loraplex.engine.scheduler.output import ModelRunnerOutput, ScheduledRequest, SchedulerOutput
from loraplex.engine.scheduler.request_queue import WaitingQueue, priority_key
from loraplex.engine.scheduler.stop_checks import check_stop, reaches_length_limit

# How many steps a request may be passed over, with its adapter not loading, before admission
# stops for everyone behind it (bounds its wait; see the module docstring).
LORA_MAX_SKIP_STEPS = 8


@dataclass
class _Step:
    """The step being built."""

    budget: int
    scheduled: dict[str, ScheduledRequest] = field(default_factory=dict)
    preempted: list[Request] = field(default_factory=list)
    swap_out: list[tuple[int, int]] = field(default_factory=list)
    swap_in: list[tuple[int, int]] = field(default_factory=list)


class Scheduler:
    def __init__(
        self,
        config: SchedulerConfig,
        kv_cache_manager: KVCacheManager,
        max_model_len: int,
        max_loras: int | None = None,
        adapter_gate: AdapterGate | None = None,
        on_finish: Callable[[Request], None] | None = None,
    ) -> None:
        self.config = config
        self.kv_cache_manager = kv_cache_manager
        self.max_model_len = max_model_len
        # Distinct adapters allowed among running requests; None = no cap.
        self.max_loras = max_loras
        self.adapter_gate = adapter_gate
        self.on_finish = on_finish
        self.fairness = VirtualTokenCounter()
        self.waiting = WaitingQueue(config.scheduling_policy, self.fairness)
        self.running: list[Request] = []
        self.requests: dict[str, Request] = {}
        self._finished_request_ids: set[str] = set()
        self.num_swap_preemptions = 0
        self.num_recompute_preemptions = 0
        # Admissions that had waited for their adapter (or the per-step adapter cap), and how
        # long those waits took in all.
        self.num_adapter_waits = 0
        self.adapter_wait_seconds = 0.0

    @property
    def is_priority(self) -> bool:
        return self.config.scheduling_policy == "priority"

    # ---- requests in and out -------------------------------------------------------------

    def add_request(self, request: Request) -> None:
        """Queue a request; raise if it can never be served (instead of waiting forever)."""
        if request.num_prompt_tokens == 0:
            raise InvalidParameterError("must not be empty", param="prompt")
        if request.num_tokens >= self.max_model_len:
            raise RequestTooLongError(
                f"the prompt has {request.num_prompt_tokens} tokens; this model's context holds "
                f"{self.max_model_len} (prompt plus at least one generated token)",
                param="prompt",
            )
        assert request.request_id not in self.requests, f"duplicate id {request.request_id}"
        request.status = RequestStatus.WAITING
        self.requests[request.request_id] = request
        self.fairness.on_add(request.fairness_key)
        self.waiting.add(request)

    def finish_requests(self, request_ids: list[str], status: RequestStatus) -> None:
        """End requests (abort, stop string, error) and free their blocks at once."""
        assert status.is_finished
        for request_id in request_ids:
            request = self.requests.get(request_id)
            if request is not None:
                self._finish(request, status)

    def has_unfinished_requests(self) -> bool:
        return bool(self.requests)

    @property
    def num_waiting_tokens(self) -> int:
        return sum(r.num_tokens - r.num_computed_tokens for r in self.waiting)

    @property
    def num_preemptions(self) -> int:
        return self.num_swap_preemptions + self.num_recompute_preemptions

    @property
    def num_swapped(self) -> int:
        return sum(1 for r in self.waiting if r.status == RequestStatus.SWAPPED)

    # ---- one step ------------------------------------------------------------------------

    def schedule(self) -> SchedulerOutput:
        step = _Step(budget=self.config.max_num_batched_tokens)
        running = sorted(self.running, key=priority_key) if self.is_priority else self.running
        for request in list(running):
            if request.status != RequestStatus.RUNNING:
                continue  # preempted earlier in this loop
            if step.budget <= 0:
                break
            if reaches_length_limit(request, self.max_model_len):
                continue  # the step in flight samples its last token
            remaining = request.num_tokens_with_placeholders - request.num_computed_tokens
            num_new = min(remaining, step.budget - self._left_for_urgent(request, step.budget))
            if num_new <= 0:
                continue  # its prefill waits a step for more urgent requests
            while not self.kv_cache_manager.allocate_slots(request, num_new):
                victim = self._pick_victim()
                self._preempt(victim, step)
                if victim is request:
                    break
            else:
                self._add_to_step(request, num_new, step)

        self.waiting.sort()
        running_loras = {r.lora_int_id for r in self.running if r.lora_int_id}
        for request in self.waiting:
            if step.preempted and not self._outranks(request, step.preempted):
                break  # blocks are short: only a more urgent request may take them
            if request.num_output_placeholders:
                continue  # preempted this step while its last step runs: next step
            if not self._fork_parent_ready(request):
                continue  # waits for its sibling's prefill, without holding up others
            if not self._adapter_fits(request, running_loras):
                if request.adapter_wait_start is None:
                    request.adapter_wait_start = time.monotonic()
                # Requests behind it go first; a bounded number of steps only, unless its
                # adapter is on its way (see the module docstring).
                if self.adapter_gate is None or not self.adapter_gate.is_loading(request):
                    request.num_lora_wait_steps += 1
                if request.num_lora_wait_steps > LORA_MAX_SKIP_STEPS:
                    break
                continue
            if not self._admit(request, step):
                break  # no skipping ahead: the queue head must not starve
            if request.lora_int_id:
                running_loras.add(request.lora_int_id)

        for item in step.scheduled.values():
            request = item.request
            request.num_computed_tokens += item.num_new_tokens
            request.num_output_placeholders += item.needs_sample
            self.fairness.charge(request.fairness_key, item.num_new_tokens)
        output = SchedulerOutput(
            scheduled=list(step.scheduled.values()),
            finished_request_ids=self._finished_request_ids,
            blocks_to_swap_out=step.swap_out,
            blocks_to_swap_in=step.swap_in,
            blocks_to_copy=self.kv_cache_manager.take_pending_copies(),
        )
        self._finished_request_ids = set()
        return output

    def update_from_output(
        self, scheduler_output: SchedulerOutput, runner_output: ModelRunnerOutput
    ) -> list[Request]:
        """Append the step's sampled tokens and finish the requests that stop.

        Returns the requests that got a new token (finished or not). A request that ended
        while the step ran (aborted, stopped by the step before) has its token dropped.
        """
        updated = []
        for item in scheduler_output.scheduled:
            if not item.needs_sample:
                continue
            request = item.request
            request.num_output_placeholders -= 1
            if request.is_finished:
                continue
            token_id = runner_output.sampled_token_ids[request.request_id]
            request.output_token_ids.append(token_id)
            status = check_stop(request, token_id, self.max_model_len)
            if status is not None:
                self._finish(request, status)
            updated.append(request)
        return updated

    # ---- admission and preemption --------------------------------------------------------

    def _admit(self, request: Request, step: _Step) -> bool:
        """Move a waiting request into the step, preempting less urgent ones if allowed."""
        while not self._try_admit(request, step):
            victim = self._victim_for(request) if self.is_priority else None
            if victim is None:
                return False
            self._preempt(victim, step)
        return True

    def _try_admit(self, request: Request, step: _Step) -> bool:
        if len(self.running) >= self.config.max_num_seqs or step.budget <= 0:
            return False
        gate = self.adapter_gate
        if gate is not None:
            # Pinned first: making room for the request (KVCacheManager.reclaim) must never
            # evict its own adapter.
            gate.on_scheduled(request)
        num_new = self._allocate_for_admission(request, step)
        if num_new is None:
            if gate is not None:
                gate.on_descheduled(request)
            return False
        self.waiting.remove(request)
        self.running.append(request)
        request.status = RequestStatus.RUNNING
        if request.adapter_wait_start is not None:
            self.adapter_wait_seconds += time.monotonic() - request.adapter_wait_start
            self.num_adapter_waits += 1
            request.adapter_wait_start = None
        self._add_to_step(request, num_new, step)
        return True

    def _allocate_for_admission(self, request: Request, step: _Step) -> int | None:
        """Blocks (and swap-ins) for a waiting request's first tokens of this step: how many
        tokens it computes, or None, changing nothing, when blocks are short."""
        kv = self.kv_cache_manager
        if request.fork_parent_id is not None:
            kv.fork(self.requests[request.fork_parent_id], request)
            if not kv.allocate_slots(request, 1):
                kv.free(request)
                request.num_computed_tokens = 0
                return None
            return 1
        if request.status == RequestStatus.SWAPPED:
            num_new = min(request.num_tokens - request.num_computed_tokens, step.budget)
            blocks_needed = cdiv(request.num_computed_tokens + num_new, kv.block_size)
            if not kv.has_free_blocks(blocks_needed):
                return None
            swap_in = kv.swap_in(request)
            assert swap_in is not None
            step.swap_in.extend(swap_in)
            allocated = kv.allocate_slots(request, num_new)
            assert allocated, "the free blocks counted above must cover the swap-in"
            return num_new
        computed_blocks: list[KVCacheBlock] = []
        num_cached = 0
        if request.num_computed_tokens == 0:
            computed_blocks, num_cached = kv.get_computed_blocks(request)
        num_new = min(request.num_tokens - request.num_computed_tokens - num_cached, step.budget)
        if not kv.allocate_slots(request, num_new, computed_blocks):
            return None
        request.num_computed_tokens += num_cached
        if request.num_preemptions == 0 and kv.enable_caching:
            request.num_cached_tokens = num_cached
            kv.record_prefix_lookup(request.num_tokens, num_cached)
        return num_new

    def _left_for_urgent(self, request: Request, budget: int) -> int:
        """Priority admission between chunks: the part of the step a running request's next
        prefill chunk leaves to waiting requests more urgent than it that could start now, so
        they join this step without preempting it. Decodes (one token) leave nothing."""
        if not self.is_priority or request.num_tokens - request.num_computed_tokens <= 1:
            return 0
        gate = self.adapter_gate
        urgent = sum(
            waiting.num_tokens - waiting.num_computed_tokens
            for waiting in self.waiting
            if waiting.priority < request.priority and (gate is None or gate.is_ready(waiting))
        )
        return min(urgent, budget)

    def _fork_parent_ready(self, request: Request) -> bool:
        """n > 1: a sibling shares the first one's prompt blocks once they are computed."""
        if request.fork_parent_id is None:
            return True
        parent = self.requests.get(request.fork_parent_id)
        if parent is None or parent.status != RequestStatus.RUNNING or request.num_preemptions:
            request.fork_parent_id = None  # the parent is gone or evicted: prefill alone
            return True
        return parent.num_computed_tokens >= parent.num_prompt_tokens

    def _add_to_step(self, request: Request, num_new: int, step: _Step) -> None:
        block_ids = self.kv_cache_manager.get_block_ids(request.request_id)
        start = request.num_computed_tokens
        needs_sample = start + num_new == request.num_tokens_with_placeholders
        step.scheduled[request.request_id] = ScheduledRequest(
            request, num_new, block_ids, start, needs_sample
        )
        step.budget -= num_new

    def _pick_victim(self) -> Request:
        """The least urgent, most recent running request (vLLM's order)."""
        if self.is_priority:
            return max(self.running, key=priority_key)
        return self.running[-1]

    def _victim_for(self, request: Request) -> Request | None:
        """A running request strictly less urgent than `request`, the least urgent first."""
        candidates = [r for r in self.running if r.priority > request.priority]
        return max(candidates, key=priority_key) if candidates else None

    @staticmethod
    def _outranks(request: Request, preempted: list[Request]) -> bool:
        return request not in preempted and all(request.priority < p.priority for p in preempted)

    def _preempt(self, request: Request, step: _Step) -> None:
        dropped = step.scheduled.pop(request.request_id, None)
        if dropped is not None:
            step.budget += dropped.num_new_tokens
        self._stop_running(request)
        kv = self.kv_cache_manager
        swap_out = kv.swap_out(request) if self.config.preemption_mode == "swap" else None
        if swap_out is not None:
            step.swap_out.extend(swap_out)
            request.status = RequestStatus.SWAPPED
            self.num_swap_preemptions += 1
        else:
            kv.free(request)
            request.num_computed_tokens = 0
            request.status = RequestStatus.PREEMPTED
            self.num_recompute_preemptions += 1
        request.num_preemptions += 1
        step.preempted.append(request)
        self.waiting.add_front(request)

    def _adapter_fits(self, request: Request, running_loras: set[int]) -> bool:
        if not request.lora_int_id:
            return True
        if self.adapter_gate is not None and not self.adapter_gate.is_ready(request):
            return False
        if self.max_loras is None:
            return True
        return request.lora_int_id in running_loras or len(running_loras) < self.max_loras

    def _stop_running(self, request: Request) -> None:
        self.running.remove(request)
        if self.adapter_gate is not None:
            self.adapter_gate.on_descheduled(request)

    # ---- endings -------------------------------------------------------------------------

    def _finish(self, request: Request, status: RequestStatus) -> None:
        assert status.is_finished
        if request.status == RequestStatus.RUNNING:
            self._stop_running(request)
        else:
            self.waiting.remove(request)
        request.status = status
        self._free_request(request)

    def _free_request(self, request: Request) -> None:
        self.kv_cache_manager.free(request)
        del self.requests[request.request_id]
        self.fairness.on_finish(request.fairness_key)
        self._finished_request_ids.add(request.request_id)
        if self.on_finish is not None:
            self.on_finish(request)
