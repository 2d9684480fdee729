"""Scheduler behaviour with exact block ids, driven by hand-made runner outputs (no model)."""

from __future__ import annotations

import pytest

from loraplex.engine.config import SchedulerConfig
from loraplex.engine.errors import InvalidParameterError, RequestTooLongError
from loraplex.engine.kv_cache import KVCacheManager
from loraplex.engine.request import (
    LoRARequest,
    Request,
    RequestStatus,
    SamplingParams,
)
from loraplex.engine.scheduler import ModelRunnerOutput, Scheduler
from loraplex.engine.scheduler.scheduler import LORA_MAX_SKIP_STEPS


def make_scheduler(
    num_blocks=16,
    block_size=4,
    max_num_seqs=8,
    max_num_batched_tokens=64,
    max_model_len=64,
    policy="fcfs",
) -> Scheduler:
    kv = KVCacheManager(num_blocks, block_size)
    config = SchedulerConfig(
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens,
        scheduling_policy=policy,
        preemption_mode="recompute",
    )
    return Scheduler(config, kv, max_model_len)


def make_request(request_id: str, num_prompt: int, max_tokens: int = 4, **kwargs) -> Request:
    return Request(
        request_id,
        list(range(1, num_prompt + 1)),
        SamplingParams(max_tokens=max_tokens, temperature=0.0),
        **kwargs,
    )


def run_step(scheduler: Scheduler, token: int = 7):
    out = scheduler.schedule()
    runner_out = ModelRunnerOutput(
        sampled_token_ids={s.request.request_id: token for s in out.scheduled if s.needs_sample}
    )
    updated = scheduler.update_from_output(out, runner_out)
    scheduler.kv_cache_manager.check_integrity()
    return out, updated


def test_prefill_then_decode_with_exact_blocks():
    s = make_scheduler()
    s.add_request(make_request("a", 6))
    out, _ = run_step(s)
    [item] = out.scheduled
    assert item.num_new_tokens == 6 and item.block_ids == [0, 1]
    out, _ = run_step(s)
    assert [x.num_new_tokens for x in out.scheduled] == [1]
    assert out.scheduled[0].block_ids == [0, 1]


def test_chunked_prefill_respects_token_budget():
    s = make_scheduler(max_num_batched_tokens=5)
    s.add_request(make_request("a", 12))
    sizes = []
    for _ in range(3):
        out, updated = run_step(s)
        sizes.append(out.scheduled[0].num_new_tokens)
    assert sizes == [5, 5, 2]
    assert s.requests["a"].output_token_ids == [7]  # sampled only once the prompt is done


def test_running_decodes_and_new_prefill_share_the_budget():
    s = make_scheduler(max_num_batched_tokens=8)
    s.add_request(make_request("a", 4))
    run_step(s)
    s.add_request(make_request("b", 20))
    out, _ = run_step(s)
    assert [(x.request.request_id, x.num_new_tokens) for x in out.scheduled] == [("a", 1), ("b", 7)]


def test_max_num_seqs_caps_running():
    s = make_scheduler(max_num_seqs=2)
    for rid in "abc":
        s.add_request(make_request(rid, 2))
    out, _ = run_step(s)
    assert [x.request.request_id for x in out.scheduled] == ["a", "b"]
    assert len(s.waiting) == 1


def test_finish_by_length_frees_blocks():
    s = make_scheduler()
    s.add_request(make_request("a", 3, max_tokens=2))
    run_step(s)
    _, updated = run_step(s)
    assert updated[0].status == RequestStatus.FINISHED_LENGTH
    assert updated[0].output_token_ids == [7, 7]
    assert s.kv_cache_manager.num_free_blocks == 16 and not s.has_unfinished_requests()


def test_eos_and_stop_token_ids_finish():
    s = make_scheduler()
    s.add_request(make_request("a", 3, eos_token_ids=frozenset({7})))
    _, updated = run_step(s)
    assert updated[0].status == RequestStatus.FINISHED_STOPPED


def test_preemption_by_recompute_when_blocks_run_out():
    # 4 blocks of 2 tokens. Two requests of 3 prompt tokens take 2 blocks each; the first
    # decode that crosses a block boundary needs a fifth block -> the newest is preempted.
    s = make_scheduler(num_blocks=4, block_size=2, max_model_len=8)
    s.add_request(make_request("a", 3, max_tokens=4))
    s.add_request(make_request("b", 3, max_tokens=4))
    out, _ = run_step(s)
    assert [x.block_ids for x in out.scheduled] == [[0, 1], [2, 3]]
    out, _ = run_step(s)  # a's 4th token: fits block 1; b likewise fits block 3
    assert [x.num_new_tokens for x in out.scheduled] == [1, 1]
    out, _ = run_step(s)  # a needs a 3rd block: b is preempted, its blocks go to a
    assert [x.request.request_id for x in out.scheduled] == ["a"]
    b = s.requests["b"]
    assert b.status == RequestStatus.PREEMPTED and b.num_computed_tokens == 0
    assert out.scheduled[0].block_ids == [0, 1, 3]
    assert s.num_preemptions == 1
    while s.has_unfinished_requests():
        run_step(s)
    assert s.kv_cache_manager.num_free_blocks == 4


def test_request_that_can_never_fit_is_rejected_at_once():
    s = make_scheduler(max_model_len=8)
    with pytest.raises(RequestTooLongError):
        s.add_request(make_request("a", 8))
    with pytest.raises(InvalidParameterError):
        s.add_request(make_request("b", 0))
    assert not s.has_unfinished_requests()


def test_generation_stops_at_the_context_limit():
    s = make_scheduler(max_model_len=6)
    s.add_request(make_request("a", 4, max_tokens=100))
    while s.has_unfinished_requests():
        _, updated = run_step(s)
    assert updated[0].status == RequestStatus.FINISHED_LENGTH
    assert updated[0].num_tokens == 6


def test_abort_frees_everything_and_is_reported_to_the_runner():
    s = make_scheduler()
    s.add_request(make_request("a", 6))
    s.add_request(make_request("b", 6))
    run_step(s)
    s.finish_requests(["a", "b"], RequestStatus.FINISHED_ABORTED)
    assert s.kv_cache_manager.num_free_blocks == 16
    out = s.schedule()
    assert out.is_empty and out.finished_request_ids == {"a", "b"}


def test_priority_policy_admits_urgent_first():
    s = make_scheduler(max_num_seqs=1, policy="priority")
    s.add_request(make_request("batch", 2, priority=2))
    s.add_request(make_request("urgent", 2, priority=0))
    out, _ = run_step(s)
    assert [x.request.request_id for x in out.scheduled] == ["urgent"]


def lora(i: int) -> LoRARequest:
    return LoRARequest(f"a{i}", i, f"/adapters/{i}", content_hash=f"h{i}")


def test_adapter_cap_per_step_and_bounded_wait():
    kv = KVCacheManager(256, 4)
    config = SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=256, scheduling_policy="fcfs")
    s = Scheduler(config, kv, max_model_len=256, max_loras=2)

    # Adapters 1 and 2 take both slots with long requests; adapter 3 waits behind a stream of
    # new adapter-1/2 requests that could otherwise keep jumping ahead of it forever.
    s.add_request(make_request("a1", 2, max_tokens=100, lora_request=lora(1)))
    s.add_request(make_request("a2", 2, max_tokens=100, lora_request=lora(2)))
    s.add_request(make_request("starved", 2, max_tokens=4, lora_request=lora(3)))
    started = None
    for step in range(200):
        s.add_request(make_request(f"more{step}", 2, max_tokens=3, lora_request=lora(1 + step % 2)))
        out, _ = run_step(s)
        loras = {x.request.lora_int_id for x in out.scheduled}
        assert len(loras - {0}) <= 2, "never more distinct adapters than slots in a step"
        if any(x.request.request_id == "starved" for x in out.scheduled):
            started = step
            break
    assert started is not None
    # Bounded: the skip budget, then the longest running request's remaining tokens.
    assert started <= LORA_MAX_SKIP_STEPS + 100


class FakeGate:
    """The LoRA manager's side of the scheduler, as sets: adapters ready, adapters loading."""

    def __init__(self) -> None:
        self.ready: set[int] = set()
        self.loading: set[int] = set()
        self.pins: dict[int, int] = {}

    def is_ready(self, request: Request) -> bool:
        return not request.lora_int_id or request.lora_int_id in self.ready

    def is_loading(self, request: Request) -> bool:
        return request.lora_int_id in self.loading

    def on_scheduled(self, request: Request) -> None:
        assert self.is_ready(request)
        if request.lora_int_id:
            self.pins[request.lora_int_id] = self.pins.get(request.lora_int_id, 0) + 1

    def on_descheduled(self, request: Request) -> None:
        if request.lora_int_id:
            self.pins[request.lora_int_id] -= 1


def make_gated_scheduler(gate: FakeGate, num_blocks: int = 64) -> Scheduler:
    config = SchedulerConfig(
        max_num_seqs=8, max_num_batched_tokens=256, scheduling_policy="fcfs",
        preemption_mode="recompute",
    )  # fmt: skip
    return Scheduler(config, KVCacheManager(num_blocks, 4), max_model_len=64, adapter_gate=gate)


def test_requests_whose_adapter_is_not_ready_let_others_go_first():
    gate = FakeGate()
    gate.ready = {2}
    gate.loading = {1}
    s = make_gated_scheduler(gate)
    s.add_request(make_request("cold", 3, lora_request=lora(1)))
    s.add_request(make_request("warm", 3, lora_request=lora(2)))
    s.add_request(make_request("base", 3))
    for _ in range(LORA_MAX_SKIP_STEPS + 5):  # loading: passed over without limit
        out, _ = run_step(s)
        assert "cold" not in {x.request.request_id for x in out.scheduled}
    assert s.requests["cold"].num_lora_wait_steps == 0
    assert gate.pins == {2: 0} and not s.requests.get("warm")
    gate.ready.add(1)
    out, _ = run_step(s)
    assert [x.request.request_id for x in out.scheduled] == ["cold"] and gate.pins[1] == 1
    assert s.num_adapter_waits == 1 and s.adapter_wait_seconds > 0
    while s.has_unfinished_requests():
        run_step(s)
    assert gate.pins == {1: 0, 2: 0}


def test_a_stuck_adapter_stops_admission_behind_it_after_the_skip_bound():
    gate = FakeGate()
    gate.ready = {2}  # adapter 1 neither ready nor loading: no room for it
    s = make_gated_scheduler(gate)
    s.add_request(make_request("stuck", 3, lora_request=lora(1)))
    admitted = []
    for step in range(LORA_MAX_SKIP_STEPS + 3):
        s.add_request(make_request(f"w{step}", 3, max_tokens=50, lora_request=lora(2)))
        out, _ = run_step(s)
        admitted.append(any(x.num_new_tokens == 3 for x in out.scheduled))
    assert admitted[:LORA_MAX_SKIP_STEPS] == [True] * LORA_MAX_SKIP_STEPS
    assert admitted[LORA_MAX_SKIP_STEPS:] == [False] * 3  # nobody jumps the stuck request now
    assert s.requests["stuck"].num_lora_wait_steps > LORA_MAX_SKIP_STEPS


def test_preemption_and_abort_release_adapter_pins():
    gate = FakeGate()
    gate.ready = {1, 2}
    s = make_gated_scheduler(gate, num_blocks=4)  # 16 tokens of KV
    s.add_request(make_request("a", 6, max_tokens=20, lora_request=lora(1)))
    s.add_request(make_request("b", 6, max_tokens=20, lora_request=lora(2)))
    run_step(s)
    assert gate.pins == {1: 1, 2: 1}
    for _ in range(3):  # a needs a third block: b is preempted (recompute)
        run_step(s)
    assert s.requests["b"].status == RequestStatus.PREEMPTED and gate.pins == {1: 1, 2: 0}
    s.finish_requests(["a", "b"], RequestStatus.FINISHED_ABORTED)
    assert gate.pins == {1: 0, 2: 0}


def test_urgent_request_joins_between_prefill_chunks_without_preemption():
    """A long, less urgent prefill leaves an urgent newcomer its share of the next step; the
    prefill goes on in the same step with the rest and is never preempted."""
    s = make_scheduler(num_blocks=32, max_num_batched_tokens=8, policy="priority")
    s.add_request(make_request("long", 40, priority=1))
    out, _ = run_step(s)
    assert [(x.request.request_id, x.num_new_tokens) for x in out.scheduled] == [("long", 8)]
    s.add_request(make_request("urgent", 3, priority=0))
    out, _ = run_step(s)
    assert [(x.request.request_id, x.num_new_tokens) for x in out.scheduled] == [
        ("long", 5),
        ("urgent", 3),
    ]
    out, _ = run_step(s)  # the urgent one decodes beside the next chunk
    assert [(x.request.request_id, x.num_new_tokens) for x in out.scheduled] == [
        ("urgent", 1),
        ("long", 7),
    ]
    assert s.num_preemptions == 0 and s.requests["long"].num_computed_tokens == 20


def test_equally_urgent_newcomer_waits_for_the_running_prefill():
    s = make_scheduler(num_blocks=32, max_num_batched_tokens=8, policy="priority")
    s.add_request(make_request("long", 40, priority=1))
    run_step(s)
    s.add_request(make_request("same", 3, priority=1))
    out, _ = run_step(s)
    assert [(x.request.request_id, x.num_new_tokens) for x in out.scheduled] == [("long", 8)]
