"""Deferred detokenization (engine/output_processor.py): a user request without stop strings
whose completions did not finish gets its new token's text while the next step's forward runs,
and its output one step later; everything a step decides (stop strings, finished text) is
still decided in that step, and no text is lost or reordered."""

from __future__ import annotations

from pathlib import Path

import pytest

from loraplex.engine import SamplingParams
from loraplex.engine.engine_args import create_engine_config
from loraplex.engine.llm_engine import LLMEngine
from loraplex.engine.request import RequestOutput
from loraplex.engine.runner.model_runner import PendingOutput

PROMPT = [5, 6, 7, 8]
DEFERRED = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
# A stop string that never matches keeps a request on the synchronous path throughout (one
# character long: no text is held back for it).
SYNCHRONOUS = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True, stop=["\x00"])


def make_engine(checkpoint: Path, output_deltas: bool = False) -> LLMEngine:
    config = create_engine_config(
        str(checkpoint), device="cpu", num_kv_blocks=32, enable_prefix_caching=False
    )
    return LLMEngine(config, output_deltas=output_deltas)


def completions(engine: LLMEngine, params: SamplingParams) -> list[tuple[list[int], str, bool]]:
    """Each step's output of one request: (token ids, text, finished)."""
    engine.add_request("r", PROMPT, params)
    seen = []
    while engine.has_unfinished_requests():
        for output in engine.step():
            seen.append((output.outputs[0].token_ids, output.outputs[0].text, output.finished))
    return seen


def test_a_deferred_output_is_the_synchronous_one_a_step_later(llama_checkpoint: Path) -> None:
    synchronous = completions(make_engine(llama_checkpoint), SYNCHRONOUS)
    deferred = completions(make_engine(llama_checkpoint), DEFERRED)
    assert [len(ids) for ids, _, _ in synchronous] == [1, 2, 3, 4, 5, 6, 7, 8]
    assert synchronous[-1][1] != "" and synchronous[-1][2]
    # Step k reports the tokens up to k - 1; the last step's, which finished it, in time.
    assert deferred == synchronous[:-2] + synchronous[-1:]


def test_both_kinds_in_one_batch_come_out_as_they_would_alone(llama_checkpoint: Path) -> None:
    alone = {
        "deferred": completions(make_engine(llama_checkpoint), DEFERRED),
        "synchronous": completions(make_engine(llama_checkpoint), SYNCHRONOUS),
    }
    engine = make_engine(llama_checkpoint)
    engine.add_request("deferred", PROMPT, DEFERRED)
    engine.add_request("synchronous", PROMPT, SYNCHRONOUS)
    together: dict[str, list[tuple[list[int], str, bool]]] = {name: [] for name in alone}
    while engine.has_unfinished_requests():
        for output in engine.step():
            completion = output.outputs[0]
            together[output.request_id].append(
                (completion.token_ids, completion.text, output.finished)
            )
    assert together == alone


def test_an_abort_keeps_the_text_of_the_deferred_token(llama_checkpoint: Path) -> None:
    aborted = {}
    for name, params in [("deferred", DEFERRED), ("synchronous", SYNCHRONOUS)]:
        engine = make_engine(llama_checkpoint)
        engine.add_request("r", PROMPT, params)
        for _ in range(3):
            engine.step()
        (output,) = engine.abort_request("r")
        assert output.finished and output.outputs[0].finish_reason == "abort"
        assert engine.step() == []  # nothing of it is left to come out
        aborted[name] = (output.outputs[0].token_ids, output.outputs[0].text)
    # Three steps ran; with async scheduling the third one's token was still on its way.
    assert len(aborted["deferred"][0]) == (2 if engine.async_scheduling else 3)
    assert aborted["deferred"] == aborted["synchronous"]


def test_the_deferred_text_is_made_while_the_forward_runs(
    llama_checkpoint: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = make_engine(llama_checkpoint)
    events: list[str] = []
    forward, wait = engine.runner.forward, PendingOutput.result
    flush = engine.output_processor.flush

    def record(name, call):  # type: ignore[no-untyped-def]
        def recorded(*args, **kwargs):  # type: ignore[no-untyped-def]
            events.append(name)
            return call(*args, **kwargs)

        return recorded

    engine.runner.forward = record("forward", forward)  # type: ignore[method-assign]
    monkeypatch.setattr(PendingOutput, "result", record("wait", wait))
    engine.output_processor.flush = record("flush", flush)  # type: ignore[method-assign]
    engine.add_request("r", PROMPT, DEFERRED)
    engine.step()
    events.clear()
    engine.step()
    assert events[:3] == ["forward", "flush", "wait"]


def each_step(engine: LLMEngine, requests: dict[str, SamplingParams]) -> list[list[RequestOutput]]:
    for request_id, params in requests.items():
        engine.add_request(request_id, PROMPT, params)
    steps = []
    while engine.has_unfinished_requests():
        steps.append(engine.step())
        if len(steps) == 3 and "aborted" in requests:  # its deferred token comes out too
            steps.append(engine.abort_request("aborted"))
    return steps


def test_deltas_add_up_to_the_cumulative_outputs_step_by_step(llama_checkpoint: Path) -> None:
    plain = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
    (text,) = [
        o.outputs[0].text for o in each_step(make_engine(llama_checkpoint), {"r": plain})[-2]
    ]
    stop = text[len(text) // 2 :][:2]  # matches mid-way: text was held back, then cut
    assert len(stop) == 2
    requests = {
        "deferred": plain,
        "stopped": SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True, stop=[stop]),
        "sampled": SamplingParams(max_tokens=10, n=2, seed=3, logprobs=2, ignore_eos=True),
        "aborted": plain,
    }
    cumulative = each_step(make_engine(llama_checkpoint), requests)
    deltas = each_step(make_engine(llama_checkpoint, output_deltas=True), requests)
    assert len(deltas) == len(cumulative)
    so_far: dict[tuple[str, int], tuple[list[int], str, list[object]]] = {}
    for step, (expected, got) in enumerate(zip(cumulative, deltas, strict=True)):
        assert [o.request_id for o in got] == [o.request_id for o in expected], step
        for want, delta in zip(expected, got, strict=True):
            assert delta.finished == want.finished
            for w, d in zip(want.outputs, delta.outputs, strict=True):
                ids, text, logprobs = so_far.get((want.request_id, w.index), ([], "", []))
                so_far[want.request_id, w.index] = (
                    ids + d.token_ids,
                    text + d.text,
                    logprobs + (d.logprobs or []),
                )
                assert so_far[want.request_id, w.index] == (
                    w.token_ids,
                    w.text,
                    w.logprobs or [],
                ), (step, want.request_id, w.index)
                assert (d.finish_reason, d.stop_reason) == (w.finish_reason, w.stop_reason)
    finished = {o.request_id: o.outputs[0] for step in cumulative for o in step if o.finished}
    assert finished["stopped"].stop_reason == stop
    assert finished["aborted"].finish_reason == "abort" and finished["aborted"].token_ids
    assert len(finished["sampled"].token_ids) == 10
