"""An engine step that raises (out of memory, a kernel fault) fails only the requests in that
step: they get a 500 engine_error (a stream: its error event), requests outside the step run
on, the engine lives, and nothing is left holding blocks, slots or usage."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from tests.platform.platform_harness import Platform


@pytest.fixture
def settings_overrides() -> dict[str, object]:
    return {"max_num_seqs": 2, "max_model_len": 1024, "max_completion_tokens": 500}


async def test_a_failing_step_fails_only_its_requests(
    server: Platform, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, headers = await server.tenant("acme")
    c = server.client
    engine = server.state.engine
    body = {"model": server.model_name, "prompt": "Once", "max_tokens": 400, "ignore_eos": True}

    async def stream() -> list[str]:
        async with c.stream(
            "POST", "/v1/completions", headers=headers, json={**body, "stream": True}
        ) as r:
            assert r.status_code == 200
            return [line async for line in r.aiter_lines() if line]

    in_step = [
        asyncio.create_task(c.post("/v1/completions", headers=headers, json=body)),
        asyncio.create_task(stream()),
    ]
    while engine.get_stats().num_running < 2:
        await asyncio.sleep(0.002)
    queued = asyncio.create_task(
        c.post("/v1/completions", headers=headers, json={**body, "max_tokens": 20})
    )
    while engine.get_stats().num_waiting < 1:
        await asyncio.sleep(0.002)

    runner = engine.engine.engine.runner
    launch = runner.launch
    failures: list[list[str]] = []

    def fail_once(scheduler_output: Any, lora: Any) -> Any:
        if not failures:
            failures.append([s.request.request_id for s in scheduler_output.scheduled])
            raise RuntimeError("CUDA out of memory (simulated)")
        return launch(scheduler_output, lora)

    monkeypatch.setattr(runner, "launch", fail_once)
    failed_json = await in_step[0]
    assert failed_json.status_code == 500
    assert failed_json.json()["error"]["code"] == "engine_error"
    lines = await in_step[1]
    assert lines[-1] == "data: [DONE]"
    error = json.loads(lines[-2].removeprefix("data: "))["error"]
    assert error["code"] == "engine_error"
    assert len(failures[0]) == 2  # the step held exactly the two running requests

    survivor = await queued
    assert survivor.status_code == 200 and survivor.json()["usage"]["completion_tokens"] == 20
    assert engine.engine.is_running
    stats = engine.get_stats()
    assert stats.num_running == stats.num_waiting == stats.kv_blocks_used == 0
    assert engine.num_inflight == 0
    await server.flush_usage()
    rows = (await c.get("/admin/v1/usage?group_by=day", headers=server.admin)).json()["data"]
    assert rows[0]["requests"] == 3
    r = await c.post("/v1/completions", headers=headers, json={**body, "max_tokens": 3})
    assert r.status_code == 200  # and it keeps serving
