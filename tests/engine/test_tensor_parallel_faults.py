"""A tensor-parallel worker that dies fails the requests in flight with a typed error and
stops the engine, never a hang (CPU, gloo, one spawned worker). Apart from
test_tensor_parallel.py: one tensor-parallel engine per process at a time."""

from __future__ import annotations

import asyncio

import pytest
import torch.distributed as dist

from loraplex.engine import AsyncEngine, SamplingParams, WorkerDiedError
from loraplex.engine.distributed.tp_runner import TensorParallelRunner
from loraplex.engine.errors import ConfigError, EngineDeadError
from tests.checkpoints import CheckpointFactory
from tests.engine.tensor_parallel_models import MODELS, TP, make_llm, make_prompts

pytestmark = pytest.mark.timeout(300)


@pytest.mark.parametrize("when", ["between-steps", "during-a-step"])
def test_a_dead_worker_fails_the_requests_in_flight_and_stops_the_engine(
    when: str, checkpoint_factory: CheckpointFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """between-steps: the liveness check sees it; during-a-step: the step's message and
    collectives fail (the check is skipped to get there). Either way: a typed error on every
    request in flight, the engine refuses more work, the workers are gone."""
    arch, kwargs = MODELS["llama-mqa"]
    llm = make_llm(checkpoint_factory(arch, **kwargs), TP)
    engine, runner = llm.engine, llm.engine.runner
    assert isinstance(runner, TensorParallelRunner)
    params = SamplingParams(max_tokens=50, temperature=0.0, ignore_eos=True)
    for i, prompt in enumerate(make_prompts()[:3]):
        engine.add_request(str(i), {"prompt_token_ids": prompt}, params)
    engine.step()
    engine.step()
    worker = runner.workers[0]
    worker.process.kill()
    if when == "during-a-step":
        worker.process.join(10)
        monkeypatch.setattr(runner, "_check_alive", lambda: None)
    outputs = engine.step()
    assert sorted(o.request_id for o in outputs) == ["0", "1", "2"]
    for output in outputs:
        assert output.finished and output.outputs[0].finish_reason == "error"
        assert isinstance(output.error, WorkerDiedError)
        assert "rank 1" in str(output.error) and "died" in str(output.error)
    assert not engine.has_unfinished_requests()
    assert not worker.process.is_alive() and not dist.is_initialized()
    with pytest.raises(EngineDeadError, match="worker died"):
        engine.add_request("late", {"prompt_token_ids": [5]}, params)
    with pytest.raises(EngineDeadError):
        engine.step()
    llm.shutdown()  # again: nothing left to stop


def test_llm_generate_raises_the_worker_error(checkpoint_factory: CheckpointFactory) -> None:
    arch, kwargs = MODELS["llama-mqa"]
    llm = make_llm(checkpoint_factory(arch, **kwargs), TP)
    runner = llm.engine.runner
    assert isinstance(runner, TensorParallelRunner)
    runner.workers[0].process.kill()
    params = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)
    with pytest.raises(WorkerDiedError, match="rank 1"):
        llm.generate([{"prompt_token_ids": [5, 6, 7]}], params, use_tqdm=False)


def test_a_second_tensor_parallel_engine_in_one_process_is_refused(
    checkpoint_factory: CheckpointFactory,
) -> None:
    arch, kwargs = MODELS["llama-mqa"]
    checkpoint = checkpoint_factory(arch, **kwargs)
    llm = make_llm(checkpoint, TP)
    try:
        with pytest.raises(ConfigError, match="one tensor-parallel engine per process"):
            make_llm(checkpoint, TP)
    finally:
        llm.shutdown()
    assert not dist.is_initialized()


# The core's thread ends on the error, as designed (EngineCore.run re-raises it).
@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
async def test_the_async_engine_fails_its_streams_and_refuses_new_ones(
    checkpoint_factory: CheckpointFactory,
) -> None:
    """The server's path: the engine core sends the requests' errors, then ends its loop."""
    arch, kwargs = MODELS["llama-mqa"]
    engine = AsyncEngine.from_engine_args(
        str(checkpoint_factory(arch, **kwargs)),
        device="cpu",
        dtype="float32",
        enable_lora=False,
        tensor_parallel_size=TP,
    )
    await engine.start()
    try:
        runner = engine.engine.runner
        assert isinstance(runner, TensorParallelRunner)
        params = SamplingParams(max_tokens=200, temperature=0.0, ignore_eos=True)
        stream = engine.generate({"prompt_token_ids": [5, 6, 7]}, params, "r1")
        await stream.__anext__()
        runner.workers[0].process.kill()
        with pytest.raises(EngineDeadError, match="rank 1"):
            async for output in stream:
                if output.error is not None:
                    raise output.error
        with pytest.raises(EngineDeadError):
            async for _ in engine.generate({"prompt_token_ids": [5]}, params, "r2"):
                pass
    finally:
        await asyncio.wait_for(engine.shutdown(), timeout=30)
    assert not dist.is_initialized()
