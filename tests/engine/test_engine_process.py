"""AsyncEngine with its step loop in a process of its own: the same outputs as in a thread,
aborts, adapters, stats, and a clean failure (never a hang) when the process dies; the core's
end of the pipe (a thread per direction) keeps order and blocks neither side."""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import pickle
import signal
import threading
from pathlib import Path

import pytest

from loraplex.engine import AsyncEngine, LoRARequest, SamplingParams
from loraplex.engine.core_transport import CorePipeEnd, ProcessTransport
from loraplex.engine.engine_core import AbortRequest, StepMessage
from loraplex.engine.errors import (
    EngineDeadError,
    InvalidAdapterError,
    InvalidParameterError,
    RequestTooLongError,
)
from loraplex.platform.demo.tiny_checkpoint import write_random_checkpoint
from tests.engine.lora_adapters import write_peft_adapter

GREEDY = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_random_checkpoint(tmp_path_factory.mktemp("process") / "base", "llama")


async def outputs(engine: AsyncEngine, lora: LoRARequest | None) -> dict[str, list[int]]:
    async def one(i: int) -> tuple[str, list[int]]:
        prompt = {"prompt_token_ids": [5 + i, 6, 7, 8 + i]}
        outs = [o async for o in engine.generate(prompt, GREEDY, f"r{i}", lora_request=lora)]
        return outs[-1].request_id, outs[-1].outputs[0].token_ids

    return dict(await asyncio.gather(*(one(i) for i in range(4))))


async def test_a_process_engine_matches_a_thread_engine(base: Path, tmp_path: Path) -> None:
    adapter = write_peft_adapter(base, tmp_path / "a", 4, ["q_proj", "v_proj"], seed=1)
    lora = LoRARequest("a", 1, str(adapter))
    results = []
    for engine_process in (False, True):
        engine = AsyncEngine.from_engine_args(
            str(base), device="cpu", dtype="float32", engine_process=engine_process
        )
        await engine.start()
        try:
            await engine.add_lora(lora)
            results.append((await outputs(engine, None), await outputs(engine, lora)))
            for _ in range(100):  # the idle engine's last snapshot arrives
                if engine.get_stats().num_generated_tokens == 2 * 4 * 6:
                    break
                await asyncio.sleep(0.02)
            assert engine.get_stats().num_generated_tokens == 2 * 4 * 6
            assert engine.get_stats().lora.num_registered == 1
            with pytest.raises(InvalidParameterError):  # raised in the core, typed here
                async for _ in engine.generate({"prompt_token_ids": []}, GREEDY, "bad"):
                    pass
            assert await engine.remove_lora(1)
        finally:
            await engine.shutdown()
    assert results[0] == results[1]
    assert results[0][0] != results[0][1]  # the adapter changed the outputs


async def test_leaving_a_stream_aborts_it_in_the_process(base: Path) -> None:
    engine = AsyncEngine.from_engine_args(str(base), device="cpu", engine_process=True)
    await engine.start()
    try:
        params = SamplingParams(max_tokens=1000, temperature=0.0, ignore_eos=True)
        stream = engine.generate({"prompt_token_ids": [5, 6, 7]}, params, "long")
        await stream.__anext__()
        await stream.aclose()
        for _ in range(200):
            stats = engine.get_stats()
            if stats.num_running == 0 and stats.num_waiting == 0 and stats.kv_blocks_used == 0:
                break
            await asyncio.sleep(0.02)
        assert stats.num_running == 0 and stats.kv_blocks_used == 0
        assert stats.num_generated_tokens < 1000
    finally:
        await engine.shutdown()


async def test_a_dead_engine_process_fails_requests_instead_of_hanging(base: Path) -> None:
    engine = AsyncEngine.from_engine_args(str(base), device="cpu", engine_process=True)
    await engine.start()
    params = SamplingParams(max_tokens=100_000, temperature=0.0, ignore_eos=True)
    stream = engine.generate({"prompt_token_ids": [5, 6, 7]}, params, "doomed")
    await stream.__anext__()
    assert isinstance(engine.transport, ProcessTransport)
    os.kill(engine.transport._process.pid, signal.SIGKILL)
    with pytest.raises(EngineDeadError):
        async with asyncio.timeout(30):
            async for _ in stream:
                pass
    assert not engine.is_running
    with pytest.raises(EngineDeadError):
        async for _ in engine.generate({"prompt_token_ids": [5]}, params, "after"):
            pass
    await engine.shutdown()


def test_engine_errors_survive_pickling() -> None:
    for error in (
        InvalidParameterError("must not be empty", param="prompt"),
        RequestTooLongError("too long", param="max_tokens"),
        InvalidAdapterError("bad weights"),
    ):
        copy = pickle.loads(pickle.dumps(error))
        assert type(copy) is type(error) and str(copy) == str(error)
        assert getattr(copy, "param", None) == getattr(error, "param", None)


def test_the_core_end_of_the_pipe_keeps_order_and_blocks_neither_side() -> None:
    server, core = multiprocessing.Pipe()
    end = CorePipeEnd(core)
    # ~2 MB of commands, far more than a pipe holds, while the step loop is not receiving: the
    # core's reader thread takes them off the pipe, so the server's sends return.
    commands = [AbortRequest(f"{i}-" + "x" * 100_000) for i in range(20)]
    sender = threading.Thread(target=lambda: [server.send(c) for c in commands], daemon=True)
    sender.start()
    sender.join(timeout=30)
    assert not sender.is_alive(), "the server blocked on a full pipe"
    # The step loop hands messages over without waiting for the server to read them.
    messages = [StepMessage(died=f"{i}-" + "y" * 100_000) for i in range(20)]
    for message in messages:
        end.send(message)
    received = [end.receive(5.0) for _ in commands]
    assert [c.request_id for c in received if isinstance(c, AbortRequest)] == [
        c.request_id for c in commands
    ]
    assert end.receive(None) is None  # nothing more: no wait
    assert [server.recv().died for _ in messages] == [m.died for m in messages]
    end.send(StepMessage(died="last"))
    server.close()
    with pytest.raises(EOFError):  # the server is gone: the loop ends
        end.receive(5.0)
    end.close()  # returns although nobody reads the last message
