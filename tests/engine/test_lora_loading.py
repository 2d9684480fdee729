"""Adapter loads off the step path: a failing load fails only its own requests; adapters come
and go while requests run."""

from __future__ import annotations

import random
import shutil
import time
from pathlib import Path

import pytest
from safetensors.torch import load_file, save_file

from loraplex.engine import LoRARequest, SamplingParams
from loraplex.engine.errors import AdapterRemovedError, InvalidAdapterError, RequestTooLongError
from loraplex.engine.llm_engine import LLMEngine
from loraplex.engine.lora import lora_manager
from loraplex.engine.lora.adapter_loader import CpuAdapter
from loraplex.engine.runner.model_runner import PendingOutput
from loraplex.engine.scheduler.output import ModelRunnerOutput
from loraplex.platform.demo.tiny_checkpoint import write_random_checkpoint
from tests.engine.engine_driver import make_llm, run_to_completion
from tests.engine.lora_adapters import write_peft_adapter

PARAMS = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_random_checkpoint(tmp_path_factory.mktemp("loading") / "base", "llama")


def holds(engine: LLMEngine) -> tuple[int, int]:
    """Requests holding an adapter (queued or running), and those running on its pages."""
    lora = engine.get_stats().lora
    return lora.num_requests_holding, lora.num_requests_pinning


def nan_adapter(base: Path, out_dir: Path) -> Path:
    """A PEFT adapter whose header is fine and whose weights are not (found while loading)."""
    write_peft_adapter(base, out_dir, 4, ["q_proj"], seed=3)
    weights = load_file(str(out_dir / "adapter_model.safetensors"))
    next(iter(weights.values())).fill_(float("nan"))
    save_file(weights, str(out_dir / "adapter_model.safetensors"))
    return out_dir


def test_a_failing_load_fails_only_its_requests(base: Path, tmp_path: Path) -> None:
    good = write_peft_adapter(base, tmp_path / "good", 4, ["q_proj", "v_proj"], seed=1)
    bad = nan_adapter(base, tmp_path / "bad")
    llm = make_llm(base)
    engine = llm.engine
    good_request = engine.lora_manager.add_lora(LoRARequest("good", 1, str(good)))
    # Registered elsewhere (as the platform does), so nothing is read until a request needs it.
    bad_request = LoRARequest("bad", 2, str(bad), content_hash="b" * 64)
    for i, lora in enumerate([good_request, bad_request, None, bad_request, good_request]):
        engine.add_request(f"r{i}", [5, 6, 7], PARAMS, lora_request=lora)
    outs = run_to_completion(engine)
    reasons = {rid: out.outputs[0].finish_reason for rid, out in outs.items()}
    assert reasons == {"r0": "length", "r1": "error", "r2": "length", "r3": "error", "r4": "length"}
    assert engine.get_stats().lora.num_load_failures == 1


def test_adapters_deep_in_the_queue_load_as_it_drains(
    base: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The per-step prefetch scan looks only at the queue's head; adapters named further back
    (a good one and a failing one) are loaded or failed once their requests move up."""
    monkeypatch.setattr(lora_manager, "PREFETCH_WINDOW", 2)
    good = write_peft_adapter(base, tmp_path / "good", 4, ["q_proj"], seed=1)
    bad = nan_adapter(base, tmp_path / "bad")
    engine = make_llm(base, max_num_seqs=2).engine
    late_good = LoRARequest("good", 1, str(good), content_hash="a" * 64)
    late_bad = LoRARequest("bad", 2, str(bad), content_hash="b" * 64)
    for i, lora in enumerate([None, None, None, None, late_bad, late_good]):
        engine.add_request(f"r{i}", [5, 6, 7], PARAMS, lora_request=lora)
    for _ in range(2):  # r0 and r1 run; the scan sees r2 and r3 (a load would end meanwhile)
        engine.step()
        time.sleep(0.2)
    stats = engine.get_stats().lora
    assert (stats.num_cpu_loads, stats.num_load_failures) == (0, 0)
    outs = run_to_completion(engine)
    reasons = {rid: out.outputs[0].finish_reason for rid, out in outs.items()}
    assert reasons == {f"r{i}": "length" for i in (0, 1, 2, 3, 5)} | {"r4": "error"}


def test_an_adapter_deleted_before_its_load_fails_its_requests_as_removed(
    base: Path, tmp_path: Path
) -> None:
    """The platform's delete: the engine forgets the id and the files go while a request still
    waits for the adapter's first load. That request ends with AdapterRemovedError (a 404 to
    its client), not a load failure (a 500); others are unaffected."""
    doomed = write_peft_adapter(base, tmp_path / "doomed", 4, ["q_proj"], seed=1)
    engine = make_llm(base).engine
    lora = LoRARequest("doomed", 7, str(doomed), content_hash="d" * 64)
    engine.add_request("waits", [5, 6, 7], PARAMS, lora_request=lora)
    engine.add_request("base", [5, 6, 7], PARAMS)
    assert engine.remove_lora(7)
    shutil.rmtree(doomed)
    outs = run_to_completion(engine)
    assert outs["base"].outputs[0].finish_reason == "length"
    assert outs["waits"].outputs[0].finish_reason == "error"
    assert isinstance(outs["waits"].error, AdapterRemovedError)
    assert "deleted" in str(outs["waits"].error)


def test_an_adapter_without_a_hash_is_checked_when_added(base: Path, tmp_path: Path) -> None:
    llm = make_llm(base)
    bad = LoRARequest("bad", 2, str(nan_adapter(base, tmp_path / "bad")))
    with pytest.raises(InvalidAdapterError, match="NaN"):
        llm.engine.add_request("r", [5, 6, 7], PARAMS, lora_request=bad)
    assert not llm.engine.has_unfinished_requests()


def test_removing_an_adapter_lets_requests_in_flight_finish(base: Path, tmp_path: Path) -> None:
    adapter = write_peft_adapter(base, tmp_path / "a", 4, ["q_proj"], seed=1)
    llm = make_llm(base)
    engine = llm.engine
    lora = LoRARequest("a", 1, str(adapter))
    engine.add_request("first", [5, 6, 7], PARAMS, lora_request=lora)
    assert holds(engine) == (1, 0)  # queued: it holds the adapter's registration
    engine.step()
    assert holds(engine) == (1, 1)  # running on its pages
    assert llm.remove_lora(1) and llm.list_loras() == []
    outs = run_to_completion(engine)
    assert outs["first"].outputs[0].finish_reason == "length"
    assert engine.lora_manager.pool.num_blocks_held == 0  # dropped once its request ended
    assert holds(engine) == (0, 0)


def test_a_request_that_cannot_fit_beside_its_adapter_fails_clearly(base: Path, tmp_path: Path):
    # Rank 8 on q, v and down_proj takes 13 blocks of 4 tokens: with 16 blocks, a 12-token
    # request fits beside it, a 20-token one never can (it must fail, not wait forever).
    adapter = write_peft_adapter(base, tmp_path / "a", 8, ["q_proj", "v_proj", "down_proj"], 1)
    llm = make_llm(base, num_kv_blocks=16, block_size=4)
    engine = llm.engine
    lora = LoRARequest("a", 1, str(adapter))
    engine.add_request("fits", [5] * 8, PARAMS, lora_request=lora)
    engine.add_request("never", [5] * 16, PARAMS, lora_request=lora)
    outs = run_to_completion(engine)
    assert outs["fits"].outputs[0].finish_reason == "length"
    assert outs["never"].outputs[0].finish_reason == "error"
    assert isinstance(outs["never"].error, RequestTooLongError)
    assert "13 KV blocks" in str(outs["never"].error)


@pytest.mark.parametrize("num_kv_blocks", [38, 40, 44, 48])
def test_making_room_for_a_request_never_evicts_its_own_adapter(
    tmp_path: Path, num_kv_blocks: int
) -> None:
    # Three adapters taking 4 + 4 + 30 blocks of the pool: admitting a request reclaims idle
    # adapters' blocks, and must not take its own adapter (ready, about to be pinned).
    base = write_random_checkpoint(
        tmp_path / "base", "llama", hidden_size=128, num_heads=4, num_kv_heads=2, head_dim=32
    )
    adapters = [
        write_peft_adapter(base, tmp_path / "a4", 4, ["q_proj", "v_proj"], seed=4),
        write_peft_adapter(base, tmp_path / "a16", 16, ["o_proj", "down_proj"], seed=16),
        write_peft_adapter(
            base, tmp_path / "a64", 64, ["q_proj", "k_proj", "gate_proj", "up_proj"], seed=64
        ),
    ]
    llm = make_llm(base, num_kv_blocks=num_kv_blocks, block_size=16)
    engine = llm.engine
    loras = [LoRARequest(f"a{i}", i + 1, str(path)) for i, path in enumerate(adapters)]
    plan = [*loras, None, *loras, None]
    rng = random.Random(0)
    params = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
    for i, lora in enumerate(plan):
        prompt = [rng.randrange(5, 500) for _ in range(rng.randrange(3, 60))]
        engine.add_request(f"r{i}", prompt, params, lora_request=lora)
    outs = run_to_completion(engine)
    assert {o.outputs[0].finish_reason for o in outs.values()} == {"length"}


def test_waiting_for_an_adapter_load_is_not_counted_as_step_time(
    base: Path, tmp_path: Path
) -> None:
    """step_seconds (the engine's busy time in /metrics) leaves out the empty steps' sleeps
    while every request waits for its adapter."""
    path = write_peft_adapter(base, tmp_path / "slow", 4, ["q_proj"], seed=4)
    engine = make_llm(base).engine
    loader = engine.lora_manager.loader
    load = loader.load

    def slow_load(request: LoRARequest) -> CpuAdapter:
        time.sleep(0.3)
        return load(request)

    loader.load = slow_load  # submit() looks it up on the instance
    # Registered elsewhere (as the platform does): read only when the request needs it.
    slow = LoRARequest("slow", 1, str(path), content_hash="c" * 64)
    engine.add_request("r", [5, 6, 7], PARAMS, lora_request=slow)
    start = time.perf_counter()
    while engine.has_unfinished_requests():  # no integrity checks between steps: they wait
        engine.step()
    wall = time.perf_counter() - start
    stats = engine.get_stats()
    assert stats.num_generated_tokens == PARAMS.max_tokens
    assert 0 < stats.step_seconds < wall - 0.25  # the 0.3 s load was waited for, not stepped


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_a_load_asked_for_in_a_step_starts_while_its_forward_runs(
    base: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, async_scheduling: bool
) -> None:
    """A load begins with Python work (the file's header), so it starts once the step's forward
    is queued and before the host waits for its sampled tokens (in that step, or with async
    scheduling in the next one), not while the host still prepares the step."""
    path = write_peft_adapter(base, tmp_path / "cold", 4, ["q_proj"], seed=5)
    engine = make_llm(base, async_scheduling=async_scheduling).engine
    manager = engine.lora_manager
    events: list[str] = []
    submit, forward, result = manager.loader.submit, engine.runner.forward, PendingOutput.result

    def record_submit(request: LoRARequest):  # type: ignore[no-untyped-def]
        events.append("load")
        return submit(request)

    def record_forward(*args, **kwargs):  # type: ignore[no-untyped-def]
        events.append("forward")
        return forward(*args, **kwargs)

    def record_wait(pending: PendingOutput) -> ModelRunnerOutput:
        events.append("wait")
        return result(pending)

    manager.loader.submit = record_submit  # type: ignore[method-assign]
    monkeypatch.setattr(PendingOutput, "result", record_wait)
    engine.runner.forward = record_forward  # type: ignore[method-assign]
    engine.add_request("warm", [5, 6, 7], PARAMS)
    engine.add_request("cold", [5, 6, 8], PARAMS, LoRARequest("c", 1, str(path), "d" * 64))
    engine.step()  # prefills "warm"; asks for "cold"'s adapter
    assert events == (["forward", "load"] if async_scheduling else ["forward", "load", "wait"])
    cold = next(r for r in engine.scheduler.waiting if r.request_id == "cold")
    assert manager.is_loading(cold)
    outs = run_to_completion(engine)
    assert {rid: len(o.outputs[0].token_ids) for rid, o in outs.items()} == {"warm": 4, "cold": 4}


def test_each_poll_starts_only_its_own_reads(base: Path, tmp_path: Path) -> None:
    """A step that launches nothing never starts its poll's disk reads; the next poll's asks
    replace them. Kept, a stale ask started a second read of an adapter that had reached the
    CPU cache meanwhile (both loading and cached: check_integrity caught it in CI). An adapter
    already being read is not asked for again."""
    path = write_peft_adapter(base, tmp_path / "a", 4, ["q_proj"], seed=3)
    engine = make_llm(base).engine
    manager = engine.lora_manager
    assert manager is not None
    submitted: list[str] = []
    submit = manager.loader.submit

    def record_submit(request: LoRARequest):  # type: ignore[no-untyped-def]
        submitted.append(request.lora_name)
        return submit(request)

    manager.loader.submit = record_submit  # type: ignore[method-assign]
    engine.add_request("r", [5, 6, 7], PARAMS, LoRARequest("a", 1, str(path), "e" * 64))
    waiting = list(engine.scheduler.waiting)
    manager.poll(waiting, 0)  # asks for a's read; no start_loads follows
    manager.poll([], 0)  # a later poll that asks for nothing
    manager.start_loads()
    assert submitted == []
    for _ in range(3):  # asked for, then being read (or cached): one read in all
        manager.poll(waiting, 0)
        manager.start_loads()
        manager.check_integrity()
    assert submitted == ["a"]
    outs = run_to_completion(engine)
    assert len(outs["r"].outputs[0].token_ids) == 4 and submitted == ["a"]
