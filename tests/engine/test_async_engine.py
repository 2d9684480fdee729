"""AsyncEngine: streaming (cumulative and delta outputs), non-streamed reads (the first output
and the rest), abort freeing everything, errors before the first output."""

from __future__ import annotations

import asyncio

import pytest

from loraplex.engine import AsyncEngine, InvalidParameterError, SamplingParams
from loraplex.engine.request import join_output
from loraplex.platform.demo.tiny_checkpoint import write_random_checkpoint


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return write_random_checkpoint(tmp_path_factory.mktemp("async"), "llama")


async def started(checkpoint) -> AsyncEngine:
    engine = AsyncEngine.from_engine_args(str(checkpoint), device="cpu", dtype="float32")
    await engine.start()
    return engine


async def test_streams_incremental_outputs_matching_offline(checkpoint):
    engine = await started(checkpoint)
    try:
        params = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
        lengths, texts = [], []
        async for out in engine.generate("hello world", params, "r1"):
            lengths.append(len(out.outputs[0].token_ids))
            texts.append(out.outputs[0].text)
        # One output per step while the reader keeps up; steps it did not read in time merge.
        assert lengths == sorted(set(lengths)) and lengths[-1] == 8
        assert all(texts[i + 1].startswith(texts[i]) for i in range(len(texts) - 1))
        offline = engine.engine.tokenizer.decode(out.outputs[0].token_ids)
        assert texts[-1] == offline
        assert out.finished and out.outputs[0].finish_reason == "length"
    finally:
        await engine.shutdown()


async def test_a_reader_that_falls_behind_gets_the_latest_output_not_a_backlog(checkpoint):
    engine = await started(checkpoint)
    try:
        params = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
        fast = [out async for out in engine.generate("hello world", params, "fast")]
        slow = engine.generate("hello world", params, "slow")
        first = await anext(slow)
        seen = list(first.outputs[0].token_ids)  # as read (one step, or more if it fell behind)
        while engine.get_stats().num_running or engine.get_stats().num_waiting:
            await asyncio.sleep(0.01)  # the engine finishes while nobody reads
        rest = [out async for out in slow]
        assert len(rest) == 1 and rest[0].finished  # the steps not read merged into one
        assert len(first.outputs[0].token_ids) < 12
        assert rest[0].outputs[0].token_ids == fast[-1].outputs[0].token_ids
        assert rest[0].outputs[0].text == fast[-1].outputs[0].text
        assert first.outputs[0].token_ids == seen == fast[-1].outputs[0].token_ids[: len(seen)]
    finally:
        await engine.shutdown()


async def test_delta_outputs_joined_equal_the_cumulative_ones(checkpoint):
    engine = await started(checkpoint)
    try:
        params = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True, n=2, logprobs=2)
        whole = [out async for out in engine.generate("hello world", params, "whole")][-1]
        stream = engine.generate("hello world", params, "parts", delta=True)
        first = await anext(stream)
        handed = [list(c.token_ids) for c in first.outputs]
        while engine.get_stats().num_running or engine.get_stats().num_waiting:
            await asyncio.sleep(0.01)  # later steps arrive while nobody reads: one delta
        rest = [out async for out in stream]
        assert len(rest) == 1 and rest[0].finished
        assert [list(c.token_ids) for c in first.outputs] == handed  # never changed later
        for index, c in enumerate(whole.outputs):
            parts = [o for out in (first, rest[0]) for o in out.outputs if o.index == index]
            assert [t for o in parts for t in o.token_ids] == c.token_ids
            assert "".join(o.text for o in parts) == c.text
            assert [lp for o in parts for lp in o.logprobs or ()] == c.logprobs
            assert parts[-1].finish_reason == c.finish_reason == "length"
    finally:
        await engine.shutdown()


async def test_a_caller_that_does_not_stream_reads_the_first_output_and_then_the_rest(checkpoint):
    engine = await started(checkpoint)
    try:
        params = SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True, n=2, logprobs=1)
        whole = [out async for out in engine.generate("hello world", params, "whole")][-1]
        for delta in (False, True):
            outs = [
                out
                async for out in engine.generate(
                    "hello world", params, f"quiet-{delta}", delta=delta, stream=False
                )
            ]
            # 16 steps; the caller is woken for the first output and for the last only (one,
            # if the engine was done before the caller first ran).
            assert len(outs) in (1, 2) and [o.finished for o in outs][-2:] in (
                [True],
                [False, True],
            )
            final = outs[0]
            for out in outs[1:]:
                final = join_output(final, out) if delta else out
            for c, expected in zip(final.outputs, whole.outputs, strict=True):
                assert (c.token_ids, c.text) == (expected.token_ids, expected.text)
                assert c.logprobs == expected.logprobs and c.finish_reason == "length"
        # A request that fails still wakes its caller with the error.
        with pytest.raises(InvalidParameterError):
            async for _ in engine.generate({"prompt_token_ids": []}, params, "bad", stream=False):
                pass
    finally:
        await engine.shutdown()


async def test_leaving_the_stream_aborts_and_frees_blocks(checkpoint):
    engine = await started(checkpoint)
    try:
        params = SamplingParams(max_tokens=200, temperature=0.0, ignore_eos=True)
        streams = [engine.generate("a b c d", params, f"s{i}") for i in range(20)]
        for stream in streams:  # read one output from each, then drop them all
            await stream.__anext__()
        for stream in streams:
            await stream.aclose()
        for _ in range(100):
            await asyncio.sleep(0.02)
            stats = engine.get_stats()
            if stats.num_running == 0 and stats.num_waiting == 0:
                break
        assert stats.kv_blocks_used == 0 and stats.num_running == 0
        engine.engine.kv_cache_manager.check_integrity()
    finally:
        await engine.shutdown()


async def test_bad_request_raises_before_output_and_engine_lives(checkpoint):
    engine = await started(checkpoint)
    try:
        with pytest.raises(InvalidParameterError):
            async for _ in engine.generate({"prompt_token_ids": []}, SamplingParams(), "bad"):
                pass
        for i, ids in enumerate(([10**9], [3, -1, 5], [7, 1, 10**9])):
            with pytest.raises(InvalidParameterError, match="token ids must be in"):
                async for _ in engine.generate(
                    {"prompt_token_ids": ids}, SamplingParams(), f"b{i}"
                ):
                    pass
        outs = [o async for o in engine.generate("ok", SamplingParams(max_tokens=2), "good")]
        assert outs[-1].finished
    finally:
        await engine.shutdown()


async def test_cancelled_before_admission_is_aborted(checkpoint):
    """A caller cancelled while its request is still being added (a client that hangs up at
    once) must not leave the request running unseen."""
    engine = await started(checkpoint)
    try:
        params = SamplingParams(max_tokens=500, temperature=0.0, ignore_eos=True)

        async def consume(i: int) -> None:
            async for _ in engine.generate({"prompt_token_ids": [1, 2, 3]}, params, f"c{i}"):
                pass

        tasks = [asyncio.create_task(consume(i)) for i in range(10)]
        await asyncio.sleep(0)  # each task is now waiting for its add
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        # Commands run in order: once a later request is done, the adds (and aborts) are too.
        later = [o async for o in engine.generate("ok", SamplingParams(max_tokens=2), "later")]
        assert later[-1].finished
        assert not engine.engine.has_unfinished_requests()
        assert (
            engine.engine.kv_cache_manager.num_free_blocks
            == engine.engine.kv_cache_manager.num_blocks
        )
    finally:
        await engine.shutdown()
