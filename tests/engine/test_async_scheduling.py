"""Async scheduling: step N+1 is scheduled and launched before step N's tokens reach the host.

The scheduler counts the tokens in flight as placeholders (exact positions and block ids
below), the runner feeds them to the next step on the device, and a request that stops while
a step for it runs has that step's token dropped. Outputs are the synchronous engine's, token
for token, whatever stops, samples, preempts or shares blocks.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch

from loraplex.engine import LLM, SamplingParams
from loraplex.engine.request import RequestOutput, RequestStatus
from loraplex.engine.runner.input_batch import prepare_inputs
from loraplex.engine.runner.model_runner import PendingOutput
from loraplex.engine.scheduler import ModelRunnerOutput
from loraplex.engine.scheduler.output import SchedulerOutput
from tests.engine.test_scheduler import make_request, make_scheduler


def sampled(out: SchedulerOutput, token: int = 7) -> ModelRunnerOutput:
    return ModelRunnerOutput(
        sampled_token_ids={s.request.request_id: token for s in out.scheduled if s.needs_sample}
    )


def test_the_next_step_continues_after_the_token_in_flight() -> None:
    s = make_scheduler(block_size=4)
    s.add_request(make_request("a", 6, max_tokens=4))
    first = s.schedule()  # prefill: positions 0-5
    [item] = first.scheduled
    assert (item.start_position, item.num_new_tokens, item.needs_sample) == (0, 6, True)
    request = item.request
    assert (request.num_computed_tokens, request.num_output_placeholders) == (6, 1)

    second = s.schedule()  # before the first step's token is known: position 6
    [item] = second.scheduled
    assert (item.start_position, item.num_new_tokens, item.needs_sample) == (6, 1, True)
    assert item.block_ids == [0, 1]
    assert (request.num_computed_tokens, request.num_output_placeholders) == (7, 2)
    # Its input token is the one in flight: the runner fills row 0 in from the last step.
    inputs = prepare_inputs(second.scheduled, 4, torch.device("cpu"))
    assert inputs.placeholder_rows == [0] and inputs.placeholder_request_ids == ["a"]
    assert inputs.positions.tolist() == [6]
    assert inputs.attn.slot_mapping.tolist() == [1 * 4 + 2]

    assert s.update_from_output(first, sampled(first, 11)) == [request]
    assert request.output_token_ids == [11] and request.num_output_placeholders == 1
    third = s.schedule()  # position 7 fills block 1; the next token needs block 2
    assert [(i.start_position, i.block_ids) for i in third.scheduled] == [(7, [0, 1])]
    s.update_from_output(second, sampled(second, 12))
    fourth = s.schedule()
    assert [(i.start_position, i.block_ids) for i in fourth.scheduled] == [(8, [0, 1, 2])]
    s.kv_cache_manager.check_integrity()


def test_a_request_at_its_length_limit_is_not_scheduled_again() -> None:
    s = make_scheduler(block_size=4)
    s.add_request(make_request("a", 6, max_tokens=2))
    first = s.schedule()
    second = s.schedule()  # output 2 of 2 is sampled here
    assert len(second.scheduled) == 1
    assert s.schedule().is_empty  # both tokens are in flight: nothing more to compute
    s.update_from_output(first, sampled(first))
    assert s.schedule().is_empty
    [request] = s.update_from_output(second, sampled(second))
    assert request.status == RequestStatus.FINISHED_LENGTH
    assert request.output_token_ids == [7, 7]
    assert s.kv_cache_manager.num_free_blocks == 16


def test_a_stop_token_drops_the_token_of_the_step_in_flight() -> None:
    s = make_scheduler(block_size=4)
    s.add_request(make_request("a", 6, max_tokens=8, eos_token_ids=frozenset({9})))
    first = s.schedule()
    second = s.schedule()  # runs although the first step's token will stop the request
    [request] = s.update_from_output(first, sampled(first, 9))
    assert request.status == RequestStatus.FINISHED_STOPPED
    assert s.kv_cache_manager.num_free_blocks == 16  # freed at once
    assert s.update_from_output(second, sampled(second, 5)) == []  # dropped
    assert request.output_token_ids == [9] and request.num_output_placeholders == 0
    assert s.schedule().is_empty and not s.has_unfinished_requests()
    s.kv_cache_manager.check_integrity()


def test_an_abort_while_its_step_runs_drops_that_steps_token() -> None:
    s = make_scheduler(block_size=4)
    s.add_request(make_request("a", 6, max_tokens=8))
    first = s.schedule()
    s.finish_requests(["a"], RequestStatus.FINISHED_ABORTED)
    assert s.update_from_output(first, sampled(first)) == []
    assert first.scheduled[0].request.output_token_ids == []
    assert s.kv_cache_manager.num_free_blocks == 16


def test_a_request_preempted_while_its_step_runs_keeps_that_steps_token() -> None:
    # 5 blocks of 4: "a" (prompt 6) and "b" (prompt 7) fit, but not both past position 8.
    s = make_scheduler(num_blocks=5, block_size=4)
    s.add_request(make_request("a", 6, max_tokens=8))
    s.add_request(make_request("b", 7, max_tokens=8))
    step1 = s.schedule()  # prefills: a in blocks 0-1, b in blocks 2-3
    a, b = (item.request for item in step1.scheduled)
    step2 = s.schedule()  # a at 6, b at 7
    s.update_from_output(step1, sampled(step1))
    step3 = s.schedule()  # a at 7, b at 8 (takes block 4, the last)
    assert [i.block_ids for i in step3.scheduled] == [[0, 1], [2, 3, 4]]
    s.update_from_output(step2, sampled(step2))
    step4 = s.schedule()  # a at 8 needs a block: b, the most recent, is preempted
    assert [i.request.request_id for i in step4.scheduled] == ["a"]
    assert step4.scheduled[0].block_ids == [0, 1, 4]
    assert b.status == RequestStatus.PREEMPTED and b.num_computed_tokens == 0
    assert b.num_output_placeholders == 1  # step 3's token is still on its way
    s.update_from_output(step3, sampled(step3, 8))
    assert b.output_token_ids == [7, 7, 8] and b.num_output_placeholders == 0
    s.kv_cache_manager.check_integrity()
    # Recomputed later from prompt and all three outputs.
    s.finish_requests(["a"], RequestStatus.FINISHED_ABORTED)
    [resumed] = s.schedule().scheduled
    assert resumed.request is b and (resumed.start_position, resumed.num_new_tokens) == (0, 10)


# ---- the engine: async scheduling against the synchronous engine -------------------------

PROMPTS = [[5, 6, 7, 8, 9, 10, 11], [12, 13, 14], [15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25]]
GREEDY = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
CASES: dict[str, tuple[dict[str, Any], list[SamplingParams]]] = {
    "greedy": ({}, [GREEDY] * 3),
    "seeded-sampling-logprobs": (
        {},
        [
            SamplingParams(max_tokens=12, temperature=0.9, top_p=0.8, seed=3, logprobs=2),
            replace(GREEDY, logprobs=1),
            SamplingParams(max_tokens=9, temperature=1.0, top_k=5, seed=4),
        ],
    ),
    "penalties-and-min-tokens": (
        {},
        [
            replace(GREEDY, repetition_penalty=1.3, presence_penalty=0.5),
            SamplingParams(max_tokens=12, temperature=0.0, min_tokens=6),
            GREEDY,
        ],
    ),
    "n-2-prefix-caching": (
        {"enable_prefix_caching": True},
        [SamplingParams(max_tokens=10, temperature=0.8, seed=1, n=2), GREEDY, GREEDY],
    ),
    "chunked-prefill": ({"max_num_batched_tokens": 4}, [GREEDY] * 3),
    "preempt-recompute": (
        {"num_kv_blocks": 6, "block_size": 4, "preemption_mode": "recompute"},
        [GREEDY] * 3,
    ),
    "preempt-swap": (
        {"num_kv_blocks": 6, "block_size": 4, "preemption_mode": "swap"},
        [GREEDY] * 3,
    ),
}


def run(checkpoint: Path, engine_kwargs: dict[str, Any], params: list[SamplingParams],
        async_scheduling: bool) -> list[RequestOutput]:  # fmt: skip
    llm = LLM(str(checkpoint), device="cpu", dtype="float32", async_scheduling=async_scheduling,
              **engine_kwargs)  # fmt: skip
    outputs = llm.generate(PROMPTS, params)
    engine = llm.engine
    kv = engine.kv_cache_manager
    kv.check_integrity()
    assert kv.num_free_blocks == kv.num_blocks and not engine.has_unfinished_requests()
    return outputs


def summary(outputs: list[RequestOutput]) -> list[list[tuple[Any, ...]]]:
    return [
        [(c.token_ids, c.text, c.finish_reason, c.stop_reason, c.logprobs) for c in o.outputs]
        for o in outputs
    ]


@pytest.mark.parametrize("case", list(CASES))
def test_async_scheduling_gives_the_synchronous_outputs(llama_checkpoint: Path, case: str) -> None:
    engine_kwargs, params = CASES[case]
    synchronous = summary(run(llama_checkpoint, engine_kwargs, params, async_scheduling=False))
    assert summary(run(llama_checkpoint, engine_kwargs, params, True)) == synchronous


def test_stop_tokens_and_strings_end_requests_as_without_async(llama_checkpoint: Path) -> None:
    # Stops taken from an unstopped run, so each request surely stops in the middle.
    free = run(llama_checkpoint, {}, [GREEDY] * 3, False)
    tokens, text = free[0].outputs[0].token_ids, free[1].outputs[0].text
    stopping = [
        replace(GREEDY, stop_token_ids=[tokens[4]], ignore_eos=False),
        replace(GREEDY, stop=[text[len(text) // 2 : len(text) // 2 + 2]]),
        GREEDY,
    ]
    synchronous = summary(run(llama_checkpoint, {}, stopping, async_scheduling=False))
    assert synchronous[0][0][2] == "stop" and synchronous[1][0][2] == "stop"
    assert summary(run(llama_checkpoint, {}, stopping, True)) == synchronous


def test_penalties_count_the_token_still_in_flight(llama_checkpoint: Path) -> None:
    """A request with penalties runs ahead too: its sampling counts the token the step before
    is still sampling (filled in on the device), so its outputs are the synchronous ones."""
    penalised = replace(GREEDY, frequency_penalty=1.5, presence_penalty=1.0, max_tokens=16)
    engine = LLM(str(llama_checkpoint), device="cpu", dtype="float32").engine
    engine.add_request("penalised", PROMPTS[1], penalised)
    engine.step()
    engine.step()
    assert engine._in_flight is not None  # the second step was launched before the first ended
    outputs = {}
    while engine.has_unfinished_requests():
        outputs.update({o.request_id: o for o in engine.step()})
    alone = LLM(str(llama_checkpoint), device="cpu", dtype="float32", async_scheduling=False)
    expected = alone.generate([PROMPTS[1]], [penalised])[0].outputs[0].token_ids
    got = outputs["penalised"].outputs[0].token_ids
    assert got == expected
    # The penalties matter here: without them the continuation differs.
    plain = alone.generate([PROMPTS[1]], [replace(GREEDY, max_tokens=16)])[0].outputs[0]
    assert plain.token_ids != expected


def test_a_request_of_the_running_step_can_be_aborted(llama_checkpoint: Path) -> None:
    engine = LLM(str(llama_checkpoint), device="cpu", dtype="float32").engine
    engine.add_request("r", PROMPTS[0], GREEDY)
    engine.step()  # launched; its token not yet read
    [aborted] = engine.abort_request("r")
    assert aborted.finished and aborted.outputs[0].token_ids == []
    assert engine.step() == [] and not engine.has_unfinished_requests()
    kv = engine.kv_cache_manager
    assert kv.num_free_blocks == kv.num_blocks


def test_request_ids_can_be_reused_while_a_dropped_token_is_in_flight(
    llama_checkpoint: Path,
) -> None:
    """The dropped token belongs to the old request object, never to a new one of that id."""
    engine = LLM(str(llama_checkpoint), device="cpu", dtype="float32").engine
    engine.add_request("r", PROMPTS[0], GREEDY)
    engine.step()
    engine.abort_request("r")
    engine.add_request("r", PROMPTS[1], replace(GREEDY, max_tokens=3))
    outputs: dict[str, RequestOutput] = {}
    while engine.has_unfinished_requests():
        outputs.update({o.request_id: o for o in engine.step()})
    alone = LLM(str(llama_checkpoint), device="cpu", dtype="float32").generate(
        [PROMPTS[1]], [replace(GREEDY, max_tokens=3)]
    )
    assert outputs["r"].outputs[0].token_ids == alone[0].outputs[0].token_ids


def test_a_step_failing_when_its_tokens_are_read_fails_only_its_requests(
    llama_checkpoint: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An error the device reports late (at the sync that reads a step's tokens) ends the
    requests of that step; a request admitted after it runs on."""
    engine = LLM(str(llama_checkpoint), device="cpu", dtype="float32").engine
    engine.add_request("early", PROMPTS[0], GREEDY)
    engine.step()  # launched, not yet read
    result = PendingOutput.result
    calls = []

    def fail_first(pending: PendingOutput) -> ModelRunnerOutput:
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("CUDA error: an illegal memory access (simulated)")
        return result(pending)

    monkeypatch.setattr(PendingOutput, "result", fail_first)
    [failed] = engine.step()  # launches the next step, then reads the first: it fails
    assert failed.request_id == "early" and failed.outputs[0].finish_reason == "error"
    engine.add_request("late", PROMPTS[1], replace(GREEDY, max_tokens=3))
    outputs = {}
    while engine.has_unfinished_requests():
        outputs.update({o.request_id: o for o in engine.step()})
    assert list(outputs) == ["late"] and len(outputs["late"].outputs[0].token_ids) == 3
    kv = engine.kv_cache_manager
    assert kv.num_free_blocks == kv.num_blocks


def test_inputs_count_the_leading_decodes_of_a_mixed_step() -> None:
    s = make_scheduler(block_size=4)
    s.add_request(make_request("a", 6, max_tokens=4))
    first = s.schedule()  # a's prompt
    assert prepare_inputs(first.scheduled, 4, torch.device("cpu")).attn.num_decode_seqs == 0
    s.add_request(make_request("b", 5, max_tokens=4))
    second = s.schedule()  # a decodes (its token in flight), b's prompt after it
    assert [i.num_new_tokens for i in second.scheduled] == [1, 5]
    inputs = prepare_inputs(second.scheduled, 4, torch.device("cpu"))
    assert inputs.attn.num_decode_seqs == 1
    s.update_from_output(first, sampled(first))
    s.update_from_output(second, sampled(second))
    third = s.schedule()  # both decode
    assert prepare_inputs(third.scheduled, 4, torch.device("cpu")).attn.num_decode_seqs == 2
