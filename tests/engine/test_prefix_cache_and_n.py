"""Prefix caching (hits, isolation by adapter and salt) and n > 1 with copy-on-write."""

from __future__ import annotations

import random

import pytest

from loraplex.engine import LoRARequest, SamplingParams
from loraplex.platform.demo.tiny_checkpoint import write_random_checkpoint
from tests.engine.engine_driver import make_llm, run_to_completion
from tests.engine.lora_adapters import write_peft_adapter

SYSTEM = [random.Random(5).randrange(5, 500) for _ in range(40)]  # 2 full blocks of 16 + 8


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    root = tmp_path_factory.mktemp("prefix")
    base = write_random_checkpoint(root / "base", "llama")
    adapter = write_peft_adapter(base, root / "a", 8, ["q_proj", "k_proj", "v_proj"], seed=1)
    return base, adapter


GREEDY = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)


def first_chunk(engine, request_id, prompt, **kwargs) -> int:
    """Add a request, run one step, return how many of its tokens that step computed."""
    engine.add_request(request_id, {"prompt_token_ids": prompt}, GREEDY, **kwargs)
    engine.lora_manager.poll(engine.scheduler.waiting, num_running=0)  # uploads its adapter
    out = engine.scheduler.schedule()
    runner_out = engine.runner.execute(out, engine.lora_manager.prepare(out.scheduled))
    updated = engine.scheduler.update_from_output(out, runner_out)
    engine.output_processor.process(updated, runner_out.logprobs)
    return next(s.num_new_tokens for s in out.scheduled if s.request.request_id == request_id)


def test_shared_system_prompt_skips_prefill(model):
    base, adapter = model
    engine = make_llm(base).engine
    assert first_chunk(engine, "a", SYSTEM + [7, 8, 9], cache_salt="t1") == 43
    run_to_completion(engine)
    # Same tenant and adapter: the two full system-prompt blocks are reused.
    assert first_chunk(engine, "b", SYSTEM + [10, 11], cache_salt="t1") == 42 - 32
    assert engine.kv_cache_manager.num_prefix_hit_tokens == 32
    assert run_to_completion(engine)["b"].num_cached_tokens == 32
    # Another tenant's salt, or another adapter: nothing is shared.
    assert first_chunk(engine, "c", SYSTEM + [12], cache_salt="t2") == 41
    lora = LoRARequest("a", 1, str(adapter))
    assert first_chunk(engine, "d", SYSTEM + [13], cache_salt="t1", lora_request=lora) == 41
    run_to_completion(engine)
    assert engine.kv_cache_manager.num_prefix_hit_tokens == 32


def outputs(base, requests, **kwargs):
    engine = make_llm(base, **kwargs).engine
    for rid, prompt, params, lora in requests:
        engine.add_request(rid, {"prompt_token_ids": prompt}, params, lora_request=lora)
    done = run_to_completion(engine)
    return {rid: [c.token_ids for c in o.outputs] for rid, o in done.items()}, engine


def test_cached_and_forked_outputs_equal_uncached(model):
    base, adapter = model
    lora = LoRARequest("a", 1, str(adapter))
    seeded = SamplingParams(max_tokens=6, temperature=1.0, seed=11, n=3, ignore_eos=True)
    greedy_n = SamplingParams(max_tokens=6, temperature=0.0, n=3, ignore_eos=True)
    requests = [
        ("r0", SYSTEM + [1, 2, 3], GREEDY, None),
        ("r1", SYSTEM + [4, 5], greedy_n, None),
        ("r2", SYSTEM + [6], seeded, lora),
        ("r3", SYSTEM[:32], greedy_n, lora),  # prompt ends on a block boundary
        ("r4", SYSTEM + [4, 5], GREEDY, None),
    ]
    cached, engine = outputs(base, requests, block_size=16, enable_prefix_caching=True)
    uncached, _ = outputs(base, requests, block_size=16, enable_prefix_caching=False)
    assert cached == uncached
    assert cached["r1"] == [cached["r4"][0]] * 3  # greedy n=3: three equal completions
    assert len({tuple(t) for t in cached["r2"]}) > 1  # sampled n=3 completions differ
    assert engine.kv_cache_manager.num_prefix_hit_tokens > 0


def test_forked_siblings_share_prompt_blocks(model):
    base, _ = model
    engine = make_llm(base, block_size=16).engine
    params = SamplingParams(max_tokens=3, temperature=0.0, n=3, ignore_eos=True)
    engine.add_request("p", {"prompt_token_ids": SYSTEM}, params)  # 40 tokens: blocks 0,1,2
    engine.step()  # sibling 0 prefills
    engine.step()  # siblings 1 and 2 fork: share blocks 0 and 1, copy block 2 on write
    kv = engine.kv_cache_manager
    tables = [kv.get_block_ids(f"p#{i}") for i in range(3)]
    assert tables[0][:2] == tables[1][:2] == tables[2][:2]
    assert kv.block_pool.blocks[tables[0][0]].ref_cnt == 3
    assert len({t[2] for t in tables}) == 3, "the partial last block is copied, not shared"
    kv.check_integrity()
    run_to_completion(engine)
