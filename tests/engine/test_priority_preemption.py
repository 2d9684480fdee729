"""Urgent requests preempt batch ones; preempted requests lose nothing (swap and recompute)."""

from __future__ import annotations

import random

import pytest

from loraplex.engine import LoRARequest, SamplingParams
from loraplex.platform.demo.tiny_checkpoint import write_random_checkpoint
from tests.engine.engine_driver import make_llm, run_to_completion
from tests.engine.lora_adapters import write_peft_adapter


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    root = tmp_path_factory.mktemp("prio")
    base = write_random_checkpoint(root / "base", "llama")
    adapters = [
        write_peft_adapter(base, root / f"a{i}", 8, ["q_proj", "v_proj", "down_proj"], seed=i)
        for i in range(2)
    ]
    return base, adapters


def workload(adapters):
    rng = random.Random(3)
    prompts = [[rng.randrange(5, 500) for _ in range(rng.randrange(8, 20))] for _ in range(5)]
    loras = [
        LoRARequest("a0", 1, str(adapters[0])),
        None,
        LoRARequest("a1", 2, str(adapters[1])),
        LoRARequest("a0", 1, str(adapters[0])),
        None,
    ]
    seeded = [
        SamplingParams(max_tokens=10, temperature=0.0, ignore_eos=True),
        SamplingParams(max_tokens=10, temperature=0.8, top_p=0.9, seed=7, ignore_eos=True),
    ]
    return prompts, loras, [seeded[i % 2] for i in range(5)]


def generate(model, urgent_at_step: int | None, **kwargs):
    base, adapters = model
    llm = make_llm(base, scheduling_policy="priority", **kwargs)
    engine = llm.engine
    prompts, loras, params = workload(adapters)
    for i in range(4):  # a batch-tier flood first
        engine.add_request(
            f"batch{i}",
            {"prompt_token_ids": prompts[i]},
            params[i],
            lora_request=loras[i],
            priority=2,
        )
    started_at: dict[str, int] = {}

    def on_step(step: int) -> None:
        if step == (urgent_at_step or 0):
            engine.add_request(
                "urgent",
                {"prompt_token_ids": prompts[4]},
                params[4],
                lora_request=loras[4],
                priority=0,
            )
        for request in engine.scheduler.running:  # seen running now = scheduled last step
            started_at.setdefault(request.request_id, step - 1)

    outs = run_to_completion(engine, on_step)
    return {rid: o.outputs[0].token_ids for rid, o in outs.items()}, started_at, engine


@pytest.mark.parametrize("mode", ["swap", "recompute"])
def test_urgent_request_starts_within_one_step_and_outputs_are_unchanged(model, mode):
    # Unpressured reference: plenty of blocks and sequence slots.
    reference, _, _ = generate(model, urgent_at_step=3)
    # Full engine: 2 sequences at most, 12 blocks of 4 tokens beside the two adapters' 26.
    pressured, started_at, engine = generate(
        model,
        urgent_at_step=3,
        max_num_seqs=2,
        num_kv_blocks=12 + 26,
        block_size=4,
        preemption_mode=mode,
    )
    assert started_at["urgent"] == 3, "admitted in the step it arrived"
    assert getattr(engine.get_stats(), f"num_preemptions_{mode}") > 0
    assert pressured == reference


def test_swap_falls_back_to_recompute_when_swap_space_is_short(model):
    reference, _, _ = generate(model, urgent_at_step=3)
    pressured, _, engine = generate(
        model,
        urgent_at_step=3,
        max_num_seqs=2,
        num_kv_blocks=12 + 26,
        block_size=4,
        preemption_mode="swap",
        swap_space_gb=1e-7,
    )
    assert engine.get_stats().num_preemptions_recompute > 0
    assert pressured == reference


def test_fcfs_does_not_preempt_for_priority(model):
    base, _ = model
    llm = make_llm(base, scheduling_policy="fcfs", max_num_seqs=1)
    params = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)
    llm.engine.add_request("first", [5, 6, 7], params, priority=2)
    llm.engine.step()
    llm.engine.add_request("urgent", [5, 6, 8], params, priority=0)
    llm.engine.step()
    assert [r.request_id for r in llm.engine.scheduler.running] == ["first"]
    assert llm.engine.scheduler.num_preemptions == 0
